"""`ptprof`: run a paradigm under the profiler, list runs, analyze traces, view them.

    ptprof run fsdp --gpus 8          # 8 ranks via torch.distributed.run; gloo on CPU without GPUs
    ptprof list                       # runs under traces/
    ptprof analyze traces/<run-id>    # the profiler's report (python -m profiler)
    ptprof view                       # the Dash viewer (python -m viewer)

This module lives in `runners` because `run` and `list` are about the run layout the runners
write. `analyze` and `view` are handed to `python -m profiler` / `python -m viewer` in a fresh
process (exec), so the runners never import the profiler or the viewer, as the import contracts
in pyproject.toml require.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import time
from pathlib import Path

from runners.options import RunOptions, add_run_arguments, options_from_namespace, options_to_argv, validate
from runners.paradigms import PARADIGMS, check_flags

EXIT_USAGE = 2  # bad arguments or an impossible request: nothing was started
EXIT_FAILED = 1  # the run started and a rank failed


class UsageError(Exception):
    """A one-line problem with the command; printed as `ptprof run: <message>`, exit 2."""


class _Parser(argparse.ArgumentParser):
    # argparse prints the whole usage block and a second line; a user wants one line saying what
    # was wrong and where to look.
    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


# ---------------------------------------------------------------------------------------------
# ptprof run


def _add_run_parser(sub) -> None:
    width = max(map(len, PARADIGMS))
    names = "\n".join(f"  {name:<{width}} {p.summary}" for name, p in PARADIGMS.items())
    run = sub.add_parser(
        "run",
        help="train one paradigm on N ranks under torch.profiler, writing traces/<run-id>/",
        description=(
            "Launch N ranks through torch.distributed.run (torchrun's machinery) and train the "
            "tiny GPT with one parallelism paradigm, profiling the last --active steps. NCCL with "
            "one GPU per rank when CUDA GPUs are visible, gloo ranks on the CPU otherwise. The run "
            "is written to <out>/<run-id>/ (one rank<R>.json.gz trace per rank and run.json) only "
            "when every rank succeeded.\n\nparadigms:\n" + names
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("paradigm", metavar="PARADIGM", help="one of: " + ", ".join(PARADIGMS))
    run.add_argument(
        "--gpus",
        type=int,
        required=True,
        metavar="N",
        help="ranks per node: one GPU each with NCCL, or N gloo processes on CPU when no GPU is visible",
    )
    launch = run.add_argument_group("multi-node (passed to torch.distributed.run)")
    launch.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    launch.add_argument("--node-rank", type=int, default=0, help="this node's rank (static rendezvous)")
    launch.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="node 0's HOST:PORT, the same on every node: node 0 hosts the rendezvous store "
        "(default: a free local port, one node)",
    )
    launch.add_argument("--rdzv-id", default=None, help="rendezvous id shared by all nodes (default: the run id)")
    add_run_arguments(run)


def _check_request(ns: argparse.Namespace) -> tuple[RunOptions, str]:
    """Validate everything that can be checked before a process starts. Returns (opts, device)."""
    if ns.paradigm not in PARADIGMS:
        raise UsageError(f"unknown paradigm {ns.paradigm!r}; choose one of: {', '.join(PARADIGMS)}")
    if ns.gpus < 1:
        raise UsageError(f"--gpus must be at least 1 (got {ns.gpus})")
    if ns.nnodes < 1 or not 0 <= ns.node_rank < ns.nnodes:
        raise UsageError(f"--node-rank {ns.node_rank} must be in [0, --nnodes {ns.nnodes})")
    if ns.nnodes > 1 and not ns.rdzv_endpoint:
        raise UsageError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT reachable from every node")
    if ns.nnodes > 1 and not ns.name:
        raise UsageError("--nnodes > 1 needs --name RUN_ID, the same on every node, so all nodes write one run")
    device = _pick_device(ns.device, ns.gpus)
    name = ns.name or f"{ns.paradigm}-{ns.gpus * ns.nnodes}r-{dt.datetime.now():%Y%m%d-%H%M%S}"
    if "/" in name or name.startswith("."):
        raise UsageError(f"--name {name!r} must be a plain folder name (no '/', not starting with '.')")
    opts = options_from_namespace(ns, device=device, run_id=name)
    paradigm = PARADIGMS[opts.paradigm]
    problem = check_flags(opts) or validate(opts, paradigm.data_parallel(opts)) or paradigm.check(opts)
    if problem:
        raise UsageError(problem)
    if (Path(opts.out) / name).exists():
        raise UsageError(f"{Path(opts.out) / name} already exists; choose another --name or remove it")
    return opts, device


def _pick_device(requested: str, n: int) -> str:
    import torch  # only here: --help and argument errors should not wait for torch to import

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "cpu" or (requested == "auto" and visible == 0):
        return "cpu"
    if visible < n:
        hint = " (CUDA_VISIBLE_DEVICES=" + os.environ["CUDA_VISIBLE_DEVICES"] + ")" if "CUDA_VISIBLE_DEVICES" in os.environ else ""
        raise UsageError(
            f"--gpus {n} needs {n} GPUs on this node but {visible} {'is' if visible == 1 else 'are'} visible{hint}; "
            f"lower --gpus or use --device cpu for gloo ranks"
        )
    return "cuda"


def _torchrun_argv(ns: argparse.Namespace, opts: RunOptions, log_dir: Path) -> list[str]:
    """The torch.distributed.run command line for this run (what `torchrun` would be given)."""
    argv = ["--nnodes", str(opts.nnodes), "--nproc-per-node", str(opts.gpus), "--max-restarts", "0"]
    if ns.rdzv_endpoint:
        # Static rendezvous: --node-rank fixes which node hosts which ranks (global rank 0 on node
        # 0, the node that publishes the run); c10d would assign them by arrival order.
        argv += ["--rdzv-backend", "static", "--rdzv-endpoint", ns.rdzv_endpoint, "--node-rank", str(ns.node_rank)]
        argv += ["--rdzv-id", ns.rdzv_id or opts.run_id]
    else:
        # What torchrun's --standalone does: a private c10d store on a free local port.
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", opts.run_id]
    # stdout (only the progress rank prints there: rank 0, or the last pipeline stage, which holds
    # the loss) goes to this terminal; every rank's stderr to <run>/logs/, where failure reports point.
    argv += ["--log-dir", str(log_dir), "--redirects", "2", "--monitor-interval", "0.2"]
    argv += ["-m", PARADIGMS[opts.paradigm].module, *options_to_argv(opts)]
    return argv


def cmd_run(ns: argparse.Namespace) -> int:
    opts, device = _check_request(ns)
    out = Path(opts.out)
    tmp = out / f".{opts.run_id}.tmp"
    final = out / opts.run_id
    world = opts.world_size
    if device == "cpu":
        print(f"No GPU in use: running {world} gloo ranks on CPU (timings are indicative only).", flush=True)
    else:
        print(f"Running {world} NCCL ranks, one GPU each.", flush=True)
    if ns.node_rank == 0:  # node 0 owns the run folder; other nodes only write into it
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    else:
        tmp.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # ranks share the cores; also silences torchrun's note
    os.environ["PTPROF_RUN_ID"] = opts.run_id  # lets tests (and users) find this run's processes
    started = time.time()
    failure = _launch(_torchrun_argv(ns, opts, tmp / "logs"))
    if failure:
        print(f"ptprof run: {failure}", file=sys.stderr)
        if ns.node_rank != 0:
            print("ptprof run: no run was written; node 0 keeps the rank logs", file=sys.stderr)
            return EXIT_FAILED
        kept = _discard_failed(out, tmp, opts.run_id)
        print(f"ptprof run: no run was written; rank logs kept in {kept}", file=sys.stderr)
        return EXIT_FAILED
    if ns.node_rank != 0:
        print(f"node {ns.node_rank}: ranks finished; node 0 publishes the run", flush=True)
        return 0
    missing = [f"rank{r}.json.gz" for r in range(world) if not (tmp / f"rank{r}.json.gz").exists()]
    if missing or not (tmp / "run.json").exists():
        kept = _discard_failed(out, tmp, opts.run_id)
        what = ", ".join(missing) or "run.json"
        print(
            f"ptprof run: every rank exited cleanly but {what} is missing in {tmp} "
            f"(multi-node runs need --out on a filesystem shared by all nodes); logs kept in {kept}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    os.replace(tmp, final)  # atomic publish: a <run-id>/ folder is always a complete run
    _print_summary(final, time.time() - started)
    return 0


def _launch(argv: list[str]) -> str | None:
    """Run torch.distributed.run's launcher in this process; return a failure line or None."""
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    # torchrun's agent logs every rendezvous step at WARNING/INFO; the failure report below says
    # what matters.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    config, cmd, cmd_args = config_from_args(parse_args(argv))
    try:
        elastic_launch(config, cmd)(*cmd_args)
    except ChildFailedError as err:
        return describe_failures({rank: (f.exitcode, f.message) for rank, f in err.failures.items()}, config.nproc_per_node * config.max_nodes)
    except KeyboardInterrupt:
        return "interrupted; all ranks stopped"
    except Exception as err:  # rendezvous or launcher trouble: say what, not a traceback
        return f"the launcher failed before the ranks finished: {type(err).__name__}: {err}"
    return None


