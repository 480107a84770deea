"""The version states key lookups keep between requests (:mod:`streamapp.web.versions`):
computed once while nothing changes, computed again as soon as any input does. Each
test would fail if a lookup answered from what was kept before the change."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from streamapp.engine.phase import Phase
from streamapp.versions import retired
from streamapp.versions.states import Declared, MemberTables
from streamapp.web.versions import VersionRoutes
from streamapp.web.views import make_app
from tests.support.webworld import World, order, versions_app

HEADER = "Streamapp-Table-Version"
KEYS = [f"order-{i}" for i in range(40)]
Client = TestClient[object, object]


class Records:
    """A directory as Kafka's and RabbitMQ's are: the same record objects on every call
    until a member's record changes (a value comparison alone would not see staleness
    here: the records are swapped, never edited)."""

    def __init__(self, *members: MemberTables) -> None:
        self.records = list(members)
        self.owners: dict[int, str] = {}
        self.calls = 0

    def owner_url(self, topic: str, partition: int) -> str | None:
        return self.owners.get(partition)

    def member_tables(self) -> list[MemberTables] | None:
        self.calls += 1
        return self.records


def _old_code(*live_v2: int) -> MemberTables:
    """Another worker's record: it owns partitions 2 and 3 with v1 live, and v2 live on
    ``live_v2`` (none: its code declares v1 only)."""
    declared = [Declared("order_status", 1, 4, frozenset({2, 3}))]
    if live_v2:
        declared.append(Declared("order_status", 2, 4, frozenset(live_v2)))
    return MemberTables("other", tuple(declared))


async def _world(partitions: list[int], app_id: str | None = None) -> World:
    world = World(versions_app(app_id or f"routes{uuid.uuid4().hex[:8]}"))
    await world.own(partitions)
    await world.send(*(order(k, "paid") for k in KEYS))
    return world


@pytest.fixture
async def clients() -> AsyncIterator[list[Client]]:
    opened: list[Client] = []
    yield opened
    for client in opened:
        await client.close()


async def _client(world: World, clients: list[Client]) -> Client:
    client: Client = TestClient(TestServer(make_app(world.assignment, "w")))
    await client.start_server()
    clients.append(client)
    return client


async def _version(client: Client, world: World, partition: int) -> tuple[int, str]:
    key = next(k for k in KEYS if world.partition_of(k) == partition)
    r = await client.get(f"/tables/order_status/{key}")
    return r.status, r.headers[HEADER]


async def test_kept_while_nothing_changes_and_computed_again_on_a_change() -> None:
    world = await _world([0, 1])
    directory = Records(_old_code())
    world.assignment.directory = directory
    routes = VersionRoutes(world.assignment, "w")
    first = routes.current()
    assert first.existing == {"order_status": (1, 2)}
    assert first.known
    assert routes.current() is first  # nothing changed: the same, not computed again
    assert routes.current() is first
    directory.records = [_old_code(2, 3)]  # the other worker now has v2 live
    again = routes.current()
    assert again is not first
    assert world.assignment.served == {"order_status": 2}  # the latch advanced
    assert routes.current() is again


async def test_a_member_record_that_changes_switches_the_version(clients: list[Client]) -> None:
    world = await _world([0, 1])
    directory = Records(_old_code())
    world.assignment.directory = directory
    client = await _client(world, clients)
    for _ in range(3):  # v2 is not live on the other worker's partitions: v1
        assert await _version(client, world, 0) == (200, "1")
    directory.records = [_old_code(2)]  # v2 live on partition 2 only: still v1
    assert await _version(client, world, 0) == (200, "1")
    directory.records = [_old_code(2, 3)]  # live everywhere now: v2
    assert await _version(client, world, 0) == (200, "2")
    assert await _version(client, world, 1) == (200, "2")


async def test_a_directory_read_at_last_is_seen(clients: list[Client]) -> None:
    world = await _world([0, 1, 2, 3])
    directory = Records()
    world.assignment.directory = directory
    unread: list[MemberTables] | None = None
    directory.member_tables = lambda: unread  # type: ignore[method-assign]
    client = await _client(world, clients)
    assert await _version(client, world, 0) == (503, "1")  # which version: not known yet
    unread = []
    assert await _version(client, world, 0) == (200, "2")


async def test_a_local_lane_going_live_switches_the_version(clients: list[Client]) -> None:
    world = await _world([0, 1, 2, 3])
    world.assignment.directory = Records()
    task = world.task(3)
    v2 = next(lane for lane in task.lanes if lane.agent.name == "project_v2")
    task.transition_lane(v2, Phase.CATCHING_UP)  # v2 of partition 3 rebuilds
    client = await _client(world, clients)
    for _ in range(3):
        assert await _version(client, world, 0) == (200, "1")
    task.transition_lane(v2, Phase.LIVE)  # caught up: v2 live on every partition
    assert await _version(client, world, 0) == (200, "2")


async def test_a_revoked_partition_and_a_retirement_are_seen(clients: list[Client]) -> None:
    app_id = f"routes{uuid.uuid4().hex[:8]}"
    world = await _world([0, 1, 2, 3], app_id)
    world.assignment.directory = Records()
    client = await _client(world, clients)
    assert await _version(client, world, 0) == (200, "2")
    closed = world.task(3)
    await closed.close()  # partition 3 closed here: its lanes answer 503, v2 stays
    assert await _version(client, world, 3) == (503, "2")
    del world.assignment.tasks[(world.agent.topic.name, 3)]  # and revoked
    assert await _version(client, world, 0) == (200, "2")
    retired.learn(app_id, [("order_status", 2)])  # v2 retired: back to v1
    assert await _version(client, world, 0) == (200, "1")
    assert world.assignment.served == {"order_status": 1}


async def test_a_latch_moved_elsewhere_is_seen() -> None:
    """``GET /tables`` computes afresh (and may move the latch): the next lookup compares
    its inputs again rather than trust what it kept."""
    world = await _world([0, 1])
    directory = Records(_old_code())
    world.assignment.directory = directory
    routes = VersionRoutes(world.assignment, "w")
    kept = routes.current()
    states, known = routes.states()
    assert known
    assert states["order_status"].active == 1
    assert routes.current() == kept  # computed again: the same states
    world.assignment.served["order_status"] = 2  # as a restarted worker's latch file says
    assert routes.current() is not kept


async def test_a_record_list_edited_in_place_is_seen(clients: list[Client]) -> None:
    """What was compared is copied: a directory that edits the list it gave is seen."""
    world = await _world([0, 1])
    directory = Records(_old_code())
    world.assignment.directory = directory
    client = await _client(world, clients)
    assert await _version(client, world, 0) == (200, "1")
    directory.records[0] = _old_code(2, 3)
    assert await _version(client, world, 0) == (200, "2")


async def test_partitions_swapped_between_lookups_are_seen(clients: list[Client]) -> None:
    """As many lanes as before, in the same phases, but of other partitions: the
    partitions are among what is compared."""
    world = await _world([0, 1, 2])
    other = MemberTables(
        "other",
        (
            Declared("order_status", 1, 4, frozenset({2})),
            Declared("order_status", 2, 4, frozenset({2})),
        ),
    )
    world.assignment.directory = Records(other)
    client = await _client(world, clients)
    assert await _version(client, world, 0) == (200, "1")  # v2 not live on partition 3
    await world.own([3])
    del world.assignment.tasks[(world.agent.topic.name, 2)]  # 2 given up, 3 taken
    assert await _version(client, world, 0) == (200, "2")  # v2 live on 0, 1, 3 and 2


async def test_a_building_versions_progress_is_its_lowest_lane_and_never_goes_back() -> None:
    """Every building lane counts, one with nothing committed too (it reached 0): the
    lowest position never drops as lanes commit their first part ('replay at store
    position 18616 ... 10820 ... 5008 of 20000' counted only lanes with a checkpoint)."""
    from streamapp.engine.served import local_tables

    world = await _world([0, 1, 2, 3])
    lanes = []
    for p in (2, 3):
        task = world.task(p)
        lane = next(lane for lane in task.lanes if lane.agent.name == "project_v2")
        task.transition_lane(lane, Phase.CATCHING_UP)
        lanes.append(lane)

    def reached() -> object:
        (v2,) = [d for d in local_tables(world.assignment, "w").declared if d.version == 2]
        assert v2.progress is not None
        assert v2.progress.catching_up == 2
        return v2.progress.store_position

    assert reached() == 0  # neither has applied anything
    seen = []
    for first, second in ((501, 1), (501, 201), (801, 201), (801, 901)):
        lanes[0].history_next, lanes[1].history_next = first, second
        seen.append(reached())
    assert seen == [0, 200, 200, 800]
