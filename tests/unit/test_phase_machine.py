"""The phase machine (engine/phase.py): every move of a task and of its lanes checked in
one place, none dropped once closed unless the mover says it may race the close, and
LIVE's sub-states (:class:`LiveState`) set and cleared through one checked method."""

from __future__ import annotations

import itertools
import logging
from collections import deque

import pytest

from streamapp import App, Event
from streamapp.engine.attempts import Attempts
from streamapp.engine.lane import Lane
from streamapp.engine.phase import (
    LIVE_MOVES,
    TRANSITIONS,
    LiveState,
    Phase,
    PhaseMachine,
    PhaseTransitionError,
)
from streamapp.records import Delivery
from streamapp.testing import MemoryBroker

FORBIDDEN = [(a, b) for a, b in itertools.product(Phase, Phase) if b not in TRANSITIONS[a]]
"""Every move the table does not link (the complement of TRANSITIONS)."""


def _app() -> App:
    app = App("machine")

    @app.agent(app.topic("in", partitions=1))
    async def count(event: Event) -> None:
        pass

    return app


async def _park(delivery: Delivery, reason: str) -> bool:
    return True


def _lane() -> Lane:
    return Lane(_app().agents["count"], _park, Attempts(0.0, 1.0), None)


def _path(to: Phase) -> list[Phase]:
    """Allowed moves from ``restoring`` (where tasks and lanes start) to ``to``."""
    paths: dict[Phase, list[Phase]] = {Phase.RESTORING: []}
    todo = deque([Phase.RESTORING])
    while todo:
        at = todo.popleft()
        for nxt in sorted(TRANSITIONS[at], key=lambda p: p.value):
            if nxt not in paths:
                paths[nxt] = [*paths[at], nxt]
                todo.append(nxt)
    return paths[to]


def _machine_at(phase: Phase) -> tuple[PhaseMachine, Lane]:
    lane = _lane()
    machine = PhaseMachine("in[0]", [lane])
    for step in _path(phase):
        machine.transition_to(step)
    assert machine.phase is phase
    assert lane.phase is phase
    return machine, lane


@pytest.mark.parametrize(("current", "to"), FORBIDDEN, ids=lambda p: p.value)
def test_a_task_refuses_every_move_the_table_does_not_link(current: Phase, to: Phase) -> None:
    machine, lane = _machine_at(current)
    with pytest.raises(PhaseTransitionError, match=rf"in\[0\]: .*from {current.value} to"):
        machine.transition_to(to)
    assert machine.phase is current
    assert lane.phase is current


@pytest.mark.parametrize(("current", "to"), FORBIDDEN, ids=lambda p: p.value)
def test_a_lane_refuses_every_move_the_table_does_not_link(current: Phase, to: Phase) -> None:
    lane = _lane()
    for step in _path(current):
        lane.move_to(step, of="in[0]")
    with pytest.raises(PhaseTransitionError, match=rf"in\[0\] of agent count: .*{current.value}"):
        lane.move_to(to, of="in[0]")
    assert lane.phase is current


def test_a_lane_moved_on_its_own_is_checked_through_the_same_table() -> None:
    machine, lane = _machine_at(Phase.RESTORING)
    machine.transition_lane(lane, Phase.CATCHING_UP)  # a lane building beside live ones
    assert lane.building
    machine.transition_to(Phase.LIVE)
    assert lane.phase is Phase.CATCHING_UP  # it stays catching up while the task is live
    machine.transition_lane(lane, Phase.LIVE)  # its handover
    assert lane.phase is Phase.LIVE
    assert not lane.building
    machine.transition_to(Phase.SUSPENDED)
    with pytest.raises(PhaseTransitionError, match=r"of agent count: .*from suspended to catching"):
        machine.transition_lane(lane, Phase.CATCHING_UP)


