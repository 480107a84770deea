"""No test of the suite skips: tests/conftest.py turns a skip (from ``pytest.skip``, a
``skipif`` marker, a fixture) into a failure that says why it skipped, unless
``SKIPS_ALLOWED`` names the test with a reason (none does)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import SKIPS_ALLOWED
from tests.support.waits import run_watched

ROOT = Path(__file__).resolve().parents[2]

SKIPPING = """
import pytest


def test_skips_in_its_body() -> None:
    pytest.skip("the broker is not ours")


@pytest.mark.skipif(True, reason="not scripts/services")
def test_skips_by_marker() -> None:
    pass


def test_passes() -> None:
    pass
"""


def test_a_skipped_test_fails_naming_why(tmp_path: Path) -> None:
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    done = run_watched(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-q", "-rfE", str(tmp_path)],
        cwd=ROOT,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 1, out
    assert "1 failed, 1 passed, 1 error" in out, out
    assert "skipped (Skipped: the broker is not ours): no test of this suite may skip" in out
    assert "skipped (Skipped: not scripts/services)" in out


def test_no_test_is_allowed_to_skip() -> None:
    assert SKIPS_ALLOWED == {}
