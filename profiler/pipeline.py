"""Pipeline parallelism: the per-rank grid of microbatch actions, measured bubbles, the textbook
bubble and the bubble of the schedule's ideal order replayed with the measured durations.

Input: the pipeline runners' compute spans `ptprof/pp/{kind} s{stage} mb{microbatch}`
(docs/run-layout.md, "Pipeline runs"; run.json's `pipeline.span_format`): kind F forward, B full
backward, I input-gradient backward, W weight-gradient backward, L the loss (last stage, right
after its F), U pipedream's per-microbatch weight update (after its B). The spans hold compute only; sends and receive waits fall between them.

Per (run, step), with p pipeline ranks, m microbatches and v stages per rank:

- window_us: from the first action start on any rank of the pipeline to the last action end on
  any of them (the pipeline's makespan; the optimizer and other step overhead are outside it). A
  hybrid run has one pipeline per pp group (run.json `hybrid.groups.pp`, global ranks by pp
  coordinate): each is its own window and replay, and run.json's per-coordinate `ideal_order`
  applies to every group. Ranks on different
  hosts are compared on their own clocks, so across hosts this is only as good as clock sync.
  A stream run (run.json `pipeline.stream`: pipedream, no flush) has no common window: its ranks
  run their steps staggered, so each rank's window is its own step (its ProfilerStep span when
  `steps` is given, else its first to last action), its microbatches (numbered over the run) are
  counted from the step's first (g - step·M), and its replay is the steady state (stream_replay).
  The split's rank-time is then Σ of the ranks' windows.
- bubble_pct (measured, per rank) = 100 * (1 - busy_us / window_us), busy_us being the union of
  the rank's action spans (L included).
- theory_pct, the textbook bubble fraction of the step time (uniform stages, no communication):
  GPipe and 1F1B (p-1)/(m+p-1) (Huang et al. 2019; Narayanan et al. 2021), interleaved 1F1B
  (p-1)/(v*m+p-1) (Narayanan et al. 2021: the bubble shrinks by v), ZB-H1 (zero-bubble, v = 1)
  (p-1)(F+I-W) / (m(F+I+W) + (p-1)(F+I-W)) with the step's mean F, I, W durations (Qi et al.
  2023), PipeDream 0 (no flush; Narayanan et al. 2019). Null for ZB-V and DualPipeV, which have
  no such closed form.
- ideal_pct: the bubble of run.json's `ideal_order` (else the order the rank actually ran)
  replayed by `simulate_order` with this step's measured durations and only the pipeline's own
  dependencies: what the schedule would give with free communication and no launch gaps.

The bubble split, per pipeline (replica) and step, the same on each of its rank rows. All are %
of the pipeline's rank-time, P x window_us, and schedule + imbalance + comm_wait =
pipeline_bubble_pct = 100 - 100 * Σ busy_us / (P x window_us) (the mean of the ranks' bubble_pct):

- schedule_bubble_pct: the bubble the schedule has with uniform stages. The same order is replayed
  with every action at its kind's mean duration over all stages and microbatches of the step (the
  same work, spread evenly); its bubble fraction u gives u / (1 - u) idle per unit of work, times
  the measured work. For GPipe and 1F1B, u is the textbook (p-1)/(m+p-1).
- imbalance_pct: what the replay with the measured per-stage durations (ideal_pct's replay,
  fraction i) idles beyond that, work x (i / (1 - i) - u / (1 - u)): unequal stages, the
  embeddings on the first and the head and loss (L folded into F) on the last included.
- comm_wait_pct: the rest of the measured bubble: waiting for messages, launch gaps and anything
  else the free-communication replay does not have.
Each is capped so that none is negative (attributed in that order): a measured imbalance that
fills the schedule better than uniform stages counts 0, not a negative share. Null without a
replay (it deadlocked, or no work). slowest_stage / slowest_stage_ratio: the stage with the most
compute in the step (F+B+I+W, L folded in; each kind's median x its count, robust to one preempted
action) and its compute over the mean stage's.
"""

from __future__ import annotations

import re

import polars as pl

from profiler.discover import manifest_field
from profiler.intervals import union
from profiler.pipeline_order import action_durations, ideal_order
from profiler.steps import KEYS, assign_steps, names_matching, profiler_steps

