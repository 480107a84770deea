"""The members directory: claims count under this worker's own group generation only."""

from __future__ import annotations

import orjson

from streamapp.engine.assignment import Assignment
from streamapp.transports.kafka.members import (
    Claim,
    Generation,
    KafkaMembers,
    parse_claim,
    stable_member_ids,
)
from streamapp.versions.states import Declared, MemberTables
from tests.support.doubles import RecordingPublisher as Published
from tests.support.webworld import orders_app


def _record(worker: str, url: str, generation: int, *claims: tuple[str, int]) -> bytes:
    return orjson.dumps(
        {
            "worker": worker,
            "url": url,
            "generation": generation,
            "member_id": f"{worker}-member",
            "partitions": [list(c) for c in claims],
        }
    )


class Group:
    """This worker's generation, as the consumer's assignment callback sets it."""

    def __init__(self, number: int | None) -> None:
        self.number = number

    def __call__(self) -> Generation | None:
        return None if self.number is None else Generation(self.number, "me-member")


def _members(group: Group, sink: Published | None = None) -> KafkaMembers:
    app = orders_app()  # not started: no broker asked
    return KafkaMembers(app, app.settings(), Assignment(app), "me", sink or Published(), group)


async def test_only_claims_of_this_workers_generation_are_routed_to() -> None:
    group = Group(7)
    members = _members(group)
    assert members.topic == "webapp-members"
    # "dead" owned partition 1 at generation 6, and its clock was far ahead: no matter.
    members._apply(b"dead", _record("dead", "http://dead:1", 6, ("orders", 1), ("orders", 2)))
    members._apply(b"live", _record("live", "http://live:1", 7, ("orders", 0), ("orders", 2)))
    assert members.owner_url("orders", 0) == "http://live:1"
    assert members.owner_url("orders", 1) is None  # nobody at generation 7 yet: 503
    assert members.owner_url("orders", 2) == "http://live:1"  # the older claim loses
    members._apply(b"heir", _record("heir", "http://heir:1", 7, ("orders", 1)))
    assert members.owner_url("orders", 1) == "http://heir:1"
    group.number = 8  # a rebalance: every record is of an older generation until rewritten
    assert [members.owner_url("orders", p) for p in range(3)] == [None, None, None]
    members._apply(b"live", _record("live", "http://live:1", 8, ("orders", 1)))
    assert members.owner_url("orders", 1) == "http://live:1"
    group.number = None  # revoked: owners unknown
    assert members.owner_url("orders", 1) is None


async def test_a_newer_generation_than_ours_waits_for_our_rebalance() -> None:
    group = Group(3)  # e.g. a group made again: a stale record of generation 57 lingers
    members = _members(group)
    members._apply(b"stale", _record("stale", "http://stale:1", 57, ("orders", 0)))
    members._apply(b"live", _record("live", "http://live:1", 3, ("orders", 1)))
    assert members.owner_url("orders", 0) is None
    assert members.owner_url("orders", 1) == "http://live:1"


async def test_two_claims_in_one_generation_are_not_guessed_between() -> None:
    members = _members(Group(5))
    members._apply(b"x", _record("x", "http://x:1", 5, ("orders", 0)))
    members._apply(b"y", _record("y", "http://y:1", 5, ("orders", 0)))
    assert members.owner_url("orders", 0) is None


async def test_tombstones_echoes_and_foreign_records_are_not_owners() -> None:
    members = _members(Group(2))
    members._apply(b"gone", _record("gone", "http://gone:1", 2, ("orders", 0)))
    members._apply(b"gone", None)  # a clean leave
    assert members.owner_url("orders", 0) is None
    members._apply(b"me", _record("me", "http://me:1", 2, ("orders", 3)))  # our own echo
    assert members.owner_url("orders", 3) is None
    members._apply(b"bad", b"not json")
    assert "bad" not in members.members
    old = orjson.dumps({"worker": "old", "url": "http://old:1", "partitions": [["orders", 4, 9]]})
    members._apply(b"old", old)  # an older streamapp's wall-clock claim: never trusted
    assert "old" not in members.members
    assert members.owner_url("orders", 4) is None


