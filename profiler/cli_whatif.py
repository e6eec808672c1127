"""`ptprof project RUN --cluster C [...]` and `ptprof plan --layers ... --gpus G --cluster C [...]`:
what a run would take on a target cluster, and which parallel layout to use (docs/whatif.md).

Bad input (an unknown preset, a broken cluster file, a layout that does not divide, a model that
fits nowhere) ends with one line naming what was wrong and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from profiler.cli import EXIT_BAD_INPUT, _Parser, _print_line, _whole_number
from profiler.errors import TraceError

MAX_GPUS = 1 << 20


def _cluster_help() -> str:
    from profiler.cluster import preset_names

    return (f"target cluster: a preset ({', '.join(preset_names()) or 'none shipped'}) or a .toml/.json file of the "
            "same fields (docs/whatif.md, 'Clusters')")


def build_project_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ptprof project",
                description="Predict the step time, its breakdown, MFU and memory per GPU of a profiled run on a target "
                            "cluster, in the run's own parallel layout or another.",
                epilog="Compute comes from the run's measured per-op work (FLOPs of its recorded shapes), communication "
                       "from the paradigm's predicted volumes under the target's α–β per link. Every projection lists "
                       "its assumptions (docs/whatif.md).")
    p.add_argument("run", metavar="RUN", help="a run folder (traces/<run-id>/ with run.json)")
    p.add_argument("--cluster", required=True, metavar="C", help=_cluster_help())
    p.add_argument("--nodes", type=_whole_number(1, MAX_GPUS), metavar="N",
                   help="nodes of the target (default: as many as the run's ranks need)")
    p.add_argument("--layout", metavar="SPEC",
                   help="dp=..,tp=..,pp=..[,zero=,mb=,m=,schedule=,v=,recompute=,sp=] (default: the run's own)")
    p.add_argument("--json", metavar="FILE", help="write the projection as JSON (schema ptprof.projection/1)")
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
    p.add_argument("--params", type=pos, metavar="N", help="parameter count as a check of the dims (e.g. 175e9 as 175000000000)")
    p.add_argument("--layers", type=pos, required=True)
    p.add_argument("--hidden", type=pos, required=True)
    p.add_argument("--heads", type=pos, required=True)
    p.add_argument("--ffn", type=pos, help="MLP hidden size (default 4 x hidden)")
    p.add_argument("--vocab", type=pos, default=51200, help="vocabulary (default 51200)")
    p.add_argument("--seq", type=pos, required=True, help="sequence length")
    p.add_argument("--global-batch", type=pos, required=True, help="sequences per optimizer step")
    p.add_argument("--gpus", type=_whole_number(1, MAX_GPUS), required=True)
    p.add_argument("--cluster", required=True, metavar="C", help=_cluster_help())
    p.add_argument("--moe", metavar="E,k", help="mixture of experts: E experts, top-k routing")
    p.add_argument("--top", type=_whole_number(1, 1000), default=10, help="layouts to print (default 10)")
    p.add_argument("--json", metavar="FILE", help="write the plan as JSON (schema ptprof.plan/1)")
    return p


def project_main(argv: list[str] | None = None) -> int:
    args = build_project_parser().parse_args(argv)
    try:
        import json
        from pathlib import Path

        from profiler.project import project_details
        from profiler.project_text import projection_dict, projection_text, resolve_cluster, save_cluster

        cluster, how, cal_work = resolve_cluster(args.cluster)
        if args.save_cluster:
            save_cluster(cluster, args.save_cluster)
        same = cal_work is not None and Path(args.cluster).resolve() == Path(args.run).resolve()
        d = project_details(args.run, cluster, nodes=args.nodes, layout=args.layout, work=cal_work if same else None)
        if args.json:
            try:
                with open(args.json, "w") as f:
                    json.dump(projection_dict(d, cluster, how, args.run), f, indent=2)
            except OSError as e:
                raise ValueError(f"--json {args.json}: cannot write ({e.strerror})") from None
        print(projection_text(d, cluster, how, args.run))
        return 0
    except (TraceError, ValueError) as e:
        _print_line(f"ptprof project: error: {e}", sys.stderr)
        return EXIT_BAD_INPUT


def plan_main(argv: list[str] | None = None) -> int:
    args = build_plan_parser().parse_args(argv)
    try:
        raise NotImplementedError("issue 15: plan")
    except (TraceError, ValueError) as e:
        _print_line(f"ptprof plan: error: {e}", sys.stderr)
        return EXIT_BAD_INPUT
