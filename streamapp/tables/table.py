"""Tables: typed key/value state of an agent, partitioned like its source.

A :class:`Table` is a declaration. During a batch, the agent sees a :class:`TableView`
of one partition: reads and writes hit an in-memory overlay (the batch's changes, with
an undo record per write of the current event), and the batch's changes reach the store
in one atomic write together with the checkpoint (see :mod:`streamapp.tables.partition`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

import msgspec
import orjson

from ..errors import ForeignKeyError
from ..topics import Partitioner, TopicSpec, partition_for
from .base import Store

V = TypeVar("V")
_MISSING: Any = object()


class ValueCodec(Protocol[V]):
    """Turns table values into bytes and back. Never pickle."""

    def dumps(self, value: V) -> bytes: ...

    def loads(self, raw: bytes) -> V: ...


class JsonCodec:
    """JSON values (orjson): dicts, lists, strings, numbers, booleans."""

    def dumps(self, value: Any) -> bytes:
        return orjson.dumps(value)

    def loads(self, raw: bytes) -> Any:
        return orjson.loads(raw)


class StructCodec(Generic[V]):
    """Typed values (``Table(..., value_type=T)``) encoded by msgspec: msgpack (compact,
    the default) or JSON. Decoding checks the type; views answer them as JSON."""

    def __init__(self, value_type: type[V], encoding: str = "msgpack") -> None:
        if encoding == "msgpack":
            self.dumps: Callable[[V], bytes] = msgspec.msgpack.Encoder().encode
            self.loads: Callable[[bytes], V] = msgspec.msgpack.Decoder(value_type).decode
        elif encoding == "json":
            self.dumps = msgspec.json.Encoder().encode
            self.loads = msgspec.json.Decoder(value_type).decode
        else:
            raise ValueError(f"encoding={encoding!r}: give 'msgpack' or 'json'")
        self.value_type, self.encoding = value_type, encoding
        schema = msgspec.json.schema(value_type)
        self.schema: dict[str, Any] = schema
        """The value's JSON schema (what /openapi.json shows)."""
        digest = hashlib.sha256(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)).hexdigest()
        name = getattr(value_type, "__qualname__", repr(value_type))
        self.tag = f"{name}/{encoding}/{digest[:12]}"
        """The value type as the store's provenance records it: its name, encoding and
        schema (a change of any of them is a new table version)."""


SWITCHES = ("auto", "manual")
"""How a new table version becomes the one views answer from (``Table(switch=...)``)."""


class Table(Generic[V]):
    """A named table; its partition count is its source topic's.

    ``version`` (default 1) is part of the table's identity, ``(name, version)``: a new
    version of a projection is another table, written by another agent beside the old
    one (each agent keeps its own stores and changelog), with its own data space in
    them. Version 1 keeps the names of a table without a version (no migration).
    """

    def __init__(
        self,
        name: str,
        *,
        version: int = 1,
        value_type: type[V] | None = None,
        default: Callable[[], V] | None = None,
        encoding: str = "msgpack",
        codec: ValueCodec[V] | None = None,
        help: str = "",
        switch: str = "auto",
    ) -> None:
        if switch not in SWITCHES:
            raise ValueError(
                f"table {name!r}: switch={switch!r}; give 'auto' (views move to this version "
                "once it is built) or 'manual' (it stays built until `streamapp versions "
                "switch`)"
            )
        if not name or not all(c.isalnum() or c in "._-" for c in name):
            raise ValueError(f"table name {name!r}: use letters, digits, '.', '_' or '-'")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(
                f"table {name!r}: version={version!r}; give a whole number, at least 1 "
                "(1 is the first version; a changed projection is the next one)"
            )
        self.name = name
        self.version = version
        self.value_type = value_type
        if value_type is not None:
            if codec is not None:
                raise ValueError(f"table {name!r}: give value_type= or codec=, not both")
            try:
                codec = StructCodec(value_type, encoding)
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"table {name!r}: value_type={value_type!r} cannot be stored: {exc} (use "
                    "a msgspec.Struct, a dataclass, or a type msgspec encodes)"
                ) from None
        if default is not None and not callable(default):
            raise ValueError(
                f"table {name!r}: default={default!r} is not callable; give a factory "
                "(default=int, default=lambda: Balance(0))"
            )
        self.default = default
        """Makes the value of a missing key for ``view[key]`` (not stored until written)."""
        self.codec: ValueCodec[V] = codec if codec is not None else JsonCodec()
        self.help = help
        self.switch = switch
        """``auto``: views answer from this version once it is live on every partition;
        ``manual``: it stays ``built`` until ``streamapp versions switch`` is run."""

    @property
    def label(self) -> str:
        """``name`` for version 1, ``name@vN`` above it: the table's identity in logs,
        metrics, errors, its data space and its changelog records."""
        return self.name if self.version == 1 else f"{self.name}@v{self.version}"

    @property
    def identity(self) -> str:
        """What the store's provenance records of the table: its label, and its value type
        for a typed table (``label:Type/encoding/schema``), so that a store of another
        value type is refused, never misread."""
        tag = getattr(self.codec, "tag", None)
        return self.label if tag is None else f"{self.label}:{tag}"

    @property
    def data_space(self) -> str:
        return "t:" + self.label

    def __repr__(self) -> str:
        if self.version == 1:
            return f"Table({self.name!r})"
        return f"Table({self.name!r}, version={self.version})"


