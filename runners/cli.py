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
import dataclasses
import datetime as dt
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from runners.entry import EXIT_USAGE, HANDED_OVER, hand_over
from runners.launch import describe_failures, launch
from runners.listing import cmd_list, find_runs
from runners.options import RunOptions, add_run_arguments, options_from_namespace, options_to_argv
from runners.paradigms import (DEFAULT_MODEL_CANDIDATES, PARADIGMS, PIPELINE_SCHEDULES, check_flags, default_model,
                               given_fields, gpu_only_reason, problem_with)

__all__ = ["describe_failures", "find_runs", "main"]

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
        help="ranks per node: one GPU each with NCCL, or N gloo processes on CPU when no GPU is visible; "
        "dp: the GPUs its one process drives",
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


def _check_request(ns: argparse.Namespace) -> tuple[RunOptions, str, bool]:
    """Validate everything that can be checked before a process starts.

    Returns (opts, device, model_chosen): model_chosen is True when --model was not given and the
    smallest preset that fits the paradigm and ranks was picked.
    """
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
    name = ns.name or f"{ns.paradigm}-{ns.gpus * ns.nnodes}r-{dt.datetime.now():%Y%m%d-%H%M%S}"
    _check_name(name)
    opts = options_from_namespace(ns, run_id=name)
    chosen = ns.model is None
    # a flag of another paradigm, even given with its default value: whatever the device
    if problem := check_flags(opts, given_fields(getattr(ns, "argv", None) or sys.argv[1:])):
        raise UsageError(problem)
    # A GPU-only request (dp, fsdp --offload) on CPU is refused for that first: its batch split or
    # model checks would only send the user fixing what cannot run here anyway.
    device = None
    if gpu_only := gpu_only_reason(opts):
        device = _pick_device(ns.device, ns.gpus, gpu_only=_gpu_only_who(opts))
        if device == "cpu":
            raise UsageError(gpu_only)
    if chosen:  # the smallest preset that fits; if none does, tiny's problem is reported below
        opts = dataclasses.replace(opts, model=default_model(opts) or opts.model)
    problem = problem_with(opts)
    # The model is at fault and no candidate fits; unless the problem already says what to use.
    if problem and chosen and "model" in problem and not _ADVICE.search(problem):
        problem += f"; no default preset ({', '.join(DEFAULT_MODEL_CANDIDATES)}) fits: give --model"
    if problem:
        raise UsageError(problem)
    if not opts.out.strip():  # Path("") is ".": an empty --out would silently mean this folder
        raise UsageError("--out is empty: give the folder that receives <run-id>/ (default traces)")
    _check_out(Path(opts.out), name)
    device = device or _pick_device(ns.device, ns.gpus)
    import torch

    if problem := v_schedule_problem(opts, device, torch.__version__):
        raise UsageError(problem)
    return dataclasses.replace(opts, device=device), device, chosen


def v_pipelines_on_gloo(torch_version: str) -> bool:
    """Whether this torch ("2.11.0+cu130") runs V-shaped pipelines on gloo ranks: 2.13 and later (an
    unreadable version is taken as able). tests/conftest.py skips the tests that launch them by it."""
    major_minor = re.match(r"(\d+)\.(\d+)", torch_version)
    return major_minor is None or tuple(map(int, major_minor.groups())) >= (2, 13)


def v_schedule_problem(opts: RunOptions, device: str, torch_version: str) -> str | None:
    """A V-shaped pipeline (zbv, dualpipev; hybrid --schedule either) on gloo ranks with torch before
    2.13. The last rank holds two adjacent stages, and torch 2.11's pipelining warm-up sends between
    them through the process group: to its own rank, which gloo refuses ("Pair is not connected";
    seen on torch 2.11, the last rank's first step). Torch 2.13 runs them; NCCL takes the self-send."""
    name = (opts.paradigm if opts.paradigm in PIPELINE_SCHEDULES
            else opts.schedule if opts.paradigm == "hybrid" and (opts.pp or 1) > 1 else None)
    if (device != "cpu" or name is None or PIPELINE_SCHEDULES[name].placement != "v"
            or v_pipelines_on_gloo(torch_version)):
        return None
    return (f"{name} on gloo ranks needs torch 2.13 or later (this is {torch_version}): its pipelining "
            "warm-up sends between the two stages of the last rank, which gloo refuses; upgrade torch or run on GPUs")


