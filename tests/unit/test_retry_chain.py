"""The retry chain (``Retry``) over the memory broker: inline retries, the retry topic and
its headers, the relay by due time, the dead-letter topic, several agents on one topic,
a stop during an inline wait, the policy's validation and the delayed-send policies."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from streamapp import App, ConfigError, Event, Outcome, Retry, Table, TableView
from streamapp.app import TopicRole
from streamapp.engine import chain
from streamapp.engine.attempts import Attempts
from streamapp.engine.delivery import Message
from streamapp.engine.lane import Lane, run_lanes
from streamapp.errors import OutputError
from streamapp.kafka import codec
from streamapp.memory import MemoryBroker

FAST = Retry(intervals=(0.1, 0.5), backoff=(1, 5))


def _app(policy: Any, fails: Counter[str], *, times: int | None = None) -> App:
    """Sums ``data.n`` per stream; an event of type ``bad`` raises ``times`` times (or
    always) after its write (rolled back)."""
    app = App("t")
    sums: Table[int] = Table("sums")

    @app.agent(app.topic("in", partitions=2), tables=[sums], on_failure=policy)
    async def summer(event: Event, view: TableView[int]) -> None:
        sid = event.stream_id
        assert sid is not None
        view[sid] = view.get(sid, 0) + event.data["n"]
        if event.type == "bad" and (times is None or fails[event.id] < times):
            fails[event.id] += 1
            raise ValueError(f"bad {event.id}")

    return app


def _ev(
    eid: str, n: int = 1, type: str = "add", sid: str = "s", version: int | None = None
) -> Event:
    return Event.create(type, stream_id=sid, data={"n": n}, id=eid, version=version)


def _h(record: Message) -> dict[str, bytes]:
    return dict(record.headers)


async def test_fails_five_times_then_succeeds_through_the_retry_topic() -> None:
    fails: Counter[str] = Counter()
    app = _app(FAST, fails, times=5)
    plan = {p.name: p.role for p in app.topic_plan()}
    assert plan["in-retry"] is TopicRole.RETRY
    assert plan["in-dlq"] is TopicRole.DEAD_LETTER
    broker = MemoryBroker(app)
    sent = broker.send("in", _ev("x", 7, "bad", version=1))
    start_ms = time.time() * 1000
    counts = await broker.process()
    assert fails["x"] == 5
    assert broker.table("sums")["s"] == 7  # as if it ran once
    assert counts[Outcome.DELIVERED] == 1
    (first,) = broker.records("in-retry")  # failures 1-3 here, 4-5 and success after it
    h1 = _h(first)
    assert (h1["x-reconsume"], h1["x-retry-hop"]) == (b"3", b"1")  # 1 + 2 inline
    assert h1["x-origin-topic"] == b"in"
    assert h1["x-retry-agent"] == b"summer"
    assert start_ms + 1000 <= int(h1["x-deliver-at"]) < start_ms + 2000  # hop 1: 1 s
    assert h1["ce_id"] == b"x"
    assert first.value == sent.value
    assert first.key == sent.key
    assert h1["ce_streamversion"] == b"1"
    (back,) = [r for r in broker.records("in") if chain.header(r.headers, chain.RECONSUME)]
    hb = _h(back)
    assert (hb["x-reconsume"], hb["x-retry-hop"], hb["ce_id"]) == (b"3", b"1", b"x")
    assert "x-deliver-at" not in hb
    assert "x-origin-topic" not in hb
    assert not broker.records("in-dlq")


async def test_a_poison_record_is_dead_lettered_after_max_reconsume_plus_one() -> None:
    fails: Counter[str] = Counter()
    app = _app(Retry(intervals=(0.1, 0.5), max_reconsume=7, backoff=(1,)), fails)
    broker = MemoryBroker(app)
    for event in (_ev("a", 1), _ev("poison", 10, "bad"), _ev("b", 100)):
        broker.send("in", event)
    await broker.process()
    assert fails["poison"] == 8  # max_reconsume + 1
    assert broker.table("sums")["s"] == 101
    assert [_h(r)["x-reconsume"] for r in broker.records("in-retry")] == [b"3", b"6"]
    (dead,) = broker.records("in-dlq")
    h = _h(dead)
    assert h["x-reconsume"] == b"8"
    assert h["x-retry-hop"] == b"2"
    assert h["x-dlq-reason"] == b"failed 8 times: ValueError: bad poison"
    assert h["x-origin-topic"] == b"in"
    assert h["x-retry-agent"] == b"summer"
    assert h["x-origin"].startswith(b"in/")
    assert h["ce_id"] == b"poison"
    assert "x-deliver-at" not in h
    assert broker.pending("in") == 0


async def test_later_records_are_not_held_behind_a_poison_record() -> None:
    """The record after the poison is applied before the poison's first retry is due."""
    order: list[str] = []
    app = App("t")

    @app.agent(app.topic("in", partitions=1), on_failure=Retry(max_reconsume=2, backoff=(1,)))
    async def agent(event: Event) -> None:
        order.append(event.id)
        if event.type == "bad":
            raise ValueError("no")

    broker = MemoryBroker(app)
    for event in (_ev("poison", type="bad"), _ev("next")):
        broker.send("in", event)
    await broker.process()
    assert order == ["poison", "poison", "poison", "next"]
    assert len(broker.records("in-dlq")) == 1
    assert not broker.records("in-retry")


