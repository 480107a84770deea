"""The sticky, standby-aware assignor's rules (streamapp.transports.kafka.assignor), and
setting standby_replicas."""

from __future__ import annotations

import pytest
from aiokafka import TopicPartition

from streamapp import ConfigError, Settings
from streamapp.transports.base import refuse_standbys, transports
from streamapp.transports.kafka.assignor import (
    Candidate,
    Given,
    Holdings,
    Planned,
    plan,
    units_of,
)

TOPIC = "orders"
UNITS = units_of({TOPIC: 8}, copartitioned=False)


def tp(p: int, topic: str = TOPIC) -> TopicPartition:
    return TopicPartition(topic, p)


def member(
    active: tuple[int, ...] | list[int] = (), standby: dict[int, int] | None = None, gen: int = 5
) -> Candidate:
    lags = {tp(p): lag for p, lag in (standby or {}).items()}
    held = Holdings(gen, frozenset(tp(p) for p in active), lags)
    return Candidate(frozenset({TOPIC}), held)


def owners(shares: dict[str, Planned]) -> dict[TopicPartition, str]:
    return {t: m for m, share in shares.items() for t in share.active}


def test_every_partition_has_one_owner_and_a_balanced_share() -> None:
    shares = plan(UNITS, {m: member() for m in "abc"}, replicas=0)
    assert sorted(owners(shares)) == [tp(p) for p in range(8)]
    assert sorted(len(s.active) for s in shares.values()) == [2, 3, 3]
    assert all(not s.standby for s in shares.values())


def test_the_same_members_keep_their_partitions() -> None:
    first = plan(UNITS, {m: member() for m in "abc"}, replicas=1)
    again = {
        m: member([t.partition for t in s.active], {t.partition: 0 for t in s.standby})
        for m, s in first.items()
    }
    second = plan(UNITS, again, replicas=1)
    assert owners(second) == owners(first)
    assert {m: sorted(s.standby) for m, s in second.items()} == {
        m: sorted(s.standby) for m, s in first.items()
    }


def test_standbys_never_on_the_owner_and_spread() -> None:
    shares = plan(UNITS, {m: member() for m in "abc"}, replicas=1)
    own = owners(shares)
    standby_of = {t: m for m, s in shares.items() for t in s.standby}
    assert sorted(standby_of) == [tp(p) for p in range(8)]
    assert all(standby_of[t] != own[t] for t in own)
    for owner in "abc":  # one owner's units have their standbys on both others
        theirs = {standby_of[t] for t, m in own.items() if m == owner}
        assert len(theirs) == 2, (owner, theirs)


def test_more_replicas_than_other_members_gives_fewer_standbys() -> None:
    shares = plan(UNITS, {m: member() for m in "ab"}, replicas=3)
    own = owners(shares)
    for m, s in shares.items():
        assert len(s.standby) == len(set(s.standby))
        assert all(own[t] != m for t in s.standby)
    assert sum(len(s.standby) for s in shares.values()) == 8


def test_a_lost_partition_goes_to_its_caught_up_standby() -> None:
    # c died; it owned 6 and 7. a keeps a standby of 6 (caught up), b of 7 (behind).
    members = {
        "a": member([0, 1, 2], {6: 0, 3: 5}),
        "b": member([3, 4, 5], {7: 40, 0: 0}),
    }
    own = owners(plan(UNITS, members, replicas=1))
    assert own[tp(6)] == "a"
    assert own[tp(7)] == "b"
    assert [own[tp(p)] for p in range(6)] == ["a"] * 3 + ["b"] * 3  # nothing else moved


def test_a_dead_owners_partition_goes_to_a_caught_up_standby_even_past_the_quota() -> None:
    # c died owning 6 and 7; a, at its quota already, keeps caught-up standbys of both
    members = {"a": member([0, 1, 2, 3], {6: 0, 7: 3}), "b": member([4, 5])}
    own = owners(plan(UNITS, members, replicas=1))
    assert own[tp(6)] == "a"
    assert own[tp(7)] == "a"
    # behind by more than ACCEPTABLE_LAG: balance wins, b restores it
    members = {"a": member([0, 1, 2, 3], {6: 0, 7: 50_000}), "b": member([4, 5])}
    own = owners(plan(UNITS, members, replicas=1))
    assert own[tp(6)] == "a"
    assert own[tp(7)] == "b"


