"""`ptprof` argument handling: one-line errors with exit status 2, and helpful --help."""

from __future__ import annotations

import json

import pytest

from runners.cli import describe_failures
from tests.conftest import ptprof


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "nosuch", "--gpus", "2"], "unknown paradigm 'nosuch'"),
        (["run", "ddp", "--gpus", "0"], "--gpus must be at least 1"),
        (["run", "ddp", "--gpus", "2", "--device", "cuda"], "needs 2 GPUs on this node but 0 are visible"),
        (["run", "ddp", "--gpus", "2", "--steps", "2", "--warmup", "1", "--active", "3"], "exceeds --steps 2"),
        (["run", "ddp", "--gpus", "3"], "not divisible by the 3 data-parallel ranks"),
        (["run", "ddp", "--gpus", "2", "--nnodes", "2"], "needs --rdzv-endpoint"),
        (["run", "ddp", "--gpus", "two"], "invalid int value"),
        (["run", "ddp"], "required: --gpus"),
        # flags another paradigm reads would be silently ignored: refused instead
        (["run", "1f1b", "--gpus", "2", "--schedule", "zbv"], "--schedule does not apply to 1f1b: it is for hybrid"),
        (["run", "fsdp", "--gpus", "2", "--pp", "2"], "--pp does not apply to fsdp: it is for hybrid"),
        (["run", "ddp", "--gpus", "2", "--microbatches", "4"], "--microbatches does not apply to ddp"),
        (["run", "ddp", "--gpus", "2", "--experts", "8"], "--experts does not apply to ddp: it is for ep"),
        # ... also when given with its default value (a flag given is a flag meant)
        (["run", "ddp", "--gpus", "2", "--schedule", "1f1b"], "--schedule does not apply to ddp: it is for hybrid"),
        (["run", "ddp", "--gpus", "2", "--top-k=2"], "--top-k does not apply to ddp: it is for ep"),
        (["run", "pipedream", "--gpus", "2", "--schedule", "1f1b"], "--schedule does not apply to pipedream"),
        (["run", "ddp", "--gpus", "2", "--capacity", "1.25"], "--capacity-factor does not apply to ddp"),  # abbreviated
        # a timeout must be a finite, positive number of seconds (nan would never fire, 1e300 overflows)
        (["run", "ddp", "--gpus", "2", "--timeout", "nan"], "--timeout: must be a number of seconds"),
        (["run", "ddp", "--gpus", "2", "--timeout", "inf"], "--timeout: must be a number of seconds"),
        (["run", "ddp", "--gpus", "2", "--timeout", "0"], "--timeout: must be a number of seconds"),
        (["run", "ddp", "--gpus", "2", "--timeout", "-5"], "--timeout: must be a number of seconds"),
        (["run", "ddp", "--gpus", "2", "--timeout", "1e300"], "--timeout: must be a number of seconds"),
        (["run", "ddp", "--gpus", "2", "--lr", "nan"], "--lr: must be a finite number"),
        # run names the filesystem cannot hold, or that would garble a terminal
        (["run", "ddp", "--gpus", "2", "--name", "n" * 300], "--name is 300 bytes long; a run name may have at most 250"),
        (["run", "ddp", "--gpus", "2", "--name", "a\nb"], "has control characters"),
        (["run", "ddp", "--gpus", "2", "--name", "a/b"], "must be a plain folder name"),
    ],
)
def test_bad_requests_are_one_line_exit_2(tmp_path, args, needle):
    res = ptprof(*args, "--out", str(tmp_path))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("ptprof run: error:") and needle in lines[0], lines[0]
    assert not list(tmp_path.iterdir()), "nothing may be written for a rejected request"