async def test_without_retry_topic_inline_retries_then_dead_letter() -> None:
    fails: Counter[str] = Counter()
    app = _app(Retry(intervals=(0.1,), retry_suffix=""), fails)
    assert "in-retry" not in {p.name for p in app.topic_plan()}
    broker = MemoryBroker(app)
    broker.send("in", _ev("p", type="bad"))
    await broker.process()
    assert fails["p"] == 2
    (dead,) = broker.records("in-dlq")
    assert _h(dead)["x-reconsume"] == b"2"
    assert _h(dead)["x-retry-hop"] == b"0"


async def test_undecodable_records_follow_the_same_chain() -> None:
    app = _app(Retry(intervals=(), max_reconsume=1, backoff=(1,)), Counter())
    broker = MemoryBroker(app)
    broker.send_raw("in", b"not an event", key=b"k", headers=[("biz", b"1")])
    counts = await broker.process()
    assert counts[Outcome.NOT_DELIVERABLE] == 2
    (retried,) = broker.records("in-retry")
    (dead,) = broker.records("in-dlq")
    assert _h(retried)["biz"] == b"1"
    assert _h(dead)["biz"] == b"1"
    assert _h(dead)["x-dlq-reason"].startswith(b"failed 2 times: not a CloudEvent")


async def test_the_relay_keeps_due_order_and_waits_without_fast_forward() -> None:
    fails: Counter[str] = Counter()
    app = _app(Retry(intervals=(), backoff=(30,)), fails, times=1)
    broker = MemoryBroker(app, fast_forward=False)
    broker.send("in", _ev("x", 5, "bad"))
    await broker.process()
    assert broker.table("sums").get("s") is None  # waiting in the retry topic
    assert len(broker.records("in-retry")) == 1
    broker.advance(29)
    await broker.process()
    assert broker.table("sums").get("s") is None
    broker.advance(2)
    await broker.process()
    assert broker.table("sums")["s"] == 5


async def test_a_retry_copy_runs_only_through_its_agent() -> None:
    """Two agents on one topic: the copy for the failing one does not run the other again."""
    seen: Counter[str] = Counter()
    fails: Counter[str] = Counter()
    app = App("t")
    topic = app.topic("in", partitions=1)

    @app.agent(topic, on_failure=Retry(intervals=(), backoff=(1,)))
    async def flaky(event: Event) -> None:
        seen["flaky"] += 1
        if fails[event.id] < 1:
            fails[event.id] += 1
            raise ValueError("once")

    @app.agent(topic)
    async def steady(event: Event) -> None:
        seen["steady"] += 1

    broker = MemoryBroker(app)
    broker.send("in", _ev("x"))
    await broker.process()
    assert seen == Counter({"flaky": 2, "steady": 1})


async def test_stop_during_an_inline_wait_answers_at_once_and_settles_nothing() -> None:
    app = _app(Retry(intervals=(30,)), Counter())
    agent = app.agents["summer"]
    lane = Lane(agent, _no_park, Attempts(0.1, 1.0), None)
    stop = asyncio.Event()
    lane.configure(stop, waits=True, clock=time.time, delayed="immediate")
    key, value, headers = codec.encode(_ev("p", type="bad"))
    record = Message("in", 0, 0, key, value, headers)
    running = asyncio.ensure_future(
        run_lanes([lane], [0], [record], lambda d: codec.decode(d.key, d.value, d.headers), 10)
    )
    await asyncio.sleep(0.05)
    started = time.monotonic()
    stop.set()
    run = await asyncio.wait_for(running, 1)
    assert time.monotonic() - started < 0.1
    assert run.stop == 0
    assert run.failed == [lane]
    assert run.reached == [0]
    assert lane.outbox is not None
    assert not lane.outbox.take()