PP_SPAN_FORMAT = "ptprof/pp/{kind} s{stage} mb{microbatch}"  # runners/harness.py PP_ACTION
ACTION_KINDS = ["F", "B", "I", "W", "L", "U"]
_FIELD_RE = {"kind": r"(?P<action>[FBIWLU])", "stage": r"(?P<stage>\d+)", "microbatch": r"(?P<microbatch>\d+)"}

ACTION_COLUMNS = {
    "run": pl.Categorical, "rank": pl.Int32, "step": pl.Int64, "action": pl.String, "stage": pl.Int64,
    "microbatch": pl.Int64, "slot": pl.Int64, "start_us": pl.Float64, "end_us": pl.Float64, "dur_us": pl.Float64,
}
SUMMARY_COLUMNS = {
    "run": pl.Categorical, "rank": pl.Int32, "step": pl.Int64, "schedule": pl.String, "pp_ranks": pl.Int64,
    "microbatches": pl.Int64, "stages_per_rank": pl.Int64, "n_actions": pl.Int64, "window_us": pl.Float64,
    "busy_us": pl.Float64, "bubble_us": pl.Float64, "bubble_pct": pl.Float64, "theory_pct": pl.Float64,
    "ideal_pct": pl.Float64, "order_source": pl.String, "order_matches": pl.Boolean,
    # The pipeline's bubble split (module docstring), the same on every rank of one pipeline and step.
    "pipeline_bubble_pct": pl.Float64, "schedule_bubble_pct": pl.Float64, "imbalance_pct": pl.Float64,
    "comm_wait_pct": pl.Float64, "slowest_stage": pl.Int64, "slowest_stage_ratio": pl.Float64,
}
# Columns _modelled computes per (run, rank, step); the fractions are the replays' bubbles (0..1).
_MODEL_COLUMNS = ("run", "rank", "step", "schedule", "pp_ranks", "microbatches", "stages_per_rank", "theory_pct",
                  "ideal_pct", "order_source", "order_matches", "slowest_stage", "slowest_stage_ratio")


