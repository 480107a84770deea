"""Re-keying (``group_by=``): registration, the topic plan, the memory broker's routing
through the repartition topic, key-function failures under the agent's policy, the
version guard, and the brokers that refuse it."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from click.testing import CliRunner

from streamapp import App, ConfigError, Event, FromEventStore, Park, Table, TableView
from streamapp.cli import main
from streamapp.codecs import kafka as codec
from streamapp.engine.assignment import Assignment
from streamapp.failures.outcomes import Outcome
from streamapp.testing import MemoryBroker, StuckRecordsError
from streamapp.topics import TopicRole, partition_for
from streamapp.worker import Worker


def shop(*, partitions: int = 4, key: Any = None, **options: Any) -> tuple[App, Table[int]]:
    """An app whose ``per_customer`` agent totals order amounts per customer."""
    app = App("shop")
    orders = app.topic("orders", partitions=partitions)
    totals: Table[int] = Table("totals")

    def customer(event: Event) -> str:
        return str(event.data["customer"])

    @app.agent(orders, group_by=key or customer, tables=[totals], **options)
    async def per_customer(event: Event, totals: TableView[int]) -> None:
        who = str(event.data["customer"])
        totals[who] = totals.get(who, 0) + int(event.data["amount"])

    return app, totals


def order_events(n_orders: int, n_events: int, customers: int) -> tuple[list[Event], Counter[str]]:
    """Events keyed by order id (versions 1..n per order), each order of one customer."""
    rng = random.Random(5)
    versions: Counter[str] = Counter()
    totals: Counter[str] = Counter()
    events = []
    for i in range(n_events):
        order = f"order-{rng.randrange(n_orders)}"
        versions[order] += 1
        who = f"c{int(order.removeprefix('order-')) % customers}"
        amount = rng.randrange(1, 100)
        totals[who] += amount
        events.append(
            Event.create(
                "order.line",
                stream_id=order,
                version=versions[order],
                id=f"e{i}",
                data={"customer": who, "amount": amount},
            )
        )
    return events, totals


# registration -----------------------------------------------------------------------------
def test_registration_makes_the_repartition_topic_and_the_forwarder() -> None:
    app, _ = shop(partitions=6)
    agent, forwarder = app.agents["per_customer"], app.agents["per_customer.group_by"]
    assert agent.topic.name == "shop-per_customer-repartition"
    assert agent.topic.partitions == 6
    assert agent.group_by is not None
    assert agent.group_by.source.name == "orders"
    assert forwarder.topic.name == "orders"
    assert forwarder.sinks == (agent.topic,)
    assert not forwarder.tables
    assert forwarder.group_by is None
    assert app.agents_of("orders") == [forwarder]
    assert app.agents_of(agent.topic.name) == [agent]
    plan = {p.name: (p.partitions, p.role) for p in app.topic_plan()}
    assert plan["orders"] == (6, TopicRole.SOURCE)
    assert plan["shop-per_customer-repartition"] == (6, TopicRole.REPARTITION)
    assert plan["shop-per_customer-changelog"] == (6, TopicRole.CHANGELOG)


def test_group_by_partitions_sets_the_repartition_count() -> None:
    app, _ = shop(partitions=4, group_by_partitions=12)
    plan = {p.name: p.partitions for p in app.topic_plan()}
    assert plan["shop-per_customer-repartition"] == 12
    assert plan["shop-per_customer-changelog"] == 12  # tables partition like their source
    assert plan["orders"] == 4


def test_the_filter_runs_in_the_forwarder_before_the_key_function() -> None:
    def placed(event: Event) -> bool:
        return event.type == "order.placed"

    app, _ = shop(filter=placed)
    assert app.agents["per_customer.group_by"].filter is placed
    assert app.agents["per_customer"].filter is None


@pytest.mark.parametrize("key", ["customer", 42, ["customer"]])
def test_a_key_that_is_not_a_function_is_refused(key: Any) -> None:
    with pytest.raises(ConfigError, match=r"agent 'per_customer': group_by=.* is not a function"):
        shop(key=key)


def test_bad_group_by_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="agent 'per_customer': group_by_partitions=0"):
        shop(group_by_partitions=0)
    with pytest.raises(ConfigError, match=r"group_by with history=.* is not supported"):
        shop(history=FromEventStore())
    app = App("shop")

    async def h(event: Event) -> None: ...

    with pytest.raises(ConfigError, match="agent 'h': group_by_partitions=3 without group_by"):
        app.agent(app.topic("orders"), group_by_partitions=3)(h)


def test_names_taken_by_the_repartition_topic_or_forwarder_are_refused() -> None:
    app = App("shop")
    orders = app.topic("orders")
    app.topic("shop-h-repartition")

    async def h(event: Event) -> None: ...

    with pytest.raises(ConfigError, match="'shop-h-repartition' is declared by the app"):
        app.agent(orders, group_by=lambda e: "k")(h)
    app = App("shop")
    orders = app.topic("orders")
    app.agent(orders, name="h.group_by")(h)
    with pytest.raises(ConfigError, match=r"an agent named 'h\.group_by' is registered already"):
        app.agent(orders, group_by=lambda e: "k")(h)
    assert list(app.agents) == ["h.group_by"]  # nothing half-registered


def test_views_route_a_key_by_the_repartition_topic() -> None:
    app, _ = shop(partitions=4, group_by_partitions=7)
    partition, _task = Assignment(app).owner_of("totals", "c3")
    assert partition == partition_for(b"c3", 7)


# the memory broker ---------------------------------------------------------------------------
async def test_per_customer_totals_are_exact_through_the_repartition_topic() -> None:
    app, _ = shop(partitions=4, group_by_partitions=3)
    broker = MemoryBroker(app)
    events, totals = order_events(n_orders=60, n_events=1500, customers=9)
    for event in events:
        broker.send("orders", event)
    counts = await broker.process()
    assert counts == Counter({Outcome.DELIVERED: 3000})  # forwarded, then applied
    table = broker.table("totals")
    assert {c: table[c] for c in totals} == dict(totals)

    repartitioned = broker.records("shop-per_customer-repartition")
    assert len(repartitioned) == len(events)
    for record in repartitioned:
        event = codec.decode(record.key, record.value, record.headers)
        assert record.key == event.data["customer"].encode()  # keyed by the new key
        assert record.partition == partition_for(record.key, 3)
        assert event.stream_id is not None
        assert event.stream_id.startswith("order-")
        assert event.stream_version is not None  # the body is the event as it was
    assert Counter(codec.decode(r.key, r.value, r.headers).id for r in repartitioned) == Counter(
        e.id for e in events
    )  # each event forwarded once


async def test_the_version_guard_dedupes_by_stream_id_and_version() -> None:
    app, _ = shop()
    broker = MemoryBroker(app)
    first = Event.create("o", stream_id="order-1", version=1, data={"customer": "c", "amount": 5})
    second = Event.create("o", stream_id="order-1", version=2, data={"customer": "c", "amount": 7})
    other = Event.create("o", stream_id="order-2", version=1, data={"customer": "c", "amount": 11})
    for event in (first, second, first, second, other):  # a producer's retries
        broker.send("orders", event)
    counts = await broker.process()
    assert broker.table("totals")["c"] == 23
    assert counts[Outcome.FILTERED] == 2  # the repeats, skipped by the agent


async def test_a_key_function_failure_parks_with_the_agent_and_event_named() -> None:
    def customer(event: Event) -> Any:
        return event.data.get("customer")

    app, _ = shop(key=customer, on_failure=Park("orders.parked"))
    broker = MemoryBroker(app)
    good = Event.create("o", stream_id="o1", id="good", data={"customer": "c", "amount": 3})
    broker.send("orders", Event.create("o", stream_id="o2", id="no-key", data={"amount": 1}))
    broker.send("orders", Event.create("o", stream_id="o3", id="empty", data={"customer": ""}))
    broker.send("orders", Event.create("o", stream_id="o4", id="int", data={"customer": 7}))
    broker.send("orders", good)
    await broker.process()
    assert broker.table("totals")["c"] == 3
    parked = broker.records("orders.parked")
    reasons = {codec.decode(r.key, r.value, r.headers).id: dict(r.headers) for r in parked}
    assert set(reasons) == {"no-key", "empty", "int"}
    for event_id, wanted in (("no-key", "None"), ("empty", "''"), ("int", "7")):
        reason = reasons[event_id]["streamapp-park-reason"].decode()
        assert reason.startswith("GroupByError: agent 'per_customer': group_by returned"), reason
        assert f"returned {wanted} for event {event_id}" in reason
        assert "must be a non-empty str" in reason
        assert reasons[event_id]["streamapp-agent"] == b"per_customer.group_by"


async def test_a_raising_key_function_follows_redeliver_and_names_the_event() -> None:
    app, _ = shop()  # event.data["customer"] raises KeyError without one
    broker = MemoryBroker(app, max_attempts=3)
    broker.send("orders", Event.create("o", stream_id="o1", id="bad", data={"amount": 1}))
    with pytest.raises(StuckRecordsError) as info:
        await broker.process()
    text = str(info.value)
    assert "agent 'per_customer.group_by'" in text
    assert "group_by raised KeyError: 'customer' for event bad (stream o1)" in text
    assert broker.records("shop-per_customer-repartition") == []


async def test_filtered_events_never_reach_the_key_function() -> None:
    app, _ = shop(filter=lambda e: "customer" in e.data)
    broker = MemoryBroker(app)
    broker.send("orders", Event.create("o", stream_id="o1", data={"note": "no customer"}))
    broker.send("orders", Event.create("o", stream_id="o2", data={"customer": "c", "amount": 2}))
    counts = await broker.process()
    assert counts[Outcome.FILTERED] == 1
    assert broker.table("totals")["c"] == 2


# brokers -------------------------------------------------------------------------------------
@pytest.mark.parametrize("broker", ["rabbitmq", "none"])
def test_brokers_that_cannot_re_key_refuse_naming_the_agent(broker: str) -> None:
    app, _ = shop()
    with pytest.raises(
        ConfigError, match=rf"agent 'per_customer' consumes 'orders' re-keyed.*'{broker}'"
    ):
        Worker(app, app.settings(broker=broker))


SHOP, _ = shop()
"""For ``-A tests.unit.test_group_by:SHOP``."""


def test_rabbitmq_topics_create_refuses_before_connecting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMAPP_BROKER", "rabbitmq")
    monkeypatch.setenv("STREAMAPP_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/")  # nothing there
    result = CliRunner().invoke(main, ["topics", "create", "-A", "tests.unit.test_group_by:SHOP"])
    assert result.exit_code == 1
    assert "agent 'per_customer' consumes 'orders' re-keyed" in result.output
    assert "did not answer" not in result.output  # refused before any connection
