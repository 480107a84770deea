"""A key's stream folded again from a real SQLite event store through the handler
(:mod:`streamapp.verify.fold`), and the view answers made of it (:mod:`streamapp.web.explain`):
the events that made a value, the value at a store position, and the refusals.
Worker processes on a store: tests/integration/test_explain_views.py."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from streamapp import App, Event, FromEventStore, Redeliver, Table, TableView
from streamapp.errors import ConfigError
from streamapp.eventstore import Append, EventStore, open_store
from streamapp.verify.compare import as_json, verify
from streamapp.verify.fold import fold, writer_of
from streamapp.web.explain import StoreFolds
from streamapp.web.views import make_app
from tests.apps.typed_orders import order_types, project
from tests.support.webworld import World

ORDER = "o-1"
summary: Table[dict[str, Any]] = Table("summary")


def _typed_app(*, history: bool = True) -> App:
    """The typed orders projection (its ``order.placed`` upcast from version 1)."""
    app = App("explain")
    orders = app.topic("orders", partitions=4)
    app.agent(
        orders,
        tables=[summary],
        events=order_types,
        history=FromEventStore() if history else None,
        name="project",
    )(project)
    return app


def _events() -> list[Event]:
    placed_v1 = Event.create(  # before the schema change: no dataschema, upcast on read
        "order.placed", stream_id=ORDER, data={"customer_name": "ada", "skus": ["a", "b"]}
    )
    placed = dataclasses.replace(placed_v1, id="e1")
    return [
        placed,
        Event.create("order.paid", stream_id=ORDER, data={"amount": 30}, id="e2"),
        Event.create("order.paid", stream_id=ORDER, data={"amount": 12}, id="e3"),
        Event.create("order.shipped", stream_id=ORDER, data={"carrier": "ups"}, id="e4"),
    ]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EventStore]:
    opened = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    other = Event.create("order.paid", stream_id="o-2", data={"amount": 1})
    await opened.append_many([Append("o-2", [other])])  # another stream: position 1
    await opened.append_many([Append(ORDER, _events())])  # positions 2..5
    try:
        yield opened
    finally:
        await opened.close()


async def test_the_fold_names_every_event_and_the_value_after_each(store: EventStore) -> None:
    result = await fold(_typed_app(), store, summary, ORDER)
    steps = result.steps
    assert [(s.position, s.id, s.type, s.stream_version) for s in steps] == [
        (2, "e1", "order.placed", 1),
        (3, "e2", "order.paid", 2),
        (4, "e3", "order.paid", 3),
        (5, "e4", "order.shipped", 4),
    ]
    assert [(s.schema_version, s.upcasted) for s in steps] == [(1, True)] + [(1, False)] * 3
    assert {s.outcome for s in steps} == {"delivered"}
    assert [s.value["paid"] for s in steps] == [0, 30, 42, 42]
    assert steps[0].value["customer"] == "ada"  # the upcaster ran: v1's customer_name
    assert result.value == steps[-1].value
    assert result.value["status"] == "shipped by ups"


async def test_as_of_folds_only_up_to_the_store_position(store: EventStore) -> None:
    result = await fold(_typed_app(), store, summary, ORDER, as_of=3)
    assert [s.id for s in result.steps] == ["e1", "e2"]
    assert result.value["paid"] == 30
    before = await fold(_typed_app(), store, summary, ORDER, as_of=1)
    assert before.steps == []
    assert before.value is None


async def test_an_event_that_fails_now_stops_the_fold_naming_it(store: EventStore) -> None:
    app = App("explain")
    orders = app.topic("orders", partitions=4)
    balance: Table[int] = Table("balance")

    @app.agent(orders, tables=[balance], history=FromEventStore(), on_failure=Redeliver())
    async def pay(event: Event, view: TableView[int]) -> None:
        if event.id == "e3":
            raise ValueError("amount 12 is not allowed")
        sid = event.stream_id
        assert sid is not None
        view[sid] = view.get(sid, 0) + int((event.data or {}).get("amount", 0))

    result = await fold(app, store, balance, ORDER)
    assert [s.id for s in result.steps] == ["e1", "e2", "e3"]
    assert result.stopped is not None
    assert result.stopped.id == "e3"
    assert "amount 12 is not allowed" in (result.stopped.error or "")
    assert result.value == 30  # what the live lane holds while it redelivers e3


def test_a_table_whose_agent_has_no_history_is_refused_naming_it() -> None:
    app = _typed_app(history=False)
    with pytest.raises(ConfigError, match=r"agent 'project' declares no history"):
        writer_of(app, summary)
    assert writer_of(app, summary, embedded=True).name == "project"  # the store feeds all


async def _client(folds: StoreFolds | None, world: World) -> TestClient[Any, Any]:
    client: TestClient[Any, Any] = TestClient(
        TestServer(make_app(world.assignment, "w1", folds=folds))
    )
    await client.start_server()
    return client


async def test_the_view_explains_and_answers_as_of(store: EventStore) -> None:
    app = _typed_app(history=False)  # the world's tasks run without a store feed
    world = World(app)
    await world.own([0, 1, 2, 3])
    client = await _client(StoreFolds(app, lambda: store, embedded=True), world)
    try:
        resp = await client.get(f"/tables/summary/{ORDER}?explain=1&limit=2")
        assert resp.status == 200, await resp.text()
        assert resp.headers["Streamapp-Folded"] == "store"
        body = await resp.json()
        assert body["events_total"] == 4
        assert body["events_omitted"] == 2
        assert [e["id"] for e in body["events"]] == ["e3", "e4"]
        assert body["value"]["paid"] == 42
        at = await client.get(f"/tables/summary/{ORDER}?as_of=3")
        assert at.status == 200
        assert at.headers["Streamapp-As-Of"] == "3"
        assert (await at.json())["paid"] == 30
        none = await client.get(f"/tables/summary/{ORDER}?as_of=1")
        assert none.status == 404
        assert "had no value in table 'summary' at store position 1" in await none.text()
        bad = await client.get(f"/tables/summary/{ORDER}?as_of=0")
        assert bad.status == 400
    finally:
        await client.close()


async def test_the_view_refuses_where_no_event_store_is_open() -> None:
    app = _typed_app(history=False)
    world = World(app)
    await world.own([0, 1, 2, 3])
    client = await _client(None, world)
    try:
        resp = await client.get(f"/tables/summary/{ORDER}?explain=1")
        assert resp.status == 400
        assert "read the event store, and this worker has none open" in await resp.text()
    finally:
        await client.close()


async def test_verify_compares_each_key_at_the_stream_version_the_live_table_reached(
    store: EventStore,
) -> None:
    app = _typed_app()
    behind = (await fold(app, store, summary, ORDER, through_version=2)).value
    answers = {ORDER: (as_json(behind), 2), "o-2": (None, 0)}  # behind, and nothing yet

    async def live(key: str) -> tuple[Any, int]:
        return answers[key]

    same = await verify(app, store, summary, [ORDER, "o-2"], live)
    assert (same.checked, same.equal, same.differ, same.missing) == (2, 2, 0, 0)
    wrong = dict(as_json(behind), paid=999)
    answers[ORDER] = (wrong, 2)
    answers["o-2"] = ({"paid": 1}, 1)  # a value the handler never makes of o-2's stream
    found = await verify(app, store, summary, [ORDER, "o-2"], live)
    assert (found.equal, found.differ, found.missing) == (0, 2, 0)
    assert not found.ok
    answers["o-2"] = (None, 1)  # the live table lost a key the stream makes
    lost = await verify(app, store, summary, ["o-2"], live)
    assert lost.missing == 1
    assert lost.examples[0].kind == "missing_live"
    assert lost.summary() == (
        "verified 1 streams of summary v1 at store position 1: 0 equal, 0 differ, 1 missing"
    )
