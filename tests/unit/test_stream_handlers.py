"""A Faust-style handler (``async for event in stream``, or one that yields) is refused
at registration with the streamapp way, instead of failing on every event."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import pytest

from streamapp import App, Event, Table, TableView
from streamapp.errors import ConfigError
from streamapp.testing import MemoryBroker


def _app() -> tuple[App, Any, Table[int]]:
    app = App("faustish")
    return app, app.topic("in", partitions=2), Table("counts")


def test_async_for_over_the_stream_is_refused_with_the_streamapp_way() -> None:
    app, topic, counts = _app()
    with pytest.raises(ConfigError) as info:

        @app.agent(topic, tables=[counts])
        async def count(stream, counts):  # type: ignore[no-untyped-def]
            async for event in stream:
                counts[event.stream_id] = counts.get(event.stream_id, 0) + 1

    message = str(info.value)
    assert "agent 'count': handler count iterates its first parameter" in message
    assert "`for ... in stream`" in message
    assert "async def count(event: Event, counts: TableView[...]) -> None:" in message
    assert app.agents == {}


@pytest.mark.parametrize("annotation", [AsyncIterator[Event], AsyncIterable[Event]])
def test_a_stream_parameter_is_refused(annotation: object) -> None:
    app, topic, _ = _app()

    async def handle(events: Any) -> None:
        pass

    handle.__annotations__["events"] = annotation
    with pytest.raises(ConfigError, match=r"takes a stream: its parameter 'events'"):
        app.agent(topic)(handle)


def test_a_string_annotation_naming_a_stream_is_refused() -> None:
    app, topic, _ = _app()

    async def handle(stream: StreamT) -> None:  # type: ignore[name-defined]  # noqa: F821
        pass

    with pytest.raises(ConfigError, match=r"takes a stream"):
        app.agent(topic)(handle)


def test_an_async_generator_shows_the_plain_handler() -> None:
    app, topic, _ = _app()

    async def relay(stream: Any) -> AsyncIterator[Event]:
        async for event in stream:
            yield event

    with pytest.raises(ConfigError, match=r"(?s)async generator .*async def relay\(event: Event\)"):
        app.agent(topic)(relay)


async def test_the_plain_handler_still_registers_and_runs() -> None:
    app, topic, counts = _app()

    @app.agent(topic, tables=[counts])
    async def count(event: Event, counts: TableView[int]) -> None:
        for part in event.type.split("."):  # loops over other values stay allowed
            assert part
        sid = event.stream_id
        assert sid is not None
        counts[sid] = (counts.get(sid) or 0) + 1

    broker = MemoryBroker(app)
    broker.send("in", Event.create("a.b", stream_id="s", data={}))
    await broker.process()
    assert broker.table("counts")["s"] == 1
