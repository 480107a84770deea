"""A held stream: the lane state that ``Park(destination, hold="stream")`` keeps.

When an event of a stream fails for good in a lane that holds streams, the stream is
held there: its later events on that partition are parked behind the failed one without
running the handler (:mod:`streamapp.engine.hold`). What a hold is, one JSON record per
stream in the partition store's ``held`` space, written in the same atomic write as the
tables and the checkpoint and carried by the changelog (tag ``h``), so a hold survives a
``kill -9`` and moves with its partition.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class HeldStream:
    """One held stream of one lane's partition.

    ``first`` is the stream version of the first held event not applied yet (None: the
    events have none), the one that failed until a release applies it; ``position``,
    ``event`` and ``error`` are the source position, id and error of the event that
    failed last. ``events`` counts the held events not applied yet; ``last`` is the
    stream version of the last one parked (redeliveries of an event parked already are
    not parked twice).
    """

    stream: str
    first: int | None
    position: int
    event: str
    error: str
    events: int = 1
    last: int | None = None
    since_ms: int = 0
    exact: bool = True
    """``first`` is the held event's own version (the one that failed); False once a
    release applied it: ``first`` is then the lowest the next one can have (a topic may
    carry some of a stream's events only, its versions with gaps)."""

    @property
    def place(self) -> str:
        """Where the hold starts, as views say it (header ``Streamapp-Stream-Held``):
        the first held event's stream version, else ``@`` and its source position."""
        return str(self.first) if self.first is not None else f"@{self.position}"

    def behind(self, version: int | None) -> HeldStream:
        """This hold with one more event parked behind it (stream version ``version``)."""
        return replace(self, events=self.events + 1, last=version or self.last)

    def applied(self, version: int | None) -> HeldStream:
        """This hold once its first event (stream version ``version``) is applied by a
        release: the next one is at or after the version after it (a topic may carry
        some of a stream's events only)."""
        first = None if version is None else version + 1
        return replace(self, first=first, events=self.events - 1, exact=False)

    def heads(self, version: int | None) -> bool:
        """True when a copy of stream version ``version`` sent back by a release is the
        next held event: the held one itself, or after a release applied it, the first
        one sent back at or after ``first`` (copies come back in the order parked)."""
        if version is None or self.first is None:
            return True
        return version == self.first or (not self.exact and version >= self.first)

    def parked_already(self, version: int | None) -> bool:
        """True when the event of stream version ``version`` is parked here already (a
        redelivery); an event without a version is never known."""
        return version is not None and self.last is not None and version <= self.last

    def as_json(self) -> dict[str, Any]:
        """What ``?meta=1`` and ``streamapp parked list --held`` show."""
        return asdict(self)

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> HeldStream:
        body = orjson.loads(raw)
        return cls(
            stream=str(body["stream"]),
            first=None if body.get("first") is None else int(body["first"]),
            position=int(body.get("position") or 0),
            event=str(body.get("event") or ""),
            error=str(body.get("error") or ""),
            events=int(body.get("events") or 1),
            last=None if body.get("last") is None else int(body["last"]),
            since_ms=int(body.get("since_ms") or 0),
            exact=bool(body.get("exact", True)),
        )
