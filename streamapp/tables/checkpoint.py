"""Where a partition's state stands: one position per source, the phase, and what the
state was made from.

Stored in the partition's store (``meta`` space) in the same atomic write as the state
it describes, and carried by every changelog batch, so a worker that takes the
partition over restores state and checkpoint together. Catching up from the event store
and then going live is a checkpoint transition (``caught_up``), not another runner.

The provenance (``store``, ``partitions``, ``tables``) says which source the state is
derived from; :mod:`streamapp.engine.provenance` checks it when the partition opens.
Checkpoints of an older streamapp lack it (same ``format``: they stay readable).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from typing import Any

import orjson

from ..errors import StoreFormatError

FORMAT = 2
"""Layout of stores and changelogs: 2 = stream versions once per partition (0.2)."""

PROVENANCE = ("store", "partitions", "tables")
"""The checkpoint's fields that say what the state was made from (None: not recorded,
a checkpoint of an older streamapp)."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """``live``: the next live-source position (None: never live). ``history``: the next
    event-store position to replay (None: nothing replayed). ``caught_up``: the replay
    reached the store's head and the partition went live. ``changelog``: the next
    changelog offset to restore from. ``written_ms``: wall clock of the last write.

    ``store``: the identity of the event store whose positions ``history`` counts.
    ``partitions``: the source's partition count the state was split by. ``tables``:
    the names of the agent's tables the state holds (sorted).

    ``resent``: the last entry of the event store's resend log this lane has handled
    (``streamapp store parked replay``): parked rows sent back are applied once."""

    live: int | None = None
    history: int | None = None
    caught_up: bool = False
    changelog: int = 0
    written_ms: int = 0
    store: str | None = None
    partitions: int | None = None
    tables: tuple[str, ...] | None = None
    mark: str = ""
    marked: int = -1
    resent: int = 0

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
                **self._provenance(),
                "mark": self.mark,
                "marked": self.marked,
                "resent": self.resent,
            }
        )

    def positions(self) -> bytes:
        """What a changelog batch carries: the source positions, the phase and the
        provenance (so a state restored on another worker is checked alike) and the
        batch's mark."""
        body: dict[str, Any] = {
            "live": self.live,
            "history": self.history,
            "caught_up": self.caught_up,
            **self._provenance(),
        }
        if self.mark:
            body["mark"] = self.mark
        return orjson.dumps(body)

    def with_positions(self, raw: bytes, offset: int = -1) -> Checkpoint:
        """This checkpoint with the positions of a changelog checkpoint record (at
        changelog ``offset``) and its provenance, when the record has it (one of an older
        streamapp has none)."""
        body = orjson.loads(raw)
        return replace(
            self,
            live=body.get("live"),
            history=body.get("history"),
            caught_up=bool(body.get("caught_up")),
            mark=str(body.get("mark") or ""),
            marked=offset,
            **{k: v for k, v in _provenance_of(body).items() if v is not None},
        )

    def _provenance(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.store is not None:
            out["store"] = self.store
        if self.partitions is not None:
            out["partitions"] = self.partitions
        if self.tables is not None:
            out["tables"] = list(self.tables)
        return out

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
            mark=str(body.get("mark") or ""),
            marked=int(body.get("marked", -1)),
            resent=int(body.get("resent") or 0),
            **_provenance_of(body),
        )


def _provenance_of(body: dict[str, Any]) -> dict[str, Any]:
    store, partitions, tables = (body.get(k) for k in PROVENANCE)
    return {
        "store": None if store is None else str(store),
        "partitions": None if partitions is None else int(partitions),
        "tables": None if tables is None else tuple(str(t) for t in tables),
    }


def new_mark() -> str:
    """A fresh batch mark: 64 random bits, never equal across changelog incarnations."""
    return secrets.token_hex(8)
