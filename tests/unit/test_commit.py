"""The commit order with lanes, sends and positions, on a recording port and transaction:

- with a transaction (Kafka), one commit carries every lane's changelog batch, the
  derived events and, when a lane has no tables, the source position with the lanes
  ahead of it (nothing else settles); when every lane has tables, the position is
  settled after the store write;
- without one (RabbitMQ), derived events are confirmed before the store write, which
  comes before the settle (the store write recorded by a RocksDB store that logs it);
- a restart places each lane at its own position (checkpoint, or the committed
  position's ``ahead``) and a lane never runs a delivery below it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from streamapp import App, Event, PublishError, Send, Table, TableView
from streamapp.agents.agent import Agent
from streamapp.codecs import kafka as codec
from streamapp.engine.factory import TaskFactory
from streamapp.engine.interfaces import Committed
from streamapp.engine.task import PartitionTask
from streamapp.engine.task_config import TaskConfig
from streamapp.records import Delivery, DeliveryRecord, Message
from streamapp.tables.checkpoint import Checkpoint
from streamapp.tables.partition import CHECKPOINT_KEY, META, BatchChanges, PartitionTables
from streamapp.tables.store import Changes, MemoryStore, RocksStore, Store
from tests.support.doubles import MemoryPort as Port
from tests.support.doubles import RecordingTransaction as Transaction
from tests.support.doubles import no_park


def app_with_lanes(calls: list[str], fail: str = "") -> App:
    """``keep`` (table) and ``echo`` (no table, sends) on one topic; ``keep`` raises on
    event id ``fail``."""
    app = App("t")
    topic, out = app.topic("in", partitions=1), app.topic("out", partitions=1)
    kept: Table[int] = Table("kept")

    @app.agent(topic, tables=[kept])
    async def keep(event: Event, kept: TableView[int]) -> None:
        calls.append(f"keep:{event.id}")
        kept["s"] = kept.get("s", 0) + 1
        if event.id == fail:
            raise RuntimeError("keep fails")

    @app.agent(topic, sinks=[out])
    async def echo(event: Event, *, send: Send) -> None:
        calls.append(f"echo:{event.id}")
        send(out, Event.create("echoed", stream_id="s", id=f"{event.id}/e"))

    return app


def records(*ids: str, start: int = 0) -> list[Delivery]:
    out: list[Delivery] = []
    for i, eid in enumerate(ids):
        key, value, headers = codec.encode(Event.create("x", stream_id="s", id=eid))
        out.append(DeliveryRecord("in", 0, start + i, key, value, tuple(headers)))
    return out


class LoggedStore(RocksStore):
    """A RocksDB store that logs each write to ``log``, with what that one write holds of
    ``kept`` and of the checkpoint: the order tests see where the store write falls
    between send and settle, and that the state and its checkpoint are one write."""

    def __init__(self, path: Path, spaces: list[str], log: list[str]) -> None:
        super().__init__(path, spaces, open_timeout_s=1)
        self.log = log

    def write(self, changes: Changes, *, keep: bool = True) -> None:
        super().write(changes, keep=keep)
        kept = changes.get("t:kept", {}).get(b"s")
        raw = changes.get(META, {}).get(CHECKPOINT_KEY)
        live = None if raw is None else Checkpoint.decode(raw).live
        self.log.append(f"store write (kept {kept!r}, checkpoint {live})")


def logged(tmp_path: Path, order: list[str]) -> Callable[[Agent, list[str]], Store]:
    """Stores for :func:`task`: a :class:`LoggedStore` per agent under ``tmp_path``."""
    return lambda agent, spaces: LoggedStore(tmp_path / agent.name, spaces, order)


def task(
    app: App,
    port: Port,
    stores: dict[str, Store],
    *,
    transaction: Transaction | None = None,
    publish: Any = None,
    make_store: Callable[[Agent, list[str]], Store] | None = None,
) -> PartitionTask:
    def open_store(agent: Agent, spaces: list[str]) -> Store:
        if agent.name not in stores:
            made = make_store(agent, spaces) if make_store else MemoryStore(spaces)
            stores[agent.name] = made
        return stores[agent.name]

    return TaskFactory(
        config=TaskConfig(redeliver_pause_s=0.0),
        decode=lambda d: codec.decode(d.key, d.value, d.headers),
        park=lambda agent, name: no_park,
        encode=codec.encode,
        publish=publish,
    ).create(
        app.agents_of("in"),
        0,
        port,
        name="in[0]",
        open_store=open_store,
        transaction=transaction,
    )


async def test_one_transaction_holds_changelogs_sends_and_the_position_with_lanes_ahead() -> None:
    calls: list[str] = []
    port, txn, stores = Port(), Transaction(), {}
    t = task(app_with_lanes(calls, fail="e1"), port, stores, transaction=txn)
    await t.open()
    await t.process(records("e0", "e1", "e2"))
    assert calls == ["keep:e0", "echo:e0", "keep:e1", "echo:e1"]  # stops after e1
    (changes, outputs, settle), *_ = txn.commits
    assert [name for name, _ in changes] == ["keep"]
    assert changes[0][1].checkpoint.live == 1
    assert [codec.decode(m.key, m.value, m.headers).id for m in outputs] == ["e0/e", "e1/e"]
    assert settle == Committed(1, {"echo": 2})  # echo settled e1: it is ahead
    assert port.settled == []  # the transaction settled
    assert port.rewound == [1]

    calls.clear()  # redelivered: only keep runs e1 again (and fails again), echo waits
    await t.process(records("e1", "e2", start=1))
    assert calls == ["keep:e1"]
    assert txn.commits[-1][2] == Committed(1, {"echo": 2})
    await t.close()


async def test_with_tables_only_the_offset_settles_after_the_store_the_transaction_has_the_last(
    tmp_path: Path,
) -> None:
    """Every lane resumes from its checkpoint (in the transaction), so the batch's offset
    needs no transactional commit: it is settled once the store holds the batch. The
    transaction carries the offset durable before the batch (the group coordinator's
    check of the worker's generation fences a zombie with it). The RocksDB store logs
    its write: a settle before it fails here."""
    app = App("t")
    kept: Table[int] = Table("kept")
    stores: dict[str, Store] = {}
    order: list[str] = []

    @app.agent(app.topic("in", partitions=1), tables=[kept])
    async def keep(event: Event, kept: TableView[int]) -> None:
        kept["s"] = kept.get("s", 0) + 1

    class Recording(Transaction):
        async def commit(
            self,
            changes: Sequence[tuple[Agent, BatchChanges]],
            outputs: Sequence[Message],
            settle: Committed | None,
        ) -> list[int]:
            order.append(f"transaction (store before: {stores['keep'].get('t:kept', b's')!r})")
            return await super().commit(changes, outputs, settle)

    port, txn = Port(log=order), Recording()
    t = task(app, port, stores, transaction=txn, make_store=logged(tmp_path, order))
    await t.open()
    await t.process(records("e0", "e1"))
    (changes, _, settle), *_ = txn.commits
    assert settle is None  # a new table's first batch: no offset durable before it
    assert changes[0][1].checkpoint.live == 2
    assert order == [
        "transaction (store before: None)",
        "store write (kept b'2', checkpoint 2)",
        "settle 2",
    ]
    assert stores["keep"].get("t:kept", b"s") == b"2"
    await t.process(records("e2", start=2))
    (changes, _, settle) = txn.commits[-1]
    assert settle == Committed(2, {})  # durable before the batch, not the batch's end
    assert changes[0][1].checkpoint.live == 3
    await t.close()


async def test_a_restart_places_each_lane_at_its_own_position() -> None:
    calls: list[str] = []
    stores: dict[str, Store] = {}
    txn = Transaction()
    first = task(app_with_lanes(calls, fail="e1"), Port(), stores, transaction=txn)
    await first.open()
    await first.process(records("e0", "e1", "e2"))
    await first.close()
    # keep's checkpoint says 1; the committed offset 1 says echo is at 2
    calls.clear()
    port = Port(committed=Committed(1, {"echo": 2}))
    again = task(app_with_lanes(calls), port, stores, transaction=Transaction())
    await again.open()
    assert [lane.next for lane in again.lanes] == [1, 2]
    assert again.next_position == 1
    await again.process(records("e1", "e2", start=1))
    assert calls == ["keep:e1", "keep:e2", "echo:e2"]  # echo never runs e1 again
    await again.close()


async def test_without_a_transaction_sends_are_confirmed_before_the_store_and_the_settle(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    order: list[str] = []
    stores: dict[str, Store] = {}
    port = Port(log=order)

    async def publish(messages: Sequence[Message]) -> None:
        kept = stores["keep"].get("t:kept", b"s")
        order.append(f"publish {len(messages)} (store before: {kept!r})")

    t = task(
        app_with_lanes(calls), port, stores, publish=publish, make_store=logged(tmp_path, order)
    )
    await t.open()
    await t.process(records("e0", "e1"))
    assert order == [
        "publish 2 (store before: None)",
        "store write (kept b'2', checkpoint 2)",
        "settle 2",
    ]
    assert stores["keep"].get("t:kept", b"s") == b"2"
    await t.close()


class CommitsThenTimesOut(Transaction):
    """The first commit reaches the broker, but its answer does not come back in time."""

    def __init__(self, port: Port) -> None:
        super().__init__()
        self.port = port
        self.unseen: dict[str, BatchChanges] = {}

    async def commit(
        self,
        changes: Sequence[tuple[Agent, BatchChanges]],
        outputs: Sequence[Message],
        settle: Committed | None,
    ) -> list[int]:
        positions = await super().commit(changes, outputs, settle)
        if len(self.commits) > 1:
            return positions
        self.unseen = {agent.name: batch for agent, batch in changes}
        self.port.committed_at = settle  # the offset was in the transaction
        raise PublishError("transaction not committed within 10s (setting publish_timeout_s)")

    async def restore(self, agent: Agent, tables: PartitionTables) -> int:
        batch = self.unseen.pop(agent.name, None)
        if batch is None:
            return 0
        tables.write(batch, 1)
        return 1


async def test_a_timed_out_transaction_that_committed_is_restored_not_run_again() -> None:
    """Its derived events would otherwise go out twice to read_committed readers."""
    calls: list[str] = []
    port, stores = Port(), dict[str, Store]()
    txn = CommitsThenTimesOut(port)
    t = task(app_with_lanes(calls), port, stores, transaction=txn)
    await t.open()
    await t.process(records("e0", "e1", "e2"))
    assert calls == ["keep:e0", "echo:e0", "keep:e1", "echo:e1", "keep:e2", "echo:e2"]
    assert [lane.committed for lane in t.lanes] == [3, 3]
    assert t.next_position == 3
    assert port.rewound[-1] == 3
    assert t.tables is not None
    assert t.tables.views[0].get("s") == 3

    calls.clear()  # the source delivers from 3 on: nothing runs twice
    await t.process(records("e3", start=3))
    assert calls == ["keep:e3", "echo:e3"]
    sent = [codec.decode(m.key, m.value, m.headers).id for _, out, _ in txn.commits for m in out]
    assert sent == ["e0/e", "e1/e", "e2/e", "e3/e"]  # each derived event once
    await t.close()


async def test_on_a_session_numbered_source_every_lane_starts_with_the_session() -> None:
    """RabbitMQ numbers deliveries per consuming session: a lane's position from an
    earlier session says nothing of this one's, so no lane skips a new delivery."""
    calls: list[str] = []
    app = App("t")
    topic = app.topic("in", partitions=1)
    a_table: Table[int] = Table("a")
    b_table: Table[int] = Table("b")

    @app.agent(topic, tables=[a_table])
    async def a(event: Event, t: TableView[int]) -> None:
        calls.append(f"a:{event.id}")
        t["s"] = t.get("s", 0) + 1

    @app.agent(topic, tables=[b_table])
    async def b(event: Event, t: TableView[int]) -> None:
        calls.append(f"b:{event.id}")
        if event.id == "e1":
            raise RuntimeError("b fails")
        t["s"] = t.get("s", 0) + 1

    stores: dict[str, Store] = {}
    first = task(app, Port(), stores)
    await first.open()
    await first.process(records("e0", "e1", "e2"))
    await first.close()
    assert [lane.committed for lane in first.lanes] == [2, 1]  # a is ahead of b

    session = Port(absolute=False)
    calls.clear()
    again = task(app, session, stores)
    await again.open()
    assert [lane.next for lane in again.lanes] == [1, 1]
    await again.process(records("n1", "n2", start=1))  # this session's deliveries
    assert calls == ["a:n1", "b:n1", "a:n2", "b:n2"]
    await again.close()
