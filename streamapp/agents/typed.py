"""Typed events: an agent's event data as models, upcast from the schemas stored years ago.

An agent declares, per CloudEvent type, the model its data is (``events=``, an
:class:`EventTypes` or a plain mapping): msgspec ``Struct`` classes (the fast path) or
pydantic v2 models. Its handler, typed ``async def h(event: Event[OrderPlaced |
OrderPaid], ...)``, gets each event with ``data`` as the model of its type, decoded when
the handler first reads it (once; a handler that never reads it pays nothing). Data that
does not fit raises :class:`~streamapp.errors.DataError` there, naming the event, its
type, the model and the field: the delivery is NOT_DELIVERABLE and follows the agent's
failure policy (park, retry chain). A type without a model is passed with ``dict`` data
(``unknown="dict"``, the default) or is NOT_DELIVERABLE (``unknown="reject"``).

**Upcasting.** The store keeps events as they were written. :meth:`EventTypes.upcaster`
registers a function from one schema version of a type's data (a dict) to the next;
chains run in order (1 -> 2 -> 3) on read, in the catch-up and live alike, before the
model decodes. An event's schema version comes from ``version=`` (a function of the
event), by default from its ``dataschema``: a trailing ``v2``, ``/2`` or ``:2``; an event
without one is version 1. The version a type's model has is one more than its last
upcaster's (1 without upcasters); typed sends write it in ``dataschema``
(``{type}/v{N}``) when it is above 1.

**Typed sends.** ``send(out, OrderShipped(...), stream_id="o-1")`` builds the CloudEvent
from a registered model (:meth:`EventTypes.to_event`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

import msgspec
import orjson

from ..codecs.data import is_json_type
from ..errors import ConfigError, DataError
from ..events import Event, Unread, build_event, data_unread, raw_data
from ..records import refuse_extensions

Upcast = Callable[[dict[str, Any]], dict[str, Any]]
"""One step of a type's schema: its data at version N (a dict) to version N + 1."""
Versioner = Callable[[Event], int | None]
"""An event's schema version (None: version 1)."""
_Read = Callable[[Event, Any], Any]
"""An event's data (as the codec gave it) read as its type's model."""

_SCHEMA_VERSION = re.compile(r"(?:^|[/:#.\-_v])v?(\d+)$")


def schema_version(event: Event) -> int | None:
    """The default :data:`Versioner`: a trailing number of ``dataschema`` (``.../v2``,
    ``urn:orders:placed:2``); None without one."""
    schema = event.dataschema
    if not schema:
        return None
    found = _SCHEMA_VERSION.search(schema)
    return int(found.group(1)) if found else None


class _Model:
    """How one model class decodes and encodes (msgspec Struct or pydantic v2)."""

    __slots__ = ("cls", "from_json", "from_obj", "name", "to_obj")

    def __init__(self, event_type: str, cls: Any) -> None:
        self.cls, self.name = cls, getattr(cls, "__name__", repr(cls))
        if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
            decoder = msgspec.json.Decoder(cls)
            self.from_json: Callable[[bytes], Any] = decoder.decode
            # str_keys: decoded JSON (a replayed event's data) reads as its bytes would
            self.from_obj: Callable[[Any], Any] = lambda obj: msgspec.convert(
                obj, cls, str_keys=True
            )
            self.to_obj: Callable[[Any], Any] = msgspec.to_builtins
        elif isinstance(cls, type) and callable(getattr(cls, "model_validate", None)):
            pydantic: Any = cls
            self.from_json = pydantic.model_validate_json
            self.from_obj = pydantic.model_validate
            self.to_obj = lambda model: model.model_dump(mode="json")
        else:
            raise ConfigError(
                f"event type {event_type!r}: its model {cls!r} is neither a msgspec.Struct "
                "nor a pydantic model (a class with model_validate)"
            )

    def read(self, event: Event, data: Any) -> Any:
        """``data`` of ``event`` (JSON bytes, or decoded JSON) as the model; DataError
        naming the event, its type, the model and the field when it does not fit."""
        try:
            if type(data) is bytes:
                return self.from_json(data)
            if isinstance(data, (bytearray, memoryview)):
                return self.from_json(bytes(data))
            return self.from_obj(data)
        except Exception as exc:  # msgspec.ValidationError, pydantic's, a JSON error
            raise self.misfit(event, exc) from None

    def misfit(self, event: Event, exc: Exception) -> DataError:
        return DataError(
            f"data of event {event.id} (type {event.type!r}) does not fit "
            f"{self.name}: {_problem(exc)}"
        )