# Errors a rank raises because a *peer* died or hung, not because it failed itself.
_PEER_SYMPTOMS = (
    "connection closed by peer",
    "connection reset",
    "broken pipe",
    "timed out",
    "timeout",
    "nccl communicator was aborted",
    "distnetworkerror",
)


def _last_line(message, limit: int = 240) -> str:
    if isinstance(message, dict):  # torchrun's error file nests {"message": ..., "extraInfo": ...}
        message = message.get("message", message)
    lines = [ln.strip() for ln in str(message).strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else "no message"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def describe_failures(failures: dict[int, tuple[int, object]], world_size: int) -> str:
    """One line naming the failing rank(s) and why, from torchrun's per-rank (exitcode, message).

    Three kinds of failed rank: a *cause* raised its own error or died of a signal other than
    SIGTERM; a *symptom* raised because a peer went away or a collective timed out; a *stopped*
    rank was terminated by the launcher (SIGTERM) without an error of its own. When only symptoms
    and stopped (or absent) ranks remain, the stopped ones are the culprits: they hung.
    """
    causes, symptoms, stopped = [], [], []
    for rank in sorted(failures):
        exitcode, message = failures[rank]
        text = str(message).lower()
        if any(s in text for s in _PEER_SYMPTOMS):
            symptoms.append(rank)
        elif exitcode == -15 and "sigterm" in text:
            stopped.append(rank)
        else:
            causes.append(rank)
    if causes:
        parts = []
        for rank in causes:
            exitcode, message = failures[rank]
            how = f"killed by signal {-exitcode}" if exitcode < 0 else f"exit {exitcode}"
            parts.append(f"rank {rank} failed ({how}): {_last_line(message)}")
        return "; ".join(parts)
    culprits = stopped + sorted(set(range(world_size)) - set(failures))
    waiting = ", ".join(map(str, symptoms))
    first = _last_line(failures[symptoms[0]][1]) if symptoms else "no message"
    if culprits:
        who = ", ".join(map(str, sorted(culprits)))
        return f"rank {who} stopped responding (hung or too slow); rank {waiting} gave up waiting: {first}"
    return f"rank {waiting} failed in a collective: {first}"


def _discard_failed(out: Path, tmp: Path, run_id: str) -> Path:
    """Delete a failed run's partial traces, keep its logs under <out>/.failed/<run-id>/."""
    kept = out / ".failed" / run_id
    if kept.exists():
        shutil.rmtree(kept)
    kept.parent.mkdir(parents=True, exist_ok=True)
    if (tmp / "logs").exists():
        shutil.move(str(tmp / "logs"), str(kept))
    else:
        kept.mkdir()
    shutil.rmtree(tmp, ignore_errors=True)
    return kept


def _print_summary(run_dir: Path, elapsed_s: float) -> None:
    manifest = json.loads((run_dir / "run.json").read_text())
    ranks = manifest["ranks"]
    profiled = manifest["profiler"]["profiled_steps"]
    step_ms = [1e3 * sum(r["step_time_s"][s] for r in ranks) / len(ranks) for s in profiled]
    losses = [loss for loss in manifest["losses"] if loss is not None]
    trace_bytes = sum((run_dir / r["trace"]).stat().st_size for r in ranks)
    mem = ranks[0]["memory"]
    print(
        f"\n{manifest['run_id']}: {manifest['paradigm']} on {manifest['world_size']} {manifest['backend']} "
        f"ranks ({manifest['device']}), {len(manifest['losses'])} steps in {elapsed_s:.1f} s"
    )
    if losses:
        print(f"  loss            {losses[0]:.4f} -> {losses[-1]:.4f} (global batch, all ranks)")
    print(f"  step time       {sum(step_ms) / len(step_ms):.1f} ms mean over profiled steps {profiled}")
    print(
        "  rank 0 holds    "
        + ", ".join(f"{k.removesuffix('_bytes')} {_fmt_bytes(mem[k])}" for k in ("params_bytes", "grads_bytes", "optimizer_bytes"))
    )
    print(f"  traces          {run_dir}/ ({len(ranks)} ranks, {_fmt_bytes(trace_bytes)})")
    print(f"  next            ptprof analyze {run_dir}")


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ---------------------------------------------------------------------------------------------
# ptprof list


def find_runs(root: Path) -> list[dict]:
    """Complete runs under `root` (folders with a run.json), newest first. Hidden folders skipped."""
    runs = []
    if not root.is_dir():
        return runs
    for manifest in sorted(root.glob("*/run.json")):
        if manifest.parent.name.startswith("."):
            continue
        try:
            data = json.loads(manifest.read_text())
        except (OSError, json.JSONDecodeError) as err:
            runs.append({"run_id": manifest.parent.name, "error": f"unreadable run.json: {err}"})
            continue
        data["_path"] = str(manifest.parent)
        runs.append(data)
    return sorted(runs, key=lambda r: r.get("created_at", ""), reverse=True)


def cmd_list(ns: argparse.Namespace) -> int:
    root = Path(ns.traces)
    runs = find_runs(root)
    if not runs:
        print(f"no runs under {root}/ (make one with `ptprof run ddp --gpus 2`)")
        return 0
    header = f"{'run':<36} {'paradigm':<10} {'ranks':>5} {'backend':<7} {'steps':>5} {'final loss':>10}  created"
    print(header)
    for r in runs:
        if "error" in r:
            print(f"{r['run_id']:<36} {r['error']}")
            continue
        losses = [x for x in r.get("losses", []) if x is not None]
        final = f"{losses[-1]:.4f}" if losses else "-"
        print(
            f"{r['run_id']:<36} {r['paradigm']:<10} {r['world_size']:>5} {r['backend']:<7} "
            f"{len(r.get('losses', [])):>5} {final:>10}  {r.get('created_at', '')}"
        )
    return 0


# ---------------------------------------------------------------------------------------------
# ptprof analyze / view: separate packages, separate processes


def _exec_module(module: str, args: list[str]) -> int:
    """Replace this process with `python -m <module> ARGS` (exit status and signals pass through)."""
    import importlib.util

    if importlib.util.find_spec(module) is None or importlib.util.find_spec(f"{module}.__main__") is None:
        print(f"ptprof: `{args[0] if args else module}` is not yet available in this version", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *args])
    return 0  # not reached


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ptprof",
        description="Trace-driven profiling for distributed PyTorch training: run a parallelism "
        "paradigm under torch.profiler, then analyze and view where each step's time and memory go.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_run_parser(sub)
    lst = sub.add_parser("list", help="list the runs under a traces folder")
    lst.add_argument("--traces", default="traces", help="folder of runs (default traces/)")
    sub.add_parser("analyze", help="analyze traces (compute/comm/idle, overlap, collectives, ...)", add_help=False)
    sub.add_parser("view", help="open the Dash viewer over a folder of runs", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # analyze/view keep their own flags: hand them over untouched.
    if argv and argv[0] in ("analyze", "view"):
        return _exec_module({"analyze": "profiler", "view": "viewer"}[argv[0]], argv)
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
        if ns.command == "run":
            return cmd_run(ns)
        if ns.command == "list":
            return cmd_list(ns)
        parser.print_help()
        return EXIT_USAGE
    except UsageError as err:
        prog = "ptprof run" if argv and argv[0] == "run" else "ptprof"
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
