"""profiler/api.py: `load_traces` and `analyze` importable without polars, starting the map's work
before the loader's imports (as `ptprof analyze` does), with the same numbers and no process left."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

SAMPLE = REPO / "traces" / "sample-1f1b-2r"


def _python(code: str, cache, *args) -> dict:
    env = dict(os.environ, PTPROF_CACHE_DIR=str(cache))
    res = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


def test_importing_the_api_imports_neither_polars_nor_numpy(tmp_path):
    got = _python("import json, sys\nfrom profiler import load_traces, analyze\n"
                  "print(json.dumps([m for m in ('polars', 'numpy', 'profiler.load', 'profiler.report') if m in sys.modules]))",
                  tmp_path)
    assert got == []


# Each load in a fresh process (prescan forks only where no other thread runs: not in a test
# worker), its report beside the one of the loader called directly (cli.py's path without the
# early start), both cold, each with its own cache.
EARLY = """
import json, sys
import psutil
import profiler.prescan as prescan
import profiler.pool as pool
forked, early = [], []
real_start, real_early = prescan.start, pool.LocalEngine.start_early
prescan.start = lambda paths: forked.append(real_start(paths)) or forked[-1]
def start_early(self, files):
    real_early(self, files)
    early.append(len(self._early))
pool.LocalEngine.start_early = start_early
from profiler import load_traces, analyze
workers = int(sys.argv[2]) or None
traces = load_traces(sys.argv[1], progress=False, workers=workers)
from profiler import build_report  # polars' threads from here on: after the load
report = build_report(analyze(traces))
print(json.dumps({"forked": forked, "early": early, "children": len(psutil.Process().children(recursive=True)),
                  "report": report}))
"""
DIRECT = """
import json, sys
from profiler.load import load_traces
from profiler.report import analyze, build_report
workers = int(sys.argv[2]) or None
print(json.dumps({"report": build_report(analyze(load_traces(sys.argv[1], progress=False, workers=workers)))}))
"""


@pytest.mark.parametrize("workers", [0, 2], ids=["in this process, scanned ahead", "two workers started early"])
def test_the_api_starts_the_work_early_with_the_same_numbers_and_leaves_no_process(tmp_path, workers):
    got = _python(EARLY, tmp_path / "a", SAMPLE, workers)
    if workers:  # the pool: both workers started before the loader's imports, no scan
        assert got["early"] == [2] and got["forked"] == []
    else:  # two small files: analysed in this process, a child scanning them meanwhile
        assert got["forked"] == [True] and got["early"] == [0]
    assert got["children"] == 0  # the child reaped, the workers stopped
    direct = _python(DIRECT, tmp_path / "b", SAMPLE, workers)
    assert got["report"] == direct["report"]
    assert got["report"]["runs"] and got["report"]["findings"]


def test_a_warm_load_starts_nothing(tmp_path):
    _python(DIRECT, tmp_path, SAMPLE, 0)
    got = _python(EARLY, tmp_path, SAMPLE, 2)
    assert True not in got["forked"] and got["early"] == [0] and got["children"] == 0


def test_a_given_engine_is_the_callers(tmp_path):
    # An engine passed in is neither started early nor closed by load_traces: the caller's.
    code = """
import json, sys
from profiler import load_traces
from profiler.pool import LocalEngine
closed = []
class Engine(LocalEngine):
    def start_early(self, files):
        raise AssertionError("started by load_traces")
    def close(self):
        closed.append(True)
t = load_traces(sys.argv[1], progress=False, engine=Engine(1))
print(json.dumps({"closed": closed, "ranks": t.ranks.height}))
"""
    assert _python(code, tmp_path, SAMPLE) == {"closed": [], "ranks": 2}


def test_paths_may_come_from_a_generator(tmp_path):
    # load_traces(Path(d).glob(...)): read once, for both the early start and the load
    from profiler import load_traces

    traces = load_traces((p for p in sorted(SAMPLE.glob("rank*.json.gz"))), progress=False)
    assert traces.ranks["rank"].to_list() == [0, 1]


def test_workers_past_two_per_core_are_capped_with_a_warning(tmp_path, monkeypatch):
    """workers=1000 started a process per file (7.6 GB on 256 files); `--workers` was capped, the
    API was not. Capped at two per core, with a warning naming what was asked."""
    from profiler import load_traces, pool

    monkeypatch.setattr(pool, "cores", lambda: 2)
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path))
    with pytest.warns(UserWarning, match=r"^workers=1000: this process may use 2 cores; using 4 workers \(two per core"):
        engine = pool.LocalEngine(1000)
    assert engine.workers == 4
    with pytest.warns(UserWarning, match="workers=9"):
        traces = load_traces(SAMPLE, workers=9, progress=False, cache=False)
    assert traces.ranks["rank"].to_list() == [0, 1]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at the cap: no warning
        assert pool.LocalEngine(4).workers == 4
