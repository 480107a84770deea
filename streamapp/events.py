"""The CloudEvent (spec 1.0) that agents see, with stream id and version helpers.

The stream id is the ``streamid`` extension, else ``subject``; the stream version (the
1-based position of the event in its stream) is the ``streamversion`` extension.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic

from typing_extensions import TypeVar

from .errors import DataError
from .records import refuse_extensions

SPECVERSION = "1.0"
REQUIRED = ("id", "source", "type", "specversion")
OPTIONAL = ("subject", "time", "datacontenttype", "dataschema")
CORE = frozenset(REQUIRED + OPTIONAL)
TRACEPARENT, TRACESTATE = "traceparent", "tracestate"
"""The CloudEvents distributed-tracing extension: the W3C trace context of the event's
start (its append or send), kept unchanged along every hop (:mod:`streamapp.tracing`)."""
TRACE_CONTEXT = frozenset({TRACEPARENT, TRACESTATE})


D = TypeVar("D", default=Any)
"""What an event's ``data`` is: ``Any`` (decoded JSON, bytes or None) unless the agent
declares models for its types (:class:`streamapp.agents.typed.EventTypes`): then
``Event[OrderPlaced | OrderPaid]``."""


@dataclass(frozen=True, slots=True)
class Event(Generic[D]):
    """One CloudEvent. ``data`` is decoded JSON for JSON content types, else bytes or None;
    for an agent with event models (``events=``), the model of its type. An event a codec
    decoded reads its data when first asked for it (:class:`LazyEvent`): a handler that
    never reads ``data`` never pays for decoding it."""

    id: str
    source: str
    type: str
    specversion: str = SPECVERSION
    subject: str | None = None
    time: str | None = None
    datacontenttype: str | None = None
    dataschema: str | None = None
    data: D = None  # type: ignore[assignment]
    extensions: Mapping[str, str] = field(default_factory=dict)

    @property
    def stream_id(self) -> str | None:
        """The key of the event's stream: ``streamid`` extension, else ``subject``."""
        return self.extensions.get("streamid") or self.subject or None

    @property
    def stream_version(self) -> int | None:
        """The event's 1-based position in its stream, when the producer knew it."""
        raw = self.extensions.get("streamversion")
        return None if raw is None else int(raw)

    @classmethod
    def create(
        cls,
        type: str,
        *,
        stream_id: str,
        data: Any = None,
        source: str = "streamapp",
        version: int | None = None,
        id: str | None = None,
        time: str | None = None,
        extensions: Mapping[str, str] | None = None,
    ) -> Event:
        """A new event on stream ``stream_id`` with JSON ``data`` and a fresh id.

        Raises ReservedNameError (a ValueError) for an extension whose name is reserved
        (:mod:`streamapp.records`: ``ce_``, ``cloudEvents_``, the chain's ``x-`` names,
        ``streamapp-``)."""
        ext = dict(extensions or {})
        if ext:
            refuse_extensions(ext, f"event of type {type!r} on stream {stream_id!r}")
        ext["streamid"] = stream_id
        if version is not None:
            if version < 1:
                raise ValueError(f"stream version of {stream_id!r} must be >= 1, got {version}")
            ext["streamversion"] = str(version)
        return cls(
            id=id or str(uuid.uuid4()),
            source=source,
            type=type,
            time=time or datetime.now(UTC).isoformat(),
            datacontenttype="application/json" if not isinstance(data, bytes) else None,
            data=data,
            extensions=ext,
        )

    def attributes(self) -> dict[str, str]:
        """Every context attribute that is set, extensions included, as strings."""
        out = {
            "id": self.id,
            "source": self.source,
            "type": self.type,
            "specversion": self.specversion,
        }
        for name in OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        out.update(self.extensions)
        return out


class _Unfrozen(Generic[D]):
    """The slot layout of :class:`Event` without its frozen ``__setattr__`` (with its
    base too: ``__class__`` assignment needs both)."""

    __slots__ = Event.__slots__


