"""The README's excerpts of `ptprof analyze` and `ptprof project` on the shipped samples are what
the commands print now, line for line (a user compares them with their own first run: they had
gone stale after the samples were re-recorded, 432 ms in the README against 55.4 ms printed)."""

from __future__ import annotations

import pytest

from tests.conftest import REPO, ptprof


def _block_after(intro: str) -> list[str]:
    """The lines of the first ``` block after `intro` in the README."""
    text = (REPO / "README.md").read_text()
    start = text.index("```\n", text.index(intro)) + len("```\n")
    return text[start:text.index("```", start)].rstrip("\n").split("\n")


def _in_order(excerpt: list[str], printed: list[str]) -> list[str]:
    """The excerpt's lines that are not in the printed output in the same order (an excerpt may skip rows)."""
    missing, at = [], 0
    for line in excerpt:
        try:
            at = printed.index(line, at) + 1
        except ValueError:
            missing.append(line)
    return missing


@pytest.mark.parametrize("intro, args", [
    ("An excerpt of `ptprof analyze traces/sample-fsdp-2r`:", ["analyze", "traces/sample-fsdp-2r"]),
    ("and of `ptprof analyze traces/sample-ddp-2r traces/sample-fsdp-2r`", ["analyze", "traces/sample-ddp-2r", "traces/sample-fsdp-2r"]),
    ("The first prints (numbers from the shipped sample):", ["project", "traces/sample-ddp-2r", "--cluster", "traces/sample-ddp-2r"]),
], ids=["analyze", "side by side", "project"])
def test_a_readme_excerpt_is_what_the_command_prints(tmp_path, intro, args):
    res = ptprof(*args, env={"PTPROF_CACHE_DIR": str(tmp_path)}, cwd=REPO)
    assert res.returncode == 0, res.stderr
    excerpt = [line for line in _block_after(intro) if "..." not in line]  # "assumptions ... ": cut in the README
    assert len(excerpt) >= 5
    assert _in_order(excerpt, res.stdout.split("\n")) == []