@pytest.mark.parametrize(
    "out, needle",
    [
        ("file", "--out is not a folder"),
        ("file/sub", "--out's parent"),
        ("", "--out is empty"),
        ("/proc/1/sub", "is not writable"),  # unwritable even for root
        ("/proc/nosuch-ptprof", "cannot create"),  # passes the checks, fails at mkdir: still one line
    ],
)
def test_unusable_out_is_one_line_exit_2(tmp_path, out, needle):
    (tmp_path / "file").write_text("not a folder")
    target = str(tmp_path / out) if out.startswith("file") else out
    res = ptprof("run", "ddp", "--gpus", "2", "--out", target, "--name", "r")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ptprof run: error:") and needle in lines[0], res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_default_model_is_the_smallest_that_fits_every_pipeline():
    """Computed here from the schedules' definitions: P x V stages need as many layers, and the
    default 2 x P microbatches must split the preset's batch."""
    from runners.options import MODEL_PRESETS, RunOptions
    from runners.paradigms import PIPELINE_SCHEDULES, default_model, problem_with

    stages_per_rank = {"gpipe": 1, "1f1b": 1, "zero-bubble": 1, "interleaved-1f1b": 2, "zbv": 2, "dualpipev": 2}
    assert set(stages_per_rank) == set(PIPELINE_SCHEDULES)
    by_size = ["tiny", "tiny8", "tiny16", "small"]  # n_params increasing
    for name, v in stages_per_rank.items():
        for ranks in (2, 4, 8):
            fits = [m for m in by_size if MODEL_PRESETS[m][2] >= ranks * v and MODEL_PRESETS[m][5] % (2 * ranks) == 0]
            opts = RunOptions(paradigm=name, gpus=ranks)
            chosen = default_model(opts)
            assert chosen == fits[0], (name, ranks, chosen)
            assert problem_with(RunOptions(paradigm=name, gpus=ranks, model=chosen)) is None


def test_run_needs_only_gpus_and_steps(tmp_path, monkeypatch):
    """Every paradigm is accepted with --gpus 2 (and 4) alone; any --steps >= 1 fits the profiler defaults."""
    import torch

    from runners.cli import _check_request, build_parser

    # As on a torch that runs every paradigm on gloo (V pipelines before 2.13: the test below).
    monkeypatch.setattr(torch, "__version__", "2.13.0")
    from runners.paradigms import PARADIGMS

    def check(*args):
        return _check_request(build_parser().parse_args(["run", *args, "--out", str(tmp_path)]))

    for paradigm in (p for p in PARADIGMS if not PARADIGMS[p].needs_gpu):  # GPU-only: refused on CPU
        for ranks in ("2", "4"):
            opts, _device, chosen = check(paradigm, "--gpus", ranks)
            assert chosen and opts.model in ("tiny", "tiny8")
    for steps, (warmup, active) in {1: (0, 1), 2: (1, 1), 3: (1, 2), 4: (1, 3), 5: (1, 3), 9: (1, 3)}.items():
        opts, _, _ = check("ddp", "--gpus", "2", "--steps", str(steps))
        assert (opts.warmup, opts.active, opts.wait) == (warmup, active, steps - warmup - active)
    opts, _, _ = check("ddp", "--gpus", "2", "--steps", "3", "--active", "3")  # explicit active: no room for warmup
    assert (opts.warmup, opts.active) == (0, 3)
    opts, _, chosen = check("zbv", "--gpus", "2", "--model", "small")  # an explicit model is kept
    assert opts.model == "small" and not chosen


