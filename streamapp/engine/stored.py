"""A partition's share of the event store's rows, as the deliveries its task replays.

The store feed (:mod:`streamapp.catchup`) reads the global order in large chunks; each
partition task gets the rows of its partition as a :class:`Share`, whose deliveries are
made one at a time as they are iterated, so no object per event lives as long as its chunk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import repeat
from operator import add, length_hint
from typing import NamedTuple, overload

from ..eventstore.base import StoredRow
from ..records import Headers

_new = tuple.__new__


class StoredDelivery(NamedTuple):
    """A replayed event as a :class:`~streamapp.engine.delivery.Delivery`: a
    :data:`StoredRow` and the task's topic and partition, made in one tuple addition."""

    position: int
    stream_id: str
    version: int
    """The event's stream version, from the store's column (checked before decoding)."""
    value: bytes
    topic: str
    partition: int
    headers: Headers

    @property
    def key(self) -> bytes:
        return self.stream_id.encode()


class Share(Sequence[StoredDelivery]):
    """One partition's deliveries of a stored chunk, each made as it is iterated: one
    lives only while its event is handled (see :data:`StoredRow` for why no object per
    event should live as long as its chunk)."""

    __slots__ = ("_indexes", "_iterating", "_rows", "_tail")

    def __init__(self, rows: list[StoredRow], indexes: list[int], topic: str, partition: int):
        self._rows, self._indexes = rows, indexes
        self._tail: tuple[str, int, Headers] = (topic, partition, ())
        self._iterating: Iterator[int] | None = None

    def taken(self) -> int:
        """How many deliveries its first iteration has handed out (progress, read
        without a cost per event: the index iterator's length hint)."""
        if self._iterating is None:
            return 0
        return len(self._indexes) - length_hint(self._iterating)

    def __len__(self) -> int:
        return len(self._indexes)

    @overload
    def __getitem__(self, i: int) -> StoredDelivery: ...
    @overload
    def __getitem__(self, i: slice) -> Share: ...
    def __getitem__(self, i: int | slice) -> StoredDelivery | Share:
        if isinstance(i, slice):
            topic, partition, _ = self._tail
            return Share(self._rows, self._indexes[i], topic, partition)
        return _new(StoredDelivery, self._rows[self._indexes[i]] + self._tail)

    def __iter__(self) -> Iterator[StoredDelivery]:
        indexes = iter(self._indexes)
        if self._iterating is None:
            self._iterating = indexes
        rows = map(self._rows.__getitem__, indexes)
        return map(_new, repeat(StoredDelivery), map(add, rows, repeat(self._tail)))
