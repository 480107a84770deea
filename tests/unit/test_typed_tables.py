"""Typed tables (``Table(..., value_type=T, default=...)``): msgspec-encoded values that
come back typed, a default for missing keys, JSON tables unchanged, and a store of
another value type refused at open, never misread."""

from __future__ import annotations

import msgspec
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from streamapp import App, Event, Table, TableView
from streamapp.agents.agent import Agent
from streamapp.codecs import kafka as codec
from streamapp.engine.factory import TaskFactory
from streamapp.engine.phase import Phase
from streamapp.engine.task import PartitionTask
from streamapp.engine.task_config import TaskConfig
from streamapp.errors import StateMismatchError
from streamapp.records import Delivery
from streamapp.tables.partition import CHECKPOINT_KEY, META, spaces_for
from streamapp.tables.store import MemoryStore
from streamapp.tables.table import StructCodec
from streamapp.testing import MemoryBroker
from streamapp.topics import TopicSpec
from streamapp.web.views import make_app
from tests.support.doubles import MemoryPort
from tests.support.webworld import World


class Balance(msgspec.Struct):
    total: int = 0
    count: int = 0


class BalanceV2(msgspec.Struct):
    total: int = 0
    count: int = 0
    last: str = ""


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
def test_values_round_trip_typed_in_either_encoding(encoding: str) -> None:
    c: StructCodec[Balance] = StructCodec(Balance, encoding)
    raw = c.dumps(Balance(5, 2))
    assert c.loads(raw) == Balance(5, 2)
    if encoding == "json":
        assert orjson.loads(raw) == {"total": 5, "count": 2}
    assert c.schema["$ref"].endswith("Balance")
    assert c.tag.startswith(f"Balance/{encoding}/")


def test_a_bad_value_type_or_default_is_refused_naming_the_table() -> None:
    with pytest.raises(ValueError, match=r"table 'b': value_type=.*cannot be stored"):
        Table("b", value_type=object)
    with pytest.raises(ValueError, match="table 'b': default=0 is not callable"):
        Table("b", default=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="value_type= or codec="):
        Table("b", value_type=Balance, codec=StructCodec(Balance))


async def test_an_agent_folds_into_typed_values_with_a_default() -> None:
    app = App("t")
    balances: Table[Balance] = Table("balances", value_type=Balance, default=Balance)
    counts: Table[int] = Table("counts", value_type=int, default=int)

    @app.agent(app.topic("in", partitions=2), tables=[balances, counts])
    async def fold(event: Event, view: TableView[Balance], n: TableView[int]) -> None:
        sid = event.stream_id
        assert sid is not None
        current = view[sid]  # Balance() when missing
        view[sid] = Balance(current.total + event.data["amount"], current.count + 1)
        n[sid] += 1

    broker = MemoryBroker(app)
    for amount in (3, 4):
        broker.send("in", Event.create("paid", stream_id="a", data={"amount": amount}))
    await broker.process()
    assert broker.table("balances")["a"] == Balance(7, 2)
    assert broker.table("counts")["a"] == 2
    assert broker.table("balances").get("missing") is None  # get() keeps dict manners


async def _noop(event: Event, view: TableView[object]) -> None: ...


def _task(table: Table[object], memory: MemoryStore) -> PartitionTask:
    async def park(delivery: Delivery, reason: str) -> bool:
        return False

    agent = Agent("a", _noop, TopicSpec("topic", 1), (table,))
    return TaskFactory(
        config=TaskConfig(redeliver_pause_s=0.0),
        decode=lambda d: codec.decode(d.key, d.value, d.headers),
        park=lambda agent, name: park,
    ).create(agent, 0, MemoryPort(), name="topic[0]", open_store=lambda agent, spaces: memory)


@pytest.mark.parametrize(
    ("before", "after", "was", "now"),
    [
        (
            Table("b", value_type=Balance),
            Table("b", value_type=BalanceV2),
            "Balance/",
            "BalanceV2/",
        ),
        (Table("b"), Table("b", value_type=Balance), "JSON (no value_type)", "Balance/msgpack"),
        (Table("b", value_type=Balance), Table("b"), "Balance/msgpack", "JSON (no value_type)"),
        (
            Table("b", value_type=Balance),
            Table("b", value_type=Balance, encoding="json"),
            "Balance/msgpack",
            "Balance/json",
        ),
    ],
)
async def test_a_store_of_another_value_type_is_refused_with_the_fix(
    before: Table[object], after: Table[object], was: str, now: str
) -> None:
    memory = MemoryStore(spaces_for([before]))
    task = _task(before, memory)
    await task.open()
    assert task.phase is Phase.LIVE
    tables = task.lanes[0].tables
    assert tables is not None  # state written: its checkpoint records the value type
    memory.write({META: {CHECKPOINT_KEY: tables.checkpoint.encode()}})
    await task.close()
    with pytest.raises(StateMismatchError) as refused:
        await _task(after, memory).open()
    message = str(refused.value)
    assert f"holds values of type {was}" in message, message
    assert f"declared with values of type {now}" in message, message
    assert "Table('b', version=2, value_type=...)" in message, message
    task = _task(before, memory)  # the old type opens as before
    await task.open()
    assert task.phase is Phase.LIVE
    await task.close()


class Account(msgspec.Struct):
    owner: str
    total: int = 0


def _typed_web_app() -> App:
    app = App("typedweb")
    accounts: Table[Account] = Table("accounts", value_type=Account)

    @app.agent(app.topic("orders", partitions=4), tables=[accounts])
    async def fold(event: Event, view: TableView[Account]) -> None:
        sid = event.stream_id
        assert sid is not None
        current = view.get(sid) or Account(owner=event.data["owner"])
        view[sid] = Account(current.owner, current.total + event.data["amount"])

    return app


async def test_views_answer_typed_values_as_json_and_openapi_shows_their_schema() -> None:
    world = World(_typed_web_app())
    await world.own(range(4))
    await world.send(
        Event.create("paid", stream_id="a1", data={"owner": "ann", "amount": 3}, version=1),
        Event.create("paid", stream_id="a1", data={"owner": "ann", "amount": 4}, version=2),
    )
    async with TestClient(TestServer(make_app(world.assignment, "w1"))) as client:
        r = await client.get("/tables/accounts/a1")
        assert r.status == 200, await r.text()
        assert await r.json() == {"owner": "ann", "total": 7}
        spec = await (await client.get("/openapi.json")).json()
    path = spec["paths"]["/tables/accounts/{key}"]["get"]
    schema = path["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/Account"}
    account = spec["components"]["schemas"]["Account"]
    assert account["properties"]["total"] == {"type": "integer", "default": 0}
    assert account["required"] == ["owner"]
