"""The text and JSON of `ptprof project` (schema "ptprof.projection/1"; docs/whatif.md, "Project")."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from profiler.cluster import CLUSTER_SCHEMA, Cluster, ClusterError, cluster_to_dict, load_cluster, preset_names

PROJECTION_SCHEMA = "ptprof.projection/1"
WIDTH = 100


def resolve_cluster(spec: str) -> tuple[Cluster, str, object]:
    """--cluster: a run folder (its measured cluster, calibrated), a preset or a cluster file.
    (cluster, how it was obtained, the run's RunWork or None). ClusterError / TraceError /
    ValueError with one line."""
    if not spec.strip():  # Path("") is the current folder: say it is empty, not "no run.json in ."
        raise ClusterError(f"--cluster {spec!r}: empty; give a preset ({', '.join(preset_names())}), a .toml/.json "
                           "cluster file or a run folder")
    path = Path(spec)
    if path.is_dir():
        from profiler.project_measure import calibrate, measure_run
        work = measure_run(path)
        return calibrate(work), f"calibrated from the run {path}", work
    return load_cluster(spec), "preset" if not path.suffix else f"file {spec}", None


def with_host_note(cluster: Cluster, other_s: float) -> Cluster:
    """The calibrated cluster with a note of the run's host time per step (what project carries over
    as "other"): informational only -- no rate holds it, and `ptprof plan` on the file leaves it out."""
    from dataclasses import replace
    note = (f"host time per step of the calibration run: {other_s * 1e3:.3g} ms, carried over as 'other' by "
            "ptprof project; not in these rates: ptprof plan on this file leaves it out (docs/whatif.md, 'Calibration')")
    return replace(cluster, notes=(*cluster.notes, note))


def save_cluster(cluster: Cluster, path: str) -> None:
    """Write a cluster as JSON that --cluster FILE loads back (cluster_to_dict)."""
    import json
    if not path.endswith(".json"):
        raise ClusterError(f"--save-cluster {path}: the file name must end in .json")
    try:
        # "schema" first: saved into a run folder it is no trace (discover.own_output), and says what it is
        Path(path).write_text(json.dumps({"schema": CLUSTER_SCHEMA, **cluster_to_dict(cluster)}, indent=2) + "\n")
    except OSError as e:
        raise ClusterError(f"--save-cluster {path}: cannot write ({e.strerror})") from None


def _ms(s: float | None) -> str:
    return "-" if s is None or not math.isfinite(s) else f"{s * 1e3:,.3f} ms"


def _gib(b: int | float | None) -> str:
    if b is None:
        return "-"
    return f"{b / 2**30:,.2f} GiB" if b >= 2**30 else f"{b / 2**20:,.2f} MiB"


def projection_dict(d: dict, cluster: Cluster, how: str, run_dir: str) -> dict:
    """The JSON projection."""
    est = d["estimate"]
    same = d["estimate"].layout == d["own_layout"] and cluster == d["source"]
    return {"schema": PROJECTION_SCHEMA, "run": run_dir, "cluster": cluster_to_dict(cluster), "cluster_from": how,
            "nodes": d["nodes"], "own_layout": d["own_layout"].as_dict(), "measured_step_s": d["measured_step_s"],
            "measured_on_target": same, "coverage": d["coverage"], "source_cluster": cluster_to_dict(d["source"]),
            # per-rank numbers exist for the run's own layout only (another layout is the cost model's)
            "per_rank": d.get("per_rank") if est.layout == d["own_layout"] else None, "estimate": est.as_dict()}


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def projection_text(d: dict, cluster: Cluster, how: str, run_dir: str) -> str:
    """The text report, at most WIDTH columns."""
    est, cov = d["estimate"], d["coverage"]
    spec = d["spec"]
    own = est.layout == d["own_layout"]
    lines = [*textwrap.wrap(f"ptprof project  {run_dir}  ->  {cluster.name} ({how}), {_n(d['nodes'], 'node')} "
                            f"of {cluster.gpus_per_node}, {_n(est.layout.gpus, 'GPU')} used", WIDTH, subsequent_indent="    "),
             f"model     L={spec.layers} h={spec.hidden} heads={spec.heads} ffn={spec.ffn} V={spec.vocab} "
             f"s={spec.seq} batch={spec.global_batch} params={spec.count_params():,}",
             *textwrap.wrap(f"layout    {est.layout.short()}" + ("  (the run's own)" if own else
                                                                 f"  (run's own: {d['own_layout'].short()})"),
                            WIDTH, subsequent_indent=" " * 10),
             f"coverage  {cov['known_pct'] or 0:.0f} % of the measured compute time has FLOPs/bytes from shapes",
             f"          (matmul+attention {cov['flop_ops_us'] / 1e3:,.1f} ms, memory-bound "
             f"{cov['memory_ops_us'] / 1e3:,.1f} ms of {cov['compute_us'] / 1e3:,.1f} ms, all ranks and steps)", ""]
    step = f"predicted step  {_ms(est.step_s)}"
    if own and cluster == d["source"]:
        err = 100.0 * (est.step_s / d["measured_step_s"] - 1) if d["measured_step_s"] > 0 else float("nan")
        step += f"    measured  {_ms(d['measured_step_s'])}  ({err:+.1f} %)"
    else:
        step += f"    (measured on its own hardware: {_ms(d['measured_step_s'])})"
    lines.append(step)
    pr = d.get("per_rank")
    # both sides: the slowest rank's mean over the profiled steps. Only for the run's own layout:
    # under --layout these would be the own layout's ranks, not the projected layout's
    if own and pr and len(pr["ranks"]) > 1:
        p_lo, p_hi = min(pr["projected_s"]), max(pr["projected_s"])
        m_lo, m_hi = min(pr["measured_s"]), max(pr["measured_s"])
        lines += textwrap.wrap(f"per rank: projected {p_lo * 1e3:.4g}-{p_hi * 1e3:.4g} ms, measured {m_lo * 1e3:.4g}-"
                               f"{m_hi * 1e3:.4g} ms (step: slowest rank's mean)", WIDTH,
                               initial_indent="  ", subsequent_indent="    ")
    for k, v in est.breakdown_s.items():
        if v <= 0:
            continue
        share = 100.0 * v / est.step_s if est.step_s > 0 else 0.0
        lines.append(f"  {k:<22} {_ms(v):>16}  {share:5.1f} %")
    lines.append(f"MFU             {est.mfu_pct:.3g} %" if est.mfu_pct is not None else "MFU             -")
    if est.memory_bytes:
        parts = ", ".join(f"{k} {_gib(v)}" for k, v in est.memory_bytes.items() if k != "total")
        usable = f", {_gib(est.usable_hbm_bytes)} usable" if est.usable_hbm_bytes is not None else ""
        lines.append(f"memory per GPU  {_gib(est.memory_bytes.get('total'))} of {_gib(est.hbm_bytes)} HBM{usable}: "
                     f"{'fits' if est.fits else 'DOES NOT FIT'}")
        lines += textwrap.wrap(parts, WIDTH, initial_indent="  ", subsequent_indent="  ")
    lines.append("")
    lines.append("assumptions")
    for a in est.assumptions:
        lines += textwrap.wrap(a, WIDTH, initial_indent="  - ", subsequent_indent="    ")
    if est.dominant:
        lines += textwrap.wrap(f"dominant uncertainty: {est.dominant}", WIDTH, subsequent_indent="  ")
    return "\n".join(lines)