def test_v_pipelines_on_gloo_need_torch_2_13():
    # Seen on an H100 machine's torch 2.11 (gloo ranks, GPUs hidden): zbv and dualpipev failed in
    # torch's pipelining warm-up, the last rank sending to itself ("Pair is not connected").
    from runners.cli import v_schedule_problem
    from runners.options import RunOptions

    def problem(version, paradigm, device="cpu", **kw):
        return v_schedule_problem(RunOptions(paradigm=paradigm, gpus=2, **kw), device, version)

    line = problem("2.11.0+cu130", "zbv")
    assert line == ("zbv on gloo ranks needs torch 2.13 or later (this is 2.11.0+cu130): its pipelining warm-up "
                    "sends between the two stages of the last rank, which gloo refuses; upgrade torch or run on GPUs")
    assert problem("2.12.1", "dualpipev").startswith("dualpipev on gloo ranks needs torch 2.13")
    assert problem("2.6.0", "hybrid", pp=2, schedule="zbv").startswith("zbv on gloo")
    # Allowed: torch 2.13 and later (2.13.0a0 dev builds too), NCCL, looped schedules, hybrid without a pipeline.
    for version, paradigm, device, kw in [("2.13.0", "zbv", "cpu", {}), ("2.13.0a0+git1234", "dualpipev", "cpu", {}),
                                          ("2.14.1", "zbv", "cpu", {}), ("2.11.0", "zbv", "cuda", {}),
                                          ("2.11.0", "interleaved-1f1b", "cpu", {}), ("2.11.0", "1f1b", "cpu", {}),
                                          ("2.11.0", "hybrid", "cpu", {"pp": 1, "schedule": "zbv"}),
                                          ("2.11.0", "ddp", "cpu", {})]:
        assert problem(version, paradigm, device, **kw) is None, (version, paradigm, device, kw)


def test_every_paradigm_runs_on_8_ranks_with_only_gpus(tmp_path, monkeypatch):
    """At 8 ranks too: ep gets 8 experts (one per rank; the old default 4 did not split over 8)."""
    import torch

    from runners.cli import UsageError, _check_request, build_parser

    monkeypatch.setattr(torch, "__version__", "2.13.0")  # as above
    from runners.paradigms import PARADIGMS

    def check(*args):
        return _check_request(build_parser().parse_args(["run", *args, "--out", str(tmp_path)]))

    for paradigm in (p for p in PARADIGMS if not PARADIGMS[p].needs_gpu):
        opts, _device, _chosen = check(paradigm, "--gpus", "8")
        assert opts.world_size == 8
    assert check("ep", "--gpus", "8")[0].experts == 8 and check("ep", "--gpus", "2")[0].experts == 4
    assert check("ep", "--gpus", "2", "--experts", "6")[0].experts == 6  # an explicit count is kept ...
    with pytest.raises(UsageError, match="--experts 4 must be divisible by the 8 ranks"):
        check("ep", "--gpus", "8", "--experts", "4")  # ... and refused where it does not split


def test_existing_run_folder_is_not_overwritten(tmp_path):
    (tmp_path / "taken").mkdir()
    res = ptprof("run", "ddp", "--gpus", "2", "--out", str(tmp_path), "--name", "taken")
    assert res.returncode == 2 and "already exists" in res.stderr


def test_help_group_headings_name_who_takes_and_who_refuses_a_flag():
    import re

    from runners.paradigms import PARADIGM_FLAGS, SPLIT_BACKWARD

    res = ptprof("run", "--help")
    memory = next(line for line in res.stdout.splitlines() if line.startswith("memory trade-offs"))
    pipeline = next(line for line in res.stdout.splitlines() if line.startswith("pipeline ("))
    assert "every paradigm but" in memory and all(re.search(rf"\b{s}\b", memory) for s in SPLIT_BACKWARD), memory
    assert all(re.search(rf"\b{p}\b", pipeline) for p in PARADIGM_FLAGS["microbatches"]), pipeline


