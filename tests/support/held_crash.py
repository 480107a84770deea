"""``python -m tests.support.held_crash worker ...``: the streamapp CLI with a crash point
in a held stream's park, for the held-stream tests.

A lane that holds streams parks an event (the broker, or the event store's rows, has
confirmed the copy) before the batch that records the hold is written: a ``kill -9`` in
between leaves a parked copy that the lane's state does not know of. This launcher wraps
the park's two places (no production code knows about it) and kills its own process
with SIGKILL, once, right after the named one, then calls the CLI's ``main``:

- ``held`` (``STREAMAPP_TEST_HELD_CRASH``): the event that failed is parked and its
  stream held in the open batch (:func:`streamapp.engine.hold.hold_failed` returned);
- ``behind``: a later event of a held stream is parked behind it and kept in the open
  batch (:meth:`streamapp.tables.partition.PartitionTables.keep` returned).

``STREAMAPP_TEST_HELD_CRASH_ONCE`` names a file made just before the kill: with it there,
the worker runs on without crashing.
"""

from __future__ import annotations

import functools
import os
import signal
from pathlib import Path
from typing import Any

POINTS = ("held", "behind")
AT = "STREAMAPP_TEST_HELD_CRASH"
ONCE = "STREAMAPP_TEST_HELD_CRASH_ONCE"


def _kill(point: str) -> None:
    once = Path(os.environ[ONCE])
    if os.environ.get(AT) != point or once.exists():
        return
    once.write_text(point)
    os.kill(os.getpid(), signal.SIGKILL)


def install() -> None:
    """Wrap the two places a held stream's park lands in the open batch."""
    from streamapp.engine import settle
    from streamapp.tables.partition import PartitionTables

    original_hold = settle.hold_failed

    @functools.wraps(original_hold)
    async def hold_failed(*args: Any, **kwargs: Any) -> bool:
        parked = await original_hold(*args, **kwargs)
        if parked:
            _kill("held")
        return parked

    settle.hold_failed = hold_failed  # type: ignore[assignment]

    original_keep = PartitionTables.keep

    @functools.wraps(original_keep)
    def keep(self: PartitionTables, *args: Any, **kwargs: Any) -> None:
        original_keep(self, *args, **kwargs)
        _kill("behind")

    PartitionTables.keep = keep  # type: ignore[method-assign]


def main() -> None:
    if os.environ.get(AT) not in POINTS:
        raise SystemExit(f"{AT} must be one of {', '.join(POINTS)}")
    install()
    from streamapp.cli import main as cli

    cli(prog_name="streamapp")


if __name__ == "__main__":
    main()
