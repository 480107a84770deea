"""``streamapp reset``: remove an agent's state so that its next start rebuilds it.

What holds an agent's state, and what the reset does with it:

- its partition stores under the data directory (:mod:`streamapp.tables.layout`): the
  agent's directory is removed, every partition of it, and nothing else;
- on Kafka, its changelog topic (restore on a move): deleted and made again empty;
- the group's committed offsets and their metadata (the lanes ahead, see
  :mod:`streamapp.transports.kafka.port`) are left alone: a lane with tables starts from its
  store's checkpoint only, never from the group's offset, so an agent without a store
  starts as a new one would (the event-store replay from its first event, else the
  topic from ``auto_offset_reset``), while the other agents of its topic go on from
  their own checkpoints. Membership (the Kafka members topic, RabbitMQ heartbeats)
  holds no agent state.

A reset is refused while a worker of the app runs, naming it: the Kafka group has
active members, RabbitMQ members beat or its partition queues have consumers, a store
in the data directory is held open by a process, or (``STREAMAPP_BROKER=none``) the
event store's worker lock is held, which the reset then holds until it is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import click

from ..agents.agent import Agent
from ..app import App
from ..errors import ConfigError, ResetRefusedError, StreamappError, UnknownAgentError
from ..settings.settings import Settings
from ..tables.layout import (
    agent_directory,
    app_directory,
    describe_process,
    lock_holders,
    partition_stores,
)
from ..topics import TopicPlan
from ..transports.base import Transport, transports
from .main import app_option, load_app, main


@main.command()
@app_option
@click.option("--agent", "agent_name", help="Reset this agent only (default: every agent).")
@click.option("--data-dir", type=click.Path(path_type=Path), help="The workers' data directory.")
@click.option("--yes", is_flag=True, help="Remove it; without: print what would go, exit 1.")
def reset(app_ref: str, agent_name: str | None, data_dir: Path | None, yes: bool) -> None:
    """Remove agents' local state and changelog topics: the next start rebuilds them.

    Run it with the workers' settings, every worker of the app stopped (it refuses,
    naming them, while one runs), on every host that keeps a data directory of the app.
    Without --yes it prints what it would remove and exits 1, touching nothing.
    """

    app = load_app(app_ref)
    try:
        settings = app.settings(**({} if data_dir is None else {"data_dir": data_dir}))
        plan = plan_reset(app, settings, agent_name)
    except UnknownAgentError as exc:
        raise click.BadParameter(str(exc), param_hint="--agent") from exc
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    if not plan.agents:
        click.echo(f"app {app.id!r} has no agent with tables or local state: nothing to reset")
        return
    try:
        done = asyncio.run(run_reset(app, settings, plan, yes=yes, say=click.echo))
    except ResetRefusedError as exc:
        raise click.ClickException(str(exc)) from exc
    except StreamappError as exc:
        raise click.ClickException(
            f"reset stopped: {exc}\nWhat it printed as done is done; run it again to finish."
        ) from exc
    if not done:
        click.echo("dry run: nothing removed; run again with --yes to remove it", err=True)
        sys.exit(1)
    click.echo("reset done: start the workers to rebuild")


@dataclass(frozen=True, slots=True)
class AgentState:
    """What the reset removes for one agent, and how the agent comes back."""

    agent: str
    directory: Path
    stores: tuple[Path, ...]
    changelog: TopicPlan | None
    rebuild: str


@dataclass(frozen=True, slots=True)
class ResetPlan:
    """Everything a reset of ``agents`` removes under ``data_dir`` and on the broker."""

    app_id: str
    broker: str
    changelog_note: str
    """What is said of an agent without a changelog ('' : nothing)."""
    data_dir: Path
    agents: tuple[AgentState, ...]
    left_alone: tuple[Path, ...]
    """Directories of the app's data directory that belong to no agent being reset."""

    def lines(self) -> list[str]:
        """What the reset removes, one line each (the dry run prints it)."""
        where = app_directory(self.data_dir, self.app_id)
        out = [f"reset of app {self.app_id!r} (broker {self.broker}), stores under {where}:"]
        for state in self.agents:
            out.append(f"agent {state.agent}:")
            if state.stores:
                numbers = ", ".join(p.name for p in state.stores)
                out.append(
                    f"  remove {state.directory} ({len(state.stores)} partition store(s): "
                    f"{numbers})"
                )
            elif state.directory.exists():
                out.append(f"  remove {state.directory} (no partition store in it)")
            else:
                out.append(f"  no local store in {state.directory}")
            if state.changelog is not None:
                out.append(
                    f"  delete changelog topic {state.changelog.name} and make it again empty "
                    f"({state.changelog.partitions} partitions, compacted)"
                )
            elif self.changelog_note:
                out.append(f"  {self.changelog_note}")
            out.append(f"  {state.rebuild}")
        for path in self.left_alone:
            out.append(f"left alone: {path}")
        return out


def plan_reset(
    app: App, settings: Settings, agent: str | None, data_dir: Path | None = None
) -> ResetPlan:
    """What resetting ``agent`` (None: every agent with state) would remove."""
    data = Path(data_dir if data_dir is not None else settings.data_dir)
    root = app_directory(data, app.id)
    if agent is not None:
        chosen = [_known_agent(app, agent, root)]
    else:
        chosen = [
            a
            for a in app.agents.values()
            if a.tables or agent_directory(data, app.id, a.name).exists()
        ]
    plans = {p.name: p for p in app.topic_plan(settings.delayed_policy)}
    transport = transports[settings.broker]
    states = []
    for a in chosen:
        directory = agent_directory(data, app.id, a.name)
        changelog = app.changelog_topic(a) if transport.capabilities.changelog else None
        states.append(
            AgentState(
                a.name,
                directory,
                tuple(partition_stores(directory)),
                plans.get(changelog) if changelog else None,
                _rebuild(a, settings, transport),
            )
        )
    names = {s.agent for s in states}
    left = tuple(sorted(p for p in root.iterdir() if p.name not in names)) if root.is_dir() else ()
    note = transport.changelog_note
    return ResetPlan(app.id, settings.broker, note, data, tuple(states), left)