def test_version_and_the_top_help_points_to_each_commands_help():
    import tomllib

    from tests.conftest import REPO

    want = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    res = ptprof("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"ptprof {want}", (res.stdout, res.stderr)
    top = " ".join(ptprof("--help").stdout.split())
    assert "Each command has its own help: ptprof COMMAND --help" in top and "ptprof run ddp --gpus 2" in top


def test_help_explains_every_flag():
    res = ptprof("run", "--help")
    assert res.returncode == 0
    for flag in ["--gpus", "--nnodes", "--node-rank", "--rdzv-endpoint", "--steps", "--model", "--batch-size",
                 "--seq-len", "--seed", "--out", "--name", "--warmup", "--active", "--profile-memory",
                 "--with-stack", "--timeout", "--device"]:
        assert flag in res.stdout, flag
    for paradigm in ["ddp", "zero1", "zero2", "fsdp"]:
        assert f"  {paradigm} " in res.stdout
    top = ptprof("--help")
    assert top.returncode == 0 and all(c in top.stdout for c in ["run", "list", "analyze", "view"])


def test_describe_failures_tells_causes_from_symptoms():
    peer_lost = (-15, {"message": "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1"})
    # A rank that raised is the cause; the peer that lost its connection is not blamed.
    line = describe_failures({0: peer_lost, 1: (1, {"message": "ValueError: bad shape"})}, 2)
    assert line == "rank 1 failed (exit 1): ValueError: bad shape"
    # Killed by SIGKILL (no error file): the cause.
    assert describe_failures({3: (-9, "Signal 9 (SIGKILL) received by PID 7")}, 4).startswith(
        "rank 3 failed (killed by signal 9)"
    )
    # Only a timeout and a rank the launcher had to stop: the stopped one hung.
    timeout = (1, {"message": "RuntimeError: Timed out waiting 5000ms for send operation to complete"})
    line = describe_failures({0: timeout, 1: (-15, "Signal 15 (SIGTERM) received by PID 9")}, 2)
    assert line.startswith("rank 1 stopped responding") and "rank 0 gave up waiting" in line
    # Ranks absent from the failures (never failed, stopped silently) are the suspects too.
    line = describe_failures({0: timeout}, 3)
    assert line.startswith("rank 1, 2 stopped responding")
    # A rank seen stopped (SIGSTOP) and then killed by the launcher did not crash: it did not respond.
    killed = (-9, "Signal 9 (SIGKILL) received by PID 9")
    line = describe_failures({0: timeout, 1: killed}, 2, stopped=frozenset({1}))
    assert line.startswith("rank 1 stopped responding (rank 1's process was stopped: SIGSTOP")
    assert "rank 0 gave up waiting" in line and "signal 9" not in line


def test_list_names_the_variant_flags(tmp_path):
    import json

    for name, options in (("plain", {"recompute": False}), ("rc", {"recompute": True}),
                          ("lp", {"loss_parallel": True, "sp": True}), ("odd", {"recompute": "yes"})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({
            "run_id": name, "paradigm": "tp" if name == "lp" else "ddp", "world_size": 2, "backend": "gloo",
            "losses": [5.0], "options": options}))
    res = ptprof("list", "--traces", str(tmp_path))
    assert res.returncode == 0, res.stderr
    paradigm = {line.split()[0]: line.split()[1] for line in res.stdout.splitlines()[1:]}
    assert paradigm == {"plain": "ddp", "rc": "ddp+rc", "lp": "tp+sp+lp", "odd": "ddp"}


def test_list_shows_runs_and_skips_hidden(tmp_path):
    import json

    (tmp_path / ".x.tmp").mkdir()
    (tmp_path / ".x.tmp" / "run.json").write_text("{}")
    run = tmp_path / "r1"
    run.mkdir()
    run.joinpath("run.json").write_text(json.dumps({
        "run_id": "r1", "paradigm": "fsdp", "world_size": 4, "backend": "gloo", "losses": [5.0, 4.5],
        "created_at": "2026-01-01T00:00:00+00:00",
    }))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("{not json")
    res = ptprof("list", "--traces", str(tmp_path))
    assert res.returncode == 0
    assert "r1" in res.stdout and "fsdp" in res.stdout and "4.5000" in res.stdout
    assert ".x" not in res.stdout
    assert "broken" in res.stdout and "unreadable run.json" in res.stdout
    assert "steps run" in res.stdout.splitlines()[0]  # all steps trained, not only the profiled ones


def test_list_survives_any_run_json(tmp_path):
    import json

    bad = {
        "a-list": "[1, 2]",
        "deep": "[" * 100_000 + "]" * 100_000,
        "wrong-types": json.dumps({"pipeline": [1]}),
        "bool-ranks": json.dumps({"paradigm": "ddp", "world_size": True, "backend": "gloo", "losses": []}),
        "str-losses": json.dumps({"paradigm": "ddp", "world_size": 2, "backend": "gloo", "losses": "1,2"}),
        "int-date": json.dumps({"paradigm": "ddp", "world_size": 2, "backend": "gloo", "losses": [], "created_at": 5}),
        "not-utf8": b"\xff\xfe\xfa",
    }
    for name, text in bad.items():
        (tmp_path / name).mkdir()
        path = tmp_path / name / "run.json"
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "run.json").write_text(json.dumps(
        {"paradigm": "ddp\x1b[31m", "world_size": 2, "backend": "gloo", "losses": [5.0, None, 4.25]}))
    res = ptprof("list", "--traces", str(tmp_path))
    assert res.returncode == 0 and not res.stderr, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines()[1:]}
    assert set(rows) == set(bad) | {"good"}
    assert "holds a JSON list, not an object" in rows["a-list"]
    assert "nested too deeply" in rows["deep"]
    assert "run.json has no 'paradigm'" in rows["wrong-types"]
    assert "'world_size' is not a positive integer" in rows["bool-ranks"]
    assert "'losses' is not a list of numbers" in rows["str-losses"]
    assert "'created_at' is not a string" in rows["int-date"]
    assert "unreadable run.json" in rows["not-utf8"]
    assert "\x1b" not in res.stdout and "ddp\\x1b[31m" in rows["good"]  # escapes shown, not obeyed
    assert rows["good"].split()[4:6] == ["3", "4.2500"]


