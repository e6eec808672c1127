"""CI runs the README's test command word for word (.ci/run copies it: a fresh clone has nothing
else to read it from before the venv exists)."""

from __future__ import annotations

from tests.conftest import REPO


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    (command,) = [ci[i + 1] for i, line in enumerate(ci) if line.startswith("# The README's test command")]
    readme = (REPO / "README.md").read_text().splitlines()
    assert command in readme, command
    # Both halves together run every test: the parallel one deselects exactly what the serial one selects.
    assert '-m "not multirank"' in command and "-m multirank" in command
