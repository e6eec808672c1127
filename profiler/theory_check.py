"""Theory beside measurement: the table that sets profiler.theory's predicted communication beside
what the traces measured (`comm_check`), and with profiler.theory_memory's persistent memory, the
whole check (`theory_check`): quantity, predicted, measured, ratio and a verdict.

Theory never reads traces and measurement never reads theory: this module is where they meet.
"""

from __future__ import annotations

import polars as pl

from profiler.theory import CHECK_COLUMNS, DATA_PARALLEL, POINT_TO_POINT, predict_run
from profiler.theory_memory import memory_check


def comm_check(runs: dict[str, dict | None], comm: pl.DataFrame, collectives: pl.DataFrame) -> pl.DataFrame:
    """CHECK_COLUMNS for communication: bytes per step by collective kind, volume in Φ, and for
    data-parallel runs the volume against DDP's 2Φ; measured = the in-step collectives' size_bytes.

    Per rank and profiled step the prediction is the rows for every step plus that step's own;
    both sides are averaged over the rank's measured steps, and "match" needs every step equal
    (bytes are deterministic). A step whose measurement differs from another's is named in `note`.
    """
    colls = collectives.filter(pl.col("step").is_not_null()).with_columns(pl.col("run").cast(pl.String))
    out: list[dict] = []
    for (run, rank), meas in colls.partition_by("run", "rank", as_dict=True).items():
        manifest = runs.get(run)
        steps = sorted(set(meas["step"]))
        if not isinstance(manifest, dict):
            why = "no run.json (a foreign trace): theory needs the model and the layout"
            for kind, per_step in _measured(meas, steps).items():
                out.append(_check(run, rank, f"{kind} bytes/step", "bytes", None, _mean(per_step), "no theory", why))
            continue
        pred = comm.filter((pl.col("run") == run) & (pl.col("rank") == rank))
        out += _rank_check(manifest, run, rank, pred, meas, steps)
    seen = set(colls.select("run", "rank").unique().iter_rows())
    for (run, rank), pred in comm.partition_by("run", "rank", as_dict=True).items() if comm.height else []:
        if (run, rank) not in seen:
            for kind in sorted(set(pred["collective"])):
                rows = pred.filter(pl.col("collective") == kind)
                # A world-1 run: NCCL launches no kernel for a group of one, so the trace has nothing to size.
                why = ("a group of one rank: no collective kernel ran, nothing moved" if (rows["group_size"] == 1).all()
                       else "no collective of this rank in the profiled steps loaded")
                out.append(_check(run, rank, f"{kind} bytes/step", "bytes", None, None, "no measurement", why))
    return pl.DataFrame(out, schema=CHECK_COLUMNS, orient="row") if out else pl.DataFrame(schema=CHECK_COLUMNS)


def _measured(meas: pl.DataFrame, steps: list[int]) -> dict[str, list[int | None]]:
    """collective kind -> measured size_bytes per step (0 where the step has none; None where a
    collective of that kind has no size)."""
    per = meas.group_by("collective", "step").agg(b=pl.col("size_bytes").sum(), unknown=pl.col("size_bytes").is_null().any())
    out: dict[str, list] = {}
    for kind in sorted(set(per["collective"].drop_nulls())):
        rows = {s: (None if u else b) for _, s, b, u in per.filter(pl.col("collective") == kind).iter_rows()}
        out[kind] = [rows.get(s, 0) for s in steps]
    return out


def _mean(values: list) -> float | None:
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def _check(run, rank, quantity, unit, predicted, measured, verdict, note=None) -> dict:
    ratio = measured / predicted if predicted and measured is not None else None
    return {"run": run, "rank": rank, "quantity": quantity, "unit": unit, "predicted": predicted,
            "measured": measured, "ratio": ratio, "verdict": verdict, "note": note}


