"""A traces root folder holding the files of several jobs: its row says so, it is never one merged run."""

from __future__ import annotations

import shutil

from tests.conftest import SHARED_TRACES
from viewer.data import RunStore, run_row


def test_a_folder_of_several_jobs_shows_an_error_not_a_merged_run(tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    # rank 3 of an 8-rank job and rank 1 of a 2-rank job, recorded on different days
    for name in ("a100_rank3_of_8.json.gz", "v100_rank1_of_2.json.gz"):
        shutil.copy(SHARED_TRACES / "single" / name, mixed / name)
    shutil.copytree(SHARED_TRACES / "gpu_nccl_2_of_128", tmp_path / "one-job")
    store = RunStore(tmp_path)
    assert store.run_ids() == ["mixed", "one-job"]
    data = store.get("mixed")
    assert not data.ok and data.analysis is None
    assert "2 different jobs" in data.error and "mixed/a100_rank3_of_8" in data.error
    assert "different jobs" in run_row(data)["status"]
    assert store.get("one-job").ok
