"""The start decision alone: from what each lane knows (checkpoint, replay, the group's
committed offset, nothing) to how the source begins and where each lane goes on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamapp.engine.start_plan import LaneStart, Placement, StartPlan, place, plan_start

CHECKPOINTED = LaneStart(stateful=True, replays=False, position=40, durable=True)
REPLAYED = LaneStart(stateful=True, replays=True, position=25, durable=True)
COMMITTED = LaneStart(stateful=False, replays=False, position=30)
NEW_TABLE = LaneStart(stateful=True, replays=False)
NEW_HISTORY = LaneStart(stateful=True, replays=True)
STATELESS = LaneStart(stateful=False, replays=False)


def test_a_checkpoint_begins_at_itself_and_settles_the_group_to_it() -> None:
    plan = plan_start([CHECKPOINTED], absolute=True)
    assert plan == StartPlan(begin_at=40, stateful=True, earliest=False, settle=True)
    assert place([CHECKPOINTED], 40, absolute=True) == Placement(40, (40,))


def test_the_lowest_known_lane_leads_and_the_group_is_not_settled_without_a_table() -> None:
    lanes = [CHECKPOINTED, COMMITTED]
    assert plan_start(lanes, absolute=True) == StartPlan(30, True, False, settle=True)
    assert plan_start([COMMITTED], absolute=True).settle is False
    # the source may begin elsewhere (retention): the partition goes on from there
    assert place(lanes, 35, absolute=True) == Placement(35, (40, 30))


def test_an_unplaced_lane_lets_the_transport_choose_and_a_lane_behind_rewinds() -> None:
    lanes = [REPLAYED, NEW_HISTORY]
    assert plan_start(lanes, absolute=True) == StartPlan(None, True, True, settle=True)
    assert place(lanes, 50, absolute=True) == Placement(25, (25, 50), rewind_to=25)
    assert place(lanes, 10, absolute=True) == Placement(10, (25, 10))


def test_a_stateless_lane_alone_asks_the_group_and_not_the_earliest_record() -> None:
    assert plan_start([STATELESS], absolute=True) == StartPlan(None, False, False, False)
    assert plan_start([NEW_TABLE], absolute=True) == StartPlan(None, True, False, False)


def test_a_session_port_starts_every_lane_where_the_source_began() -> None:
    lanes = [CHECKPOINTED, NEW_HISTORY]
    # the known lane's position is asked for; a new table without history asks nothing
    assert plan_start(lanes, absolute=False) == StartPlan(40, True, False, settle=True)
    fresh = [CHECKPOINTED, NEW_TABLE]
    assert plan_start(fresh, absolute=False) == StartPlan(None, True, False, settle=True)
    assert place(lanes, 3, absolute=False) == Placement(3, (3, 3))


def test_a_new_table_beside_live_lanes_starts_from_the_earliest_offset() -> None:
    live = LaneStart(True, True, 120, durable=True)
    new = LaneStart(True, False)  # tables, no history, no checkpoint
    plan = plan_start([live, new], absolute=True)
    assert (plan.begin_at, plan.earliest) == (None, True)
    placed = place([live, new], 0, absolute=True)
    assert placed.positions == (120, 0)  # the live lane skips what it did
    assert (placed.start, placed.rewind_to) == (0, None)
    alone = plan_start([new], absolute=True)  # a new app: the transport's own start
    assert not alone.earliest


def test_a_partition_has_a_lane() -> None:
    with pytest.raises(ValueError, match="at least one lane"):
        plan_start([], absolute=True)


lane_starts = st.builds(
    LaneStart,
    stateful=st.booleans(),
    replays=st.booleans(),
    position=st.none() | st.integers(0, 1000),
    durable=st.booleans(),
)


@given(st.lists(lane_starts, min_size=1, max_size=5), st.booleans(), st.integers(0, 1000))
def test_every_lane_is_placed_and_nothing_is_skipped(
    lanes: list[LaneStart], absolute: bool, begun: int
) -> None:
    plan = plan_start(lanes, absolute=absolute)
    placed = place(lanes, begun, absolute=absolute)
    assert len(placed.positions) == len(lanes)
    assert plan.settle is any(lane.durable for lane in lanes)
    known = [lane.position for lane in lanes if lane.position is not None]
    if plan.begin_at is not None:  # a position asked is a known one, the lowest
        assert plan.begin_at == min(known)
    if plan.earliest:  # a replay holds nothing live, or a new table beside live lanes
        unknown = [lane for lane in lanes if lane.stateful and lane.position is None]
        assert any(lane.replays for lane in unknown) or (known and unknown)
    if not absolute:
        assert placed == Placement(begun, (begun,) * len(lanes))
        return
    for lane, position in zip(lanes, placed.positions, strict=True):
        assert position == (begun if lane.position is None else lane.position)
    if len(known) == len(lanes):
        assert placed.start == begun
        assert placed.rewind_to is None
    else:  # the partition goes on from its lowest lane: no lane skips a record
        assert placed.start == min(placed.positions) <= begun
        assert placed.rewind_to == (placed.start if placed.start < begun else None)
