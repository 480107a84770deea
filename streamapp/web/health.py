"""Liveness, readiness and status of one worker.

``/healthz`` says the process answers; ``/readyz`` says every assigned partition is
restored, caught up and live, the group is not rebalancing, it confirmed this worker's
ownership within ``owner_lease_s`` and no agent has all its partitions here stalled (503
otherwise, naming the partitions that are not live, ``not_live``, those whose ownership
is not confirmed, ``unconfirmed``, with why, the agents stalled, ``stalled``, with why:
:mod:`streamapp.engine.stalled`, and ``disk``: ``disk full under DATA_DIR``, when the
stores' disk has no room left); ``/status`` is informational: partitions, phases,
lag where the transport knows it (in records, ``lag``, and in seconds, ``lag_s``),
outcomes, the catch-up progress of the event-store feed, and the last stall of the event
loop (who blocked it, on which record, how long), the publishes each
sink's broker did not confirm (``sinks``), the relays' held copies and lag (``relays``)
and the retry chain's copies by ``x-retry-hop`` (``retry_hops``); an agent that holds
streams (``Park(destination, hold="stream")``) has ``held_streams`` and ``held_events``,
and so has each of its partitions' lanes, with each hold. A held stream never makes a
worker unready.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from ..agents.agent import Agent
from ..engine.assignment import Assignment
from ..failures.outcomes import parking
from ..tables.layout import disk_full
from .held import held_of_agent
from .responses import json_response


def add_routes(
    app: web.Application,
    assignment: Assignment,
    worker_id: str,
    history: Callable[[], dict[str, object]] | None,
    stall: Callable[[], dict[str, object] | None] = lambda: None,
    operations: Callable[[], dict[str, object]] = dict,
    *,
    data_dir: Path | None = None,
) -> None:
    """``operations``: the ``sinks``, ``relays`` and ``retry_hops`` sections of ``/status``
    (:meth:`~streamapp.web.metrics.WorkerMetrics.operations`); ``data_dir``: where the
    table stores are, whose disk ``/readyz`` checks (``disk``)."""

    async def healthz(request: web.Request) -> web.Response:
        return json_response({"status": "ok", "worker": worker_id})

    async def readyz(request: web.Request) -> web.Response:
        body = readiness(assignment, data_dir)
        if body["ready"]:
            return json_response(body)
        return json_response(body, 503, **{"Retry-After": "1"})

    async def status(request: web.Request) -> web.Response:
        return json_response(
            {
                "worker": worker_id,
                "app": assignment.app.id,
                "ready": assignment.ready,
                "rebalancing": assignment.rebalancing,
                "last_rebalance_s_ago": _rounded(assignment.last_rebalance_s_ago()),
                "agents": {
                    name: {
                        "topic": agent.topic.name,
                        "partitions": agent.topic.partitions,
                        "tables": [t.name for t in agent.tables],
                        "reads": [t.name for t in agent.reads],
                        "sinks": [t.name for t in agent.sinks],
                        **_held(assignment, agent),
                    }
                    for name, agent in assignment.app.agents.items()
                },
                "partitions": assignment.status(),
                "standbys": assignment.standbys.status() if assignment.standbys else {},
                "history": history() if history is not None else None,
                "last_loop_stall": stall(),
                **operations(),
            }
        )

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status)


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _held(assignment: Assignment, agent: Agent) -> dict[str, int]:
    """The held streams of an agent that holds them, on this worker's partitions."""
    policy = parking(agent.on_failure)
    if policy is None or not policy.holds:
        return {}
    held = held_of_agent(assignment, agent.name)
    return {"held_streams": held["streams"], "held_events": held["events"]}


def readiness(assignment: Assignment, data_dir: Path | None) -> dict[str, Any]:
    """``/readyz``'s body, and ``streamapp_ready``'s value (``ready``): one answer for both."""
    not_live = assignment.not_live()
    unconfirmed = assignment.not_confirmed()
    rebalancing = assignment.rebalancing
    stalled = assignment.stalled_agents()
    disk = disk_full(data_dir) if data_dir is not None else None
    return {
        "ready": not rebalancing
        and not not_live
        and assignment.unconfirmed() is None
        and not stalled
        and disk is None,
        "disk": disk,
        "rebalancing": rebalancing,
        "partitions": len(assignment.tasks),
        "not_live": not_live,
        "unconfirmed": unconfirmed,
        "stalled": stalled,
        "stuck_on": {
            task.name: task.counts.stuck_on
            for task in assignment.tasks.values()
            if task.counts.stuck_on is not None
        },
    }
