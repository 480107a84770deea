"""A relay's window over one partition: copies read ahead, waiting for their due time.

Copies enter in offset order (:meth:`DueWindow.add`); :meth:`DueWindow.take_due` hands
out those due, in due-time order (ties by offset), whatever their offsets; once the
broker confirmed them, :meth:`DueWindow.done` forgets them. :attr:`DueWindow.commit_at`
is the offset to commit: the lowest offset still held (taken or not), or past the last
copy read when none is. It never passes a copy not yet republished, so a crash
republishes at most the window again (at least once).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class DueWindow(Generic[T]):
    """Copies of one partition held in memory until due, at most ``bound`` of them."""

    bound: int
    _waiting: list[tuple[int, int, T]] = field(default_factory=list)
    """Heap of ``(due_ms, offset, copy)`` not yet handed out."""
    _held: set[int] = field(default_factory=set)
    """Offsets read and not yet republished (waiting or taken)."""
    _next: int | None = None
    """Past the last offset read (None: nothing read yet)."""

    def __len__(self) -> int:
        return len(self._held)

    @property
    def full(self) -> bool:
        """No room for another copy: pause the partition until copies leave."""
        return len(self._held) >= self.bound

    def add(self, offset: int, due_ms: int, copy: T) -> bool:
        """Hold ``copy`` (read at ``offset``) until due; False: that offset was read already."""
        if self._next is not None and offset < self._next:
            return False
        heapq.heappush(self._waiting, (due_ms, offset, copy))
        self._held.add(offset)
        self._next = offset + 1
        return True

    def skip(self, offset: int) -> None:
        """``offset`` was read and needs no republish (not a chain copy)."""
        if self._next is None or offset >= self._next:
            self._next = offset + 1

    def next_due(self) -> int | None:
        """When the earliest copy not yet handed out is due (epoch ms; None: none)."""
        return self._waiting[0][0] if self._waiting else None

    def take_due(self, now_ms: float) -> list[tuple[int, T]]:
        """``(offset, copy)`` of every copy due by ``now_ms``, in due order, ties by offset.

        They stay held (commit stops at them) until :meth:`done`, or :meth:`put_back`.
        """
        out: list[tuple[int, T]] = []
        while self._waiting and self._waiting[0][0] <= now_ms:
            _, offset, copy = heapq.heappop(self._waiting)
            out.append((offset, copy))
        return out

    def put_back(self, taken: Iterable[tuple[int, T]], due_ms: int) -> None:
        """Copies whose republish failed: handed out again from ``due_ms``."""
        for offset, copy in taken:
            heapq.heappush(self._waiting, (due_ms, offset, copy))

    def done(self, offsets: Iterable[int]) -> None:
        """The broker confirmed these copies: they no longer hold the commit back."""
        self._held.difference_update(offsets)

    @property
    def commit_at(self) -> int | None:
        """The offset to commit (None: nothing read yet)."""
        if self._held:
            return min(self._held)
        return self._next
