"""Park(destination, hold="stream"): a failed event holds its stream, not its partition."""

from __future__ import annotations

import pytest

from streamapp import App, Event, Outcome, Park, Redeliver, Table, TableView
from streamapp.codecs import kafka as kafka_codec
from streamapp.engine.hold import HELD_PLACE, HELD_STREAM
from streamapp.errors import ConfigError
from streamapp.failures.outcomes import check_policy
from streamapp.tables.changelog import RestoreChunk, records
from streamapp.tables.held import HeldStream
from streamapp.tables.partition import PartitionTables, spaces_for
from streamapp.tables.store import MemoryStore
from streamapp.testing import MemoryBroker


def _bank(policy: Park | Redeliver) -> tuple[App, MemoryBroker]:
    app = App("bank")
    balances: Table[int] = Table("balances")

    @app.agent(app.topic("tx", partitions=1), tables=[balances], on_failure=policy)
    async def apply(event: Event, balance: TableView[int]) -> None:
        if event.data.get("poison"):
            raise ValueError(f"cannot apply {event.type}")
        sid = event.stream_id
        assert sid is not None
        balance[sid] = balance.get(sid, 0) + int(event.data["amount"])

    return app, MemoryBroker(app)


def _send(
    broker: MemoryBroker, stream: str, version: int, amount: int, poison: bool = False
) -> None:
    data = {"amount": amount, "poison": poison}
    broker.send("tx", Event.create("moved", stream_id=stream, version=version, data=data))


async def test_a_failed_event_holds_its_stream_and_parks_its_later_events_behind_in_order() -> None:
    """Stream b fails at version 2: b stays at its last applied value, b's versions 3 and
    4 are parked behind version 2 in order (marked with the stream and their place), and
    streams a and c, before and after it in the partition, are exact."""
    _, broker = _bank(Park("parked", hold="stream"))
    for version in (1, 2, 3, 4):
        for stream in ("a", "b", "c"):
            _send(broker, stream, version, 10 * version, poison=(stream, version) == ("b", 2))
    counts = await broker.process()
    table = broker.table("balances")
    assert (table["a"], table["b"], table["c"]) == (100, 10, 100)
    assert counts[Outcome.FAILED] == 1
    assert counts[Outcome.HELD] == 2
    parked = broker.records("parked")
    assert [dict(r.headers)["ce_streamversion"] for r in parked] == [b"2", b"3", b"4"]
    assert [dict(r.headers)[HELD_STREAM] for r in parked] == [b"b"] * 3
    assert [dict(r.headers)[HELD_PLACE] for r in parked] == [b"1", b"2", b"3"]
    (held,) = broker.held("apply").values()
    assert (held.stream, held.first, held.events, held.last) == ("b", 2, 3, 4)
    assert "ValueError: cannot apply moved" in held.error


async def test_without_hold_a_stream_goes_on_without_its_failed_event() -> None:
    """Park(destination) stays as it was: the later events of the stream are applied."""
    _, broker = _bank(Park("parked"))
    for version in (1, 2, 3):
        _send(broker, "b", version, 10 * version, poison=version == 2)
    await broker.process()
    assert broker.table("balances")["b"] == 40
    assert len(broker.records("parked")) == 1


async def test_a_bounded_redeliver_holds_the_stream_once_its_attempts_are_spent() -> None:
    _, broker = _bank(Redeliver(max_attempts=2, fallback=Park("parked", hold="stream")))
    for version in (1, 2, 3):
        _send(broker, "b", version, 10 * version, poison=version == 2)
    _send(broker, "a", 1, 5)
    await broker.process()
    assert (broker.table("balances")["b"], broker.table("balances")["a"]) == (10, 5)
    assert [dict(r.headers)[HELD_PLACE] for r in broker.records("parked")] == [b"1", b"2"]


async def test_a_redelivered_event_parked_already_is_not_parked_twice() -> None:
    _, broker = _bank(Park("parked", hold="stream"))
    for version in (1, 2, 3, 3):
        _send(broker, "b", version, 10 * version, poison=version == 2)
    await broker.process()
    assert len(broker.records("parked")) == 2


def test_a_hold_needs_the_agent_to_have_a_table() -> None:
    app = App("t")
    with pytest.raises(ConfigError, match="held stream is part of the agent's table state"):

        @app.agent(app.topic("in"), on_failure=Park("p", hold="stream"))
        async def nothing(event: Event) -> None:
            pass


