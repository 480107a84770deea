"""MemoryStore: a real Store in a dict per space, not durable (users' unit tests, the
in-memory broker)."""

from __future__ import annotations

from collections.abc import Iterable

from .base import Changes, OnDamage, Reader


class MemoryStore:
    """A real, non-durable Store for tests and the in-memory broker."""

    def __init__(self, spaces: Iterable[str]) -> None:
        self._spaces: dict[str, dict[bytes, bytes]] = {s: {} for s in spaces}

    def get(self, space: str, key: bytes) -> bytes | None:
        return self._spaces[space].get(key)

    def reader(self, space: str) -> Reader:
        return self._spaces[space].get

    def scan(self, space: str, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        items = sorted(self._spaces[space].items())
        if after is not None:
            items = [kv for kv in items if kv[0] > after]
        return items[:limit]

    def count(self, space: str) -> int | None:
        return len(self._spaces[space])

    def wipe(self) -> None:
        for kv in self._spaces.values():
            kv.clear()

    def watch(self, on_damage: OnDamage) -> None:
        pass  # memory is never corrupt

    def write(self, changes: Changes, *, keep: bool = True) -> None:
        unknown = [space for space in changes if space not in self._spaces]
        if unknown:  # all or nothing, like a RocksDB WriteBatch
            raise KeyError(f"unknown store space(s) {unknown}")
        for space, kv in changes.items():
            target = self._spaces[space]
            for key, value in kv.items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value

    def close(self) -> None:
        pass
