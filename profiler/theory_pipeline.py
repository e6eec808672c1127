"""Theory of pipeline communication: the activations sent forward and the gradients sent back
across stage boundaries, per microbatch, for every schedule (and a hybrid run's pp dimension).

A pipeline sends one activation per microbatch per stage boundary forward, and its gradient back
(Huang et al. 2019, GPipe; Narayanan et al. 2021, Megatron-LM). The message is the stage's output,
the residual stream of one microbatch: b·s·h elements of the activation dtype (b = run.json
`pipeline.microbatch_size`, s = `model.seq_len`, h = `model.d_model`), with sequence parallelism
in a hybrid run a tp rank's sequence shard, b·(s/tp)·h. Per step, a rank holding stage k sends
M such messages for the boundary k -> k+1 (forward) and M for k -> k-1 (backward), and receives
the mirror images. What torch 2.13's `torch.distributed.pipelining` does, and the traces show:

- every schedule (GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-V, DualPipeV) moves exactly these
  messages: one `isend`/`irecv` per tensor, F's output forward and I's (or B's) input gradient
  back; W (weight gradient) sends nothing; the first stage sends no gradient (its input is token
  ids) and the last stage no activation (its output is the loss);
- a boundary between two stages on the SAME rank (the turn of the V in ZB-V and DualPipeV: stages
  P-1 and P) is a local hand-over, no message (schedules.py, `_PipelineScheduleRuntime`:
  `set_local_fwd_input` / `set_local_bwd_input` instead of SEND/RECV);
- the first step also exchanges shapes (stage.py `_shape_inference`, object messages): outside
  the profiled steps of a ptprof run, and not in this per-step theory.

On gloo the profiler sees each message as a `gloo:send` / `gloo:recv` span with its tensor's
`Input Dims` (profiler.collectives), so the measured bytes per step equal these exactly.
`group_size` is the pipeline's process group (P ranks: the world of a pipeline run, the pp group
of a hybrid run), as profiler.collectives names it. traffic_bytes is what the rank sends (recv
rows 0); phi is null: activations are not parameter bytes.
"""

from __future__ import annotations

from profiler.theory_params import run_dtypes

