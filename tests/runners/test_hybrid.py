"""Hybrid 3D (FSDP2 over dp, pipeline over pp, tensor parallel over tp) on gloo ranks: loss parity
with a single process for the 2-D meshes at 4 ranks and dp2 x pp2 x tp2 at 8, run.json's mesh and
groups, the collectives each degree implies (and none that a degree of 1 rules out), and one-line
errors for impossible degrees.

One `ptprof run` per mesh through the session fixture `runs`. On 2 shared cores the 4-rank runs
take ~20-45 s and the 8-rank one ~50 s; the --sp and multi-stage-schedule variants (~50-70 s each)
run only with PTPROF_SLOW_TESTS=1.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
from pathlib import Path

import pytest

from tests.conftest import STEPS, ptprof
from tests.runners.reference import single_process_losses

pytestmark = pytest.mark.multirank

ACTIVE = 2  # conftest's runs profile the last 2 of 3 steps
SLOW = pytest.mark.skipif(not os.environ.get("PTPROF_SLOW_TESTS"), reason="extra 4-rank run; set PTPROF_SLOW_TESTS=1")
# (dp, pp, tp, extra flags): the three 2-D meshes, the 3-D one, and (slow) sequence parallel across
# stages and multi-stage schedules on the 8-layer model.
MESHES = [
    pytest.param(2, 2, 1, (), id="dp2-pp2-tp1"),
    pytest.param(1, 2, 2, (), id="dp1-pp2-tp2"),
    pytest.param(2, 1, 2, (), id="dp2-pp1-tp2"),
    pytest.param(2, 2, 2, (), id="dp2-pp2-tp2"),
    pytest.param(
        1, 2, 2, ("--sp", "--model", "tiny8", "--schedule", "interleaved-1f1b"), id="sp-interleaved", marks=SLOW
    ),
    pytest.param(2, 2, 1, ("--model", "tiny8", "--schedule", "zbv"), id="dp2-zbv", marks=SLOW),
]
# Main-thread c10d ops each degree > 1 implies, with the gloo op that does the work (gloo runs a
# reduce-scatter as an all-reduce). FSDP's flat-buffer collectives are the `_base_` ones; TP's
# row-parallel outputs are all-reduced (or with --sp reduce-scattered as `..._coalesced_`).
IMPLIED = {
    "pp": {"c10d::send": "gloo:send", "c10d::recv_": "gloo:recv"},
    "dp": {"c10d::_allgather_base_": "gloo:all_gather", "c10d::_reduce_scatter_base_": "gloo:all_reduce"},
    "tp": {"c10d::allreduce_": "gloo:all_reduce"},
}


def hybrid_run(runs, dp: int, pp: int, tp: int, extra: tuple = ()) -> Path:
    return runs("hybrid", dp * pp * tp, "--dp", str(dp), "--pp", str(pp), "--tp", str(tp), *extra)


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def main_thread_ops(run_dir: Path, rank: int) -> tuple[collections.Counter, collections.Counter]:
    """(names of the events on the main thread, names of every event) in one rank's trace."""
    with gzip.open(run_dir / f"rank{rank}.json.gz", "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    main = next(e["tid"] for e in events if e["name"].startswith("ProfilerStep#"))
    everywhere = collections.Counter(e["name"] for e in events)
    return collections.Counter(e["name"] for e in events if e["tid"] == main), everywhere


@pytest.mark.parametrize("dp, pp, tp, extra", MESHES)
def test_losses_match_single_process(runs, dp, pp, tp, extra):
    m = manifest(hybrid_run(runs, dp, pp, tp, extra))
    want = single_process_losses(model=m["model"]["preset"], steps=STEPS)
    for got, ref in zip(m["losses"], want, strict=True):
        assert abs(got - ref) / abs(ref) < 1e-4, (m["losses"], want)
    assert want[-1] < want[0]
    assert m["mesh"] == {"dp": dp, "pp": pp, "tp": tp}
    # The ranks holding the loss: every rank without pipelining, else the last stage's (all its tp
    # ranks), each standing for its dp replica's 1/dp of the batch.
    last = m["pipeline"]["stage_to_rank"][-1] if pp > 1 else None
    for r in m["ranks"]:
        pp_rank = next(g.index(r["rank"]) for g in m["hybrid"]["groups"]["pp"] if r["rank"] in g)
        reports = pp == 1 or pp_rank == last
        assert r["loss_tokens"] == (m["tokens_per_step"] // dp if reports else 0), r["rank"]


def test_run_json_names_the_ranks_of_every_group(runs):
    m = manifest(hybrid_run(runs, 2, 2, 2))
    # Mesh (dp, pp, tp), tp innermost: rank = (dp_i * 2 + pp_i) * 2 + tp_i.
    assert m["hybrid"]["dims"] == ["dp", "pp", "tp"] and m["hybrid"]["shape"] == [2, 2, 2]
    assert m["hybrid"]["groups"] == {
        "dp": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
    }
    pp = m["pipeline"]
    # Per dp replica: 8 / 2 = 4 sequences in 2 x pp = 4 microbatches; stage s on pp rank s.
    assert (pp["schedule"], pp["ranks"], pp["microbatches"], pp["microbatch_size"]) == ("1f1b", 2, 4, 1)
    assert pp["stage_to_rank"] == [0, 1] and len(pp["ideal_order"]) == 2
    assert m["phases"] == {"optimizer": "ptprof/optimizer"}


@pytest.mark.parametrize("dp, pp, tp, extra", MESHES)
def test_traces_show_the_collectives_each_degree_implies(runs, dp, pp, tp, extra):
    run_dir = hybrid_run(runs, dp, pp, tp, extra)
    m = manifest(run_dir)
    degrees = {"dp": dp, "pp": pp, "tp": tp}
    for rank in range(dp * pp * tp):
        main, everywhere = main_thread_ops(run_dir, rank)
        for dim, ops in IMPLIED.items():
            if dim == "tp" and "--sp" in extra:
                ops = {"c10d::reduce_scatter_tensor_coalesced_": "gloo:all_reduce"}
            for op, gloo_op in ops.items():
                if degrees[dim] > 1:
                    assert main[op] > 0 and everywhere[gloo_op] > 0, (rank, dim, op, gloo_op)
                else:
                    assert everywhere[op] == 0, (rank, dim, op)  # nothing of a dimension that is not there
        # Pipelined: per-microbatch compute spans; otherwise the data-parallel forward/backward phases.
        spans = [n for n in main if n.startswith("ptprof/pp/F ")]
        if pp > 1:
            n_forwards = m["pipeline"]["microbatches"] * m["pipeline"]["stages_per_rank"] * ACTIVE
            assert sum(main[n] for n in spans) == n_forwards, rank
        else:
            assert not spans and main["ptprof/forward"] == main["ptprof/backward"] == ACTIVE


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gpus", "4", "--dp", "2", "--pp", "2", "--tp", "2"], "dp 2 x pp 2 x tp 2 = 8, but --gpus 4 gives 4 ranks"),
        (["--gpus", "6", "--dp", "1", "--pp", "2", "--tp", "3"],
         "tp 3 needs attention heads (4, model 'tiny') divisible by 3; "
         "no default preset (tiny, tiny8, tiny16, small) fits: give --model"),
        (["--gpus", "4", "--dp", "2", "--pp", "2", "--microbatches", "3"],
         "a dp replica's batch of 4 (--batch-size 8 / dp 2) does not split into 3 equal microbatches; "
         "use --microbatches dividing 4"),
        (["--gpus", "4", "--dp", "1", "--pp", "4", "--tp", "1", "--model", "tiny"],
         "1f1b over pp 4 x 1 stage(s) per rank needs 4 layers, but model 'tiny' has 2; "
         "use a deeper --model (tiny8 has 8)"),
    ],
    ids=["degrees", "tp-heads", "microbatches", "layers"],
)
def test_impossible_meshes_are_one_line_errors(tmp_path, args, message):
    res = ptprof("run", "hybrid", *args, "--out", str(tmp_path))
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == f"ptprof run: error: {message}"
    assert not list(tmp_path.iterdir()), "nothing may be written for a rejected request"