class EventTypes:
    """The models of an agent's event types, their upcasters, and what to do with a type
    that has no model (``unknown``: ``"dict"`` passes its data as decoded JSON,
    ``"reject"`` makes it NOT_DELIVERABLE)."""

    def __init__(
        self,
        models: Mapping[str, type[Any]],
        *,
        unknown: Literal["dict", "reject"] = "dict",
        version: Versioner = schema_version,
    ) -> None:
        if unknown not in ("dict", "reject"):
            raise ConfigError(f"EventTypes(unknown={unknown!r}): give 'dict' or 'reject'")
        if not models:
            raise ConfigError("EventTypes({}): name at least one event type and its model")
        self._models = {t: _Model(t, cls) for t, cls in models.items()}
        self._types: dict[Any, str] = {}
        for t, cls in models.items():
            if cls in self._types:
                raise ConfigError(
                    f"model {cls.__name__} is registered for types {self._types[cls]!r} and "
                    f"{t!r}: a typed send could not tell which; give each type its own model"
                )
            self._types[cls] = t
        self.unknown = unknown
        self._version = version
        self._upcasts: dict[str, dict[int, Upcast]] = {}
        self._readers: dict[str, _Read] = {}

    def upcaster(self, event_type: str, from_version: int) -> Callable[[Upcast], Upcast]:
        """Register ``fn(data) -> data`` from version ``from_version`` of
        ``event_type``'s data to the next (a decorator)."""
        if event_type not in self._models:
            raise ConfigError(
                f"upcaster for {event_type!r}: it has no model here (types: "
                f"{', '.join(sorted(self._models))})"
            )
        if from_version < 1:
            raise ConfigError(f"upcaster for {event_type!r}: from_version must be >= 1")

        def register(fn: Upcast) -> Upcast:
            steps = self._upcasts.setdefault(event_type, {})
            if from_version in steps:
                raise ConfigError(f"{event_type!r} has two upcasters from version {from_version}")
            steps[from_version] = fn
            self._readers.pop(event_type, None)
            return fn

        return register

    def schema_of(self, event: Event) -> int:
        """The schema version ``event``'s data was written in (1 when it names none)."""
        return self._version(event) or 1

    def current_version(self, event_type: str) -> int:
        """The schema version ``event_type``'s model reads (one past its last upcaster)."""
        steps = self._upcasts.get(event_type)
        return max(steps) + 1 if steps else 1

    def check(self) -> None:
        """ConfigError for an upcaster chain with a gap (1 -> 2, then 3 -> 4)."""
        for event_type, steps in self._upcasts.items():
            missing = sorted(set(range(1, max(steps) + 1)) - set(steps))
            if missing:
                raise ConfigError(
                    f"{event_type!r}: no upcaster from version(s) {missing}; the chain must "
                    f"run 1 -> {max(steps) + 1} without a gap"
                )

    def model_of(self, event_type: str) -> type[Any] | None:
        model = self._models.get(event_type)
        return None if model is None else model.cls

    # reading -------------------------------------------------------------------------
    def view(self, event: Event) -> Event | DataError:
        """``event`` as the handler sees it: its data decoded by its type's model when
        first read; a DataError when its type has no model and unknown types are rejected."""
        read = self._readers.get(event.type)
        if read is not None:  # per delivery: the type's reader is known after its first
            return _typed(event, read)
        model = self._models.get(event.type)
        if model is None:
            if self.unknown == "reject":
                return DataError(
                    f"event {event.id} has type {event.type!r}, which has no model in the "
                    f"agent's events (its types: {', '.join(sorted(self._models))})"
                )
            if data_unread(event):
                return event  # decoded JSON when first read (a DataError there)
            if type(raw_data(event)) is bytes and is_json_type(event.datacontenttype):
                return _typed(event, _as_obj)  # the codec left it as bytes for the models
            return event
        return _typed(event, self._reader(event.type, model))

    def _reader(self, event_type: str, model: _Model) -> _Read:
        """How data of ``event_type`` is read: by its model, after its upcasters."""
        read = self._readers.get(event_type)
        if read is None:
            steps = self._upcasts.get(event_type)
            read = model.read if not steps else functools.partial(self._upcast_read, model, steps)
            self._readers[event_type] = read
        return read

    def _upcast_read(
        self, model: _Model, steps: Mapping[int, Upcast], event: Event, data: Any
    ) -> Any:
        upcast = self._upcast(event, steps, _as_obj(event, data))
        try:
            return model.from_obj(upcast)
        except Exception as exc:
            raise model.misfit(event, exc) from None

    def _upcast(self, event: Event, steps: Mapping[int, Upcast], data: Any) -> Any:
        at = self._version(event) or 1
        current = max(steps) + 1
        if at > current:
            raise DataError(
                f"event {event.id} (type {event.type!r}) has schema version {at}, newer than "
                f"this code reads ({current}): deploy the code that knows it"
            )
        while at < current:
            if not isinstance(data, dict):
                raise DataError(
                    f"event {event.id} (type {event.type!r}) version {at}: data is a "
                    f"{type(data).__name__}, the upcaster takes an object"
                )
            try:
                data = steps[at](data)
            except Exception as exc:
                raise DataError(
                    f"upcasting event {event.id} (type {event.type!r}) from version {at} "
                    f"failed: {type(exc).__name__}: {exc}"
                ) from None
            at += 1
        return data

    # sending -------------------------------------------------------------------------
    def to_event(
        self,
        model: Any,
        *,
        stream_id: str,
        id: str | None = None,
        version: int | None = None,
        source: str = "streamapp",
        extensions: Mapping[str, str] | None = None,
    ) -> Event:
        """A CloudEvent of ``model``'s registered type, its data the model as JSON."""
        event_type = self._types.get(type(model))
        if event_type is None:
            raise TypeError(
                f"{type(model).__name__} is not a registered event model (registered: "
                f"{', '.join(m.name for m in self._models.values())})"
            )
        if extensions:
            refuse_extensions(dict(extensions), f"event of type {event_type!r}")
        event = Event.create(
            event_type,
            stream_id=stream_id,
            data=self._models[event_type].to_obj(model),
            source=source,
            version=version,
            id=id,
            extensions=extensions,
        )
        current = self.current_version(event_type)
        if current > 1:
            event = _with_schema(event, f"{event_type}/v{current}")
        return event


def _as_obj(event: Event, data: Any) -> Any:
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise DataError(f"data of event {event.id} is not valid JSON: {exc}") from None
    return data


def _problem(exc: Exception) -> str:
    text = str(exc).strip()
    return text.replace("\n", "; ") if text else type(exc).__name__


def _with_schema(event: Event, schema: str) -> Event:
    return dataclasses.replace(event, dataschema=schema)


def _typed(event: Event, read: _Read) -> Event:
    """``event`` as a :class:`~streamapp.events.LazyEvent` whose data ``read`` decodes
    when first read (a copy: another lane may read the same event)."""
    return build_event(
        event.id,
        event.source,
        event.type,
        event.specversion,
        event.subject,
        event.time,
        event.datacontenttype,
        event.dataschema,
        Unread(raw_data(event), read),
        event.extensions,
    )
