"""The owner's lease (issue 33): its edge cases, and what views, /readyz and /status do
past it. A fake clock stands for the worker's monotonic clock."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiokafka import TopicPartition

from streamapp.engine.lease import Lease
from streamapp.errors import FencedError, PublishError
from streamapp.transports.kafka.transaction import KafkaTransaction
from streamapp.transports.rabbitmq.lease import EchoLease
from streamapp.web.tables import STALE_HEADER
from streamapp.web.views import make_app
from tests.support.webworld import World, order, orders_app


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_slow_heartbeat_that_succeeds_confirms_from_when_it_was_sent() -> None:
    clock = Clock()
    lease = Lease(6.0, clock)
    lease.begin("g1", clock.now)  # the assignment
    sent = clock.now + 3.0  # the next heartbeat goes out at 103 ...
    clock.now += 8.0  # ... and its answer only arrives at 108
    assert not lease.held  # the assignment's confirmation ran out at 106
    assert lease.confirm("g1", sent)
    assert lease.held  # confirmed as of 103: until 109, not 114
    clock.now = sent + 5.9
    assert lease.held
    clock.now = sent + 6.0
    assert not lease.held
    assert lease.unconfirmed_s() == 6.0
    # an older heartbeat answered after a newer one does not move the lease back
    assert lease.confirm("g1", sent - 2.0)
    assert lease.confirmed_at == sent


def test_a_confirmation_of_the_generation_before_confirms_nothing() -> None:
    """A heartbeat sent under generation 1 is answered after the group moved on (a batch
    ran meanwhile): generation 2's lease is not confirmed by it."""
    clock = Clock()
    lease = Lease(6.0, clock)
    lease.begin("g1", clock.now)
    sent = clock.now + 1.0
    clock.now += 2.0
    lease.end()  # revoked while the batch (and the heartbeat) ran
    assert not lease.held
    assert not lease.confirm("g1", sent)
    assert lease.reason() is not None
    assert "rebalancing" in (lease.reason() or "")
    lease.begin("g2")  # assigned again, not confirmed yet
    assert not lease.confirm("g1", sent)
    assert not lease.held
    lease.failed("no heartbeat answered (KafkaConnectionError)")
    assert "KafkaConnectionError" in (lease.reason() or "")
    assert lease.confirm("g2", clock.now)
    assert lease.held
    assert lease.reason() is None


async def test_views_readyz_and_status_past_the_lease() -> None:
    clock = Clock()
    world = World(orders_app())
    await world.own(range(4))
    lease = world.assignment.lease = Lease(5.0, clock)
    lease.begin("g1", clock.now)
    await world.send(order("order-1"))
    p = world.partition_of("order-1")
    async with TestClient(TestServer(make_app(world.assignment, "w1"))) as client:
        r = await client.get("/tables/order_status/order-1")
        assert r.status == 200
        assert STALE_HEADER not in r.headers
        assert (await client.get("/readyz")).status == 200

        clock.now += 7.25  # no heartbeat confirmed since
        r = await client.get("/tables/order_status/order-1")
        assert r.status == 503
        assert r.headers["Retry-After"]
        body = await r.json()
        assert body["error"] == f"ownership of partition {p} not confirmed for 7.2 s"
        assert body["phase"] == "unconfirmed"
        r = await client.get("/tables/order_status/order-1?stale_ok=1")
        assert r.status == 200
        assert await r.json() == {"status": "placed"}
        assert r.headers[STALE_HEADER] == "7.2"
        assert (await client.get("/tables/order_status")).status == 503
        r = await client.get("/tables/order_status?stale_ok=1")
        assert r.status == 200
        assert r.headers[STALE_HEADER] == "7.2"

        r = await client.get("/readyz")
        assert r.status == 503
        body = await r.json()
        assert body["ready"] is False
        assert "streamapp_ready 0.0" in await (await client.get("/metrics")).text()
        assert body["not_live"] == {}
        assert set(body["unconfirmed"]) == {f"orders[{q}]" for q in range(4)}
        assert "not confirmed by the group for 7.2 s" in body["unconfirmed"][f"orders[{p}]"]
        status = await (await client.get("/status")).json()
        assert status["ready"] is False
        assert status["partitions"][f"orders[{p}]"]["phase"] == "unconfirmed"

        lease.confirm("g1", clock.now)  # a heartbeat got through again
        assert (await client.get("/tables/order_status/order-1")).status == 200
        assert (await client.get("/readyz")).status == 200
        status = await (await client.get("/status")).json()
        assert status["partitions"][f"orders[{p}]"]["phase"] == "live"


