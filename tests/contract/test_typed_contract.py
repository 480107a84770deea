"""The typed-events contract, run over every transport (memory, Kafka, RabbitMQ, the
event store alone): an agent with msgspec models for four event types folds them
exactly, ``order.placed`` events of the old schema (version 1, as the store held them
before the change) upcast on read beside version 2 ones; data that does not fit its
model, and a type with no model (``unknown="reject"``), are parked with a reason naming
the type, the model and the field, and the partition goes on (``tests/apps/typed_orders.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import PgUrlFactory, Services

from streamapp import App, Event, Park, Table
from tests.apps.typed_orders import order_types, project

from .harness import AgentHarness
from .kafka_harness import KafkaHarness
from .memory_harness import MemoryHarness
from .rabbit_harness import RabbitHarness
from .store_harness import StoreHarness


def typed_app(h: AgentHarness) -> tuple[App, str]:
    app = h.new_app()
    topic = app.topic(h.name("orders"), partitions=2)
    summary: Table[dict[str, Any]] = Table("summary")
    parking = h.name("orders.parked")
    app.agent(topic, tables=[summary], events=order_types, on_failure=Park(parking))(project)
    return app, parking


def order(sid: str, n: int, type: str, data: dict[str, Any], *, schema: str | None = None) -> Event:
    event = Event.create(type, stream_id=sid, data=data, version=n, id=f"{sid}-{n}")
    if schema is None:
        return event
    import dataclasses

    return dataclasses.replace(event, dataschema=schema)


class TypedContract:
    @pytest.fixture
    def h(self) -> AgentHarness:
        raise NotImplementedError("a transport's subclass provides the harness")

    async def test_models_fold_exactly_and_old_schemas_are_upcast(self, h: AgentHarness) -> None:
        app, _ = typed_app(h)
        await h.start(app)
        events = [
            order("o1", 1, "order.placed", {"customer_name": "ann", "skus": ["a", "b"]}),
            order(
                "o2",
                1,
                "order.placed",
                {"customer": "bob", "items": [{"sku": "a", "qty": 3}]},
                schema="order.placed/v2",
            ),
            order("o1", 2, "order.paid", {"amount": 40}),
            order("o2", 2, "order.paid", {"amount": 7}),
            order("o2", 3, "order.paid", {"amount": 5}),
            order("o1", 3, "order.shipped", {"carrier": "dhl"}),
            order("o2", 4, "order.cancelled", {"reason": "late"}),
        ]
        for event in events:
            await h.send(event)
        assert await h.settle()
        assert await h.table("summary", "o1") == {
            "status": "shipped by dhl", "customer": "ann", "qty": 2, "paid": 40, "events": 3,
        }  # fmt: skip
        assert await h.table("summary", "o2") == {
            "status": "cancelled", "customer": "bob", "qty": 3, "paid": 12, "events": 4,
        }  # fmt: skip

    async def test_data_that_does_not_fit_and_unknown_types_are_parked_with_the_reason(
        self, h: AgentHarness
    ) -> None:
        app, parking = typed_app(h)
        await h.start(app)
        await h.send(order("o1", 1, "order.placed", {"customer": "ann", "items": []}, schema="v2"))
        await h.send(order("o1", 2, "order.paid", {"amount": "ten"}))  # not an int
        await h.send(order("o1", 3, "order.refunded", {"amount": 1}))  # no model
        await h.send(order("o1", 4, "order.paid", {"amount": 10}))
        assert await h.settle()
        assert await h.table("summary", "o1") == {
            "status": "paid", "customer": "ann", "qty": 0, "paid": 10, "events": 2,
        }  # fmt: skip
        parked = await h.parked(parking)
        reasons = sorted(p.reason for p in parked)
        assert len(reasons) == 2, reasons
        paid, refunded = (r for r in reasons if "o1-2" in r), (r for r in reasons if "o1-3" in r)
        paid_reason = next(paid)
        for part in ("'order.paid'", "OrderPaid", "`$.amount`", "Expected `int`"):
            assert part in paid_reason, paid_reason
        assert "'order.refunded', which has no model" in next(refunded)


class TestMemory(TypedContract):
    @pytest.fixture
    async def h(self) -> AsyncIterator[AgentHarness]:
        harness = MemoryHarness()
        try:
            yield harness
        finally:
            await harness.stop()


@pytest.mark.integration
class TestKafka(TypedContract):
    @pytest.fixture
    async def h(self, kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        harness = KafkaHarness(kafka_bootstrap, tmp_path / "data")
        try:
            yield harness
        finally:
            await harness.stop()


@pytest.mark.integration
class TestRabbitMQ(TypedContract):
    @pytest.fixture
    async def h(self, services: Services, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        harness = RabbitHarness(services.amqp, tmp_path)
        try:
            yield harness
        finally:
            await harness.stop()


class TestEventStore(TypedContract):
    @pytest.fixture
    async def h(self, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        harness = StoreHarness(f"sqlite:///{tmp_path}/events.db", tmp_path / "data")
        try:
            yield harness
        finally:
            await harness.stop()


@pytest.mark.integration
class TestEventStorePostgres(TypedContract):
    @pytest.fixture
    async def h(self, pg_url_factory: PgUrlFactory, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        async with pg_url_factory() as url:
            harness = StoreHarness(url, tmp_path / "data")
            try:
                yield harness
            finally:
                await harness.stop()
