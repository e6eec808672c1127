"""Seeded fuzz of `ptprof analyze` over damaged input (issue 12 B): no traceback, no hang, and no
impossible number in the report (negative, NaN or infinite times; shares outside 0-100 %).

Each case is one small damaged file, analysed in this process through the CLI's `main` (a
subprocess per case would cost more than the analysis); a few run as a real subprocess to check
the exit status and stderr. Classes: truncation, bit flips in gzip and in JSON, JSON that is not
a trace, semantic damage to real events (a small slice of a real NCCL trace, a real gloo trace and
a hand-made one), deep nesting, odd values and damaged run.json files.

    python -m pytest -q tests/profiler/test_fuzz.py                            # 320 cases, the suite's
    PTPROF_FUZZ_CASES=5000 python -m pytest -q tests/profiler/test_fuzz.py     # the long run
    PTPROF_FUZZ_SEED=7 ...                                                     # another sequence

A failure names the case (class, number, seed) and keeps its input under pytest's tmp folder.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import profiler.report
from profiler.cli import main
from profiler.damaged import DAMAGED
from profiler.parse import PURE_PARSER_ENV
from profiler.steps import NO_STEP
from tests.conftest import REPO, SHARED_TRACES

N_CASES = int(os.environ.get("PTPROF_FUZZ_CASES", "320"))
SEED = int(os.environ.get("PTPROF_FUZZ_SEED", "20261123"))
CASE_TIMEOUT_S = 60  # a hang, not a slow case: the inputs are a few KB
N_SUBPROCESS = 6

ODD_VALUES = [None, True, False, -1, 0, -5.0, 1.7, 1e300, -1e300, 2**40, 2**63, -(2**63) - 1, 2**64, "", "x", "NaN", "inf",
              "-inf", "12", "0x10", "1e400", [], {}, [1, 2], {"a": 1}, "ProfilerStep#99999999999999999999"]
FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
ARG_FIELDS = ["correlation", "stream", "External id", "Collective name", "In msg nelems", "Out msg nelems", "dtype",
              "Group size", "Process Group Ranks", "Input Dims", "Input type", "Bytes", "Total Allocated", "Device Type"]


def _real_docs() -> list[dict]:
    """Small real traces: a slice of an NCCL GPU trace (every step span kept), a gloo CPU trace,
    and a hand-made two-step trace."""
    nccl = msgspec.json.decode(gzip.decompress((SHARED_TRACES / "gpu_nccl_2_of_128" / "rank0.json.gz").read_bytes()))
    events = nccl["traceEvents"]
    kept = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep")] + events[:: len(events) // 120]
    gloo = msgspec.json.decode(gzip.decompress((SHARED_TRACES / "single" / "cpu_gloo_rank34_of_300.json.gz").read_bytes()))
    hand = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1, "tid": 1, "ts": 100 * k, "dur": 100}
            for k in (1, 2)]
    hand += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100 * k + 10, "dur": 20 + k}
             for k in (1, 2)]
    hand += [{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 150, "s": "t",
              "args": {"Bytes": 512, "Total Allocated": 1024, "Total Reserved": 2048, "Addr": 1, "Device Type": 0, "Device Id": -1}}]
    return [
        {"distributedInfo": nccl["distributedInfo"], "traceEvents": kept},
        {"distributedInfo": gloo["distributedInfo"], "traceEvents": gloo["traceEvents"]},
        {"distributedInfo": {"rank": 0, "world_size": 1, "backend": "gloo"}, "traceEvents": hand},
    ]


def _nested(rng: random.Random) -> str:
    depth = rng.choice([50, 500, 5_000, 100_000])
    open_, close = rng.choice([("[", "]"), ('{"a":', "}")])
    return open_ * depth + "1" + close * depth


class Cases:
    """The generator: `make(i)` -> (class name, file name, bytes, run.json text or None)."""

    def __init__(self, seed: int):
        self.docs = _real_docs()
        self.seed = seed

    def make(self, i: int):
        rng = random.Random(f"{self.seed}-{i}")
        kind = ["truncate", "flip_gzip", "flip_json", "not_trace", "semantic", "semantic", "semantic", "nesting",
                "odd_literal", "manifest"][i % 10]
        doc = rng.choice(self.docs)
        raw = msgspec.json.encode(doc)
        name, manifest = "rank0.json", None
        if kind == "truncate":
            data = gzip.compress(raw, 1) if rng.random() < 0.5 else raw
            name = "rank0.json.gz" if data[:2] == b"\x1f\x8b" else name
            data = data[: rng.randrange(len(data))]
        elif kind == "flip_gzip":
            data, name = bytearray(gzip.compress(raw, 1)), "rank0.json.gz"
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == "flip_json":
            data = bytearray(raw)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == "not_trace":
            data = json.dumps(rng.choice([
                1, "trace", None, [], [1, 2], {}, {"traceEvents": None}, {"traceEvents": {}}, {"traceEvents": "x"},
                {"traceEvents": [1, "a", None]}, {"traceEvents": [[]]}, {"hello": [1]}, {"schemaVersion": 1},
                {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "p"}}]},
                {"traceEvents": [{}] * rng.randint(1, 5)},
            ])).encode()
        elif kind == "semantic":
            data = msgspec.json.encode(self._semantic(doc, rng))
        elif kind == "nesting":
            where = rng.choice(["args", "info", "event", "top", "name"])
            nest = _nested(rng)
            events = raw.decode()
            if where == "args":
                data = events.replace('"args":{', f'"args":{{"deep":{nest},', 1)
            elif where == "info":
                data = events.replace('"distributedInfo":{', f'"distributedInfo":{{"pg_config":{nest},', 1)
            elif where == "event":
                data = events.replace('"traceEvents":[', f'"traceEvents":[{nest},', 1)
            elif where == "top":
                data = nest
            else:
                data = events.replace('"ph":"X"', f'"ph":{nest}', 1)
            data = data.encode()
        elif kind == "odd_literal":
            text = raw.decode()
            for _ in range(rng.randint(1, 3)):
                key = rng.choice(['"dur":', '"ts":', '"pid":', '"rank":'])
                at = text.find(key, rng.randrange(len(text)))
                if at >= 0:
                    end = at + len(key)
                    stop = min(x for x in (text.find(",", end), text.find("}", end)) if x >= 0)
                    text = text[:end] + rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "-0", "0.0e0", '"NaN"', "true",
                                                    "null", "99999999999999999999999"]) + text[stop:]
            data = text.encode()
        else:  # a good trace in a run folder with a damaged run.json
            data = raw
            base = json.loads((REPO / "traces" / "sample-1f1b-2r" / "run.json").read_text())
            manifest = json.dumps(self._damage_manifest(base, rng))
        return kind, name, bytes(data), manifest

    def _semantic(self, doc: dict, rng: random.Random) -> dict:
        doc = json.loads(json.dumps(doc))  # a copy
        events = doc["traceEvents"]
        for _ in range(rng.randint(1, 6)):
            op = rng.random()
            if op < 0.1 and isinstance(doc.get("distributedInfo"), dict):
                doc["distributedInfo"][rng.choice(["rank", "world_size", "backend", "pg_config"])] = rng.choice(ODD_VALUES)
                continue
            if not events:
                break
            e = rng.choice(events)
            if not isinstance(e, dict):
                continue
            if op < 0.55:
                e[rng.choice(FIELDS)] = rng.choice(ODD_VALUES)
            elif op < 0.7:
                e.pop(rng.choice(FIELDS), None)
            elif op < 0.85:
                args = e.setdefault("args", {}) if isinstance(e.get("args", {}), dict) else {}
                args[rng.choice(ARG_FIELDS)] = rng.choice(ODD_VALUES)
            elif op < 0.95:
                events.insert(rng.randrange(len(events)), json.loads(json.dumps(e)))  # a duplicate
            else:
                del events[rng.randrange(len(events)):]  # a tail cut off cleanly
        return doc

    def _damage_manifest(self, m: dict, rng: random.Random):
        if rng.random() < 0.1:
            return rng.choice([[1, 2], "run", None, 5])
        for _ in range(rng.randint(1, 3)):
            target, keys = m, []
            while isinstance(target, dict) and target and rng.random() < 0.6:
                k = rng.choice(list(target))
                keys.append(k)
                if not isinstance(target[k], dict):
                    break
                target = target[k]
            if isinstance(target, dict) and target:
                target[rng.choice(list(target))] = rng.choice(ODD_VALUES)
        return m


# Numbers that can never be negative: times, sizes, bandwidths and counts (`n_events`, the dropped
# counts by why, ...), ranks and group sizes. `step` may be -1: steps.NO_STEP, the single window of
# a trace without ProfilerStep spans (docs/report.md); below that it is impossible.
_NON_NEGATIVE_SUFFIXES = ("_us", "_bytes", "_gbps")
_NON_NEGATIVE_KEYS = {"count", "rank", "world_size", "group_size", "microbatches", "pp_ranks", "stages_per_rank", *DAMAGED}


def _check_numbers(node, where: str = "$") -> None:
    """No impossible number anywhere in the report: every number finite; times, sizes, bandwidths
    and counts ≥ 0; steps ≥ NO_STEP; shares in 0-100 %."""
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                at = f"{where}.{k} = {v}"
                assert math.isfinite(v), at
                if k.endswith(_NON_NEGATIVE_SUFFIXES) or k.startswith("n_") or k in _NON_NEGATIVE_KEYS:
                    assert v >= -1e-6, at
                if k == "step":
                    assert v >= NO_STEP, at
                if k.endswith("_pct") and not k.endswith("_diff_pct"):
                    assert -1e-6 <= v <= 100 + 1e-6, at
            _check_numbers(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_numbers(v, f"{where}[{i}]")


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang(f"no result in {CASE_TIMEOUT_S} s")


@pytest.fixture
def keep_nan(monkeypatch):
    # The report writes NaN and inf as null; here they must show, so the check can see them.
    monkeypatch.setattr(profiler.report, "_finite", lambda frame: frame)


def test_fuzz_analyze_in_process(tmp_path, capsys, keep_nan, monkeypatch):
    cases = Cases(SEED)
    outcomes: dict[str, dict[int, int]] = {}
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(N_CASES):
            kind, name, data, manifest = cases.make(i)
            folder = tmp_path / f"case{i:05d}"
            folder.mkdir()
            (folder / name).write_bytes(data)
            if manifest is not None:
                (folder / "run.json").write_text(manifest)
            report = folder / "report.json"
            # Every 4th case through the msgspec parser (what runs where the C parser is not built,
            # or declines a file); the others through the C parser where it is built.
            pure = i % 4 == 3
            if pure:
                monkeypatch.setenv(PURE_PARSER_ENV, "1")
            else:
                monkeypatch.delenv(PURE_PARSER_ENV, raising=False)
            label = f"case {i} ({kind}, seed {SEED}{', pure parser' if pure else ''}): {folder}"
            signal.alarm(CASE_TIMEOUT_S)
            try:
                # Every other case prints the text report too (every 4th with --full): it must not
                # crash on what the JSON survives, and stays 100 columns wide.
                mode = ["--quiet"] if i % 2 else ["--full"] if i % 4 == 0 else []
                code = main(["analyze", str(folder / name if manifest is None else folder), "--no-cache", *mode,
                             "--json", str(report)])
            except BaseException as e:  # noqa: BLE001 (a traceback is the failure being looked for)
                raise AssertionError(f"{label}: {type(e).__name__}: {e}") from e
            finally:
                signal.alarm(0)
            out, err = capsys.readouterr()
            assert code in (0, 2), f"{label}: exit {code}"
            # The closing `report: PATH` line is as long as the user's path (xdist's tmp paths are long).
            wide = [line for line in out.split("\n") if len(line) > 100 and not line.startswith("report: ")]
            assert i % 4 == 0 or not wide, f"{label}: lines over 100 columns: {wide}"
            if code == 2:
                assert err.strip() and "Traceback" not in err, f"{label}: {err}"
                assert len(err.strip().splitlines()) == 1, f"{label}: {err}"
                assert str(folder) in err, f"{label}: the line names neither the file nor its folder: {err}"
            else:
                _check_numbers(json.loads(report.read_text(), parse_constant=float), label)
            outcomes.setdefault(kind, {}).setdefault(code, 0)
            outcomes[kind][code] += 1
    finally:
        signal.signal(signal.SIGALRM, old)
    print(f"\nfuzz: {N_CASES} cases, seed {SEED}; exit statuses by class: {outcomes}")
    # The classes meant to be read must mostly be read, else the fuzz tests only the refusals.
    assert N_CASES < 100 or outcomes["semantic"].get(0, 0) > 0.3 * sum(outcomes["semantic"].values())


def test_fuzz_exit_status_in_a_subprocess(tmp_path):
    cases = Cases(SEED + 1)
    for i in range(N_SUBPROCESS):
        kind, name, data, manifest = cases.make(i * 7 + 4)  # semantic, odd literal and flip classes
        folder = tmp_path / f"case{i}"
        folder.mkdir()
        (folder / name).write_bytes(data)
        res = subprocess.run([sys.executable, "-m", "profiler", "analyze", str(folder / name), "--quiet", "--no-cache"],
                             capture_output=True, text=True, timeout=120, cwd=REPO)
        assert res.returncode in (0, 2) and "Traceback" not in res.stderr, f"case {i} ({kind}): {res.stderr}"
        assert (res.returncode == 2) == bool(res.stderr.strip()) or "warning" in res.stderr, f"case {i} ({kind}): {res.stderr}"
