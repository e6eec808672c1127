"""Pipeline runners at 2 and 4 gloo ranks: loss parity with a single process, per-microbatch spans
that follow the schedule's ideal order, and one-line errors for impossible schedules.

One `ptprof run` per (schedule, ranks), shared by the parity and the span tests through the
session fixture `runs`. The model is `tiny8` (8 layers) so that 4 ranks x 2 stages fit.
"""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from profiler import load_traces, pipeline_actions, pipeline_summary
from tests.conftest import STEPS, ptprof
from tests.runners.reference import single_process_losses

pytestmark = pytest.mark.multirank

MODEL = "tiny8"
SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "zbv", "dualpipev"]
STAGES_PER_RANK = {"gpipe": 1, "1f1b": 1, "interleaved-1f1b": 2, "zero-bubble": 1, "zbv": 2, "dualpipev": 2}
# How each schedule runs a microbatch's backward on a stage: one full B, or I then W, or either.
BACKWARD = {"gpipe": "B", "1f1b": "B", "interleaved-1f1b": "B", "zero-bubble": "IW", "zbv": "IW", "dualpipev": "any"}
ACTIVE = 2  # conftest's runs profile the last 2 of 3 steps
PREFIX = "ptprof/pp/"


def pipeline_run(runs, schedule: str, ranks: int) -> Path:
    return runs(schedule, ranks, "--model", MODEL, "--microbatches", str(2 * ranks))


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def spans(run_dir: Path, rank: int) -> tuple[list[dict], list[dict]]:
    """(our per-microbatch spans in time order, c10d/gloo communication ops) of one rank's trace."""
    with gzip.open(run_dir / f"rank{rank}.json.gz", "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ours = sorted((e for e in events if e["name"].startswith(PREFIX)), key=lambda e: e["ts"])
    comms = [e for e in events if e["name"].startswith(("c10d::", "gloo:"))]
    return ours, comms


def parse(name: str) -> tuple[str, int, int]:
    """'ptprof/pp/F s1 mb3' -> ('F', 1, 3): the format docs/run-layout.md documents."""
    kind, stage, microbatch = name.removeprefix(PREFIX).split(" ")
    assert stage.startswith("s") and microbatch.startswith("mb"), name
    return kind, int(stage[1:]), int(microbatch[2:])


def expected_placement(schedule: str, ranks: int) -> list[int]:
    """Looped: stage s on rank s mod P. V-shaped: rank r holds stages r and 2P-1-r."""
    n_stages = ranks * STAGES_PER_RANK[schedule]
    if schedule in ("zbv", "dualpipev"):
        return [s if s < ranks else 2 * ranks - 1 - s for s in range(n_stages)]
    return [s % ranks for s in range(n_stages)]


def textbook_order(schedule: str, rank: int, ranks: int, m: int) -> list[list]:
    """GPipe: all forwards, then all backwards. 1F1B: stage r keeps at most P - r microbatches in
    flight, forwarding whenever it may and running the oldest backward otherwise."""
    if schedule == "gpipe":
        return [["F", rank, i] for i in range(m)] + [["B", rank, i] for i in range(m)]
    order, f, b = [], 0, 0
    while b < m:
        if f < m and f - b < ranks - rank:
            order.append(["F", rank, f])
            f += 1
        else:
            order.append(["B", rank, b])
            b += 1
    return order


# Every schedule at 2 and 4 ranks (the issue asks parity at both). 4-rank runs take ~35-50 s each
# on 2 shared cores, so span-order checks at 4 ranks stay on the three schedules the issue names.
P2 = [(s, 2) for s in SCHEDULES]
P4 = [("gpipe", 4), ("1f1b", 4), ("zbv", 4)]
P4_PARITY_ONLY = [("interleaved-1f1b", 4), ("zero-bubble", 4), ("dualpipev", 4)]


@pytest.mark.parametrize("schedule, ranks", P2 + P4 + P4_PARITY_ONLY)
def test_losses_match_single_process(runs, schedule, ranks):
    m = manifest(pipeline_run(runs, schedule, ranks))
    want = single_process_losses(model=MODEL, steps=STEPS)
    assert len(m["losses"]) == STEPS
    for got, ref in zip(m["losses"], want):
        assert abs(got - ref) / abs(ref) < 1e-4, (schedule, m["losses"], want)
    assert want[-1] < want[0]
    # Only the rank holding the last stage has a loss; it stands for the whole global batch.
    loss_rank = expected_placement(schedule, ranks)[-1]
    for r in m["ranks"]:
        assert (r["loss_tokens"] == m["tokens_per_step"]) == (r["rank"] == loss_rank)


@pytest.mark.parametrize("schedule, ranks", P2 + P4)
def test_spans_follow_the_ideal_order(runs, schedule, ranks):
    run_dir = pipeline_run(runs, schedule, ranks)
    m = manifest(run_dir)
    pp = m["pipeline"]
    n_mb, v = 2 * ranks, STAGES_PER_RANK[schedule]
    n_stages = ranks * v
    assert (pp["schedule"], pp["ranks"], pp["microbatches"], pp["stages_per_rank"]) == (schedule, ranks, n_mb, v)
    assert pp["stage_to_rank"] == expected_placement(schedule, ranks)
    assert pp["span_format"] == "ptprof/pp/{kind} s{stage} mb{microbatch}"
    assert m["mesh"] == {"pp": ranks} and m["phases"] == {"optimizer": "ptprof/optimizer"}
    for rank in range(ranks):
        ideal = pp["ideal_order"][rank]
        if schedule in ("gpipe", "1f1b"):
            assert ideal == textbook_order(schedule, rank, ranks, n_mb), rank
        ours, _ = spans(run_dir, rank)
        actions = [list(parse(e["name"])) for e in ours]
        compute = [a for a in actions if a[0] != "L"]
        # Every profiled step runs the ideal order exactly.
        assert compute == ideal * ACTIVE, (rank, compute[: len(ideal)], ideal)
        # Each stage on this rank runs every microbatch once forward and once backward (B, or I and W).
        counts = collections.Counter(map(tuple, compute))
        my_stages = [s for s in range(n_stages) if pp["stage_to_rank"][s] == rank]
        assert {s for _, s, _ in counts} == set(my_stages)
        for stage in my_stages:
            for mb in range(n_mb):
                per_step = {kind: counts[(kind, stage, mb)] / ACTIVE for kind in "FBIW"}
                full = per_step == {"F": 1, "B": 1, "I": 0, "W": 0}
                split = per_step == {"F": 1, "B": 0, "I": 1, "W": 1}
                assert {"B": full, "IW": split, "any": full or split}[BACKWARD[schedule]], (rank, stage, mb, per_step)
                positions = [compute.index([kind, stage, mb]) for kind in (["F", "B"] if full else ["F", "I", "W"])]
                assert positions == sorted(positions), (rank, stage, mb)  # F, then B (or I, then W)
        # The loss: on the last stage only, right after that microbatch's forward.
        losses = [i for i, a in enumerate(actions) if a[0] == "L"]
        if rank == pp["stage_to_rank"][-1]:
            assert len(losses) == n_mb * ACTIVE
            assert all(actions[i - 1] == ["F", n_stages - 1, actions[i][2]] for i in losses)
        else:
            assert not losses


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_spans_hold_compute_only(runs, schedule):
    # Sends and receives (and their gloo work) happen between the annotated compute calls.
    run_dir = pipeline_run(runs, schedule, 2)
    for rank in range(2):
        ours, comms = spans(run_dir, rank)
        assert comms, "a pipeline rank sends and receives"
        for op in comms:
            inside = [s["name"] for s in ours if s["ts"] <= op["ts"] < s["ts"] + s["dur"]]
            assert not inside, (rank, op["name"], inside)


def test_stage_layers_unbalance_one_stage(runs):
    # 1F1B over 2 ranks with the last stage holding 7 of tiny8's 8 blocks: the same model, so the
    # same losses, but stage 1's forward and backward take clearly longer, and the analysis puts
    # the extra bubble on stage imbalance.
    run_dir = runs("1f1b", 2, "--model", MODEL, "--microbatches", "4", "--stage-layers", "1,7")
    m = manifest(run_dir)
    assert m["options"]["stage_layers"] == "1,7"
    assert m["pipeline"]["stage_layers"] == [[0, 1], [1, 8]]
    for got, ref in zip(m["losses"], single_process_losses(model=MODEL, steps=STEPS)):
        assert abs(got - ref) / abs(ref) < 1e-4, m["losses"]
    traces = load_traces(run_dir)
    actions = pipeline_actions(traces.events, runs=traces.runs).filter(pl.col("step").is_not_null())
    # Medians per (stage, kind): one preempted action on 2 shared cores must not decide the test.
    med = dict(((s, k), d) for s, k, d in actions.group_by("stage", "action").agg(pl.col("dur_us").median()).iter_rows())
    for kind in ("F", "B"):
        assert med[(1, kind)] > 2 * med[(0, kind)], (kind, med)
    s = pipeline_summary(actions, traces.runs)
    assert s["slowest_stage"].to_list() == [1] * s.height
    assert (s["imbalance_pct"] > 10).all(), s.select("step", "pipeline_bubble_pct", "schedule_bubble_pct", "imbalance_pct")
    parts = s["schedule_bubble_pct"] + s["imbalance_pct"] + s["comm_wait_pct"]
    assert ((parts - s["pipeline_bubble_pct"]).abs() < 1e-6).all()


@pytest.mark.parametrize(
    "args, message",
    [
        (["dualpipev", "--gpus", "2", "--model", MODEL, "--microbatches", "2"],
         "dualpipev needs at least as many microbatches as stages (4), got --microbatches 2"),
        (["1f1b", "--gpus", "4", "--model", MODEL, "--microbatches", "2"],
         "1f1b needs at least as many microbatches as stages (4), got --microbatches 2"),
        (["interleaved-1f1b", "--gpus", "2", "--model", MODEL, "--batch-size", "10", "--microbatches", "5"],
         "interleaved-1f1b needs --microbatches divisible by its 2 rounds (max(1, M // 2 ranks)), got 5"),
        (["gpipe", "--gpus", "2", "--microbatches", "3"],
         "--batch-size 8 does not split into 3 equal microbatches; use --microbatches dividing 8"),
        (["zbv", "--gpus", "2", "--model", "tiny"],
         "zbv over 2 ranks x 2 stage(s) per rank needs 4 layers, but model 'tiny' has 2; use a deeper --model (tiny8 has 8)"),
        (["zbv", "--gpus", "2", "--model", MODEL, "--stages-per-rank", "3"],
         "zbv runs exactly 2 stage(s) per rank, got --stages-per-rank 3"),
        (["1f1b", "--gpus", "2", "--model", MODEL, "--stage-layers", "2,5"],
         "--stage-layers 2,5 gives 2 stage(s) of 7 blocks; 1f1b over 2 ranks x 1 stage(s) per rank needs 2 counts "
         "summing to the 8 layers of model 'tiny8'"),
        (["ddp", "--gpus", "2", "--stage-layers", "1,1"],
         "--stage-layers does not apply to ddp: it is for 1f1b, dualpipev, gpipe, interleaved-1f1b, pipedream, zbv, zero-bubble"),
    ],
)
def test_impossible_schedules_are_one_line_errors(tmp_path, args, message):
    res = ptprof("run", *args, "--out", str(tmp_path))
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == f"ptprof run: error: {message}"
    assert not list(tmp_path.iterdir()), "nothing may be written for a rejected request"
