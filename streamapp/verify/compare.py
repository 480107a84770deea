"""A live table checked against its rebuild from the event store, key by key
(``streamapp verify``).

Each key is compared at the point the live table has reached for it: the live side
answers the key's value with its committed stream version V (the view's ``?meta=1``:
the value and the stream version come from one committed read of the key's partition),
and the rebuild folds the key's stream through the app's current handler up to
version V (:func:`~streamapp.verify.fold.fold`). A stream's events are applied in
stream-version order on every transport (the stream-version guard), so "the events of
the stream up to V" is exactly what that live value is made of: a worker behind the
store (lag) or applying while it is read is no difference, and no worker is paused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from msgspec import to_builtins

from ..app import App
from ..tables.table import Table
from .fold import StreamReader, fold

CONCURRENCY = 8
"""Keys checked at once (each a view request and a fold)."""
EXAMPLES = 10
"""Differences kept to show (all are counted)."""


class LiveReader(Protocol):
    """The live side: a key's committed value (None: no value) and stream version."""

    def __call__(self, key: str) -> Awaitable[tuple[Any, int]]: ...


@dataclass(frozen=True, slots=True)
class Difference:
    key: str
    live: Any
    rebuilt: Any
    stream_version: int
    """The stream version both sides are at (the live table's, for this key)."""
    position: int | None
    """The store position of the stream's last event folded (None: none folded)."""

    @property
    def kind(self) -> str:
        """``differ`` (both have a value), ``missing_live`` or ``missing_rebuilt``."""
        if self.live is None:
            return "missing_live"
        return "missing_rebuilt" if self.rebuilt is None else "differ"

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "live": self.live,
            "rebuilt": self.rebuilt,
            "stream_version": self.stream_version,
            "position": self.position,
        }


@dataclass(slots=True)
class Verification:
    """What ``streamapp verify`` found for one table version."""

    table: Table[Any]
    checked: int = 0
    equal: int = 0
    differ: int = 0
    missing: int = 0
    position: int = 0
    """The highest store position folded."""
    examples: list[Difference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.differ == 0 and self.missing == 0

    def summary(self) -> str:
        return (
            f"verified {self.checked:,} streams of {self.table.name} v{self.table.version} "
            f"at store position {self.position:,}: {self.equal:,} equal, {self.differ:,} "
            f"differ, {self.missing:,} missing"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table.name,
            "version": self.table.version,
            "checked": self.checked,
            "equal": self.equal,
            "differ": self.differ,
            "missing": self.missing,
            "store_position": self.position,
            "differences": [d.as_dict() for d in self.examples],
        }

    def add(self, found: Difference | None) -> None:
        self.checked += 1
        if found is None:
            self.equal += 1
            return
        if found.kind == "differ":
            self.differ += 1
        else:
            self.missing += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(found)


def as_json(value: Any) -> Any:
    """A table value as a view answers it (JSON; typed values as msgspec writes them)."""
    return None if value is None else orjson.loads(orjson.dumps(value, default=to_builtins))


async def verify(
    app: App,
    store: StreamReader,
    table: Table[Any],
    keys: Sequence[str],
    live: LiveReader,
    *,
    embedded: bool = False,
    progress: Callable[[int], None] | None = None,
) -> Verification:
    """Compare ``keys`` of ``table`` as ``live`` answers them with their fold from
    ``store`` at the same stream version."""
    result = Verification(table)
    queue = iter(keys)

    async def check(key: str) -> Difference | None:
        value, version = await live(key)
        folded = await fold(app, store, table, key, through_version=version, embedded=embedded)
        last = folded.steps[-1].position if folded.steps else None
        if last is not None:
            result.position = max(result.position, last)
        rebuilt = as_json(folded.value)
        if rebuilt == value:
            return None
        return Difference(key, value, rebuilt, version, last)

    async def worker() -> None:
        for key in queue:
            result.add(await check(key))
            if progress is not None:
                progress(result.checked)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return result
