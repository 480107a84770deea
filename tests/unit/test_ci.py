"""CI runs the README's two commands, in a new user's order, and then the acceptance
scenarios: a demo that fails fails the run (it once broke for a whole round unseen,
because nothing ran it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _steps(script: str) -> list[str]:
    """The commands of a shell script, comments and blank lines left out."""
    lines = (line.split("#", 1)[0].strip() for line in script.splitlines())
    return [line for line in lines if line]


def test_ci_runs_the_demo_then_the_tests_then_the_acceptance_scenarios() -> None:
    steps = _steps((ROOT / ".ci" / "run").read_text())
    assert "set -euo pipefail" in steps  # any step that fails fails the run
    makes = [s for s in steps if s.startswith("make ")]
    assert makes == ["make demo", "make test", "make acceptance"]
    assert steps.index("set -euo pipefail") < steps.index("make demo")


def test_the_readme_gives_the_two_commands_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^make demo\b", readme, re.M)
    assert re.search(r"^make test\b", readme, re.M)


def test_make_targets_run_their_scripts() -> None:
    """Each target's recipe, as make itself reads it (``make -n``)."""
    for target, script in (
        ("demo", "scripts/demo"),
        ("test", "scripts/test"),
        ("acceptance", "scripts/acceptance"),
    ):
        recipe = subprocess.run(
            ["make", "-n", "-C", str(ROOT), target], capture_output=True, text=True, check=True
        ).stdout
        assert script in recipe, (target, recipe)


def test_the_suite_and_the_acceptance_run_split_the_tests() -> None:
    """make test leaves out exactly what make acceptance runs, and the acceptance run
    fails when it collects nothing (a marker typo would otherwise pass it empty)."""
    test = (ROOT / "scripts" / "test").read_text()
    acceptance = (ROOT / "scripts" / "acceptance").read_text()
    assert '-m "not serial and not acceptance"' in test
    assert '-m "serial and not acceptance"' in test
    assert "-m acceptance" in acceptance
    assert '"$rc" -eq 5' in acceptance
