"""The `ptprof` console script (runners/entry.py): analyze/project/plan/view handed over before the
runners' modules are imported, and a Ctrl-C while `run`/`list` import them is one line."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

HANDOVER = """
import os, sys
import runners.entry as e
os.execv = lambda exe, args: (print("EXEC", *args[1:4], "cli imported:", "runners.cli" in sys.modules), sys.exit(0))
e.main(sys.argv[1:])
"""

INTERRUPTED = """
import sys
class Stop:  # a Ctrl-C while runners.cli's imports run
    def find_spec(self, name, path=None, target=None):
        if name == "runners.cli":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Stop())
import runners.entry as e
sys.exit(e.main(["list"]))
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_analyze_is_handed_over_without_the_runners_modules():
    for command, module in (("analyze", "profiler"), ("plan", "profiler"), ("view", "viewer")):
        res = _python(HANDOVER, command, "x")
        assert res.stdout.split() == ["EXEC", "-m", module, command, "cli", "imported:", "False"], res.stdout + res.stderr


def test_a_ctrl_c_while_run_or_list_imports_is_one_line():
    res = _python(INTERRUPTED)
    assert res.returncode == 130 and res.stderr == "ptprof: interrupted\n", res.stderr