def test_hold_is_stream_or_nothing() -> None:
    with pytest.raises(ConfigError, match="give hold='stream'"):
        check_policy(Park("p", hold="key"), "a")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="give hold='stream'"):
        check_policy(Redeliver(max_attempts=1, fallback=Park("p", hold="all")), "a")  # type: ignore[arg-type]


def test_holds_are_written_with_the_batch_and_restored_from_its_changelog_records() -> None:
    """The hold travels in the batch: the store write and the changelog records carry
    it, a restore from those records holds the stream again, a release removes it."""
    table: Table[int] = Table("n")
    store = MemoryStore(spaces_for([table]))
    tables = PartitionTables([table], store, 0)
    tables.hold(HeldStream("s", first=2, position=7, event="e2", error="boom"))
    assert tables.holding
    assert tables.committed_held("s") is None  # open batch only
    batch = tables.take_batch(tables.checkpoint)
    tables.write(batch)
    assert tables.committed_held("s") == HeldStream("s", 2, 7, "e2", "boom")
    assert PartitionTables([table], store, 0).held("s") is not None  # reopened: held

    restored = PartitionTables([table], MemoryStore(spaces_for([table])), 0)
    chunk = RestoreChunk(restored)
    for key, value in records(batch):
        chunk.apply(key, value)
    chunk.write(restored, 1)
    assert restored.held("s") == HeldStream("s", 2, 7, "e2", "boom")

    restored.release("s")
    released = restored.take_batch(restored.checkpoint)
    restored.write(released)
    assert not restored.holding
    chunk = RestoreChunk(restored)
    for key, value in [*records(batch), *records(released)]:
        chunk.apply(key, value)
    chunk.write(restored, 2)
    assert restored.held("s") is None


def test_a_dropped_batch_forgets_its_holds() -> None:
    table: Table[int] = Table("n")
    tables = PartitionTables([table], MemoryStore(spaces_for([table])), 0)
    tables.hold(HeldStream("s", first=2, position=7, event="e2", error="boom"))
    tables.drop_batch()
    assert not tables.holding


async def test_a_hold_is_its_lane_s_alone_when_two_agents_share_a_topic() -> None:
    """Two agents of one topic: the one that holds parks stream b behind its failure;
    the other, which did not fail, applies every event of b."""
    app = App("two")
    topic = app.topic("tx", partitions=1)
    held: Table[int] = Table("held")
    seen: Table[int] = Table("seen")

    @app.agent(topic, tables=[held], on_failure=Park("parked", hold="stream"))
    async def strict(event: Event, t: TableView[int]) -> None:
        if event.data.get("poison"):
            raise ValueError("poison")
        t[event.stream_id or ""] = t.get(event.stream_id or "", 0) + 1

    @app.agent(topic, tables=[seen])
    async def count(event: Event, t: TableView[int]) -> None:
        t[event.stream_id or ""] = t.get(event.stream_id or "", 0) + 1

    broker = MemoryBroker(app)
    for version in (1, 2, 3):
        _send(broker, "b", version, 1, poison=version == 2)
    _send(broker, "a", 1, 1)
    await broker.process()
    assert (broker.table("held")["b"], broker.table("held")["a"]) == (1, 1)
    assert broker.table("seen")["b"] == 3
    assert list(broker.held("strict")) == ["b"]
    assert broker.held("count") == {}


def _fixable_bank() -> tuple[dict[str, bool], MemoryBroker]:
    """A bank whose poison events fail until ``fixed["fixed"]`` is set; the fold doubles
    the balance before each amount, so the order of a stream's events shows."""
    fixed: dict[str, bool] = {"fixed": False}
    app = App("bank")
    balances: Table[int] = Table("balances")

    @app.agent(app.topic("tx", partitions=1), tables=[balances],
               on_failure=Park("parked", hold="stream"))  # fmt: skip
    async def apply(event: Event, balance: TableView[int]) -> None:
        if event.data.get("poison") and not fixed["fixed"]:
            raise ValueError("not yet")
        sid = event.stream_id or ""
        balance[sid] = balance.get(sid, 0) * 2 + int(event.data["amount"])  # order matters

    return fixed, MemoryBroker(app)


async def test_a_replay_releases_the_held_stream_in_order_and_the_table_is_exact() -> None:
    """The handler is fixed, the parked records go back: b's held events are applied in
    order, b is released, and the table equals one built from scratch."""
    fixed, broker = _fixable_bank()
    for version in (1, 2, 3, 4):
        for stream in ("a", "b"):
            _send(broker, stream, version, version, poison=(stream, version) == ("b", 2))
    await broker.process()
    assert broker.table("balances")["b"] == 1
    fixed["fixed"] = True
    assert broker.replay_parked("parked") == 3
    await broker.process()
    assert broker.held("apply") == {}
    assert broker.table("balances")["b"] == broker.table("balances")["a"] == 26
    assert broker.replay_parked("parked") == 0  # each once