def scan(
    store: Store, space: str, *, prefix: bytes = b"", after: bytes | None = None, limit: int
) -> list[tuple[bytes, bytes]]:
    """Up to ``limit`` committed items of ``space`` with keys starting with ``prefix``,
    in key order, from the first key above ``after`` (one short-lived page read)."""
    out: list[tuple[bytes, bytes]] = []
    if prefix and (after is None or after < prefix):
        first = store.get(space, prefix)  # scan() starts above a key: the prefix itself
        if first is not None:
            out.append((prefix, first))
        after = prefix
    for key, value in store.scan(space, after, limit - len(out)) if len(out) < limit else ():
        if not key.startswith(prefix):
            break
        out.append((key, value))
    return out


def foreign_key(
    table: str, key: str, partition: int, source: TopicSpec, advice: str
) -> ForeignKeyError:
    """The error for ``key`` of ``table`` used by an event of ``partition`` of ``source``
    though ``source``'s partitioner puts it on another partition. When another
    partitioner puts it on ``partition``, the likely cause is that the topic's producers
    use that one (a librdkafka client's ``crc32`` on a topic declared ``murmur2``): the
    message says how to declare it; else it gives ``advice``."""
    raw = key.encode()
    owner, used = source.partition_of(raw), source.partitioner.value
    head = (
        f"table {table!r}: key {key!r} belongs to partition {owner}, but this event is "
        f"handled in partition {partition}. Topic {source.name!r} places keys by the "
        f"partitioner {used!r} (setting app.topic({source.name!r}, ..., partitioner={used!r}))."
    )
    fits = [
        p.value
        for p in Partitioner
        if p is not source.partitioner and partition_for(raw, source.partitions, p) == partition
    ]
    if not fits:
        return ForeignKeyError(f"{head} {advice}")
    other = fits[0]
    return ForeignKeyError(
        f"{head} The {other!r} partitioner puts this key on partition {partition}: if the "
        f"key is the event's stream id, the topic's producers place keys by {other!r} "
        "('crc32' is librdkafka's default: confluent-kafka, kcat, librdkafka clients in Go, "
        "C, .NET, Node; 'murmur2' is Kafka's Java client's and Quix Streams'). Declare it, "
        f"app.topic({source.name!r}, ..., partitioner={other!r}), restart the workers, and "
        f"replay what was parked (streamapp parked replay). Otherwise: {advice}"
    )