def build_event(
    id: str,
    source: str,
    type: str,
    specversion: str,
    subject: str | None,
    time: str | None,
    datacontenttype: str | None,
    dataschema: str | None,
    data: Any,
    extensions: Mapping[str, str],
) -> Event:
    """``Event(...)`` for decoders on the hot path: the same frozen Event, built without
    the frozen-dataclass ``__init__`` (a guarded ``setattr`` per field). The fields are
    set on an object of the same slot layout, which then becomes an Event (``__class__``
    assignment, which Python allows between identical layouts): plain slot stores are
    the fastest way to fill one. ``data`` an :class:`Unread` makes a :class:`LazyEvent`."""
    event: Any = _Unfrozen()
    event.id = id
    event.source = source
    event.type = type
    event.specversion = specversion
    event.subject = subject
    event.time = time
    event.datacontenttype = datacontenttype
    event.dataschema = dataschema
    event.data = data
    event.extensions = extensions
    event.__class__ = LazyEvent if data.__class__ is Unread else Event
    built: Event = event
    return built


Read = Callable[[Event, Any], Any]
"""How an event's data is read when first asked for: ``read(event, raw)`` gives its value
from the bytes (or the value) it came with, or raises :class:`~streamapp.errors.DataError`
saying why it cannot (never anything else)."""


class Unread:
    """What a :class:`LazyEvent`'s ``data`` slot holds until first read: the data as it
    came (``raw``: JSON bytes, a decoded value) and how it is read (``read``)."""

    __slots__ = ("raw", "read")

    def __init__(self, raw: Any, read: Read) -> None:
        self.raw, self.read = raw, read


_data_slot = Event.__dict__["data"]  # the slot under LazyEvent's ``data`` property
_slot_data: Callable[[Event], Any] = _data_slot.__get__
_set_slot_data: Callable[[Event, Any], None] = _data_slot.__set__


class LazyEvent(Event):
    """An Event whose ``data`` is read when first asked for, once: the value then
    replaces the :class:`Unread` in its slot, so every later read (another lane's, the
    handler's again) is a slot load. A read that fails raises
    :class:`~streamapp.errors.DataError` there, each time it is asked (inside a handler
    or a filter: NOT_DELIVERABLE, under the agent's failure policy). It compares equal to
    an Event of the same fields (its data read to compare). No slots of its own: built
    as :func:`build_event` builds events."""

    __slots__ = ()

    @property
    def data(self) -> Any:
        value = _slot_data(self)
        if value.__class__ is Unread:
            value = value.read(self, value.raw)
            _set_slot_data(self, value)
        return value

    @data.setter
    def data(self, value: Any) -> None:
        """Only the dataclass ``__init__`` sets it (``dataclasses.replace``): the event is
        frozen to everything else."""
        _set_slot_data(self, value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return _fields(self) == _fields(other)

    __hash__ = Event.__hash__

    def __repr__(self) -> str:
        try:
            data = repr(self.data)
        except DataError as exc:  # a repr (a log line) never raises for bad data
            data = f"<not readable: {exc.reason}>"
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in _REPR)
        return f"Event({shown}, data={data}, extensions={self.extensions!r})"


_REPR = (*REQUIRED, *OPTIONAL)


def _fields(event: Event) -> tuple[Any, ...]:
    """What equality compares: every field, data that cannot be read by what it came as
    (a comparison never raises)."""
    try:
        data = event.data
    except DataError:
        data = (Unread, raw_data(event))
    return (*(getattr(event, name) for name in _REPR), data, event.extensions)


def raw_data(event: Event) -> Any:
    """``event``'s data as it came, without reading it: the :class:`Unread`'s raw bytes
    (or value) while unread, else the data itself."""
    value = _slot_data(event)
    return value.raw if value.__class__ is Unread else value


def data_unread(event: Event) -> bool:
    """True while ``event``'s data has not been read (nothing decoded yet)."""
    return _slot_data(event).__class__ is Unread
