"""`ptprof project RUN --cluster C [...]` and `ptprof plan --layers ... --gpus G --cluster C [...]`:
what a run would take on a target cluster, and which parallel layout to use (docs/whatif.md).

Bad input (an unknown preset, a broken cluster file, a layout that does not divide, a model that
fits nowhere) ends with one line naming what was wrong and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from profiler.cli import EXIT_BAD_INPUT, _Parser, _print_line, _whole_number
from profiler import jsonfile
from profiler.errors import TraceError

MAX_GPUS = 1 << 20
PARAMS_TOLERANCE_PCT = 10.0  # --params further than this from the dims' count is refused


SUFFIXES = {"k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}  # --params 7B, 1.3B, 350M, 1T


def _count(text: str) -> int:
    """An argparse type: a whole count written 175000000000, 175e9, 175B or 1.3B (K/M/B/T suffixes)."""
    from decimal import Decimal, InvalidOperation

    t = text.strip().replace("_", "").replace(",", "")
    scale = SUFFIXES.get(t[-1:].lower(), 1) if t[-1:].isalpha() and t[-1:].lower() != "e" else 1
    num = t[:-1] if scale > 1 else t
    try:
        value = Decimal(num) * scale  # Decimal: 1.3B is exactly 1,300,000,000 (no float rounding)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 175e9, 175B or 1.3B)") from None
    if not (value.is_finite() and 1 <= value < Decimal("1e16") and value == value.to_integral_value()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole count between 1 and 1e16")
    return int(value)


def _cluster_help(run_folder: bool = False) -> str:
    from profiler.cluster import preset_names

    return (f"target cluster: a preset ({', '.join(preset_names()) or 'none shipped'}), a .toml/.json file of the "
            "same fields (docs/whatif.md, 'Clusters')"
            + (", or a run folder: the cluster that run was measured on, calibrated from its traces "
               "(--save-cluster keeps it as a file)" if run_folder else ""))


def build_project_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ptprof project",
                description="Predict the step time, its breakdown, MFU and memory per GPU of a profiled run on a target "
                            "cluster, in the run's own parallel layout or another.",
                epilog="Compute comes from the run's measured per-op work (FLOPs of its recorded shapes), communication "
                       "from the paradigm's predicted volumes under the target's α–β per link. Every projection lists "
                       "its assumptions (docs/whatif.md).")
    p.add_argument("run", metavar="RUN", help="a run folder (traces/<run-id>/ with run.json)")
    p.add_argument("--cluster", required=True, metavar="C", help=_cluster_help(run_folder=True))
    p.add_argument("--nodes", type=_whole_number(1, MAX_GPUS), metavar="N",
                   help="a check, not a placement: the nodes the layout must fill (GPUs per node come from the "
                        "cluster; ranks are packed tp innermost); refused when it differs (default: as many as "
                        "the layout fills)")
    p.add_argument("--layout", metavar="SPEC",
                   help="dp=..,tp=..,pp=..[,zero=,mb=,m=,schedule=,v=,recompute=,sp=], or a layout as plan prints "
                        "it ('dp=2 tp=2 pp=2 z1 mb=1x8 i1f1b v=2 rc=sel sp') (default: the run's own)")
    p.add_argument("--json", metavar="FILE", help="write the projection as JSON (schema ptprof.projection/1); "
                                                  "- for standard output (then no text)")
    p.add_argument("--save-cluster", metavar="FILE.json",
                   help="write the cluster used (e.g. the one calibrated from a run folder) as JSON, loadable by --cluster")
    return p


def build_plan_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ptprof plan",
                description="Search the parallel layouts (dp x tp x pp [x ep], ZeRO/FSDP, microbatches, pipeline "
                            "schedule, recomputation) of a transformer on G GPUs of a cluster; keep those that fit "
                            "memory, ranked by predicted step time.",
                epilog="No trace informs a pure plan: compute efficiency is assumed (docs/whatif.md says how).")
    pos = _whole_number(1, 1 << 40)
    p.add_argument("--params", type=_count, metavar="N",
                   help="parameter count, as a check of the dims (175e9, 175B, 1.3B or 175000000000): refused when more than "
                        f"{PARAMS_TOLERANCE_PCT:g} %% off the count of the dims")
    p.add_argument("--layers", type=pos, required=True, help="transformer blocks")
    p.add_argument("--hidden", type=pos, required=True, help="model width h")
    p.add_argument("--heads", type=pos, required=True, help="attention heads (must divide --hidden)")
    p.add_argument("--ffn", type=pos, help="MLP hidden size (default 4 x hidden)")
    p.add_argument("--vocab", type=pos, default=51200, help="vocabulary (default 51200)")
    p.add_argument("--seq", type=pos, required=True, help="sequence length")
    p.add_argument("--global-batch", type=pos, required=True, help="sequences per optimizer step")
    p.add_argument("--gpus", type=_whole_number(1, MAX_GPUS), required=True, help="GPUs of the job (G)")
    p.add_argument("--cluster", required=True, metavar="C", help=_cluster_help())
    p.add_argument("--moe", metavar="E,k", help="mixture of experts: E experts, top-k routing (every block's MLP)")
    p.add_argument("--flash-attention", action="store_true",
                   help="fused attention (FlashAttention): no attention scores kept, cheaper memory traffic "
                        "(default off, as the Megatron papers' accounting)")
    p.add_argument("--top", type=_whole_number(1, 1000), default=10, help="layouts to print and write (default 10)")
    p.add_argument("--json", metavar="FILE", help="write the plan as JSON (schema ptprof.plan/1); "
                                                  "- for standard output (then no text)")
    return p


def project_main(argv: list[str] | None = None) -> int:
    args = build_project_parser().parse_args(argv)
    try:
        import json
        from pathlib import Path

        from profiler.project import project_details
        from profiler.project_text import projection_dict, projection_text, resolve_cluster, save_cluster, with_host_note

        json_path = _check_json_path(args.json, "projection.json")  # before the work, as plan and analyze
        cluster, how, cal_work = resolve_cluster(args.cluster)
        if cal_work is None:  # a preset or file; a calibrated cluster's rates are what the run measured
            warn_cluster("project", args.cluster, cluster)
        if args.save_cluster:  # written before the work (a bad name fails fast), again below with the host note
            save_cluster(cluster, args.save_cluster)
        same = cal_work is not None and Path(args.cluster).resolve() == Path(args.run).resolve()
        d = project_details(args.run, cluster, nodes=args.nodes, layout=args.layout, work=cal_work if same else None)
        if args.save_cluster and same:
            save_cluster(with_host_note(cluster, d["estimate"].breakdown_s.get("other", 0.0)), args.save_cluster)
        if args.json == STDOUT:  # the JSON alone on stdout
            json.dump(projection_dict(d, cluster, how, args.run), sys.stdout, indent=2)
            print()
            if args.save_cluster:
                _print_line(f"cluster: {args.save_cluster}", sys.stderr)
            return 0
        if args.json:
            try:
                with open(json_path, "w") as f:
                    json.dump(projection_dict(d, cluster, how, args.run), f, indent=2)
            except OSError as e:
                raise ValueError(f"--json {args.json}: cannot write ({e.strerror})") from None
        print(projection_text(d, cluster, how, args.run))
        if args.save_cluster or args.json:  # the files written, as plan's `plan: F`
            print()
        if args.save_cluster:
            print(f"cluster: {args.save_cluster}")
        if args.json:
            print(f"projection: {json_path}")
        return 0
    except (TraceError, ValueError) as e:
        _print_line(f"ptprof project: error: {e}", sys.stderr)
        return EXIT_BAD_INPUT


def warn_cluster(prog: str, spec: str, cluster) -> None:
    """The cluster's plausibility warnings (profiler.cluster.cluster_warnings: likely unit
    mistakes), one stderr line each: `ptprof <prog>: warning: <file>: ...`."""
    from profiler.cluster import cluster_warnings

    for w in cluster_warnings(cluster):
        _print_line(f"ptprof {prog}: warning: {spec}: {w}", sys.stderr)


def _parse_moe(text: str | None) -> tuple[int, int]:
    """`--moe E,k` -> (E, k); (0, 0) without it."""
    if text is None:
        return 0, 0
    e, sep, k = text.partition(",")
    if not (sep and e.strip().isdigit() and k.strip().isdigit() and 1 <= int(k) <= int(e)):
        raise ValueError(f"--moe {text!r}: expected E,k with E >= 1 experts and 1 <= k <= E top-k (e.g. 8,2)")
    return int(e), int(k)


def _check_params(spec, given: int | None) -> str:
    """The header's note on --params; ValueError when it is more than PARAMS_TOLERANCE_PCT off."""
    counted = spec.count_params()
    if given is None:
        return " (counted from the dims)"
    off_pct = 100 * abs(counted - given) / given
    if off_pct > PARAMS_TOLERANCE_PCT:
        raise ValueError(f"--params {given:,} is {off_pct:.1f} % off the {counted:,} the dims give (layers, hidden, "
                         f"ffn, vocab, seq; docs/whatif.md, 'Plan'): check the dims or drop --params")
    from profiler.plan_report import params_text

    return f" (--params {params_text(given)}: {off_pct:.1f} % off)"