async def test_a_held_stream_whose_versions_have_gaps_is_released_in_full() -> None:
    """The topic carries some of b's events only (versions 1, 3, 5, 8: the others go to
    another topic): b fails at 3, 5 and 8 wait behind it, and a release applies all three
    in order (a release that waited for version 4 would hold b for good)."""
    fixed, broker = _fixable_bank()
    for version in (1, 3, 5, 8):
        _send(broker, "b", version, version, poison=version == 3)
    await broker.process()
    assert broker.table("balances")["b"] == 1
    fixed["fixed"] = True
    assert broker.replay_parked("parked") == 3
    await broker.process()
    assert broker.held("apply") == {}
    assert broker.table("balances")["b"] == ((1 * 2 + 3) * 2 + 5) * 2 + 8


async def test_a_replayed_event_that_fails_again_holds_the_stream_again_from_it() -> None:
    """Of b's held 2, 3, 4, version 3 still fails when sent back: 2 is applied, b is held
    again from 3 (3 and 4 parked again, in order); a second replay, fixed, releases it."""
    poison = {3}
    app = App("bank")
    balances: Table[int] = Table("balances")

    @app.agent(app.topic("tx", partitions=1), tables=[balances],
               on_failure=Park("parked", hold="stream"))  # fmt: skip
    async def apply(event: Event, balance: TableView[int]) -> None:
        if event.stream_id == "b" and (event.stream_version or 0) in poison:
            raise ValueError(f"poison {event.stream_version}")
        sid = event.stream_id or ""
        balance[sid] = balance.get(sid, 0) * 2 + int(event.data["amount"])

    broker = MemoryBroker(app)
    poison.add(2)
    for version in (1, 2, 3, 4):
        _send(broker, "b", version, version)
    await broker.process()
    poison.discard(2)
    assert broker.replay_parked("parked") == 3
    await broker.process()
    assert broker.table("balances")["b"] == 4  # 1, then 1*2+2
    (held,) = broker.held("apply").values()
    assert (held.first, held.events, held.last) == (3, 2, 4)
    assert "poison 3" in held.error
    again = broker.records("parked")[3:]
    assert [dict(r.headers)["ce_streamversion"] for r in again] == [b"3", b"4"]
    poison.clear()
    assert broker.replay_parked("parked") == 2
    await broker.process()
    assert broker.held("apply") == {}
    assert broker.table("balances")["b"] == 26