class TableView(Generic[V]):
    """One partition of a table as the agent sees it during a batch."""

    __slots__ = (
        "_batch",
        "_dumps",
        "_loads",
        "_owned",
        "_read",
        "_space",
        "_store",
        "_undo",
        "codec",
        "partition",
        "source",
        "table",
    )

    def __init__(
        self, table: Table[V], store: Store, partition: int, source: TopicSpec | None = None
    ) -> None:
        self.table = table
        self.codec = table.codec
        self._loads: Callable[[bytes], Any] = self.codec.loads
        self._dumps: Callable[[Any], bytes] = self.codec.dumps
        if type(self.codec) is JsonCodec:  # its methods are orjson's: one Python call less
            self._loads, self._dumps = orjson.loads, orjson.dumps
        self.partition = partition
        self.source = source
        """The topic the table is partitioned like (None: writes are not checked)."""
        self._store = store
        self._space = table.data_space
        self._read = store.reader(self._space)
        self._batch: dict[bytes, bytes | None] = {}
        """The open batch's changes, the current event's included."""
        self._undo: list[tuple[bytes, bytes | None]] = []
        """What the current event's writes replaced in ``_batch`` (``_MISSING``: nothing),
        so that a failed event is rolled back and a good one costs nothing to keep."""
        self._owned: set[bytes] = set()
        """Keys already checked to belong to this partition (murmur2 is ~3 us a key)."""

    def get(self, key: str, default: Any = None) -> V | Any:
        raw = key.encode()
        value = self._batch.get(raw, _MISSING)
        if value is _MISSING:
            value = self._read(raw)
        return default if value is None else self._loads(value)

    def __getitem__(self, key: str) -> V:
        raw = self._raw(key.encode())
        if raw is None:
            default = self.table.default
            if default is not None:
                return default()
            raise KeyError(key)
        loaded: V = self._loads(raw)
        return loaded

    def __setitem__(self, key: str, value: V) -> None:
        raw = key.encode()
        if raw not in self._owned and self.source is not None:
            self._check_owned(key, raw)
        encoded = self._dumps(value)
        batch = self._batch
        self._undo.append((raw, batch.get(raw, _MISSING)))
        batch[raw] = encoded

    def __delitem__(self, key: str) -> None:
        raw = key.encode()
        if raw not in self._owned and self.source is not None:
            self._check_owned(key, raw)
        batch = self._batch
        self._undo.append((raw, batch.get(raw, _MISSING)))
        batch[raw] = None

    def _check_owned(self, key: str, raw: bytes) -> None:
        assert self.source is not None
        if self.source.partition_of(raw) != self.partition:
            raise foreign_key(
                self.table.label,
                key,
                self.partition,
                self.source,
                "A table is partitioned like its source: write only keys of the event's own "
                "stream id (re-key the source with group_by= so that the key is the stream id).",
            )
        if len(self._owned) >= 100_000:
            self._owned.clear()
        self._owned.add(raw)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._raw(key.encode()) is not None

    def items(self, page: int = 1000, *, prefix: str = "") -> Iterator[tuple[str, V]]:
        """Committed items of this partition (not the open batch's changes), in key order,
        only keys starting with ``prefix``, read in pages so that no store iterator
        outlives a page."""
        after: bytes | None = None
        while True:
            rows = scan(self._store, self._space, prefix=prefix.encode(), after=after, limit=page)
            for key, raw in rows:
                yield key.decode(), self._loads(raw)
            if len(rows) < page:
                return
            after = rows[-1][0]

    def _raw(self, key: bytes) -> bytes | None:
        raw: bytes | None = self._batch.get(key, _MISSING)
        if raw is _MISSING:
            return self._read(key)
        return raw

    # The partition's runner drives the layers (PartitionTables), never a handler:
    def commit_event(self) -> None:
        """Keep the current event's writes in the open batch (the runner's, after a
        handler returned)."""
        if self._undo:
            self._undo.clear()

    def rollback_event(self) -> None:
        """Undo the current event's writes (the runner's, after a handler raised)."""
        undo, batch = self._undo, self._batch
        while undo:
            key, replaced = undo.pop()
            if replaced is _MISSING:
                del batch[key]
            else:
                batch[key] = replaced

    def take_batch(self) -> dict[bytes, bytes | None]:
        """The open batch's changes, the overlay emptied (the runner's, at a commit); an
        open event's writes stay open, out of what is taken."""
        changes, self._batch = self._batch, {}
        undo, self._undo = self._undo, []
        if undo:  # an event is open: its writes stay open, and out of the batch taken
            keys = dict.fromkeys(key for key, _ in undo)
            self._batch = {key: changes[key] for key in keys}
            self._undo = [(key, _MISSING) for key in keys]
            for key, replaced in reversed(undo):
                if replaced is _MISSING:
                    del changes[key]
                else:
                    changes[key] = replaced
        return changes