def span_pattern(span_format: str = PP_SPAN_FORMAT) -> str:
    """Regex (groups action, stage, microbatch) matching the span names of a run.json span_format."""
    parts = re.split(r"\{(\w+)\}", span_format)
    if set(parts[1::2]) != set(_FIELD_RE):
        raise ValueError(f"pipeline span format {span_format!r} must name {{kind}}, {{stage}} and {{microbatch}}")
    # Escaped by hand: polars' (Rust) regex rejects Python's escapes of spaces and slashes.
    literal = [re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", p) for p in parts[::2]]
    return "^" + "".join(lit + (_FIELD_RE[f] if f else "") for lit, f in zip(literal, [*parts[1::2], ""])) + "$"


def pipeline_actions(events: pl.DataFrame, *, steps: pl.DataFrame | None = None, runs: dict[str, dict | None] | None = None,
                     span_format: str = PP_SPAN_FORMAT) -> pl.DataFrame:
    """The grid: one row per action span (ACTION_COLUMNS), in time order per rank.

    `slot` numbers a rank's F/B/I/W actions within a step in the order they ran (what run.json's
    ideal_order lists); L has none. `step` is null for actions outside every profiled step. Span
    names follow `span_format`, or each run's run.json `pipeline.span_format` where `runs` has one.
    """
    formats = _span_formats(events, runs or {})
    if len(formats) == 1:  # the usual case: no need to split the frame by run
        return _actions(events, steps, next(iter(formats)))
    frames = [_actions(events.filter(pl.col("run").cast(pl.String).is_in(ids)), steps, fmt) for fmt, ids in formats.items()]
    frames = [f for f in frames if f.height]
    return pl.concat(frames) if frames else pl.DataFrame(schema=ACTION_COLUMNS)


def _actions(events: pl.DataFrame, steps: pl.DataFrame | None, span_format: str) -> pl.DataFrame:
    pattern = span_pattern(span_format)
    spans = events.filter(pl.col("name").is_in(names_matching(events, pattern)) & (pl.col("device") == "cpu") & (pl.col("ph") == "X"))
    if spans.is_empty():
        return pl.DataFrame(schema=ACTION_COLUMNS)
    steps = profiler_steps(events) if steps is None else steps
    parsed = pl.col("name").cast(pl.String).str.extract_groups(pattern)
    by = [*KEYS, "step"]
    return (
        assign_steps(spans, steps)
        .select(
            *by,
            action=parsed.struct.field("action"),
            stage=parsed.struct.field("stage").cast(pl.Int64),
            microbatch=parsed.struct.field("microbatch").cast(pl.Int64),
            start_us="ts_us", end_us="end_us", dur_us="dur_us",
        )
        .sort(*by, "start_us")
        .with_columns(slot=pl.when(pl.col("action") != "L").then((pl.col("action") != "L").cum_sum().over(by) - 1))
        .select(list(ACTION_COLUMNS))
        .cast(ACTION_COLUMNS)
    )


def ideal_orders(runs: dict[str, dict | None]) -> pl.DataFrame:
    """run.json's `pipeline.ideal_order` as a frame: run, rank (global), slot, action, stage, microbatch."""
    rows = []
    for run, manifest in runs.items():
        order = ideal_order(manifest) or []
        # run.json's rows are pp coordinates; a hybrid run repeats them on every pipeline replica.
        coords = pp_coordinates(manifest) or {c: (0, c) for c in range(len(order))}
        rows += [
            {"run": run, "rank": rank, "slot": slot, "action": a[0], "stage": a[1], "microbatch": a[2]}
            for rank, (_, c) in sorted(coords.items()) if c < len(order)
            for slot, a in enumerate(order[c])
        ]
    schema = {"run": pl.Categorical, "rank": pl.Int32, "slot": pl.Int64, "action": pl.String, "stage": pl.Int64, "microbatch": pl.Int64}
    return pl.DataFrame(rows, schema=schema)


def pipeline_grid(actions: pl.DataFrame) -> pl.DataFrame:
    """Per (run, rank, step) the order the rank ran its actions in, as text: `F0 F1 B0 ...`
    (kind + microbatch, plus `@s<stage>` on ranks holding several stages; L left out)."""
    several = pl.col("stage").n_unique().over(KEYS) > 1
    token = pl.when(several).then(pl.format("{}{}@s{}", "action", "microbatch", "stage")).otherwise(pl.format("{}{}", "action", "microbatch"))
    return (
        actions.filter(pl.col("slot").is_not_null() & pl.col("step").is_not_null())
        .with_columns(token=token)
        .group_by(*KEYS, "step")
        .agg(n_actions=pl.len(), order=pl.col("token").sort_by("slot").str.join(" "))
        .sort(*KEYS, "step")
    )


def theory_bubble_pct(pp_ranks: int, microbatches: int, stages_per_rank: int = 1) -> float:
    """Textbook bubble of GPipe / 1F1B (v = 1) and interleaved 1F1B: 100 * (p-1) / (v*m + p-1)."""
    p, m, v = pp_ranks, microbatches, max(1, stages_per_rank)
    return 100.0 * (p - 1) / (v * m + p - 1)


def zero_bubble_h1_pct(pp_ranks: int, microbatches: int, f_us: float, i_us: float, w_us: float) -> float:
    """ZB-H1's bubble in % of the step: bubble (p-1)(F+I-W) beside m(F+I+W) of compute (Qi et al. 2023)."""
    bubble = (pp_ranks - 1) * max(0.0, f_us + i_us - w_us)
    total = microbatches * (f_us + i_us + w_us) + bubble
    return 100.0 * bubble / total if total > 0 else 0.0


def schedule_theory_pct(schedule: str | None, pp_ranks: int, microbatches: int, stages_per_rank: int,
                        mean_us: dict[str, float]) -> float | None:
    """The textbook bubble of a named schedule (module docstring), or None where there is none."""
    if schedule == "pipedream":  # asynchronous 1F1B never flushes: no bubble in steady state
        return 0.0
    if schedule in ("gpipe", "1f1b", "interleaved-1f1b"):
        return theory_bubble_pct(pp_ranks, microbatches, stages_per_rank if schedule == "interleaved-1f1b" else 1)
    if schedule == "zero-bubble" and stages_per_rank == 1 and all(k in mean_us for k in "FIW"):
        return zero_bubble_h1_pct(pp_ranks, microbatches, mean_us["F"], mean_us["I"], mean_us["W"])
    return None


def simulate_order(order: list[list[tuple[str, int, int]]], dur_us: dict[tuple[str, int, int], float], *,
                   last_stage: int, carried_in: bool = False) -> tuple[list[float], float] | None:
    """Replay per-rank action lists; returns (busy µs per rank, makespan µs), None if they deadlock.

    order[r]: rank r's actions (kind, stage, microbatch) in the order it runs them. Each rank runs
    its list in order; an action starts when the rank is free and its inputs exist: F(s, i) after
    F(s-1, i); B or I (s, i) after F(s, i) and, below the last stage, after the B or I of (s+1, i);
    W(s, i) after I(s, i); U(s, i) (pipedream's update) after B(s, i). With `carried_in` (a stream
    schedule's order), a dependency on a negative microbatch, an earlier step's, is done at time 0.
    Communication takes no time. dur_us must hold every action (fold the
    loss into the last stage's F). A discrete-event replay over the schedule's few hundred actions,
    not over trace events.
    """
    planned = {a for acts in order for a in acts}

    def grad(s: int, i: int) -> tuple[str, int, int]:
        return ("I", s, i) if ("I", s, i) in planned else ("B", s, i)

    def deps(kind: str, s: int, i: int) -> list[tuple[str, int, int]]:
        if kind == "F":
            return [("F", s - 1, i)] if s > 0 else []
        if kind in ("B", "I"):
            return [("F", s, i)] + ([grad(s + 1, i)] if s < last_stage else [])
        return [("B" if kind == "U" else "I", s, i)]  # U, W

    def ready(d: tuple[str, int, int]) -> bool:
        return d in done or (carried_in and d[2] < 0)

    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * len(order)
    busy = [0.0] * len(order)
    pos = [0] * len(order)
    progressed = True
    while progressed:
        progressed = False
        for r, acts in enumerate(order):
            while pos[r] < len(acts):
                action = acts[pos[r]]
                needs = deps(*action)
                if not all(map(ready, needs)):
                    break
                start = max([free[r], *(done.get(d, 0.0) for d in needs)])
                free[r] = done[action] = start + dur_us[action]
                busy[r] += dur_us[action]
                pos[r] += 1
                progressed = True
    if any(p < len(acts) for p, acts in zip(pos, order)):
        return None
    return busy, max(free, default=0.0)


def stream_replay(order: list[list[tuple[str, int, int]]], dur_us: dict[tuple[str, int, int], float], *,
                  last_stage: int, microbatches: int) -> tuple[list[float], float] | None:
    """The steady state of a stream schedule (pipedream): (busy µs per rank in one step, the step's
    period µs), None if the order deadlocks.

    `order` is one step's, microbatches counted from the step's first (negative: the previous
    step's). Consecutive steps are replayed back to back (step c's microbatch i is c·M + i) and the
    period is what one more step adds to the makespan, once the first step's fill has passed.
    """
    def tiled(n: int):
        plan = [[(k, s, i + c * microbatches) for c in range(n) for k, s, i in acts] for acts in order]
        durations = {(k, s, i + c * microbatches): dur_us[(k, s, i)] for c in range(n) for (k, s, i) in dur_us}
        return simulate_order(plan, durations, last_stage=last_stage, carried_in=True)

    n = len(order) + 2  # enough steps for the fill to pass
    before, after = tiled(n), tiled(n + 1)
    if before is None or after is None:
        return None
    # Differences of large sums: rounded to 1e-6 µs, so that a rank busy the whole period reads
    # exactly 0 % idle rather than ±1e-14 %.
    busy = [round(b - a, 6) for a, b in zip(before[0], after[0])]
    return busy, max(round(after[1] - before[1], 6), *busy)


def pipeline_summary(actions: pl.DataFrame, runs: dict[str, dict | None], *,
                     steps: pl.DataFrame | None = None) -> pl.DataFrame | None:
    """Per (run, rank, step) of `pipeline_actions`: SUMMARY_COLUMNS (module docstring); None
    when there are no actions in any step. `steps`: profiler_steps' frame, the per-rank windows
    of stream runs (else each rank's first to last action of the step).

    `order_matches`: the rank ran its F/B/I/W actions in exactly run.json's ideal order.
    """
    actions = actions.filter(pl.col("step").is_not_null())
    if actions.is_empty():
        return None
    by = [*KEYS, "step"]
    # Each rank's pipeline replica and pp coordinate: a hybrid run's pp groups, else replica 0 and
    # the rank itself. Each replica has its own window and replay.
    coords = pl.DataFrame(
        [{"run": run, "rank": g, "_pipe": k, "_coord": c} for run in actions["run"].cast(pl.String).unique().to_list()
         for g, (k, c) in (pp_coordinates(runs.get(run)) or {}).items()],
        schema={"run": pl.String, "rank": pl.Int32, "_pipe": pl.Int64, "_coord": pl.Int64},
    ).with_columns(pl.col("run").cast(actions.schema["run"]))
    actions = actions.join(coords, on=KEYS, how="left").with_columns(
        pl.col("_pipe").fill_null(0), pl.col("_coord").fill_null(pl.col("rank").cast(pl.Int64))
    )
    span = actions.group_by("run", "_pipe", "step").agg(window_start_us=pl.col("start_us").min(), window_end_us=pl.col("end_us").max())
    busy = union(actions.select(*by, "start_us", "end_us"), by).group_by(by).agg(busy_us=(pl.col("end_us") - pl.col("start_us")).sum())
    grid = pipeline_grid(actions)
    # A stream run (run.json pipeline.stream: pipedream) never flushes: its ranks run their steps
    # staggered, so each rank's window is its own step (ProfilerStep span), not the pipeline's.
    stream = [run for run, m in runs.items() if manifest_field(m, "pipeline", "stream") is True]
    own = (steps.select(*by, "start_us", "end_us") if steps is not None
           else actions.group_by(by).agg(start_us=pl.col("start_us").min(), end_us=pl.col("end_us").max()))
    own = own.with_columns(pl.col("run").cast(pl.String)).filter(pl.col("run").is_in(stream)).cast(
        {"run": actions.schema["run"], "rank": pl.Int32})
    measured = (
        busy.join(actions.select(*KEYS, "_pipe").unique(), on=KEYS)
        .join(span, on=["run", "_pipe", "step"])
        .join(own.rename({"start_us": "_own_start", "end_us": "_own_end"}), on=by, how="left")
        .with_columns(window_start_us=pl.coalesce("_own_start", "window_start_us"),
                      window_end_us=pl.coalesce("_own_end", "window_end_us"))
        .join(grid.drop("order"), on=by, how="left")
        .with_columns(window_us=pl.col("window_end_us") - pl.col("window_start_us"))
        .with_columns(bubble_us=pl.col("window_us") - pl.col("busy_us"))
        .with_columns(bubble_pct=100 * pl.col("bubble_us") / pl.col("window_us"))
    )
    model = pl.DataFrame([row for run in measured["run"].cast(pl.String).unique().sort()
                          for row in _modelled(actions.filter(pl.col("run") == run), run, runs.get(run) or {})],
                         schema={c: SUMMARY_COLUMNS[c] for c in _MODEL_COLUMNS} | {"_uniform": pl.Float64, "_ideal": pl.Float64})
    return (
        measured.join(model, on=by, how="left")
        .with_columns(bubble_split(pl.col("busy_us"), pl.col("window_us"), pl.col("_uniform"), pl.col("_ideal"),
                                   over=["run", "_pipe", "step"]))
        .select(list(SUMMARY_COLUMNS))
        .cast(SUMMARY_COLUMNS)
        .sort(by)
    )


def _modelled(actions: pl.DataFrame, run: str, manifest: dict) -> list[dict]:
    """Rows of (run, rank, step) -> shape, theory_pct, ideal_pct, order facts for one run
    (actions with the `_pipe` and `_coord` columns of pipeline_summary)."""
    cfg = manifest_field(manifest, "pipeline")
    cfg = cfg if isinstance(cfg, dict) else {}  # run.json is user data: a list here is no pipeline block
    pipes: dict[int, dict[int, int]] = {}  # replica -> pp coordinate -> global rank
    for r, k, c in actions.select("rank", "_pipe", "_coord").unique().iter_rows():
        pipes.setdefault(k, {})[c] = r
    p = positive_int(cfg.get("ranks")) or max(len(members) for members in pipes.values())
    stages = actions["stage"].n_unique()
    v = positive_int(cfg.get("stages_per_rank")) or max(1, stages // max(1, p))
    m = positive_int(cfg.get("microbatches")) or actions["microbatch"].n_unique()
    last_stage = cfg.get("loss_stage") if isinstance(cfg.get("loss_stage"), int) else actions["stage"].max()
    ideal = ideal_order(manifest)
    stream = cfg.get("stream") is True  # microbatches numbered over the run: step k's i is k·M + i
    rows = []
    for step in actions["step"].unique().sort().to_list():
        for members in pipes.values():  # coordinate -> global rank, one pipeline replica
            acts = actions.filter((pl.col("step") == step) & pl.col("rank").is_in(list(members.values())))
            if stream:  # counted from the step's first, as ideal_order counts them
                acts = acts.with_columns(pl.col("microbatch") - step * m)
            ran = {c: [(a, s, i) for a, s, i in acts.filter((pl.col("rank") == r) & pl.col("slot").is_not_null())
                       .sort("slot").select("action", "stage", "microbatch").iter_rows()] for c, r in members.items()}
            if ideal is not None and len(ideal) == p:
                plan, source = ideal, "run.json"
            else:
                plan, source = [ran.get(c, []) for c in range(max(members) + 1)], "measured"
            durations = action_durations(acts, plan, last_stage)
            if stream:
                sim = stream_replay(plan, durations, last_stage=last_stage, microbatches=m) if plan else None
                uniform = stream_replay(plan, uniform_durations(durations), last_stage=last_stage, microbatches=m) if plan else None
            else:
                sim = simulate_order(plan, durations, last_stage=last_stage) if plan else None
                uniform = simulate_order(plan, uniform_durations(durations), last_stage=last_stage) if plan else None
            slowest, ratio = slowest_stage(durations)
            means = dict(acts.filter(pl.col("action") != "L").group_by("action").agg(pl.col("dur_us").mean()).iter_rows())
            theory = schedule_theory_pct(cfg.get("schedule"), p, m, v, means)
            for c, r in sorted(members.items()):
                ideal_pct = None
                if sim is not None and c < len(sim[0]) and sim[1] > 0:
                    ideal_pct = 100.0 * (1 - sim[0][c] / sim[1])
                rows.append({"run": run, "rank": r, "step": step, "schedule": cfg.get("schedule"), "pp_ranks": p, "microbatches": m,
                             "stages_per_rank": v, "theory_pct": theory, "ideal_pct": ideal_pct, "order_source": source,
                             "order_matches": (ran[c] == plan[c]) if ideal is not None and c < len(plan) else None,
                             "slowest_stage": slowest, "slowest_stage_ratio": ratio,
                             "_uniform": replay_bubble(uniform), "_ideal": replay_bubble(sim)})
    return rows


def uniform_durations(dur_us: dict[tuple[str, int, int], float]) -> dict[tuple[str, int, int], float]:
    """Every action at the mean duration of its kind (F, B, I, W) over all stages and microbatches:
    the same total work, spread evenly over the stages (the textbook's uniform stages)."""
    by_kind: dict[str, list[float]] = {}
    for (kind, _, _), d in dur_us.items():
        by_kind.setdefault(kind, []).append(d)
    mean = {k: sum(v) / len(v) for k, v in by_kind.items()}
    return {x: mean[x[0]] for x in dur_us}


def replay_bubble(sim: tuple[list[float], float] | None) -> float | None:
    """The bubble fraction (0..1) of a whole replayed pipeline: 1 - Σ busy / (ranks x makespan);
    None without a replay or without work."""
    if sim is None or sim[1] <= 0 or not sim[0] or sum(sim[0]) <= 0:
        return None
    return 1.0 - sum(sim[0]) / (len(sim[0]) * sim[1])


def slowest_stage(dur_us: dict[tuple[str, int, int], float]) -> tuple[int | None, float | None]:
    """(stage with the most compute in the step, its compute / the mean stage's); (None, None) without work.

    A stage's compute is its typical one, Σ over kinds of count x median duration, so that one
    preempted action (a straggling core) does not name a stage slow.
    """
    by: dict[tuple[int, str], list[float]] = {}
    for (kind, stage, _), d in dur_us.items():
        by.setdefault((stage, kind), []).append(d)
    per_stage: dict[int, float] = {}
    for (stage, _), ds in by.items():
        ds = sorted(ds)
        median = (ds[(len(ds) - 1) // 2] + ds[len(ds) // 2]) / 2
        per_stage[stage] = per_stage.get(stage, 0.0) + len(ds) * median
    mean = sum(per_stage.values()) / len(per_stage) if per_stage else 0.0
    if mean <= 0:
        return None, None
    stage = max(per_stage, key=lambda s: (per_stage[s], -s))
    return stage, per_stage[stage] / mean


def slowest_over_steps(rows: pl.DataFrame) -> tuple[int, float] | None:
    """One run's slowest stage over its steps, for every view to name the same one: the stage most
    often the step's slowest (pipeline_summary rows), ties to the larger mean ratio then the lower
    stage, with the mean of its ratio over the steps where it was the slowest; None without one."""
    if "slowest_stage" not in rows.columns:
        return None
    per = (rows.filter(pl.col("slowest_stage").is_not_null() & pl.col("slowest_stage_ratio").is_finite())
           .group_by("slowest_stage").agg(n=pl.len(), ratio=pl.col("slowest_stage_ratio").mean()))
    if per.is_empty():
        return None
    stage, _, ratio = per.sort(["n", "ratio", "slowest_stage"], descending=[True, True, False]).row(0)
    return stage, ratio


def bubble_split(busy_us: pl.Expr, window_us: pl.Expr, uniform: pl.Expr, ideal: pl.Expr, *, over: list[str]) -> list[pl.Expr]:
    """The pipeline's bubble (% of ranks x window) and its split into schedule, imbalance and
    communication wait (module docstring), as expressions over one row per rank of a pipeline.

    The replays' bubble fractions become idle time per unit of work (f / (1 - f)) and are scaled
    by the measured work, so all three are shares of the same measured rank-time; each is capped
    so that none is negative and they sum to pipeline_bubble_pct exactly.
    """
    work = busy_us.sum().over(over)
    capacity = window_us.sum().over(over)  # one window per rank: P x window rank-µs (a stream run's differ)
    valid = (capacity > 0) & uniform.is_not_null() & ideal.is_not_null() & (uniform < 1) & (ideal < 1)
    bubble = pl.when(capacity > 0).then(100 * (1 - work / capacity))
    busy_pct = 100 * work / capacity
    schedule = pl.min_horizontal(busy_pct * uniform / (1 - uniform), bubble)
    imbalance = (busy_pct * ideal / (1 - ideal) - schedule).clip(0, None)
    imbalance = pl.min_horizontal(imbalance, bubble - schedule)
    return [
        bubble.alias("pipeline_bubble_pct"),
        pl.when(valid).then(schedule).alias("schedule_bubble_pct"),
        pl.when(valid).then(imbalance).alias("imbalance_pct"),
        pl.when(valid).then(bubble - schedule - imbalance).alias("comm_wait_pct"),
    ]


def pp_coordinates(manifest: dict | None) -> dict[int, tuple[int, int]] | None:
    """A hybrid run's global rank -> (pipeline replica, pp coordinate), from run.json's
    `hybrid.groups.pp` (docs/run-layout.md: each group lists its global ranks by pp coordinate);
    None for runs without one (there the rank is the coordinate)."""
    groups = manifest_field(manifest, "hybrid", "groups", "pp")
    if not isinstance(groups, list) or not all(isinstance(g, list) and all(isinstance(r, int) for r in g) for g in groups):
        return None
    return {r: (k, c) for k, g in enumerate(groups) for c, r in enumerate(g)}


def _span_formats(events: pl.DataFrame, runs: dict[str, dict | None]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for run in events.get_column("run").unique().cast(pl.String).to_list():
        fmt = manifest_field(runs.get(run), "pipeline", "span_format")
        out.setdefault(fmt if isinstance(fmt, str) and _valid_format(fmt) else PP_SPAN_FORMAT, []).append(run)
    return out


def _valid_format(fmt: str) -> bool:
    try:
        span_pattern(fmt)
    except ValueError:
        return False
    return True


def positive_int(v) -> int | None:
    """A run.json count (pipeline ranks, microbatches, stages) as an int, or None where it is not a
    positive number (run.json is user data: strings and bools are not counts)."""
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None