STDOUT = "-"  # --json -: the JSON on standard output, and nothing else there


def _check_json_path(path: str | None, example: str = "plan.json") -> Path | None:
    # before the work, not after it (as profiler/cli.py)
    if path is None or path == STDOUT:
        return None
    if why := jsonfile.unwritable(path, example=example):
        raise ValueError(f"--json {path}: {why}")
    return Path(path)


def plan_main(argv: list[str] | None = None) -> int:
    args = build_plan_parser().parse_args(argv)
    try:
        from profiler.cluster import cluster_to_dict, load_cluster
        from profiler.layout import ModelSpec
        from profiler.plan import plan
        from profiler.plan_report import format_plan, plan_json

        json_path = _check_json_path(args.json)
        experts, top_k = _parse_moe(args.moe)
        spec = ModelSpec(layers=args.layers, hidden=args.hidden, heads=args.heads, ffn=args.ffn or 4 * args.hidden,
                         vocab=args.vocab, seq=args.seq, global_batch=args.global_batch, experts=experts, top_k=top_k,
                         params=args.params, flash_attention=args.flash_attention)
        spec.check()
        params_note = _check_params(spec, args.params)
        if args.cluster.strip() and Path(args.cluster).is_dir():  # a run folder calibrates in `project` only
            raise ValueError(f"--cluster {args.cluster}: a folder; plan takes a preset or a .toml/.json cluster file. "
                             f"To plan on the cluster a run measured: ptprof project RUN --cluster RUN "
                             f"--save-cluster FILE.json, then --cluster FILE.json")
        cluster = load_cluster(args.cluster)
        warn_cluster("plan", args.cluster, cluster)
        result = plan(spec, args.gpus, cluster)
        if not result.ranked:
            if result.min_memory_bytes is None:
                why = "; ".join(f"{n:,} {k}" for k, n in result.refused.items() if n)
                raise ValueError(f"no layout of {args.gpus} GPUs divides this model and batch ({why})")
            raise ValueError(f"nothing fits: the smallest memory need of any layout is "
                             f"{result.min_memory_bytes / 2**30:,.1f} GiB per GPU, over the "
                             f"{cluster.usable_hbm_bytes / 2**30:.1f} GiB usable of the {cluster.hbm_gib:g} GiB HBM of {cluster.name} (more GPUs, a smaller model or a smaller global batch)")
        if args.json == STDOUT:  # the JSON alone on stdout
            jsonfile.write_stdout(plan_json(spec, args.gpus, cluster_to_dict(cluster), result, args.top, cluster))
            return 0
        print(format_plan(spec, args.gpus, cluster, result, args.top, params_note))
        if json_path is not None:
            report = plan_json(spec, args.gpus, cluster_to_dict(cluster), result, args.top, cluster)
            try:
                json_path.write_bytes(jsonfile.dumps(report))
            except OSError as e:
                raise ValueError(f"--json {args.json}: cannot write the plan ({e.strerror})") from None
            print("\nplan: " + str(json_path))
    except (TraceError, ValueError) as e:
        _print_line(f"ptprof plan: error: {e}", sys.stderr)
        return EXIT_BAD_INPUT
    return 0