def test_list_shows_a_folder_of_traces_without_run_json(tmp_path):
    """torch's tensorboard_trace_handler output copied under traces/: the viewer shows it as a run,
    `ptprof list` left it out. A row now says what it is and how to analyse it (the path quoted)."""
    import json

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "run.json").write_text(json.dumps(
        {"paradigm": "ddp", "world_size": 2, "backend": "gloo", "losses": [5.0]}))
    tb = tmp_path / "tb run"
    tb.mkdir()
    for name in ("host_1.pt.trace.json.gz", "host_2.pt.trace.json", "notes.txt", ".hidden.json"):
        (tb / name).write_text("{}")
    (tmp_path / "empty").mkdir()
    (tmp_path / "reports").mkdir()  # ptprof's own report alone is no run: `ptprof analyze` of it would fail
    (tmp_path / "reports" / "report.json").write_text('{\n "schema": "ptprof.report/1"}')
    deep = tmp_path / ("long-name-" * 12)  # the suggested command is never cut ("..." made it unrunnable)
    deep.mkdir()
    (deep / "rank0.json").write_text("{}")
    (tmp_path / ".tmp-run").mkdir()
    (tmp_path / ".tmp-run" / "rank0.json.gz").write_text("{}")
    res = ptprof("list", "--traces", str(tmp_path))
    assert res.returncode == 0, res.stderr
    rows = res.stdout.splitlines()[1:]
    assert [r.split()[0][:10] for r in rows] == ["mine", "long-name-", "tb"]
    assert rows[1].endswith(f"`ptprof analyze {deep}`")
    assert rows[2].startswith("tb run ") and (f"2 trace files, no run.json (not made by `ptprof run`): "
                                              f"`ptprof analyze '{tb}'`") in rows[2]


def test_list_never_opens_a_run_json_that_is_no_regular_file(tmp_path):
    import os

    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "run.json")  # reading it would block the listing forever
    res = ptprof("list", "--traces", str(tmp_path), timeout=60)
    assert res.returncode == 0 and "run.json is not a regular file" in res.stdout, res.stdout + res.stderr


def test_view_is_a_clear_placeholder_until_the_viewer_lands():
    import importlib.util

    if importlib.util.find_spec("viewer.__main__") is not None:
        pytest.skip("the viewer exists now; its own tests cover `ptprof view`")
    res = ptprof("view")
    assert res.returncode == 2
    assert res.stderr.strip() == "ptprof: `view` is not yet available in this version"