def test_a_move_from_closed_raises_and_a_racing_move_is_dropped_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    machine, lane = _machine_at(Phase.CLOSED)
    for to in Phase:
        with pytest.raises(PhaseTransitionError, match="from closed"):
            machine.transition_to(to)
    with caplog.at_level(logging.DEBUG, logger="streamapp.partition"):
        assert not machine.transition_if_open(Phase.LIVE)
        assert not machine.transition_if_open(Phase.LIVE, lane)
    assert machine.phase is Phase.CLOSED
    assert lane.phase is Phase.CLOSED
    assert "in[0]: closed, move to live dropped" in caplog.text
    assert "in[0] of agent count: closed, move to live dropped" in caplog.text


def test_an_open_task_moves_through_transition_if_open() -> None:
    machine, lane = _machine_at(Phase.RESTORING)
    assert machine.transition_if_open(Phase.LIVE)
    assert machine.phase is Phase.LIVE
    assert lane.phase is Phase.LIVE
    assert machine.transition_if_open(Phase.LOST)  # fenced: not closed, so it moves
    with pytest.raises(PhaseTransitionError, match="from lost to live"):
        machine.transition_if_open(Phase.LIVE)  # only a close makes a move droppable


WORK = [s for s in LiveState if s is not LiveState.IDLE]


@pytest.mark.parametrize("work", WORK, ids=lambda s: s.value)
def test_work_starts_only_on_an_idle_task(work: LiveState) -> None:
    machine, _ = _machine_at(Phase.LIVE)
    if work is LiveState.REJOINING:  # a rejoin follows a suspend, never an idle task
        with pytest.raises(PhaseTransitionError, match="from idle to rejoining"):
            machine.set_live_state(work, was=LiveState.IDLE)
        return
    machine.set_live_state(work, was=LiveState.IDLE)
    assert machine.live_state is work
    for other in WORK:  # occupying while occupied raises
        with pytest.raises(PhaseTransitionError, match=f"it is {work.value}"):
            machine.set_live_state(other, was=LiveState.IDLE)
    assert machine.live_state is work


@pytest.mark.parametrize(("work", "other"), [(a, b) for a in WORK for b in WORK if a is not b])
def test_only_its_own_work_ends(work: LiveState, other: LiveState) -> None:
    machine, _ = _machine_at(Phase.LIVE)
    machine.live_state = work
    with pytest.raises(PhaseTransitionError, match=f"it is {work.value}"):
        machine.set_live_state(LiveState.IDLE, was=other)  # clearing another's work
    assert machine.live_state is work
    if LiveState.IDLE in LIVE_MOVES[work]:
        machine.set_live_state(LiveState.IDLE, was=work)
        assert machine.live_state is LiveState.IDLE


def test_a_suspended_task_rejoins_before_it_is_idle() -> None:
    machine, _ = _machine_at(Phase.LIVE)
    machine.set_live_state(LiveState.SUSPENDED, was=LiveState.IDLE)
    with pytest.raises(PhaseTransitionError, match="from suspended to idle"):
        machine.set_live_state(LiveState.IDLE, was=LiveState.SUSPENDED)
    machine.set_live_state(LiveState.REJOINING, was=LiveState.SUSPENDED)
    machine.set_live_state(LiveState.IDLE, was=LiveState.REJOINING)


async def test_status_shows_the_live_state_beside_busy() -> None:
    broker = MemoryBroker(_app())
    task, _ = await broker._task("in", 0)
    status = task.status()
    assert (status["phase"], status["busy"], status["live_state"]) == ("live", False, "idle")
    assert await task.suspend()
    status = task.status()
    assert (status["phase"], status["busy"], status["live_state"]) == (
        "suspended",
        True,
        "suspended",
    )
    task.rejoin()
    assert task.live_state in (LiveState.REJOINING, LiveState.IDLE)
    await task.close()
    status = task.status()
    assert (status["phase"], status["live_state"]) == ("closed", None)
    with pytest.raises(PhaseTransitionError, match="it is"):
        task.set_live_state(LiveState.HANDLING, was=LiveState.REBUILDING)