_ADVICE = re.compile(r"[:;] use ")  # "...: use --gpus 2 or 4": a problem that names its own fix


def _gpu_only_who(opts: RunOptions) -> str:
    """How a GPU-only request needs its --gpus GPUs, for the error when too few are visible."""
    if PARADIGMS[opts.paradigm].processes_per_node(opts) != opts.gpus:
        return f"{opts.paradigm} (one process driving every GPU)"
    return f"{opts.paradigm}{' --offload' if opts.offload else ''} (one rank per GPU)"


# A run folder is created as .<name>.tmp and as <name> (and .failed/<name>): the longest, plus the
# filesystem's 255-byte limit on one name, bounds --name.
_NAME_MAX_BYTES = 255 - len("..tmp")


def _check_name(name: str) -> None:
    if "/" in name or name.startswith(".") or not name:
        raise UsageError(f"--name {name!r} must be a plain folder name (no '/', not starting with '.')")
    if not name.isprintable():
        raise UsageError(f"--name {name!r} has control characters (newline, escape, ...): use a plain folder name")
    try:
        size = len(os.fsencode(name))
    except UnicodeError:
        raise UsageError(f"--name {name!r} cannot be encoded as a file name on this system") from None
    if size > _NAME_MAX_BYTES:
        raise UsageError(f"--name is {size} bytes long; a run name may have at most {_NAME_MAX_BYTES}")


def _check_out(out: Path, name: str) -> None:
    """--out must be (or be creatable as) a writable folder, and <out>/<name> must not exist yet."""
    try:
        existing = out
        while not existing.exists():  # the nearest existing ancestor decides whether we can create out
            if existing.parent == existing:
                break
            existing = existing.parent
        if not existing.is_dir():
            what = "--out" if existing == out else f"--out's parent {existing}"
            raise UsageError(f"{what} is not a folder ({out}); give a folder to write <run-id>/ into")
        # os.access honours read-only filesystems; root passes it elsewhere, and a later mkdir
        # failure is still turned into a one-line error by cmd_run.
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UsageError(f"--out {out} is not writable (no write permission on {existing})")
        if (out / name).exists() or (out / name).is_symlink():
            raise UsageError(f"{out / name} already exists; choose another --name or remove it")
    except OSError as err:  # e.g. ENAMETOOLONG for the whole path, EACCES on an ancestor
        raise UsageError(f"--out {out}: {err.strerror or err}") from None


def _pick_device(requested: str, n: int, *, gpu_only: str | None = None) -> str:
    """"cuda" or "cpu" for --gpus `n` (GPUs of the node: one per rank, or dp's one process's).

    `gpu_only`: who is asking, for a request that cannot take gloo CPU ranks (e.g. "dp (one process
    driving every GPU)"): its error offers no CPU way out, and no fewer GPUs than it needs.
    """
    import torch  # only here: --help and argument errors should not wait for torch to import

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "cpu" or (requested == "auto" and visible == 0):
        return "cpu"
    if visible < n:
        hint = " (CUDA_VISIBLE_DEVICES=" + os.environ["CUDA_VISIBLE_DEVICES"] + ")" if "CUDA_VISIBLE_DEVICES" in os.environ else ""
        if gpu_only:
            seen = "none is visible" if visible == 0 else f"only {visible} {'is' if visible == 1 else 'are'} visible"
            raise UsageError(f"{gpu_only} needs {n} CUDA GPUs on this node, but {seen}{hint}")
        raise UsageError(
            f"--gpus {n} needs {n} GPUs on this node but {visible} {'is' if visible == 1 else 'are'} visible{hint}; "
            "lower --gpus or use --device cpu for gloo ranks"
        )
    return "cuda"


