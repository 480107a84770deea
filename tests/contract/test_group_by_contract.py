"""The contract of re-keying (``group_by=``), over the transports that run it and those
that refuse it.

- A re-keyed agent's table is keyed by the key function's value: events of several
  streams land on their key's partition, each applied once.
- A key function that fails (raises, or returns no non-empty ``str``) parks the event
  under the agent's policy, naming the agent and the event; the rest goes on.
- RabbitMQ and the event store alone refuse the app, naming the agent.

On Kafka the same contract runs with worker processes and ``kill -9`` in
``tests/integration/test_group_by.py``: its harness's settle counts a topic's end offset,
which a transactional topic such as the repartition topic never reaches (the commit
marker), so it has no subclass here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Services

from streamapp import App, ConfigError, Event, Park, Table, TableView

from .harness import AgentHarness
from .memory_harness import MemoryHarness
from .rabbit_harness import RabbitHarness
from .store_harness import StoreHarness

REFUSED = r"agent 'per_group' consumes '.*in' re-keyed \(group_by=\.\.\.\)"


def grouping_app(h: AgentHarness) -> App:
    """``per_group`` sums ``data.n`` per ``data.group`` of events keyed by stream id."""
    app = h.new_app()
    topic = app.topic(h.name("in"), partitions=2)
    sums: Table[dict[str, Any]] = Table("sums")

    def group(event: Event) -> Any:
        return event.data.get("group")

    @app.agent(
        topic,
        group_by=group,
        group_by_partitions=3,
        tables=[sums],
        on_failure=Park(h.name("in.parked")),
        name="per_group",
    )
    async def per_group(event: Event, sums: TableView[dict[str, Any]]) -> None:
        h.calls[event.id] += 1
        key = str(event.data["group"])
        row = sums.get(key, {"n": 0, "ids": []})
        sums[key] = {"n": row["n"] + int(event.data["n"]), "ids": [*row["ids"], event.id]}

    return app


def sent_events() -> list[Event]:
    events = [
        Event.create("add", stream_id=f"s{i % 5}", id=f"e{i}", data={"group": f"g{i % 3}", "n": i})
        for i in range(30)
    ]
    events.insert(7, Event.create("add", stream_id="s9", id="no-group", data={"n": 100}))
    events.insert(12, Event.create("add", stream_id="s9", id="int", data={"group": 4, "n": 1}))
    return events


class GroupByContract:
    """Subclasses provide the ``h`` fixture."""

    @pytest.fixture
    def h(self) -> AgentHarness:
        raise NotImplementedError("a transport's subclass provides the harness")

    async def test_a_re_keyed_table_sums_per_key_and_parks_bad_keys(self, h: AgentHarness) -> None:
        await h.start(grouping_app(h))
        sent = sent_events()
        for event in sent:
            await h.send(event)
        assert await h.settle()
        assert await h.unsettled() == 0
        for g in range(3):
            mine = [e for e in sent if e.data.get("group") == f"g{g}"]
            want = {"n": sum(int(e.data["n"]) for e in mine), "ids": [e.id for e in mine]}
            row = await h.table("sums", f"g{g}")
            assert row["n"] == want["n"]
            assert sorted(row["ids"]) == sorted(want["ids"])  # each once
        parked = await h.parked(h.name("in.parked"))
        assert sorted(h.parked_event(r).id for r in parked) == ["int", "no-group"]
        for record in parked:
            assert record.headers["streamapp-agent"] == b"per_group.group_by"
            assert record.reason.startswith("GroupByError: agent 'per_group': group_by returned")
        assert "no-group" not in h.calls


class TestMemory(GroupByContract):
    @pytest.fixture
    async def h(self) -> AsyncIterator[AgentHarness]:
        harness = MemoryHarness()
        try:
            yield harness
        finally:
            await harness.stop()


@pytest.mark.integration
class TestRabbitMQ(GroupByContract):
    """Refused: ``topics create`` (here the harness's start) names the agent."""

    @pytest.fixture
    async def h(self, services: Services, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        harness = RabbitHarness(services.amqp, tmp_path)
        try:
            yield harness
        finally:
            await harness.stop()

    async def test_a_re_keyed_table_sums_per_key_and_parks_bad_keys(self, h: AgentHarness) -> None:
        with pytest.raises(ConfigError, match=REFUSED + r".*'rabbitmq'"):
            await h.start(grouping_app(h))


class TestEventStore(GroupByContract):
    """Refused at start: the store alone has no topic to re-key through."""

    @pytest.fixture
    async def h(self, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        harness = StoreHarness(f"sqlite:///{tmp_path}/events.db", tmp_path / "data")
        try:
            yield harness
        finally:
            await harness.stop()

    async def test_a_re_keyed_table_sums_per_key_and_parks_bad_keys(self, h: AgentHarness) -> None:
        with pytest.raises(ConfigError, match=REFUSED + r".*'none'"):
            await h.start(grouping_app(h))
