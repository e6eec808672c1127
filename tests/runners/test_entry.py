"""The `ptprof` console script (runners/entry.py): analyze/project/plan/view handed over before the
runners' modules are imported, and a Ctrl-C while `run`/`list` import them is one line."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

HANDOVER = """
import os, runpy, sys
import runners.entry as e
os.execv = lambda exe, args: (print("EXEC", *args[1:4], "cli imported:", "runners.cli" in sys.modules), sys.exit(0))
runpy.run_module = lambda module, run_name, alter_sys: (
    print("RUN", module, run_name, *sys.argv[1:2], "cli imported:", "runners.cli" in sys.modules), sys.exit(0))
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
    # analyze/project/plan run as `python -m profiler` in this process; the viewer is exec'd.
    for command in ("analyze", "project", "plan"):
        res = _python(HANDOVER, command, "x")
        assert res.stdout.split() == ["RUN", "profiler", "__main__", command, "cli", "imported:", "False"], res.stdout + res.stderr
    res = _python(HANDOVER, "view", "x")
    assert res.stdout.split() == ["EXEC", "-m", "viewer", "view", "cli", "imported:", "False"], res.stdout + res.stderr


def test_the_console_script_gives_python_m_profilers_status_and_output(tmp_path):
    """In-process, exit statuses and streams are those of `python -m profiler`."""
    script = "import sys\nfrom runners.entry import main\nsys.exit(main())"
    for args, status in ((["analyze", str(tmp_path / "missing")], 2), (["analyze", "--help"], 0), (["plan"], 2)):
        ours = _python(script, *args)
        theirs = subprocess.run([sys.executable, "-m", "profiler", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert (ours.returncode, ours.stdout, ours.stderr) == (theirs.returncode, theirs.stdout, theirs.stderr)
        assert ours.returncode == status


def test_a_ctrl_c_while_run_or_list_imports_is_one_line():
    res = _python(INTERRUPTED)
    assert res.returncode == 130 and res.stderr == "ptprof: interrupted\n", res.stderr


def test_a_ctrl_c_while_python_m_profiler_imports_is_one_line():
    code = """
import runpy, sys
class Stop:  # a Ctrl-C while profiler.cli is imported, before the command's own handling
    def find_spec(self, name, path=None, target=None):
        if name == "profiler.cli":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Stop())
sys.argv = ["ptprof", "analyze", "x"]
runpy.run_module("profiler", run_name="__main__", alter_sys=True)
"""
    res = _python(code)
    assert res.returncode == 130 and res.stderr == "ptprof analyze: interrupted\n", res.stderr


def test_a_ctrl_c_while_the_console_script_hands_analyze_over_names_the_command():
    code = """
import sys
class Stop:  # a Ctrl-C while runpy finds python -m profiler
    def find_spec(self, name, path=None, target=None):
        if name == "profiler.__main__":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Stop())
import runners.entry as e
sys.exit(e.main(["analyze", "x"]))
"""
    res = _python(code)
    assert res.returncode == 130 and res.stderr == "ptprof analyze: interrupted\n", res.stderr


def test_a_ctrl_c_python_would_drop_during_analyzes_imports_still_stops_it():
    """Python prints a KeyboardInterrupt raised in a weakref callback (its import machinery uses
    them) as "Exception ignored" and goes on: `ptprof analyze` ran to the end and exited 0. The
    imports run with Ctrl-C held (profiler.startup.ctrl_c_held): it stops the command after them."""
    code = """
import contextlib, gc, os, signal, sys, time, weakref
import profiler.cli as cli

@contextlib.contextmanager
def imports(freeze=False):
    class Lock:
        pass
    def callback(_):  # as importlib's module-lock callback: the Ctrl-C lands in here
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            time.sleep(0.001)  # the signal's handler runs here, inside the callback
    lock = Lock()
    ref = weakref.ref(lock, callback)
    del lock
    yield

cli.collector_paused = imports
sys.exit(cli.main(["analyze", sys.argv[1], "--quiet"]))
"""
    res = _python(code, str(REPO / "traces" / "sample-ddp-2r" / "rank0.json.gz"))
    assert res.returncode == 130 and res.stderr == "ptprof analyze: interrupted\n", (res.returncode, res.stderr)