def _torchrun_argv(ns: argparse.Namespace, opts: RunOptions, log_dir: Path) -> list[str]:
    """The torch.distributed.run command line for this run (what `torchrun` would be given)."""
    nproc = PARADIGMS[opts.paradigm].processes_per_node(opts)
    argv = ["--nnodes", str(opts.nnodes), "--nproc-per-node", str(nproc), "--max-restarts", "0"]
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
    opts, device, model_chosen = _check_request(ns)
    out = Path(opts.out)
    tmp = out / f".{opts.run_id}.tmp"
    try:
        if ns.node_rank == 0:  # node 0 owns the run folder; other nodes only write into it
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        else:
            tmp.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # what _check_out could not foresee (root on a read-only mount, a race)
        raise UsageError(f"cannot create {tmp}: {err.strerror or err}") from None
    published = False
    try:
        _print_plan(opts, device, model_chosen)
        status = _run_and_publish(ns, opts, tmp, model_chosen)
        published = status == 0 and ns.node_rank == 0
        return status
    finally:
        # Whatever went wrong (even an exception here), no half-written run is left behind.
        if not published and ns.node_rank == 0 and tmp.exists():
            _discard_failed(out, tmp, opts.run_id)


def _print_plan(opts: RunOptions, device: str, model_chosen: bool) -> None:
    """What will run: ranks and backend, the model (and why), which steps are profiled."""
    world = opts.world_size
    if device == "cpu":
        print(f"No GPU in use: running {world} gloo ranks on CPU (timings are indicative only).")
    elif PARADIGMS[opts.paradigm].processes_per_node(opts) != opts.gpus:
        print(f"Running 1 process per node driving {opts.gpus} GPUs ({opts.paradigm}).")
    else:
        print(f"Running {world} NCCL ranks, one GPU each.")
    layers = opts.preset[2]
    on = f"{opts.gpus} GPUs" if PARADIGMS[opts.paradigm].processes_per_node(opts) != opts.gpus else f"{world} ranks"
    why = f", the smallest preset that fits {opts.paradigm} on {on} (--model to choose)" if model_chosen else ""
    print(f"Model {opts.model} ({layers} layers, batch {opts.global_batch_size}){why}.")
    print(f"{_profile_plan(opts)}.", flush=True)


def _profile_plan(opts: RunOptions) -> str:
    """'steps 0-4 (numbered as ProfilerStep#k in the traces): 2-4 profiled after 1 warmup step'."""
    steps = opts.profiled_steps
    profiled = f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else f"{steps[0]}"
    warmup = f" after {opts.warmup} warmup step{'s' if opts.warmup != 1 else ''}" if opts.warmup else ", no warmup"
    return (
        f"{opts.steps} step{'s' if opts.steps != 1 else ''}, numbered 0-{opts.steps - 1} as ProfilerStep#k in the "
        f"traces: step{'s' if opts.active > 1 else ''} {profiled} profiled{warmup}"
    )


def _run_and_publish(ns: argparse.Namespace, opts: RunOptions, tmp: Path, model_chosen: bool) -> int:
    """Launch the ranks; on node 0, publish tmp as <out>/<run-id> when every file is there."""
    # Processes, hence traces: one per GPU, except dp's single process driving --gpus GPUs.
    out, world = Path(opts.out), PARADIGMS[opts.paradigm].processes_per_node(opts) * opts.nnodes
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # ranks share the cores; also silences torchrun's note
    os.environ["PTPROF_RUN_ID"] = opts.run_id  # lets tests (and users) find this run's processes
    started = time.time()
    failure = launch(_torchrun_argv(ns, opts, tmp / "logs"))
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
    final = out / opts.run_id
    os.replace(tmp, final)  # atomic publish: a <run-id>/ folder is always a complete run
    _print_summary(final, time.time() - started, model_chosen)
    return 0


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