# run.json paradigms that are a pipeline schedule (runners/paradigms.py PIPELINE_SCHEDULES; the
# profiler may not import runners). A hybrid run's pp dimension also has a `pipeline` block.
MAX_BYTES = 2**63 - 1  # the bytes column is Int64
# pipedream (asynchronous 1F1B) moves the same messages: one activation and one gradient per
# microbatch per boundary, M of each per step (its steps stream, but each runs M forwards and M
# backwards in steady state; the first step's fill and the drain after the last differ).
PIPELINE_PARADIGMS = frozenset({"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "zbv", "dualpipev", "pipedream"})


def pipeline_p2p_rows(manifest: dict, rank: int) -> list[dict]:
    """Rows of profiler.theory.COMM_COLUMNS (without run/rank) for the sends and receives global
    `rank` does per step in the pipeline (dim "pp"); [] when the run has no pipeline."""
    shape = _pipeline_shape(manifest, rank)
    if shape is None:
        return []
    coord, p, m, stage_to_rank, msg_bytes, dims = shape
    # (phase, collective) -> the boundaries this rank's side of crosses the network.
    crossings: dict[tuple[str, str], list[str]] = {}
    last = len(stage_to_rank) - 1
    for s, owner in enumerate(stage_to_rank):
        if owner != coord:
            continue
        if s < last and stage_to_rank[s + 1] != coord:  # activation out, gradient in
            crossings.setdefault(("forward", "send"), []).append(f"{s}->{s + 1}")
            crossings.setdefault(("backward", "recv"), []).append(f"{s + 1}->{s}")
        if s > 0 and stage_to_rank[s - 1] != coord:  # activation in, gradient out
            crossings.setdefault(("forward", "recv"), []).append(f"{s - 1}->{s}")
            crossings.setdefault(("backward", "send"), []).append(f"{s}->{s - 1}")
    rows = []
    for phase, collective in [("forward", "send"), ("forward", "recv"), ("backward", "send"), ("backward", "recv")]:
        boundaries = crossings.get((phase, collective))
        if not boundaries:
            continue
        calls = m * len(boundaries)
        if calls * msg_bytes > MAX_BYTES:  # run.json is user data: no number that overflows the frame
            return []
        what = "activation" if phase == "forward" else "activation gradient"
        rows.append({
            "dim": "pp", "phase": phase, "collective": collective, "group_size": p, "calls": calls,
            "bytes": calls * msg_bytes, "traffic_bytes": float(calls * msg_bytes) if collective == "send" else 0.0,
            "phi": None,
            "formula": f"{dims} = {m * msg_bytes} B x {len(boundaries)}",
            "note": f"one {what} per microbatch, stage boundaries {', '.join(boundaries)}",
        })
    return rows


def _pipeline_shape(manifest: dict, rank: int) -> tuple[int, int, int, list[int], int, str] | None:
    """(pp coordinate, P, M, stage_to_rank, message bytes, the message's dims as text) of `rank`, or
    None where run.json lacks a fact (run.json is user data: no guessing)."""
    if not isinstance(manifest, dict):
        return None
    pipe, model = manifest.get("pipeline"), manifest.get("model")
    if not isinstance(pipe, dict) or not isinstance(model, dict):
        return None
    stage_to_rank = pipe.get("stage_to_rank")
    m, b = _count(pipe.get("microbatches")), _count(pipe.get("microbatch_size"))
    s, h = _count(model.get("seq_len")), _count(model.get("d_model"))
    seq = "s"
    # Activations are in the parameters' dtype in our runners (no autocast): the dtype rule every
    # theory module shares (profiler.theory_params.run_dtypes); none where it gives no dtype.
    dt, _note, why = run_dtypes(manifest)
    width = None if why else dt.param
    if not (isinstance(stage_to_rank, list) and stage_to_rank
            and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in stage_to_rank)):
        return None
    if None in (m, b, s, h, width):
        return None
    hybrid = manifest.get("hybrid")
    if isinstance(hybrid, dict):
        coords = _hybrid_coordinate(hybrid, rank)
        if coords is None:
            return None
        coord, p, tp, sp = coords
        if sp:  # a tp rank sends its sequence shard (runners/tp_sp.py apply_tp_plan)
            if s % tp:
                return None
            s = s // tp
            seq = "(s/T)"  # the formula says what it plugs in (it read s beside s/T's value: trial)
    else:
        p = _count(pipe.get("ranks")) or len(set(stage_to_rank))
        coord = rank
    if not 0 <= coord < p or max(stage_to_rank) >= p:
        return None
    return coord, p, m, stage_to_rank, b * s * h * width, f"m·b·{seq}·h·dtype per boundary = {m}·{b}·{s}·{h}·{width}"


def _hybrid_coordinate(hybrid: dict, rank: int) -> tuple[int, int, int, bool] | None:
    """(pp coordinate, pp degree, tp degree, sp) of global `rank` from run.json's `hybrid` block."""
    groups = (hybrid.get("groups") or {}).get("pp") if isinstance(hybrid.get("groups"), dict) else None
    dims, shape = hybrid.get("dims"), hybrid.get("shape")
    if not isinstance(groups, list) or not isinstance(dims, list) or not isinstance(shape, list) or len(dims) != len(shape):
        return None
    sizes = dict(zip(dims, shape))
    for group in groups:
        if isinstance(group, list) and rank in group:
            tp = _count(sizes.get("tp", 1))
            return (group.index(rank), len(group), tp, bool(hybrid.get("sp"))) if tp else None
    return None


def _count(v) -> int | None:
    """A run.json count as an int, or None where it is not a positive integer."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