async def test_live_events_of_a_held_stream_during_its_release_are_released_by_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A new live event of b comes before the held ones come back (parked behind them, and
    kept by the lane), another after them: one replay applies 2, 3, then 4 right after
    them, and 5 live, in order; nothing stays held, and the copy of 4 that a later replay
    sends back is skipped by its stream version without a warning."""
    fixed = {"fixed": False}
    app = App("bank")
    balances: Table[int] = Table("balances")

    @app.agent(app.topic("tx", partitions=1), tables=[balances],
               on_failure=Park("parked", hold="stream"))  # fmt: skip
    async def apply(event: Event, balance: TableView[int]) -> None:
        if event.data.get("poison") and not fixed["fixed"]:
            raise ValueError("not yet")
        sid = event.stream_id or ""
        balance[sid] = balance.get(sid, 0) * 2 + int(event.data["amount"])

    broker = MemoryBroker(app)
    for version in (1, 2, 3):
        _send(broker, "b", version, version, poison=version == 2)
    await broker.process()
    fixed["fixed"] = True
    _send(broker, "b", 4, 4)  # live, before the held ones come back
    assert broker.replay_parked("parked") == 2  # 2 and 3: 4 is parked after the run began
    _send(broker, "b", 5, 5)  # live, after them
    await broker.process()
    assert broker.held("apply") == {}
    assert broker.table("balances")["b"] == 57  # 1, 4, 11, 26, 57: one replay
    assert broker.replay_parked("parked") == 1  # 4's copy, applied already
    await broker.process()
    assert broker.table("balances")["b"] == 57
    assert "moved on while it was held" not in caplog.text


def test_kept_events_are_written_with_the_batch_and_restored_from_its_changelog_records() -> None:
    """The events kept behind a hold travel in the batch and its changelog records: a
    restore finds them, lowest stream version first; one done with is gone."""
    table: Table[int] = Table("n")
    tables = PartitionTables([table], MemoryStore(spaces_for([table])), 0)
    tables.keep("s", 4, b"four")
    tables.keep("s", 3, b"three")
    tables.keep("t", 1, b"other")
    assert tables.next_kept("s", 2) == (3, b"three")  # the open batch
    batch = tables.take_batch(tables.checkpoint)
    tables.write(batch)
    assert (tables.next_kept("s", 2), tables.next_kept("s", 3)) == ((3, b"three"), (4, b"four"))
    tables.done_with("s", 3)
    assert tables.next_kept("s", 2) == (4, b"four")
    done = tables.take_batch(tables.checkpoint)
    restored = PartitionTables([table], MemoryStore(spaces_for([table])), 0)
    chunk = RestoreChunk(restored)
    for key, value in [*records(batch), *records(done)]:
        chunk.apply(key, value)
    chunk.write(restored, 1)
    assert (restored.next_kept("s", 0), restored.next_kept("s", 4)) == ((4, b"four"), None)
    assert restored.next_kept("t", 0) == (1, b"other")


async def test_a_skip_leaves_one_held_event_out_on_purpose_and_releases_the_rest() -> None:
    """Of b's held 2, 3, event 2 is skipped: the handler never sees it, the skip is in the
    lane's state (written with the batch, in the changelog records), 3 is applied after
    1, b is released; a later replay of 2 is skipped by the stream-version guard."""
    seen: list[int] = []
    app = App("bank")
    balances: Table[int] = Table("balances")

    @app.agent(app.topic("tx", partitions=1), tables=[balances],
               on_failure=Park("parked", hold="stream"))  # fmt: skip
    async def apply(event: Event, balance: TableView[int]) -> None:
        seen.append(event.stream_version or 0)
        if event.data.get("poison"):
            raise ValueError("poison forever")
        sid = event.stream_id or ""
        balance[sid] = balance.get(sid, 0) * 2 + int(event.data["amount"])

    broker = MemoryBroker(app)
    for version in (1, 2, 3):
        _send(broker, "b", version, version, poison=version == 2)
    await broker.process()
    poison_id = dict(broker.records("parked")[0].headers)["ce_id"].decode()
    assert broker.replay_parked("parked", stream="b", skip=poison_id) == 2
    await broker.process()
    assert seen == [1, 2, 3]  # 2 ran once (its failure), never again
    assert broker.held("apply") == {}
    assert broker.table("balances")["b"] == 5  # 1, then 1*2+3


def test_a_skip_is_written_with_the_batch_and_restored_from_its_changelog_records() -> None:
    table: Table[int] = Table("n")
    tables = PartitionTables([table], MemoryStore(spaces_for([table])), 0)
    tables.skip("s", "e2", b'{"stream":"s","event":"e2"}')
    assert tables.skipped() == []  # the open batch only
    batch = tables.take_batch(tables.checkpoint)
    tables.write(batch)
    assert tables.skipped() == [b'{"stream":"s","event":"e2"}']
    restored = PartitionTables([table], MemoryStore(spaces_for([table])), 0)
    chunk = RestoreChunk(restored)
    for key, value in records(batch):
        chunk.apply(key, value)
    chunk.write(restored, 1)
    assert restored.skipped() == [b'{"stream":"s","event":"e2"}']
    assert (tables.skips, restored.skips) == (1, 1)  # counted in memory, restored at open
    assert PartitionTables([table], restored.store, 0).skips == 1


async def test_a_skip_finds_the_id_of_a_structured_mode_event() -> None:
    """The poison event is a structured-mode CloudEvent (its id in the JSON body, no
    ``ce_id`` header): the skip finds it by that id and releases the rest in order."""
    _, broker = _fixable_bank()  # never fixed
    _send(broker, "b", 1, 1)
    poison = Event.create("moved", stream_id="b", version=2, data={"amount": 2, "poison": True})
    key, value, headers = kafka_codec.encode_structured(poison)
    broker.send_raw("tx", value, key=key, headers=headers)
    _send(broker, "b", 3, 3)
    await broker.process()
    assert "ce_id" not in dict(broker.records("parked")[0].headers)
    assert broker.replay_parked("parked", stream="b", skip=poison.id) == 2
    await broker.process()
    assert broker.held("apply") == {}
    assert broker.table("balances")["b"] == 1 * 2 + 3  # 2 left out, on purpose
