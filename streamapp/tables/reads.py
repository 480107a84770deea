"""Co-partitioned reads: an agent reads another agent's table, never writes it.

An agent lists the table in ``reads=[...]`` (``App.agent`` checks at registration that
both source topics have the same partition count and partitioner). Its handler gets a
:class:`ReadView` of the table's partition with the same number as the event's: the
committed state of that partition's store on this worker (never the owner's open batch).
Partition ``p`` of co-partitioned topics is owned by the same worker (Kafka's range
assignor, which a worker uses when an agent reads another's table; RabbitMQ's membership
gives partition ``p`` of every topic to one member); when the partition is not live here
right now (restoring, catching up, moving, owned elsewhere), or its store fails (a
corrupt block: its owner rebuilds it), a read raises
:class:`~streamapp.errors.TableUnavailableError` and the event is UNAVAILABLE: tried
again after a pause, not counted as a failure. A table of another agent of the same topic
is read in the same partition task, whatever its phase.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic

from ..errors import StoreClosedError, StoreError, TableUnavailableError
from ..topics import TopicSpec
from .base import Store
from .table import Table, V, foreign_key, scan

Locator = Callable[[Table[Any], int], Store]
"""The committed store of a table's partition on this worker; raises
TableUnavailableError when this worker does not serve it right now."""


class ReadView(Generic[V]):
    """One partition of another agent's table, read-only, committed state."""

    __slots__ = ("_locate", "codec", "partition", "source", "table")

    def __init__(self, table: Table[V], partition: int, source: TopicSpec, locate: Locator) -> None:
        self.table, self.codec = table, table.codec
        self.partition, self.source = partition, source
        self._locate = locate

    def get(self, key: str, default: Any = None) -> V | Any:
        raw = self._raw(key)
        return default if raw is None else self.codec.loads(raw)

    def __getitem__(self, key: str) -> V:
        raw = self._raw(key)
        if raw is None:
            default = self.table.default
            if default is not None:
                return default()
            raise KeyError(key)
        return self.codec.loads(raw)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._raw(key) is not None

    def items(self, page: int = 1000, *, prefix: str = "") -> Iterator[tuple[str, V]]:
        """Committed items of this partition, in key order, in pages."""
        after: bytes | None = None
        while True:
            rows = self._scan(prefix.encode(), after, page)
            for key, raw in rows:
                yield key.decode(), self.codec.loads(raw)
            if len(rows) < page:
                return
            after = rows[-1][0]

    def _raw(self, key: str) -> bytes | None:
        raw = key.encode()
        if self.source.partition_of(raw) != self.partition:
            raise foreign_key(
                self.table.name,
                key,
                self.partition,
                self.source,
                "A table of another agent is read in place, partition by partition: read "
                "only keys of the event's partition (its stream id).",
            )
        store = self._locate(self.table, self.partition)
        try:
            return store.get(self.table.data_space, raw)
        except (StoreClosedError, StoreError) as exc:  # revoked meanwhile, or damaged
            raise self._closed(exc) from exc

    def _scan(self, prefix: bytes, after: bytes | None, page: int) -> list[tuple[bytes, bytes]]:
        store = self._locate(self.table, self.partition)
        try:
            return scan(store, self.table.data_space, prefix=prefix, after=after, limit=page)
        except (StoreClosedError, StoreError) as exc:
            raise self._closed(exc) from exc

    def _closed(self, exc: Exception) -> TableUnavailableError:
        """A store closed under the read, or failing (its owner task, told by the store,
        rebuilds a corrupt one): the event waits, as for a partition not served here."""
        return TableUnavailableError(
            f"table {self.table.name!r} partition {self.partition} cannot be read now: {exc}"
        )

    def __repr__(self) -> str:
        return f"ReadView({self.table.name!r}, partition={self.partition})"
