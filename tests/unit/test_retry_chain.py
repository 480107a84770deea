"""The retry chain (``Retry``) over the memory broker, where it is the memory broker's
own: its relay without fast-forward, several agents on one topic, a stop during an
inline wait, the policy's validation and the delayed-send policies. The chain's shared
behaviour (hops, back-offs, headers, dead letters) is the contract suite,
``tests/contract/test_chain_contract.py``, which runs over the memory broker too."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from streamapp import App, ConfigError, Event, Retry, Table, TableView
from streamapp.codecs import kafka as codec
from streamapp.engine.attempts import Attempts
from streamapp.engine.lane import Lane
from streamapp.engine.run import run_lanes
from streamapp.errors import OutputError
from streamapp.records import DeliveryRecord
from streamapp.testing import MemoryBroker
from streamapp.topics import TopicRole

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


def _h(record: DeliveryRecord) -> dict[str, bytes]:
    return dict(record.headers)


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
    record = DeliveryRecord("in", 0, 0, key, value, headers)
    running = asyncio.ensure_future(
        run_lanes([lane], [0], [record], lambda d: codec.decode(d.key, d.value, d.headers), 10)
    )
    await asyncio.sleep(0.05)
    assert not running.done()  # waiting out the 30 s interval
    stop.set()
    # ends well inside the 30 s interval: the stop ended the wait (the bound only stops a hang)
    run = await asyncio.wait_for(running, 10)
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
    from streamapp.settings.settings import Settings
    from streamapp.transports.rabbitmq.topology import plans
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
