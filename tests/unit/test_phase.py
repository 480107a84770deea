"""The partition task's phases: the allowed-transitions table, and the one method that
moves a task, which refuses any move the table does not link."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from streamapp import AgentRefusedError, App, Event, Refuse, Table, TableView
from streamapp.engine.phase import TRANSITIONS, Phase, PhaseTransitionError, check_transition
from streamapp.testing import MemoryBroker

EXPECTED: dict[Phase, set[Phase]] = {
    Phase.RESTORING: {
        Phase.RESTORING,
        Phase.CATCHING_UP,
        Phase.LIVE,
        Phase.CLOSED,
        Phase.LOST,
        Phase.FAILED,
    },
    Phase.CATCHING_UP: {Phase.RESTORING, Phase.LIVE, Phase.CLOSED, Phase.LOST, Phase.FAILED},
    Phase.LIVE: {
        Phase.RESTORING,
        Phase.CATCHING_UP,
        Phase.SUSPENDED,
        Phase.CLOSED,
        Phase.LOST,
        Phase.FAILED,
    },
    Phase.SUSPENDED: {Phase.LIVE, Phase.CLOSED, Phase.LOST, Phase.FAILED},
    Phase.LOST: {Phase.FAILED, Phase.CLOSED},
    Phase.FAILED: {Phase.CLOSED},
    Phase.CLOSED: set(),
}


def test_the_table_links_exactly_the_moves_the_task_makes() -> None:
    assert {phase: set(to) for phase, to in TRANSITIONS.items()} == EXPECTED


@pytest.mark.parametrize(("current", "to"), list(itertools.product(Phase, Phase)))
def test_check_transition_follows_the_table(current: Phase, to: Phase) -> None:
    if to in EXPECTED[current]:
        check_transition("in[0]", current, to)
    else:
        with pytest.raises(PhaseTransitionError, match=rf"in\[0\].*from {current.value} to"):
            check_transition("in[0]", current, to)


def test_every_phase_but_closed_can_close_and_closed_is_terminal() -> None:
    for phase in Phase:
        assert (Phase.CLOSED in TRANSITIONS[phase]) is (phase is not Phase.CLOSED)
    assert [p for p in Phase if p.stopped] == [Phase.CLOSED, Phase.LOST, Phase.FAILED]
    assert [p for p in Phase if p.serves] == [Phase.LIVE]


def _app() -> App:
    app = App("phases")
    counts: Table[int] = Table("counts")

    @app.agent(app.topic("in", partitions=1), tables=[counts])
    async def count(event: Event, counts: TableView[int]) -> None:
        counts["n"] = counts.get("n", 0) + 1

    return app


async def test_a_task_moves_through_its_phases_and_refuses_an_invalid_move() -> None:
    broker = MemoryBroker(_app())
    task, _ = await broker._task("in", 0)
    assert task.phase is Phase.LIVE
    with pytest.raises(PhaseTransitionError, match="from live to live"):
        task.transition_to(Phase.LIVE)
    assert task.phase is Phase.LIVE  # a refused move changes nothing

    assert await task.suspend()  # revoked, maybe handed back: kept open
    assert task.phase is Phase.SUSPENDED
    assert not task.accepting
    with pytest.raises(PhaseTransitionError, match="from suspended to catching_up"):
        task.transition_to(Phase.CATCHING_UP)
    task.rejoin()
    assert task.phase is Phase.LIVE
    for _ in range(100):  # the rejoin runs in the background
        if task.accepting:
            break
        await asyncio.sleep(0)
    assert task.accepting

    await task.close()
    assert task.phase is Phase.CLOSED
    with pytest.raises(PhaseTransitionError, match="from closed to live"):
        task.transition_to(Phase.LIVE)  # a move from closed is a bug: it raises
    assert not task.transition_if_open(Phase.LIVE)  # work that raced the close says so
    assert task.phase is Phase.CLOSED
    assert not await task.suspend()  # a closed task is not kept


async def test_a_refused_partition_is_failed_not_lost() -> None:
    app = App("refusing")

    @app.agent(app.topic("in", partitions=1))
    async def picky(event: Event) -> None:
        raise Refuse("not for this version")

    broker = MemoryBroker(app)
    broker.send("in", Event.create("x", stream_id="s", id="e1"))
    with pytest.raises(AgentRefusedError):
        await broker.process()
    task, _ = await broker._task("in", 0)
    assert task.phase is Phase.FAILED
    assert task.status()["phase"] == "failed"
    assert isinstance(task.fatal, AgentRefusedError)


async def test_a_rejoin_that_cannot_go_on_opens_again_and_takes_deliveries() -> None:
    """A kept partition whose rejoin fails (the broker refused its start, say) is opened
    again from its store: it must come back live and idle, taking deliveries, not stay
    ``rejoining`` for good (nothing is fed to a task that is not idle)."""
    broker = MemoryBroker(_app())
    task, _ = await broker._task("in", 0)
    assert await task.suspend()
    failing = task.transaction if task.transaction is not None else task.port
    name = "reset" if task.transaction is not None else "begin"
    real = getattr(failing, name)
    calls: list[int] = []

    async def once(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("the broker went away during the rejoin")
        return await real(*args, **kwargs)

    setattr(failing, name, once)
    task.rejoin()
    for _ in range(1000):  # the rejoin, then the opening again, run in the background
        if task.accepting:
            break
        await asyncio.sleep(0.001)
    assert calls, "the rejoin never reached the failing call"
    assert task.phase is Phase.LIVE
    assert task.live_state.value == "idle"
    assert task.accepting
    await task.close()
