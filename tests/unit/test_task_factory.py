"""The task factory: one per source, the agents of a topic checked before a task is
made, each task its own lanes, state and replay over what the source shares."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from streamapp import App, ConfigError, Event, Retry, Send, Table, TableView
from streamapp.codecs import kafka as codec
from streamapp.engine.factory import TaskFactory
from streamapp.engine.phase import Phase
from streamapp.engine.task_config import TaskConfig
from streamapp.records import Delivery, Message
from tests.support.doubles import MemoryPort


async def _no_park(delivery: Delivery, reason: str) -> bool:
    return False


async def _publish(messages: Sequence[Message]) -> None:
    raise AssertionError("nothing is sent here")


def _factory(**kw: object) -> TaskFactory:
    return TaskFactory(
        config=TaskConfig(redeliver_pause_s=0.0),
        decode=lambda d: codec.decode(d.key, d.value, d.headers),
        park=lambda agent, name: _no_park,
        **kw,  # type: ignore[arg-type]
    )


def _app() -> App:
    app = App("factory")
    counts: Table[int] = Table("counts")
    out = app.topic("out", partitions=1)

    @app.agent(app.topic("in", partitions=2), tables=[counts])
    async def count(event: Event, counts: TableView[int]) -> None:
        counts["n"] = counts.get("n", 0) + 1

    @app.agent(app.topic("derive", partitions=1), sinks=[out])
    async def derive(event: Event, *, send: Send) -> None:
        send(out, event)

    @app.agent(app.topic("chained", partitions=1), on_failure=Retry(intervals=(0.1,)))
    async def chained(event: Event) -> None:
        pass

    return app


def test_agents_a_source_cannot_run_are_refused_naming_them() -> None:
    app, factory = _app(), _factory()
    with pytest.raises(ConfigError, match=r"derive\[0\]: agent\(s\) \['derive'\] send derived"):
        factory.create(app.agents_of("derive"), 0, MemoryPort(), name="derive[0]")
    with pytest.raises(ConfigError, match=r"\['chained'\] use on_failure=Retry"):
        factory.create(app.agents_of("chained"), 0, MemoryPort(), name="chained[0]")
    mixed = [*app.agents_of("in"), *app.agents_of("derive")]
    with pytest.raises(ConfigError, match="runs the agents of one topic"):
        factory.create(mixed, 0, MemoryPort(), name="in[0]")
    with pytest.raises(ConfigError, match="runs the agents of one topic"):
        factory.create([], 0, MemoryPort(), name="in[0]")
    # with a broker to send to, the same agents are made
    sending = _factory(encode=codec.encode, publish=_publish)
    task = sending.create(app.agents_of("derive"), 0, MemoryPort(), name="derive[0]")
    assert task.lanes[0].send is not None


def test_each_task_has_its_own_parts_over_what_the_source_shares() -> None:
    app, factory = _app(), _factory()
    first = factory.create(app.agents_of("in"), 0, MemoryPort(), name="in[0]")
    second = factory.create(app.agents_of("in"), 1, MemoryPort(), name="in[1]")
    assert first.config is second.config is factory.config
    assert (first.partition, second.partition) == (0, 1)
    assert first.lanes[0] is not second.lanes[0]
    assert first.state is not second.state
    assert first.replay.partition == 0
    assert second.replay.name == "in[1]"
    assert first.phase is second.phase is Phase.RESTORING
    assert first.status()["phase"] == "restoring"