async def test_a_worker_that_loses_the_lease_mid_answer_answers_503() -> None:
    """A ``?min_version=`` read waits for the key's next event; the lease lapses while
    it waits, then the event arrives: the answer is 503, not the value."""
    clock = Clock()
    world = World(orders_app())
    await world.own(range(4))
    lease = world.assignment.lease = Lease(5.0, clock)
    lease.begin("g1", clock.now)
    await world.send(order("order-1", version=1))
    p = world.partition_of("order-1")

    async def later() -> None:
        await asyncio.sleep(0.2)
        clock.now += 6.0  # cut off meanwhile
        await world.send(order("order-1", "paid", version=2))

    async with TestClient(TestServer(make_app(world.assignment, "w1"))) as client:
        sender = asyncio.create_task(later())
        r = await client.get("/tables/order_status/order-1?min_version=2")
        await sender
        assert r.status == 503
        assert (await r.json())["error"] == f"ownership of partition {p} not confirmed for 6.0 s"
        r = await client.get("/tables/order_status/order-1?min_version=2&stale_ok=1")
        assert r.status == 200
        assert r.headers[STALE_HEADER] == "6.0"


async def test_no_transactional_writer_starts_past_the_lease_or_after_a_revoke() -> None:
    """A worker whose network comes back before its consumer learns it left the group
    still holds its assignment: its writer (whose start fences the partition's owner)
    is not started until a heartbeat of its generation is confirmed again; once revoked
    (the lease ended), never. No broker is needed: the gate comes before any request."""
    clock = Clock()
    lease = Lease(5.0, clock)
    lease.begin("g1", clock.now)
    clock.now += 6.0
    txn = KafkaTransaction(
        "127.0.0.1:1",  # never contacted
        "app-orders-0",
        TopicPartition("orders", 0),
        "app",
        lambda agent: None,
        timeout_s=1.0,
        stall_timeout_s=1.0,
        retention_ms={},
        assigned=lambda: lease.term is not None,  # as KafkaSource gives it
        unconfirmed=lease.reason,
    )
    with pytest.raises(PublishError, match=r"not confirmed by the group for 6\.0 s"):
        await txn.open()
    with pytest.raises(PublishError, match="owner_lease_s"):
        await txn.reset()
    lease.end()
    with pytest.raises(FencedError, match="no longer assigned"):
        await txn.reset()


def test_a_rabbitmq_member_is_confirmed_by_its_own_heartbeats_heard_back() -> None:
    """As of when each was sent; a beat that never came back confirms nothing, and the
    first beat heard after a lapse says so (the member rebalances: it may take again)."""
    clock = Clock()
    echo = EchoLease(Lease(2.0, clock), "m1")
    echo.begin()
    assert not echo.held
    echo.sent(1)
    clock.now += 0.1
    assert echo.heard(1)  # the first confirmation: it may take what it is assigned
    assert echo.held
    echo.sent(2)  # cut off: never heard back
    clock.now += 1.0
    echo.sent(3)
    clock.now += 1.5
    assert not echo.held  # confirmed as of beat 1, sent 2.6 s ago
    assert "not heard back" in echo.why
    echo.sent(4)
    late = clock.now
    clock.now += 1.9  # the network came back; beat 4 arrives late
    assert echo.heard(4)
    assert echo.lease.confirmed_at == late
    assert not echo.heard(2)  # overtaken: dropped, confirms nothing
    assert echo.lease.confirmed_at == late
    clock.now += 0.2
    assert not echo.held  # beat 4 was sent 2.1 s ago
