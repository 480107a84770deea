"""No module of ``streamapp/`` grows past 500 lines (issue 16): a module that does is
doing more than one job; split it by responsibility, as ``engine/`` and ``cli/`` are."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "streamapp"
LIMIT = 500


def test_no_module_of_streamapp_is_over_500_lines() -> None:
    sizes = {
        str(path.relative_to(PACKAGE.parent)): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert len(sizes) > 50, sizes  # the walk found the package
    over = {name: lines for name, lines in sizes.items() if lines > LIMIT}
    assert not over, f"modules over {LIMIT} lines, split them by responsibility: {over}"