def test_the_fewest_records_behind_wins() -> None:
    members = {"a": member([0, 1], {5: 300}), "b": member([2, 3], {5: 2}), "c": member([4])}
    units = units_of({TOPIC: 6}, copartitioned=False)
    assert owners(plan(units, members, replicas=1))[tp(5)] == "b"


def test_an_older_generation_loses_its_claim() -> None:
    # a frozen worker woken up claims what it owned two generations ago
    members = {"zombie": member([0, 1, 2, 3], gen=3), "new": member([0, 1, 2, 3], gen=5)}
    units = units_of({TOPIC: 4}, copartitioned=False)
    own = owners(plan(units, members, replicas=0))
    assert [own[tp(p)] for p in range(2)] == ["new", "new"]  # quota 2: the rest goes over


def test_co_partitioned_topics_stay_together() -> None:
    units = units_of({"orders": 4, "customers": 4, "other": 2}, copartitioned=True)
    members = {m: Candidate(frozenset({"orders", "customers", "other"})) for m in "ab"}
    shares = plan(units, members, replicas=1)
    own = owners(shares)
    for p in range(4):
        assert own[tp(p, "orders")] == own[tp(p, "customers")]
    standby_of = {t: m for m, s in shares.items() for t in s.standby}
    for p in range(4):
        assert standby_of[tp(p, "orders")] == standby_of[tp(p, "customers")]


def test_held_and_standbys_round_trip() -> None:
    held = Holdings(7, frozenset({tp(1)}), {tp(2): 10})
    assert Holdings.decode(held.encode()) == held
    assert Holdings.decode(b"not json") == Holdings()
    given = Given(frozenset({tp(1), tp(2)}), frozenset({tp(2)}))
    assert Given.decode(given.encode()) == given
    assert Given.decode(b"") == Given()


def test_setting_standby_replicas() -> None:
    assert Settings(app_id="a").standby_replicas == 0
    assert Settings.from_env("a", env={"STREAMAPP_STANDBY_REPLICAS": "1"}).standby_replicas == 1
    with pytest.raises(ConfigError, match="STREAMAPP_STANDBY_REPLICAS"):
        Settings(app_id="a", standby_replicas=-1)
    rabbitmq = Settings(app_id="a", broker="rabbitmq", standby_replicas=1)
    with pytest.raises(ConfigError, match="STREAMAPP_STANDBY_REPLICAS"):
        refuse_standbys(rabbitmq, transports["rabbitmq"].capabilities)
    refuse_standbys(rabbitmq, transports["kafka"].capabilities)


def test_a_scale_out_moves_a_partition_only_after_its_warm_up() -> None:
    before = {"a": member([0, 1, 2, 3], {4: 0, 5: 0}), "b": member([4, 5, 6, 7], {0: 0, 1: 0})}
    joined = {**before, "c": member()}
    shares = plan(UNITS, joined, replicas=1, warmups=True)
    own = owners(shares)
    assert own == owners(plan(UNITS, before, replicas=1))  # nothing moved yet
    warming = sorted(shares["c"].warmup)
    assert warming == [tp(3), tp(7)]  # past the quota of 3: one of a's, one of b's
    assert set(warming) <= set(shares["c"].standby)
    # c's warm-ups caught up (the probing rebalance): they move to c, nothing else
    caught_up = {**before, "c": member([], {3: 0, 7: 12})}
    own = owners(plan(UNITS, caught_up, replicas=1, warmups=True))
    assert own[tp(3)] == own[tp(7)] == "c"
    assert [own[tp(p)] for p in (0, 1, 2, 4, 5, 6)] == ["a"] * 3 + ["b"] * 3


def test_without_warm_ups_a_scale_out_moves_at_once() -> None:
    before = {"a": member([0, 1, 2, 3]), "b": member([4, 5, 6, 7])}
    own = owners(plan(UNITS, {**before, "c": member()}, replicas=0))
    assert own[tp(3)] == own[tp(7)] == "c"