async def _no_park(delivery: Any, reason: str) -> bool:
    return False


@pytest.mark.parametrize(
    ("policy", "words"),
    [
        (Retry(intervals=(-1,)), "intervals holds -1"),
        (Retry(intervals=[0.1]), "intervals must be a tuple"),  # type: ignore[arg-type]
        (Retry(backoff=()), "backoff must be a tuple of seconds, at least one"),
        (Retry(max_reconsume=-1), "max_reconsume must be an integer of 0 or more"),
        (Retry(dlq_suffix=""), "dlq_suffix must not be empty"),
        (Retry(retry_suffix="-x", dlq_suffix="-x"), "must differ"),
        (Retry(retry_suffix=" -r"), "retry_suffix must be a string without spaces"),
    ],
)
def test_bad_retry_policies_are_refused_naming_the_agent(policy: Retry, words: str) -> None:
    app = App("t")
    with pytest.raises(ConfigError, match="agent '_handler'") as err:
        app.agent(app.topic("in"), on_failure=policy)(_handler)
    assert words in str(err.value)


async def _handler(event: Event) -> None:
    return None


def test_backoff_beyond_the_table_keeps_the_last_value() -> None:
    policy = Retry()
    assert [policy.backoff_s(h) for h in (1, 2, 8, 9, 50)] == [1, 5, 240, 240, 240]


def test_the_retry_chain_runs_on_rabbitmq_and_is_refused_without_a_broker() -> None:
    from streamapp.rabbitmq.topology import plans
    from streamapp.settings import Settings
    from streamapp.worker import Worker

    app = _app(Retry(), Counter())
    roles = {p.name: p.role for p in plans(app)}
    assert roles["in-retry"] is TopicRole.RETRY
    assert roles["in-dlq"] is TopicRole.DEAD_LETTER
    Worker(app, Settings("t", broker="rabbitmq"))  # accepted
    with pytest.raises(ConfigError, match=r"agent 'summer'.*STREAMAPP_BROKER\) = 'none'"):
        Worker(app, Settings("t", broker="none"))
    sender = _sender_app()
    assert "out-delay" in {p.name for p in plans(sender, "relay")}
    assert "out-delay" not in {p.name for p in plans(sender)}


def _sender_app() -> App:
    app = App("t")
    out = app.topic("out", partitions=1)

    @app.agent(app.topic("in", partitions=1), sinks=[out])
    async def later(event: Event, *, send: Any) -> None:
        send(out, _ev("d-" + event.id, sid="o"), delay_s=10)

    return app


async def test_delayed_send_under_relay_goes_through_the_delay_topic() -> None:
    app = _sender_app()
    assert "out-delay" in {p.name for p in app.topic_plan("relay")}
    assert "out-delay" not in {p.name for p in app.topic_plan()}
    broker = MemoryBroker(app, delayed_policy="relay", fast_forward=False)
    broker.send("in", _ev("e"))
    await broker.process()
    (held,) = broker.records("out-delay")
    assert _h(held)["x-origin-topic"] == b"out"
    assert not broker.records("out")
    broker.advance(11)
    await broker.process()
    (out,) = broker.records("out")
    assert _h(out)["ce_id"] == b"d-e"
    assert "x-deliver-at" not in _h(out)


async def test_delayed_send_immediate_sends_now_and_reject_fails_the_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = MemoryBroker(_sender_app())
    broker.send("in", _ev("e"))
    await broker.process()
    assert len(broker.records("out")) == 1
    assert "setting delayed_policy is 'immediate'" in caplog.text
    rejecting = MemoryBroker(_sender_app(), delayed_policy="reject", max_attempts=1)
    rejecting.send("in", _ev("e"))
    with pytest.raises(Exception, match="delayed_policy") as err:
        await rejecting.process()
    assert not rejecting.records("out")
    assert isinstance(err.value, Exception)
    assert OutputError.__name__ in str(err.value)
