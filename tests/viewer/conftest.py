"""Viewer test fixtures: the shipped sample runs (loaded once per session) and the app over them.

The samples are `traces/sample-*` (see docs/viewer.md); where a checkout lacks them they are made
with `ptprof run` into a temp folder first. Tests work on a temp copy of the traces root, so
uploads and broken runs never touch the repo.
"""

from __future__ import annotations

import base64
import shutil

import pytest

from tests.conftest import REPO, ptprof

SAMPLES = {  # folder -> the `ptprof run` arguments that make it (as shipped)
    "sample-ddp-2r": ["ddp", "--gpus", "2", "--profile-memory"],
    "sample-fsdp-2r": ["fsdp", "--gpus", "2", "--profile-memory"],
    "sample-1f1b-2r": ["1f1b", "--gpus", "2", "--microbatches", "4"],
    "sample-zbv-2r": ["zbv", "--gpus", "2", "--model", "tiny8", "--microbatches", "4"],
    "sample-ring-2r": ["ring", "--gpus", "2", "--profile-memory"],
}
BROKEN = "broken-run"  # a run folder whose only trace is not gzip, for the bad-data tests


@pytest.fixture(scope="session")
def traces_root(tmp_path_factory):
    """A traces root holding the five sample runs, a foreign trace folder and a broken run."""
    root = tmp_path_factory.mktemp("traces")
    for name, args in SAMPLES.items():
        shipped = REPO / "traces" / name
        if (shipped / "run.json").is_file():
            shutil.copytree(shipped, root / name)
            continue
        res = ptprof("run", *args, "--steps", "4", "--warmup", "1", "--active", "2", "--out", str(root), "--name", name)
        assert res.returncode == 0, res.stderr
    foreign = root / "foreign-trace"
    foreign.mkdir()
    shutil.copy(root / "sample-ddp-2r" / "rank0.json.gz", foreign / "worker0_rank0.trace.json.gz")
    broken = root / BROKEN
    broken.mkdir()
    (broken / "rank0.json.gz").write_bytes(b"\x1f\x8b this is not gzip")
    return root


@pytest.fixture(scope="session")
def app(traces_root):
    from viewer.app import create_app

    return create_app(traces_root)


@pytest.fixture(scope="session")
def store(app):
    from viewer.pages import STORE_KEY

    return app.server.config[STORE_KEY]


@pytest.fixture(scope="session")
def pages(app):
    """The page modules (importable only once an app exists: they register themselves)."""
    import types

    from viewer.pages import compare, open as open_page, runs

    return types.SimpleNamespace(runs=runs, compare=compare, open=open_page)


def dash_post(app, output: str, *values, state=(), changed: int = 0):
    """POST to /_dash-update-component as the browser does: the callback whose output names
    `output` (e.g. "compare-timeline.figure"), its inputs set to `values` and its state to `state`.
    Returns the Flask response; `changed` is the index of the input that fired."""
    client = app.server.test_client()
    client.get("/")  # first request: dash registers the callbacks
    deps = client.get("/_dash-dependencies").get_json()
    (dep,) = [d for d in deps if (output in d["output"].strip(".").split("...") or d["output"].split("@")[0] == output)
              and len(d["inputs"]) == len(values) and len(d["state"]) == len(state)]  # two callbacks may share an output
    if dep["output"].startswith(".."):
        outputs = [dict(zip(("id", "property"), o.split(".", 1))) for o in dep["output"][2:-2].split("...")]
    else:
        outputs = dict(zip(("id", "property"), dep["output"].split(".", 1)))
    body = {
        "output": dep["output"], "outputs": outputs,
        "inputs": [{**i, "value": v} for i, v in zip(dep["inputs"], values, strict=True)],
        "state": [{**s, "value": v} for s, v in zip(dep["state"], state, strict=True)],
        "changedPropIds": [f"{dep['inputs'][changed]['id']}.{dep['inputs'][changed]['property']}"],
    }
    return client.post("/_dash-update-component", json=body)


def data_url(blob: bytes) -> str:
    """`blob` as dcc.Upload hands a file to a callback."""
    return "data:application/gzip;base64," + base64.b64encode(blob).decode()
