"""What a worker owns, in one log line each time its partitions change.

:func:`summarize_partitions` says it after each start or rebalance (per-partition lines
are DEBUG), once the partitions are live or a while after with some still catching up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence

from .assignment import Assignment

SUMMARY_POLL_S = 0.2
"""How often :func:`summarize_partitions` looks at the assignment."""
SUMMARY_WAIT_S = 3.0
"""How long the summary waits for partitions catching up to go live before it is said
with them still catching up (a long catch-up logs its own progress)."""


async def summarize_partitions(
    assignment: Assignment,
    say: Callable[[str], None],
    poll_s: float = SUMMARY_POLL_S,
    wait_s: float = SUMMARY_WAIT_S,
) -> None:
    """Say what this worker owns in one line each time its partitions change (a start, a
    rebalance): once none is restoring and all are live, or ``wait_s`` after that with
    some still catching up (then once more when all are live). Runs until cancelled."""
    said: frozenset[tuple[str, int]] | None = None
    settled_at: float | None = None
    waiting_live = False
    while True:
        await asyncio.sleep(poll_s)
        phases = {key: task.phase.value for key, task in dict(assignment.tasks).items()}
        if assignment.rebalancing or "restoring" in phases.values():
            settled_at = None
            continue
        live = set(phases.values()) <= {"live"}
        owned = frozenset(phases)
        if owned != said:
            settled_at = settled_at or time.monotonic()
            if live or time.monotonic() - settled_at >= wait_s:
                said, settled_at, waiting_live = owned, None, not live
                say(partitions_line(assignment, phases))
        elif waiting_live and live:
            waiting_live = False
            say(f"all {len(phases)} partitions live: {_ranges(list(phases))}")


def partitions_line(assignment: Assignment, phases: Mapping[tuple[str, int], str]) -> str:
    """``owns 8 partitions: orders[0-7] (agents project); live 6, catching_up 2``."""
    if not phases:
        return "owns no partitions (the group has more workers than partitions to give)"
    counts: dict[str, int] = {}
    for phase in phases.values():
        counts[phase] = counts.get(phase, 0) + 1
    topics: list[str] = []
    for topic in dict.fromkeys(t for t, _ in sorted(phases)):
        agents = ", ".join(a.name for a in assignment.app.agents_of(topic))
        mine = [(t, p) for t, p in phases if t == topic]
        topics.append(f"{_ranges(mine)} (agent{'s' if ',' in agents else ''} {agents})")
    shown = ", ".join(f"{phase} {n}" for phase, n in sorted(counts.items(), key=lambda i: i[0]))
    return f"owns {len(phases)} partitions: {'; '.join(topics)}; {shown}"


def _ranges(keys: Sequence[tuple[str, int]]) -> str:
    """``orders[0-3,6], payments[1]``: each topic's partition numbers, runs joined."""
    out: list[str] = []
    for topic in dict.fromkeys(t for t, _ in sorted(keys)):
        numbers = sorted(p for t, p in keys if t == topic)
        runs: list[str] = []
        start = prev = numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            if n is not None:
                start = prev = n
        out.append(f"{topic}[{','.join(runs)}]")
    return ", ".join(out)