def test_summary_step_time_is_the_mean_over_ranks_and_names_the_spread(tmp_path, capsys):
    """The progress lines are one rank's; the summary's mean is over every rank, and says so."""
    from runners.cli import _print_summary

    run = tmp_path / "r"
    run.mkdir()
    mem = {"params_bytes": 1, "grads_bytes": 1, "optimizer_bytes": 1}
    ranks = [  # profiled steps 1-2: rank 0 means 20 ms, rank 1 means 50 ms; step 0 (warmup) is left out
        {"rank": 0, "trace": "rank0.json.gz", "step_time_s": [9.0, 0.010, 0.030], "memory": mem},
        {"rank": 1, "trace": "rank1.json.gz", "step_time_s": [9.0, 0.040, 0.060], "memory": mem},
    ]
    for r in ranks:
        (run / r["trace"]).write_bytes(b"x")
    (run / "run.json").write_text(json.dumps({
        "run_id": "r", "paradigm": "ddp", "world_size": 2, "backend": "gloo", "device": "cpu",
        "losses": [1.0, 0.9, 0.8], "ranks": ranks, "profiler": {"profiled_steps": [1, 2]},
        "model": {"preset": "tiny", "n_layers": 2, "n_params": 10},
    }))
    _print_summary(run, 1.0, False)
    out = capsys.readouterr().out
    assert "35.0 ms mean over profiled steps 1-2 and 2 ranks, wall clock\n" in out
    assert "\n                  per rank 20.0 ms (rank 0) to 50.0 ms (rank 1)\n" in out
    # Within 100 columns, but for the run's folder, which is as long as the user's path (under
    # xdist tmp_path gains a popen-gwN/ level).
    assert max(len(line.replace(str(run), "r")) for line in out.split("\n")) <= 100


def test_summary_and_plan_of_dp_name_one_process_and_its_gpus(tmp_path, capsys):
    """dp is one process driving --gpus GPUs: neither '1 nccl ranks' nor 'GPUs each' nor 'on 2 ranks'."""
    from runners.cli import _print_plan, _print_summary
    from runners.options import RunOptions

    run = tmp_path / "r"
    run.mkdir()
    (run / "rank0.json.gz").write_bytes(b"x")
    mem = {"params_bytes": 1, "grads_bytes": 1, "optimizer_bytes": 1}
    (run / "run.json").write_text(json.dumps({
        "run_id": "r", "paradigm": "dp", "world_size": 1, "backend": "nccl", "device": "cuda", "gpus_per_process": 2,
        "losses": [1.0, 0.9, 0.8], "profiler": {"profiled_steps": [1, 2]},
        "ranks": [{"rank": 0, "trace": "rank0.json.gz", "step_time_s": [9.0, 0.010, 0.030], "memory": mem}],
        "model": {"preset": "tiny", "n_layers": 2, "n_params": 10},
    }))
    _print_summary(run, 1.0, False)
    _print_plan(RunOptions(paradigm="dp", gpus=2), "cuda", True)
    out = capsys.readouterr().out
    assert "\nr: dp in 1 process driving 2 GPUs (nccl, cuda), 3 steps in 1.0 s\n" in out
    assert "(1 rank, 1 B)\n" in out
    assert "Running 1 process per node driving 2 GPUs (dp).\n" in out
    assert "the smallest preset that fits dp on 2 GPUs (--model to choose)" in out


def test_list_columns_are_as_wide_as_their_longest_entry(tmp_path):
    """`interleaved-1f1b` (16 characters) pushed its row's numbers out of the columns (trial)."""
    import json

    for name, paradigm in (("a", "ddp"), ("a-run-name-longer-than-thirty-six-characters", "interleaved-1f1b")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({
            "run_id": name, "paradigm": paradigm, "world_size": 2, "backend": "gloo", "losses": [5.0]}))
    res = ptprof("list", "--traces", str(tmp_path))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    # every row's "ranks" column ends where the header's does
    end = lines[0].index("ranks") + len("ranks")
    assert all(line[end - 1] == "2" and line[end] == " " for line in lines[1:]), lines
