"""Redeliver with a bound: attempts per delivery, doubling pauses, the fallback, and the
memory broker's own bound (it raises rather than leave records stuck silently)."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest

from streamapp import App, ConfigError, Event, Outcome, Park, Redeliver, Settings, Table, TableView
from streamapp.agents.agent import Agent
from streamapp.codecs import kafka as codec
from streamapp.engine.attempts import Attempts
from streamapp.engine.backoff import doubled
from streamapp.engine.lane import Lane
from streamapp.engine.run import run_lanes
from streamapp.engine.task_config import TaskConfig
from streamapp.records import Delivery, DeliveryRecord
from streamapp.testing import MemoryBroker, StuckRecordsError
from streamapp.topics import TopicSpec

PARKED = "in.parked"


def _app(policy: Any, fails: Counter[str], *, times: int | None = None) -> App:
    """Sums ``data.n`` per stream in table ``sums``; an event of type ``bad`` raises
    (``times`` times, or always), after its write (which must be rolled back)."""
    app = App("t")
    sums: Table[int] = Table("sums")

    @app.agent(app.topic("in", partitions=1), tables=[sums], on_failure=policy)
    async def summer(event: Event, view: TableView[int]) -> None:
        sid = event.stream_id
        assert sid is not None
        view[sid] = view.get(sid, 0) + event.data["n"]
        if event.type == "bad" and (times is None or fails[event.id] < times):
            fails[event.id] += 1
            raise ValueError(f"bad {event.id}")

    return app


def _ev(eid: str, n: int = 1, type: str = "add", sid: str = "s") -> Event:
    return Event.create(type, stream_id=sid, data={"n": n}, id=eid)


async def test_bounded_redeliver_falls_back_to_park_after_max_attempts() -> None:
    fails: Counter[str] = Counter()
    app = _app(Redeliver(max_attempts=3, fallback=Park(PARKED)), fails)
    assert [p.name for p in app.topic_plan() if p.role == "parking"] == [PARKED]
    broker = MemoryBroker(app)
    for event in (_ev("a", 1), _ev("poison", 10, "bad"), _ev("b", 100), _ev("c", 1000)):
        broker.send("in", event)
    counts = await broker.process()
    assert fails["poison"] == 3
    assert counts == Counter({Outcome.DELIVERED: 3, Outcome.FAILED: 3})
    assert broker.table("sums")["s"] == 1101  # later records applied, the poison's write not
    assert broker.pending("in") == 0
    (parked,) = broker.records(PARKED)
    headers = dict(parked.headers)
    assert headers["streamapp-park-reason"] == b"gave up after 3 attempts: ValueError: bad poison"
    assert headers["streamapp-source"] == b"in/0/1"
    assert headers["ce_id"] == b"poison"
    assert parked.value == broker.records("in")[1].value


async def test_max_attempts_1_parks_at_the_first_failure() -> None:
    fails: Counter[str] = Counter()
    app = _app(Redeliver(max_attempts=1, fallback=Park(PARKED)), fails)
    broker = MemoryBroker(app)
    broker.send("in", _ev("poison", type="bad"))
    await broker.process()
    assert fails["poison"] == 1
    (parked,) = broker.records(PARKED)
    assert dict(parked.headers)["streamapp-park-reason"].startswith(b"gave up after 1 attempts")


async def test_attempts_are_counted_per_delivery_and_reset_when_it_settles() -> None:
    """Two records each failing twice under max_attempts=3 are both applied: the count of
    the first ends when it settles, the second starts from one."""
    fails: Counter[str] = Counter()
    app = _app(Redeliver(max_attempts=3, fallback=Park(PARKED)), fails, times=2)
    broker = MemoryBroker(app)
    for event in (_ev("x", 1, "bad"), _ev("y", 10, "bad"), _ev("z", 100)):
        broker.send("in", event)
    counts = await broker.process()
    assert fails == Counter({"x": 2, "y": 2})
    assert counts == Counter({Outcome.FAILED: 4, Outcome.DELIVERED: 3})
    assert broker.table("sums")["s"] == 111
    assert PARKED not in broker.topics or not broker.records(PARKED)
    task, _ = broker._tasks[("in", 0)]
    assert (task.attempts.position, task.attempts.failed) == (None, 0)  # settled: forgotten


async def test_an_undecodable_record_under_bounded_redeliver_is_parked_too() -> None:
    app = _app(Redeliver(max_attempts=2, fallback=Park(PARKED)), Counter())
    broker = MemoryBroker(app)
    broker.send_raw("in", b"not a CloudEvent", key=b"s")
    broker.send("in", _ev("after", 5))
    counts = await broker.process()
    assert counts[Outcome.NOT_DELIVERABLE] == 2
    assert broker.table("sums")["s"] == 5
    (parked,) = broker.records(PARKED)
    reason = dict(parked.headers)["streamapp-park-reason"].decode()
    assert reason.startswith("gave up after 2 attempts: ")
    assert "not a CloudEvent" in reason


async def test_the_memory_broker_bound_gives_the_policy_its_attempts() -> None:
    """MemoryBroker(max_attempts=2) does not cut a Redeliver(max_attempts=5) short."""
    fails: Counter[str] = Counter()
    app = _app(Redeliver(max_attempts=5, fallback=Park(PARKED)), fails)
    broker = MemoryBroker(app, max_attempts=2)
    broker.send("in", _ev("poison", type="bad"))
    await broker.process()
    assert fails["poison"] == 5
    assert len(broker.records(PARKED)) == 1


async def test_the_memory_broker_raises_on_a_stuck_record_naming_it() -> None:
    fails: Counter[str] = Counter()
    app = _app(Redeliver(), fails)  # the default: unbounded
    broker = MemoryBroker(app)  # its bound: 10 attempts per record and call
    broker.send("in", _ev("ok", 1))
    broker.send("in", _ev("poison", type="bad"))
    broker.send("in", _ev("behind", 100))
    with pytest.raises(StuckRecordsError) as raised:
        await broker.process()
    assert fails["poison"] == 10
    assert raised.value.counts == Counter({Outcome.DELIVERED: 1, Outcome.FAILED: 10})
    (stuck,) = raised.value.stuck
    assert (stuck.agent, stuck.attempts, stuck.error) == ("summer", 10, "ValueError: bad poison")
    assert stuck.record == broker.records("in")[1]
    assert str(stuck) == (
        "agent 'summer', topic 'in' partition 0 position 1 (event id 'poison', type 'bad', "
        "stream 's'): failed 10 times, last error: ValueError: bad poison"
    )
    assert "Redeliver(max_attempts=N, fallback=Park(...))" in str(raised.value)
    assert broker.pending("in") == 2
    assert broker.table("sums")["s"] == 1


async def test_the_memory_broker_names_an_undecodable_stuck_record() -> None:
    app = _app(Redeliver(), Counter())
    broker = MemoryBroker(app, max_attempts=2)
    broker.send_raw("in", b"plain text", key=b"k")
    with pytest.raises(StuckRecordsError, match="not a CloudEvent") as raised:
        await broker.process()
    (stuck,) = raised.value.stuck
    assert "key b'k', not a CloudEvent: b'plain text'" in str(stuck)
    assert stuck.error.startswith("not a CloudEvent")


async def test_the_memory_broker_lists_every_stuck_partition_and_agent() -> None:
    app = App("t")

    for name in ("one", "two"):

        @app.agent(app.topic(name, partitions=1), name=name)
        async def broken(event: Event) -> None:
            raise KeyError("missing")

    broker = MemoryBroker(app, max_attempts=2)
    broker.send("one", _ev("e1"))
    broker.send("two", _ev("e2"))
    with pytest.raises(StuckRecordsError) as raised:
        await broker.process()
    assert [(s.agent, s.record.topic) for s in raised.value.stuck] == [
        ("one", "one"),
        ("two", "two"),
    ]
    assert str(raised.value).startswith("2 record(s) still unsettled")


# run_batch: the fallback, directly ------------------------------------------------------
def _message(eid: str, position: int = 7) -> DeliveryRecord:
    key, value, headers = codec.encode(_ev(eid))
    return DeliveryRecord("in", 0, position, key, value, tuple(headers))


async def _raise(event: Event) -> None:
    raise RuntimeError("down")


def _decode(d: Delivery) -> Event:
    return codec.decode(d.key, d.value, d.headers)


async def test_a_fallback_park_that_fails_redelivers_instead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = Agent(
        "a", _raise, TopicSpec("in", 1), on_failure=Redeliver(max_attempts=3, fallback=Park("p"))
    )
    asked: list[str] = []

    async def park(delivery: Delivery, reason: str) -> bool:
        asked.append(reason)
        return False  # the broker did not confirm

    caplog.set_level(logging.WARNING, logger="streamapp.agent")
    record = _message("e")
    lane = Lane(agent, park, Attempts(0.0, 0.0), None)
    lane.attempts.failed_at(record.position, "down")  # attempt 1 failed before
    early = await run_lanes([lane], [0], [record], _decode, 10)
    assert (early.reached, early.stop, asked) == ([0], 7, [])  # attempt 2 of 3: no fallback
    assert "will redeliver (attempt 2 of 3)" in caplog.text
    late = await run_lanes([lane], [0], [record], _decode, 10)
    assert late.reached == [0]
    assert late.failed == [lane]
    assert asked == ["gave up after 3 attempts: RuntimeError: down"]
    assert "will redeliver (attempt 3 of 3)" in caplog.text


# attempts and pauses ------------------------------------------------------------------------
def test_pauses_double_per_failed_attempt_up_to_the_cap() -> None:
    attempts = Attempts(first_pause_s=0.5, max_pause_s=3.0)
    assert attempts.pause_s() == 0.5  # nothing failed yet: the first pause
    pauses = []
    for _ in range(6):
        attempts.failed_at(4, "boom")
        pauses.append(attempts.pause_s())
    assert pauses == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert attempts.before(_message("e", 4)) == 6
    assert attempts.before(_message("e", 5)) == 0
    attempts.settled(4)  # below 4 settled: not this one
    assert attempts.failed == 6
    assert attempts.failed_at(5, "other") == 1  # another delivery counts from one
    attempts.settled(6)
    assert (attempts.position, attempts.failed, attempts.last_error) == (None, 0, "")


def test_doubled_keeps_a_first_pause_above_the_cap_and_zero_stays_zero() -> None:
    assert doubled(5.0, 2.0, 1) == doubled(5.0, 2.0, 4) == 5.0
    assert doubled(0.0, 2.0, 9) == 0.0
    assert doubled(0.5, 30.0, 10_000) == 30.0


def test_the_first_pause_is_the_policy_pause_else_the_poll_timeout() -> None:
    config = TaskConfig.from_settings(
        Settings("a", poll_timeout_ms=200, redeliver_backoff_max_ms=4_000)
    )
    assert (config.redeliver_pause_s, config.redeliver_backoff_max_s) == (0.2, 4.0)
    assert config.first_pause_s(Redeliver()) == 0.2
    assert config.first_pause_s(Redeliver(pause_s=1.5)) == 1.5
    assert config.first_pause_s(Park("p")) == 0.2  # a park that fails is redelivered
    quiet = TaskConfig(redeliver_pause_s=0.0, policy_pauses=False)  # the memory broker
    assert quiet.first_pause_s(Redeliver(pause_s=1.5)) == 0.0


def test_the_backoff_cap_is_a_setting() -> None:
    assert Settings("a").redeliver_backoff_max_ms == 30_000
    env = {"STREAMAPP_REDELIVER_BACKOFF_MAX_MS": "5000"}
    assert Settings.from_env("a", env=env).redeliver_backoff_max_ms == 5000
    with pytest.raises(ConfigError, match="STREAMAPP_REDELIVER_BACKOFF_MAX_MS"):
        Settings.from_env("a", env={"STREAMAPP_REDELIVER_BACKOFF_MAX_MS": "0"})


# validation -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("policy", "why"),
    [
        (Redeliver(max_attempts=0, fallback=Park("p")), "max_attempts must be an integer of at"),
        (Redeliver(max_attempts=-2, fallback=Park("p")), "max_attempts must be an integer of at"),
        (Redeliver(max_attempts=3, fallback=Redeliver()), "cannot be another Redeliver"),  # type: ignore[arg-type]
        (Redeliver(max_attempts=3), "needs somewhere to go: give fallback=Park"),
        (Redeliver(fallback=Park("p")), "give max_attempts too"),
        (Redeliver(max_attempts=3, fallback="dlq"), "other than Redeliver"),  # type: ignore[arg-type]
        (Redeliver(max_attempts=3, fallback=Park(" ")), "non-blank"),
        (Redeliver(pause_s=-1.0), "pause_s must be zero or more"),
        (Park(""), "non-blank"),
        ("park", "Redeliver(...) or Park(destination)"),
    ],
)
def test_a_policy_that_cannot_work_is_refused_naming_the_agent(policy: Any, why: str) -> None:
    app = App("t")
    with pytest.raises(ConfigError, match="agent 'orders_view'") as raised:

        @app.agent(app.topic("in"), on_failure=policy, name="orders_view")
        async def handler(event: Event) -> None:
            pass

    assert why in str(raised.value)
    assert "orders_view" not in app.agents


def test_unbounded_redeliver_stays_the_default() -> None:
    app = App("t")

    @app.agent(app.topic("in"))
    async def handler(event: Event) -> None:
        pass

    assert app.agents["handler"].on_failure == Redeliver()
    assert Redeliver().max_attempts is None
    assert Redeliver().fallback is None
    assert not [p for p in app.topic_plan() if p.role == "parking"]
