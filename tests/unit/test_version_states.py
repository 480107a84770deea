"""Table version states from a members directory snapshot (streamapp.versions.states)."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from streamapp.versions.states import (
    Declared,
    MemberTables,
    Progress,
    State,
    encode_member,
    group_states,
    parse_member,
)

N = 4
ALL = frozenset(range(N))


def member(worker: str, *versions: tuple[int, frozenset[int]], **serving: int) -> MemberTables:
    return MemberTables(
        worker, tuple(Declared("t", v, N, live) for v, live in versions), dict(serving)
    )


def states(members: list[MemberTables], retired: set[tuple[str, int]] | None = None) -> dict:
    (table,) = group_states(members, retired or set()).values()
    return {v.version: (v.state.value, v.live, v.total) for v in table.versions}


def test_one_version_live_everywhere_is_active() -> None:
    assert states([member("a", (1, ALL))]) == {1: ("active", 4, 4)}


def test_a_version_live_on_some_partitions_builds_beside_the_active_one() -> None:
    got = states([member("a", (1, ALL), (2, frozenset({0, 1})))])
    assert got == {1: ("active", 4, 4), 2: ("building", 2, 4)}


def test_the_switch_when_the_new_version_is_live_everywhere() -> None:
    a = member("a", (1, frozenset({0, 1})), (2, frozenset({0, 1})))
    b = member("b", (1, frozenset({2, 3})), (2, frozenset({2, 3})))
    assert states([a, b]) == {1: ("previous", 4, 4), 2: ("active", 4, 4)}


def test_partitions_of_a_worker_of_the_old_code_are_not_live_for_the_new_version() -> None:
    new = member("new", (1, frozenset({0, 1})), (2, frozenset({0, 1})))
    old = member("old", (1, frozenset({2, 3})))
    (table,) = group_states([new, old]).values()
    assert table.active == 1
    assert table.state_of(2) is not None
    assert table.state_of(2).declared_by == ("new",)
    assert table.state_of(1) is not None
    assert table.state_of(1).declared_by == ("new", "old")


def test_a_latched_version_stays_active_while_its_partitions_move() -> None:
    moving = member("a", (1, ALL), (2, frozenset({0})))
    assert states([moving]) == {1: ("active", 4, 4), 2: ("building", 1, 4)}
    (table,) = group_states([moving], (), {"t": 2}).values()
    assert table.active == 2
    other = member("b", (1, ALL), (2, frozenset()), t=2)  # a member answers from v2
    assert next(iter(group_states([moving, other]).values())).active == 2


def test_retired_versions_are_never_active_and_release_the_latch() -> None:
    a = member("a", (1, ALL), (2, ALL), t=2)
    (table,) = group_states([a], {("t", 2)}, {"t": 2}).values()
    assert table.active == 1
    assert [v.state for v in table.versions] == [State.ACTIVE, State.RETIRED]
    assert table.existing == [1]
    (table,) = group_states([member("a", (2, ALL))], {("t", 1)}).values()
    assert (table.active, table.existing) == (2, [2])
    assert [v.state for v in table.versions] == [State.RETIRED, State.ACTIVE]


def test_nothing_live_yet_answers_from_the_lowest_version() -> None:
    assert states([member("a", (1, frozenset()), (2, frozenset()))]) == {
        1: ("active", 0, 4),
        2: ("building", 0, 4),
    }


def test_progress_of_a_building_version_is_summed_over_the_members() -> None:
    def building(worker: str, live: frozenset[int], progress: Progress) -> MemberTables:
        return MemberTables(worker, (Declared("t", 1, N, ALL), Declared("t", 2, N, live, progress)))

    a = building("a", frozenset({0}), Progress(1, 500))
    b = building("b", frozenset({2}), Progress(1, 120))
    (table,) = group_states([a, b]).values()
    v2 = table.state_of(2)
    assert v2 is not None
    assert v2.progress == Progress(2, 120)
    assert v2.as_dict()["progress"] == {"catching_up": 2, "store_position": 120}


def test_a_record_of_an_older_streamapp_declares_what_the_caller_says() -> None:
    old = (Declared("t", 1, N, frozenset({1})),)
    assert parse_member("w", {"url": "u", "partitions": [["o", 1]]}, old) == MemberTables("w", old)
    assert parse_member("w", {"tables": [{"table": "t"}]}, old) is None
    assert (
        parse_member("w", {"tables": [{"table": "t", "version": 0, "partitions": 4}]}, old) is None
    )


# properties ------------------------------------------------------------------------
versions = st.integers(min_value=1, max_value=4)
lives = st.frozensets(st.integers(min_value=0, max_value=N - 1))
members_st = st.lists(
    st.tuples(
        st.dictionaries(versions, lives, min_size=1, max_size=3),
        st.dictionaries(st.just("t"), versions, max_size=1),
    ),
    min_size=1,
    max_size=4,
)


def _members(raw: list[tuple[dict[int, frozenset[int]], dict[str, int]]]) -> list[MemberTables]:
    return [
        MemberTables(f"w{i}", tuple(Declared("t", v, N, live) for v, live in sorted(d.items())), s)
        for i, (d, s) in enumerate(raw)
    ]


@settings(max_examples=150, deadline=None)
@given(members_st, st.frozensets(st.tuples(st.just("t"), versions), max_size=2))
def test_exactly_one_active_version_and_ordered_states(raw: list, retired: frozenset) -> None:
    members = _members(raw)
    (table,) = group_states(members, retired).values()
    declared = {d.version for m in members for d in m.declared}
    usable = declared - {v for _, v in retired}
    live = {v: set().union(*(d.live for m in members for d in m.declared if d.version == v))
            for v in declared}  # fmt: skip
    complete = {v for v in usable if live[v] == set(ALL)}
    latched = {v for m in members for t, v in m.serving.items() if v in usable}
    if not usable:
        assert table.active is None
        return
    assert table.active in usable
    assert table.active in complete | latched or table.active == min(usable)
    assert all(v <= table.active for v in complete | latched)  # never a complete one above
    for v in table.versions:
        if v.state is State.RETIRED:
            assert ("t", v.version) in retired
        elif v.state is State.BUILDING:
            assert v.version > table.active
            assert v.version not in complete
        elif v.state is State.PREVIOUS:
            assert v.version < table.active
        assert v.live == len(live.get(v.version, ()))
        assert v.total == (N if v.version in declared else 0)


@settings(max_examples=100, deadline=None)
@given(st.lists(members_st, min_size=2, max_size=6))
def test_the_switch_is_one_way_for_a_worker(snapshots: list) -> None:
    """Whatever the directory says next (partitions moving, members coming and going),
    a worker that feeds its latch back never answers from a lower version, as long as
    the version it answered from is still declared and not retired."""
    latch: dict[str, int] = {}
    for raw in snapshots:
        members = _members(raw)
        (table,) = group_states(members, (), latch).values()
        declared = {d.version for m in members for d in m.declared}
        if latch.get("t") in declared:
            assert table.active is not None
            assert table.active >= latch["t"]
        assert table.active is not None
        latch["t"] = table.active


@given(members_st.map(_members))
def test_records_round_trip_through_json(members: list[MemberTables]) -> None:
    for m in members:
        wire = orjson.loads(orjson.dumps(encode_member(m)))
        assert parse_member(m.worker, wire, ()) == m


def _manual(worker: str, live2: frozenset[int], **serving: int) -> MemberTables:
    declared = (Declared("t", 1, N, ALL), Declared("t", 2, N, live2, manual=True))
    return MemberTables(worker, declared, dict(serving))


def test_a_manual_version_live_everywhere_is_built_not_active_until_switched() -> None:
    building = group_states([_manual("a", frozenset({0}))])["t"]
    assert [v.state for v in building.versions] == [State.ACTIVE, State.BUILDING]
    built = group_states([_manual("a", ALL)])["t"]
    assert [v.state for v in built.versions] == [State.ACTIVE, State.BUILT]
    assert built.active == 1
    switched = group_states([_manual("a", ALL)], switched={("t", 2)})["t"]
    assert [v.state for v in switched.versions] == [State.PREVIOUS, State.ACTIVE]
    assert switched.active == 2


def test_a_switched_manual_version_is_not_active_before_it_is_built() -> None:
    got = group_states([_manual("a", frozenset({0, 1}))], switched={("t", 2)})["t"]
    assert (got.active, got.versions[1].state) == (1, State.BUILDING)


def test_the_manual_flag_travels_in_the_directory_record() -> None:
    record = orjson.loads(orjson.dumps(encode_member(_manual("a", ALL))))
    parsed = parse_member("a", record, ())
    assert parsed is not None
    assert [d.manual for d in parsed.declared] == [False, True]