def _known_agent(app: App, name: str, root: Path) -> Agent:
    agent = app.agents.get(name)
    if agent is None:
        names = list(app.agents)
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.4)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise UnknownAgentError(
            f"app {app.id!r} has no agent {name!r}{hint} (its agents: "
            f"{', '.join(names) or 'none'}; `streamapp agents -A ...` lists them)"
        )
    if not agent.tables and not (root / name).exists():
        stateful = [a.name for a in app.agents.values() if a.tables]
        raise UnknownAgentError(
            f"agent {name!r} of app {app.id!r} has no tables and no local state under "
            f"{root}: there is nothing to reset (agents with tables: "
            f"{', '.join(stateful) or 'none'})"
        )
    return agent


def _rebuild(agent: Agent, settings: Settings, transport: Transport) -> str:
    """How ``agent``'s tables come back on the next start."""
    if not agent.tables:
        return "has no tables any more: nothing to rebuild"
    store = f"the event store {_without_password(settings.event_store)} from its first event"
    capabilities = transport.capabilities
    if capabilities.embedded or (not capabilities.keeps_consumed and agent.history):
        return f"rebuilt on the next start by replaying {store}"
    if not capabilities.keeps_consumed:
        return (
            f"has no history=FromEventStore(): {transport.title} keeps no consumed message, "
            "so its tables cannot be rebuilt (a worker refuses such an agent)"
        )
    topic = agent.topic.name
    if agent.history is not None:
        return f"rebuilt on the next start by replaying {store}, then live on topic {topic}"
    if settings.auto_offset_reset == "earliest":
        return (
            f"rebuilt on the next start from topic {topic} from its earliest offset "
            "(what the topic's retention kept)"
        )
    return (
        f"starts empty at the end of topic {topic} on the next start (setting "
        "auto_offset_reset = latest): earlier events are not applied again"
    )


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


Say = Callable[[str], None]


async def run_reset(app: App, settings: Settings, plan: ResetPlan, *, yes: bool, say: Say) -> bool:
    """Refuse while a worker of the app runs; then, with ``yes``, remove what ``plan``
    names and say what was removed. False: a dry run, nothing touched.

    Changelogs go first, stores second: a reset stopped between the two (an error names
    it) leaves stores that a restart would keep and run again (``streamapp reset`` is
    idempotent: run it again)."""
    for line in plan.lines():
        say(line)
    transport = transports[settings.broker]
    async with _embedded_lock(app, settings, transport) as held_by:
        reasons = [held_by] if held_by else []
        reasons += _open_stores(plan)
        reasons += await transport.running_workers(app, settings)
        if reasons:
            raise ResetRefusedError(_refusal(app, settings, transport, reasons))
        if not yes:
            return False
        changelogs = [s.changelog for s in plan.agents if s.changelog is not None]
        if changelogs:
            existed = await transport.recreate_changelogs(settings, changelogs)
            for topic in changelogs:
                if existed[topic.name]:
                    say(f"deleted topic {topic.name} and made it again empty")
                else:
                    say(f"topic {topic.name} did not exist: made it empty")
        for state in plan.agents:
            if state.directory.exists():
                shutil.rmtree(state.directory)
                say(f"removed {state.directory}")
    return True


def _open_stores(plan: ResetPlan) -> list[str]:
    """The processes holding stores of ``plan`` open, each with the stores it holds."""
    stores = [store for state in plan.agents for store in state.stores]
    held: dict[int, list[Path]] = {}
    for store, pid in sorted(lock_holders(stores).items()):
        held.setdefault(pid, []).append(store)
    out = []
    for pid, paths in held.items():
        by_agent: dict[Path, list[str]] = {}
        for path in paths:
            by_agent.setdefault(path.parent, []).append(path.name)
        listed = "; ".join(f"{d} partitions {', '.join(n)}" for d, n in by_agent.items())
        out.append(f"{describe_process(pid)} holds table stores open: {listed}")
    return out


@contextlib.asynccontextmanager
async def _embedded_lock(
    app: App, settings: Settings, transport: Transport
) -> AsyncIterator[str | None]:
    """The event store alone (``STREAMAPP_BROKER=none``): hold the store's worker lock
    for the reset (a worker cannot start meanwhile); yields why not when a worker holds
    it."""
    if not transport.capabilities.embedded:
        yield None
        return
    from ..eventstore import open_store

    store = await open_store(settings.event_store)
    try:
        lock = store.worker_lock(app.id)
        try:
            await lock.__aenter__()
        except ConfigError as exc:
            yield f"the event store's worker lock is held: {exc}"
            return
        try:
            yield None
        finally:
            await lock.__aexit__(None, None, None)
    finally:
        await store.close()


def _refusal(app: App, settings: Settings, transport: Transport, reasons: list[str]) -> str:
    lines = [f"reset refused, nothing removed: a worker of app {app.id!r} runs:"]
    lines += [f"  - {reason}" for reason in reasons]
    lines.append(
        "Stop the workers named (SIGTERM: they finish their batches and leave), then run "
        "the reset again."
    )
    hint = transport.refusal_hint(settings)
    if hint:
        lines.append(hint)
    return "\n".join(lines)