def _rank_check(manifest: dict, run: str, rank: int, pred: pl.DataFrame, meas: pl.DataFrame,
                steps: list[int]) -> list[dict]:
    """The check rows of one (run, rank) with a run.json."""
    facts = predict_run(manifest)[1]
    if pred.is_empty():
        why = facts["why"] or f"no communication theory for paradigm {manifest.get('paradigm')!r}"
        return [_check(run, rank, f"{kind} bytes/step", "bytes", None, _mean(v), "no theory", why)
                for kind, v in _measured(meas, steps).items()]
    measured = _measured(meas, steps)
    out, volume_pred, volume_meas, left_out = [], [0.0] * len(steps), [0.0] * len(steps), []
    for kind in sorted(set(pred["collective"]) | set(measured)):
        rows = pred.filter(pl.col("collective") == kind)
        per_pred = [_predicted_bytes(rows, s) for s in steps]
        per_meas = measured.get(kind, [0] * len(steps))
        weight = 2.0 if kind == "all_reduce" else 1.0
        notes = [n for n in rows["note"].drop_nulls().unique().sort()] if rows.height else []
        dims = sorted(set(rows["dim"].drop_nulls())) if rows.height else []
        if len(dims) > 1:
            notes.insert(0, "dims " + ", ".join(
                f"{d} {int(rows.filter(pl.col('dim') == d)['bytes'].sum()):,} B" for d in dims))
        if (kind in POINT_TO_POINT and not rows.height) or any(p is None for p in per_pred) or any(
                v is None for v in per_meas):
            left_out.append(kind)
        if kind in POINT_TO_POINT and not rows.height:
            out.append(_check(run, rank, f"{kind} bytes/step", "bytes", None, _mean(per_meas), "no theory",
                              "no pipeline send/recv theory (profiler.theory_pipeline gave no rows)"))
            continue
        if any(p is None for p in per_pred):
            out.append(_check(run, rank, f"{kind} bytes/step", "bytes", None, _mean(per_meas), "no theory",
                              "; ".join(notes) or "sizes unknown"))
            continue
        if any(v is None for v in per_meas):
            out.append(_check(run, rank, f"{kind} bytes/step", "bytes", _mean(per_pred), None, "no measurement",
                              "the trace gives some of these collectives no size"))
            continue
        for i in range(len(steps)):
            volume_pred[i] += weight * per_pred[i]
            volume_meas[i] += weight * per_meas[i]
        if len(set(per_meas)) > 1:
            notes.append("steps differ: " + ", ".join(f"{s}: {v:,}" for s, v in zip(steps, per_meas)))
        if len(dims) == 1 and manifest.get("paradigm") == "hybrid":
            notes.insert(0, f"dim {dims[0]}")
        out.append(_check(run, rank, f"{kind} bytes/step", "bytes", _mean(per_pred), _mean(per_meas),
                          _verdict(per_pred, per_meas), "; ".join(notes) or None))
        if len(dims) > 1:
            out += _dim_split(run, rank, kind, rows, meas.filter(pl.col("collective") == kind), steps)
    phi = facts["phi_bytes"]
    if phi:
        out.append(_check(run, rank, "volume/step", "Φ", _mean(volume_pred) / phi, _mean(volume_meas) / phi,
                          _verdict(volume_pred, volume_meas),
                          f"Φ = {phi:,} B; all-reduce counted twice (reduce-scatter + all-gather)"
                          + (f"; without {', '.join(left_out)} (one side unknown)" if left_out else "")))
        textbook, named = DATA_PARALLEL.get(manifest.get("paradigm"), (None, None))
        steady = [i for i, s in enumerate(steps) if pred.filter(pl.col("step") == s).is_empty()]
        if textbook is not None and steady:
            p = sum(volume_pred[i] for i in steady) / len(steady) / (2 * phi)
            mv = sum(volume_meas[i] for i in steady) / len(steady) / (2 * phi)
            out.append(_check(run, rank, "volume / DDP's 2Φ", "×", p, mv,
                              _verdict([volume_pred[i] for i in steady], [volume_meas[i] for i in steady]),
                              f"steps {', '.join(str(steps[i]) for i in steady)} (those without one-time "
                              f"collectives); textbook {textbook:g}× ({named})"))
    return out


def _dim_split(run: str, rank: int, kind: str, rows: pl.DataFrame, meas: pl.DataFrame, steps: list[int]) -> list[dict]:
    """`<kind> bytes/step (<dim>)` rows for a kind several dims share (hybrid: FSDP's all-gathers
    beside tp's). The trace does not name a collective's group, so measured calls are told apart by
    message size: every row of a non-dp dim sends one size (bytes / calls), dp (FSDP, one size per
    unit) takes the rest. Nothing where two dims predict the same size, or dp is not among them."""
    sizes: dict[int, str] = {}
    for dim, calls, nbytes in rows.filter(pl.col("dim") != "dp").select("dim", "calls", "bytes").iter_rows():
        size = nbytes // calls if calls else None
        if size is None or sizes.get(size, dim) != dim:
            return []
        sizes[size] = dim
    dims = sorted(set(rows["dim"]))
    if "dp" not in dims:
        return []
    named = meas.with_columns(dim=pl.col("size_bytes").replace_strict(sizes, default="dp", return_dtype=pl.String))
    out = []
    for dim in dims:
        here = named.filter(pl.col("dim") == dim)
        per_meas = [int(here.filter(pl.col("step") == s)["size_bytes"].sum()) for s in steps]
        per_pred = [_predicted_bytes(rows.filter(pl.col("dim") == dim), s) for s in steps]
        if any(p is None for p in per_pred):
            continue
        shown = ", ".join(f"{b:,} B" for b, d in sorted(sizes.items()) if d != "dp")
        out.append(_check(run, rank, f"{kind} bytes/step ({dim})", "bytes", _mean(per_pred), _mean(per_meas),
                          _verdict(per_pred, per_meas),
                          f"split by message size (the trace names no group): {shown} are tp's, the rest dp's"))
    return out


def _predicted_bytes(rows: pl.DataFrame, step: int) -> int | None:
    """Bytes of `rows` in training step `step`: the every-step rows plus that step's own."""
    here = rows.filter(pl.col("step").is_null() | (pl.col("step") == step))
    if here["bytes"].null_count():
        return None
    return int(here["bytes"].sum())


def _verdict(predicted: list[float], measured: list[float]) -> str:
    # Bytes are deterministic: equal in every step, or not (a relative 1e-12 absorbs float sums of Φ).
    if all(abs(p - m) <= 1e-12 * max(abs(p), 1.0) for p, m in zip(predicted, measured)):
        return "match"
    return "above" if sum(measured) > sum(predicted) else "below"


def theory_check(runs: dict[str, dict | None], comm: pl.DataFrame, collectives: pl.DataFrame,
                 memory: pl.DataFrame, persistent: pl.DataFrame) -> pl.DataFrame:
    """CHECK_COLUMNS: each predicted quantity beside its measurement (communication, then memory)."""
    parts = [comm_check(runs, comm, collectives), memory_check(memory, persistent)]
    return pl.concat([p.select(list(CHECK_COLUMNS)).cast(CHECK_COLUMNS) for p in parts])