async def test_the_record_names_url_generation_member_and_partitions() -> None:
    sink = Published()
    members = _members(Group(4), sink)
    members.url = "http://me:1"
    tables = MemberTables("me", (Declared("order_status", 1, 4, frozenset({2})),), {})
    await members._publish(Generation(4, "me-member"), frozenset({("orders", 2)}), tables)
    ((topic, value, key),) = sink.sent
    assert (topic, key) == ("webapp-members", b"me")
    assert value is not None
    body = orjson.loads(value)
    assert body == {
        "worker": "me",
        "url": "http://me:1",
        "generation": 4,
        "member_id": "me-member",
        "partitions": [["orders", 2]],
        "tables": [
            {"table": "order_status", "version": 1, "partitions": 4, "live": [2], "progress": None}
        ],
        "serving": {},
    }
    assert parse_claim(body) == Claim("http://me:1", 4, "me-member", frozenset({("orders", 2)}))


async def test_once_described_only_members_of_the_group_are_owners() -> None:
    group = Group(5)
    members = _members(group)
    members._apply(b"ghost", _record("ghost", "http://ghost:1", 5, ("orders", 0)))
    members._apply(b"live", _record("live", "http://live:1", 5, ("orders", 0)))
    assert members.owner_url("orders", 0) is None  # two claims: not guessed between
    members.current = (5, frozenset({"live-member", "me-member"}))
    assert members.owner_url("orders", 0) == "http://live:1"
    members.current = (4, frozenset({"ghost-member"}))  # described under another generation
    assert members.owner_url("orders", 0) is None


class _Described:
    """A DescribeGroups response as aiokafka decodes it (version 2: tuples)."""

    def __init__(self, *groups: tuple[object, ...]) -> None:
        self.groups = list(groups)


def test_member_ids_come_from_a_stable_group_only() -> None:
    member = ("m-1", "client", "/127.0.0.1", b"", b"")
    stable = _Described((0, "g", "Stable", "consumer", "roundrobin", [member]))
    assert stable_member_ids(stable, "g") == frozenset({"m-1"})
    assert stable_member_ids(stable, "other") is None
    moving = _Described((0, "g", "PreparingRebalance", "consumer", "", [member]))
    assert stable_member_ids(moving, "g") is None
    failed = _Described((16, "g", "", "", "", []))
    assert stable_member_ids(failed, "g") is None


def test_member_tables_of_trusted_records_old_ones_declaring_version_1() -> None:
    group = Group(3)
    members = _members(group)
    assert members.member_tables() is None  # the topic not read up to its end yet
    members.read_up = True
    members._apply(b"old", _record("old", "http://old:1", 3, ("orders", 0), ("orders", 1)))
    new = {
        **orjson.loads(_record("new", "http://new:1", 3, ("orders", 2), ("orders", 3))),
        "tables": [
            {"table": "order_status", "version": 1, "partitions": 4, "live": [2, 3]},
            {"table": "order_status", "version": 2, "partitions": 4, "live": [2]},
        ],
        "serving": {"order_status": 1},
    }
    members._apply(b"new", orjson.dumps(new))
    members._apply(b"gone", _record("gone", "http://gone:1", 2, ("orders", 0)))  # older
    fresh, old = members.member_tables() or []
    assert old == MemberTables(
        "old", (Declared("order_status", 1, 4, frozenset({0, 1})),)
    )  # an older streamapp's record: version 1, live where it owns
    assert [(d.version, d.live) for d in fresh.declared] == [(1, {2, 3}), (2, {2})]
    assert fresh.serving == {"order_status": 1}
    group.number = None  # between a revoke and the next assignment: the last trusted
    assert [m.worker for m in members.member_tables() or []] == ["new", "old"]
    group.number = 4
    assert members.member_tables() == []  # nobody rewrote under generation 4 yet
    members._apply(b"new", None)
    assert "new" not in members.tables