def _print_summary(run_dir: Path, elapsed_s: float, model_chosen: bool) -> None:
    manifest = json.loads((run_dir / "run.json").read_text())
    ranks = manifest["ranks"]
    profiled = manifest["profiler"]["profiled_steps"]
    # Each rank's own wall-clock mean over the profiled steps: the progress lines are one rank's,
    # so the summary names the spread as well as the mean over ranks.
    rank_ms = [1e3 * sum(r["step_time_s"][s] for s in profiled) / len(profiled) for r in ranks]
    losses = [loss for loss in manifest["losses"] if loss is not None]
    trace_bytes = sum((run_dir / r["trace"]).stat().st_size for r in ranks)
    mem = ranks[0]["memory"]
    print(f"\n{manifest['run_id']}: {manifest['paradigm']} {_ran_on(manifest)}, {len(manifest['losses'])} steps "
          f"in {elapsed_s:.1f} s")
    if losses:
        print(f"  loss            {losses[0]:.4f} -> {losses[-1]:.4f} (global batch, all ranks)")
    model = manifest["model"]
    how = " (smallest that fits; --model)" if model_chosen else ""
    print(f"  model           {model['preset']}: {model['n_layers']} layers, {model['n_params']:,} parameters{how}")
    steps = f"{profiled[0]}-{profiled[-1]}" if len(profiled) > 1 else str(profiled[0])
    spread = ""
    if len(ranks) > 1:
        lo, hi = min(range(len(ranks)), key=rank_ms.__getitem__), max(range(len(ranks)), key=rank_ms.__getitem__)
        spread = (f"\n                  per rank {rank_ms[lo]:.1f} ms (rank {ranks[lo]['rank']}) to "
                  f"{rank_ms[hi]:.1f} ms (rank {ranks[hi]['rank']})")
    # Two lines rather than one of ~130 columns: the summary fits 100 like `ptprof analyze`.
    print(f"  step time       {sum(rank_ms) / len(rank_ms):.1f} ms mean over profiled steps {steps} and "
          f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''}, wall clock{spread}")
    held = ("params_bytes", "grads_bytes", "optimizer_bytes") + (("stashed_params_bytes",) if mem.get("stashed_params_bytes") else ())
    where = " (host memory)" if manifest.get("offload") else ""  # fsdp --offload keeps the shards on the CPU
    print("  rank 0 holds    " + ", ".join(f"{k.removesuffix('_bytes').replace('_', ' ')} {_fmt_bytes(mem[k])}" for k in held) + where)
    print(f"  traces          {run_dir}/ ({_plural(len(ranks), 'rank')}, {_fmt_bytes(trace_bytes)})")
    print(f"  next            ptprof analyze {run_dir}")


def _ran_on(manifest: dict) -> str:
    """'on 2 gloo ranks (cpu)', or for dp 'in 1 process driving 2 GPUs (nccl, cuda)'."""
    n, world = manifest.get("gpus_per_process"), manifest["world_size"]
    if isinstance(n, int) and n > 1:  # dp: one process per node, several GPUs each
        each = " each" if world > 1 else ""
        return f"in {_plural(world, 'process', 'processes')} driving {n} GPUs{each} ({manifest['backend']}, {manifest['device']})"
    return f"on {_plural(world, manifest['backend'] + ' rank')} ({manifest['device']})"


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ---------------------------------------------------------------------------------------------
# ptprof analyze / view: separate packages, separate processes


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ptprof")
    except PackageNotFoundError:  # run from a checkout without installing it
        return "(not installed: run from a source checkout)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ptprof",
        description="Trace-driven profiling for distributed PyTorch training: run a parallelism "
        "paradigm under torch.profiler, then analyze and view where each step's time and memory go.",
        epilog="Each command has its own help: ptprof COMMAND --help. A first session: ptprof run ddp --gpus 2, "
        "then ptprof analyze traces/<the run id it prints>, then ptprof view (README, Quick start).",
    )
    parser.add_argument("--version", action="version", version=f"ptprof {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_run_parser(sub)
    lst = sub.add_parser("list", help="list the runs under a traces folder")
    lst.add_argument("--traces", default="traces", help="folder of runs (default traces/)")
    sub.add_parser("analyze", help="analyze traces (compute/comm/idle, overlap, collectives, ...)", add_help=False)
    sub.add_parser("project", help="predict a run's step time and memory on a target cluster and layout", add_help=False)
    sub.add_parser("plan", help="rank the parallel layouts of a model on G GPUs of a cluster", add_help=False)
    sub.add_parser("view", help="open the Dash viewer over a folder of runs", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # analyze/project/plan/view keep their own flags: hand them over untouched.
    if argv and argv[0] in HANDED_OVER:  # the console script (runners/entry.py) hands them over before this module
        return hand_over(argv)
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
        ns.argv = list(argv)  # the flags given, default values included (check_flags)
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
    except KeyboardInterrupt:  # outside the launch (which reports its own): cmd_run has cleaned up
        print("ptprof: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader closed the pipe (`ptprof list | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
