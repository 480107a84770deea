"""Where a partition's state stands: one position per source, and the phase.

Stored in the partition's store (``meta`` space) in the same atomic write as the state
it describes, and carried by every changelog batch, so a worker that takes the
partition over restores state and checkpoint together. Catching up from the event store
and then going live is a checkpoint transition (``caught_up``), not another runner.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson

from ..errors import StoreFormatError

FORMAT = 2
"""Layout of stores and changelogs: 2 = stream versions once per partition (0.2)."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """``live``: the next live-source position (None: never live). ``history``: the next
    event-store position to replay (None: nothing replayed). ``caught_up``: the replay
    reached the store's head and the partition went live. ``changelog``: the next
    changelog offset to restore from. ``written_ms``: wall clock of the last write."""

    live: int | None = None
    history: int | None = None
    caught_up: bool = False
    changelog: int = 0
    written_ms: int = 0

    def advanced(self, **changes: Any) -> Checkpoint:
        return replace(self, **changes)

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "format": FORMAT,
                "live": self.live,
                "history": self.history,
                "caught_up": self.caught_up,
                "changelog": self.changelog,
                "written_ms": self.written_ms,
            }
        )

    def positions(self) -> bytes:
        """What a changelog batch carries: the source positions and the phase."""
        body = {"live": self.live, "history": self.history, "caught_up": self.caught_up}
        return orjson.dumps(body)

    def with_positions(self, raw: bytes) -> Checkpoint:
        """This checkpoint with the positions of a changelog checkpoint record."""
        body = orjson.loads(raw)
        return replace(
            self,
            live=body.get("live"),
            history=body.get("history"),
            caught_up=bool(body.get("caught_up")),
        )

    @classmethod
    def decode(cls, raw: bytes | None, where: str = "") -> Checkpoint:
        if raw is None:
            return cls()
        body = orjson.loads(raw)
        if body.get("format") != FORMAT:
            raise StoreFormatError(
                f"table store {where} has checkpoint format {body.get('format', 1)}, this "
                f"streamapp writes format {FORMAT} (stream versions once per partition). "
                "Remove the store directory and its changelog topic; the partition is then "
                "rebuilt from its source."
            )
        return cls(
            live=body.get("live"),
            history=body.get("history"),
            caught_up=bool(body.get("caught_up")),
            changelog=int(body.get("changelog") or 0),
            written_ms=int(body.get("written_ms") or 0),
        )
