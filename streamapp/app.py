"""App: names the application and registers its topics, agents and tables.

The app id is the Kafka consumer group of its workers and prefixes its changelog topics.
Settings are read from ``STREAMAPP_*`` and validated when a worker starts.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .agent import Agent, Handler, TopicSpec
from .binding import bind_tables
from .errors import ConfigError
from .events import Event
from .history import History
from .outcomes import FailurePolicy, Redeliver, Retry, parking
from .repartition import (
    GroupBy,
    KeyFunction,
    check_key_function,
    forwarder_name,
    forwarding_handler,
    repartition_topic,
)
from .settings import Settings, check_setting_names
from .tables.changelog import changelog_topic
from .tables.table import Table


class TopicRole(enum.StrEnum):
    """Why the app needs a topic (``streamapp topics create`` prints it)."""

    SOURCE = "source"
    """Feeds agents."""
    OUTPUT = "output"
    """Agents send derived events to it (``sinks=[...]``) and no agent of the app reads it."""
    CHANGELOG = "changelog"
    """An agent's tables, compacted."""
    PARKING = "parking"
    """Where a failure policy parks records."""
    REPARTITION = "repartition"
    """Internal: a re-keyed agent's forwarder sends to it, the agent consumes it
    (``group_by=``)."""
    RETRY = "retry"
    """Copies of failed records waiting for the relay (``Retry``: ``{topic}-retry``)."""
    DEAD_LETTER = "dead-letter"
    """Records whose retries are spent (``Retry``: ``{topic}-dlq``)."""
    DELAY = "delay"
    """Derived events sent with a delay, waiting for the relay (``{topic}-delay``,
    setting ``delayed_policy=relay``)."""
    MEMBERS = "members"
    """Where workers say which partitions they own (views forward through it)."""


@dataclass(frozen=True)
class TopicPlan:
    """A topic the app needs: what ``streamapp topics create`` makes."""

    name: str
    partitions: int
    compacted: bool = False
    role: TopicRole = TopicRole.SOURCE


def delay_topic(topic: str) -> str:
    """Where derived events for ``topic`` sent with a delay wait (``delayed_policy=relay``)."""
    return f"{topic}-delay"


def relayed(plan: list[TopicPlan]) -> list[TopicPlan]:
    """The topics of ``plan`` the relay consumes (retry and delay topics)."""
    return [p for p in plan if p.role in (TopicRole.RETRY, TopicRole.DELAY)]


def refuse_chain(app: App, broker: str) -> None:
    """ConfigError when an agent uses the retry chain on a broker that has none (the
    store-only source, ``broker=none``: no topic to hold the copies)."""
    for agent in app.agents.values():
        if isinstance(agent.on_failure, Retry) and broker not in ("kafka", "rabbitmq"):
            raise ConfigError(
                f"agent {agent.name!r} (topic {agent.topic.name!r}) uses "
                f"on_failure=Retry(...), but setting broker (STREAMAPP_BROKER) = {broker!r} "
                "has no retry chain (it runs on kafka, rabbitmq and the memory broker): use "
                "Park(destination) or Redeliver(max_attempts=..., fallback=Park(...)) there"
            )


class App:
    """A streamapp application: ``App("orders")``, then ``@app.agent(...)``.

    ``settings`` are :class:`~streamapp.settings.Settings` fields that win over the
    environment; an unknown name is a ConfigError naming the closest setting.
    """

    def __init__(self, id: str, **settings: Any) -> None:
        check_setting_names(settings)
        self.id = id
        self._overrides = settings
        self.agents: dict[str, Agent] = {}
        self.topics: dict[str, TopicSpec] = {}
        self.tables: dict[str, tuple[Agent, Table[Any]]] = {}
        """Every table of the app, with the agent that owns it."""

    def settings(self, **overrides: Any) -> Settings:
        """Validated settings: environment, then the app's own, then ``overrides``."""
        return Settings.from_env(self.id, **{**self._overrides, **overrides})

    def topic(self, name: str, *, partitions: int = 8) -> TopicSpec:
        """Declare a topic the app reads or sends to (declaring it again returns the same
        spec)."""
        known = self.topics.get(name)
        if known is not None:
            if known.partitions != partitions:
                raise ConfigError(f"topic {name!r} declared twice with different partition counts")
            return known
        spec = TopicSpec(name, partitions)
        self.topics[name] = spec
        return spec

    def agent(
        self,
        topic: TopicSpec,
        *,
        tables: Sequence[Table[Any]] = (),
        reads: Sequence[Table[Any]] = (),
        sinks: Sequence[TopicSpec] = (),
        filter: Callable[[Event], bool] | None = None,
        on_failure: FailurePolicy | None = None,
        history: History | None = None,
        name: str | None = None,
        group_by: KeyFunction | None = None,
        group_by_partitions: int | None = None,
    ) -> Callable[[Handler], Agent]:
        """Register ``async def handler(event, *views, send=...)`` as an agent of ``topic``.

        With ``history=FromEventStore()`` each partition first replays its events from
        the event store into the tables, then hands over to ``topic`` (catch-up then live).

        ``sinks=[out]`` declares the topics the agent sends derived events to: the handler
        takes a keyword-only ``send`` and calls ``send(out, event)``; sends go out with the
        batch's commit (on Kafka in its transaction, exactly once), never for an event
        whose handler raised. ``reads=[table]`` gives the handler a read-only view of
        another agent's table, co-partitioned: committed state of the partition with the
        event's number.

        Several agents may share a topic: one consumer feeds them all, each with its own
        tables, outcome and failure policy per event (see :mod:`streamapp.engine.lane`).

        ``group_by=lambda e: e.data["customer"]`` consumes ``topic`` re-keyed (Faust's
        ``group_by``): a forwarding agent ``{name}.group_by`` on ``topic`` sends each
        event (after ``filter``) keyed by the function's value to the internal topic
        ``{app}-{name}-repartition`` (``group_by_partitions``, default: ``topic``'s
        count), which the agent consumes; its tables are keyed by the new key. A key
        function that raises or returns no non-empty ``str`` fails the event under
        ``on_failure`` (see :mod:`streamapp.repartition`).

        Registration refuses (ConfigError naming the agent and what to change):

        - a handler that is not ``async def``;
        - a ``topic`` or a sink that is not declared by :meth:`topic` of this app;
        - handler parameters that do not match ``tables`` and ``reads``. After the event
          parameter comes one positional parameter per listed table, own tables first,
          then tables read (or fewer and ``*args``, which takes the rest); other
          parameters are keyword-only with defaults, but ``send``, which an agent with
          sinks takes and only such an agent. When every table has a parameter of its
          exact name, tables bind by name, whatever the order of the lists; otherwise by
          position, and a parameter named after a listed table must sit at that table's
          position (else the lists and the parameters are in different orders).
          ``Agent.bound`` is in parameter order;
        - a table of another agent in ``tables`` (a table has one writer);
        - a table in ``reads`` that no agent registered so far owns, or whose agent's
          topic has another partition count (not co-partitioned);
        - a ``group_by`` that is not a function, ``group_by_partitions`` without
          ``group_by`` or below 1, ``group_by`` with ``history`` (the store is replayed
          by stream id), or a repartition topic name the app declares itself.
        """

        def register(handler: Handler) -> Agent:
            agent_name = name or getattr(handler, "__name__", None) or type(handler).__name__
            self._check_topic(agent_name, topic)
            outputs = self._check_sinks(agent_name, sinks)
            bound = bind_tables(agent_name, handler, tables, reads, sends=bool(outputs))
            if agent_name in self.agents:
                raise ConfigError(f"agent {agent_name!r} is registered twice in app {self.id!r}")
            regroup = self._group_by(agent_name, topic, group_by, group_by_partitions, history)
            source = topic if regroup is None else regroup.topic
            own = tuple(t for t in bound if t in tuple(tables))
            read = tuple(t for t in bound if t not in own)
            for other in self.agents.values():
                shared = {t.name for t in other.tables} & {t.name for t in own}
                if shared:
                    raise ConfigError(
                        f"agent {agent_name!r}: table(s) {sorted(shared)} belong to agent "
                        f"{other.name!r}; a table has one writer: list it in reads=[...] to "
                        "read it"
                    )
            self._check_reads(agent_name, source, read)
            policy = on_failure or Redeliver()
            agent = Agent(
                name=agent_name,
                handler=handler,
                topic=source,
                tables=own,
                filter=filter if regroup is None else None,  # the forwarder filters
                on_failure=policy,
                history=history,
                sinks=outputs,
                reads=read,
                bound=bound,
                group_by=regroup,
            )
            if regroup is not None:
                self.topics[regroup.topic.name] = regroup.topic
                self.agents[regroup.forwarder] = Agent(
                    name=regroup.forwarder,
                    handler=forwarding_handler(agent_name, regroup),
                    topic=topic,
                    filter=filter,
                    on_failure=policy,
                    sinks=(regroup.topic,),
                )
            self.agents[agent_name] = agent
            self.tables.update({t.name: (agent, t) for t in agent.tables})
            return agent

        return register

    def _group_by(
        self,
        agent: str,
        topic: TopicSpec,
        key: KeyFunction | None,
        partitions: int | None,
        history: History | None,
    ) -> GroupBy | None:
        """The re-keying of ``agent`` (None: it consumes ``topic`` as it is keyed)."""
        if key is None:
            if partitions is not None:
                raise ConfigError(
                    f"agent {agent!r}: group_by_partitions={partitions!r} without group_by; "
                    "drop it, or re-key the topic with group_by=..."
                )
            return None
        key = check_key_function(agent, key)
        if history is not None:
            raise ConfigError(
                f"agent {agent!r}: group_by with history={history!r} is not supported: the "
                "event store is replayed by stream id, not by the key function; drop one"
            )
        count = topic.partitions if partitions is None else partitions
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(
                f"agent {agent!r}: group_by_partitions={partitions!r}; give a whole number "
                "of partitions, at least 1 (default: the source topic's count)"
            )
        name = repartition_topic(self.id, agent)
        if name in self.topics:
            raise ConfigError(
                f"agent {agent!r}: topic {name!r} is declared by the app, but it is the "
                "agent's internal repartition topic (group_by); rename the topic or the agent"
            )
        forwarder = forwarder_name(agent)
        if forwarder in self.agents:
            raise ConfigError(
                f"agent {agent!r}: an agent named {forwarder!r} is registered already, but "
                "it is the name of this agent's forwarder (group_by); rename that agent"
            )
        return GroupBy(key, topic, TopicSpec(name, count), forwarder)

    def agents_of(self, topic: str) -> list[Agent]:
        """The agents fed by ``topic``, in registration order (the order they run in)."""
        return [a for a in self.agents.values() if a.topic.name == topic]

    @property
    def sources(self) -> dict[str, TopicSpec]:
        """Every topic that feeds an agent, by name, in registration order."""
        return {a.topic.name: a.topic for a in self.agents.values()}

    @property
    def copartitioned(self) -> bool:
        """True when an agent reads another's table: partition ``p`` of every source topic
        must then be owned by one worker (Kafka: the range assignor)."""
        return any(a.reads for a in self.agents.values())

    def _check_sinks(self, agent: str, sinks: Sequence[TopicSpec]) -> tuple[TopicSpec, ...]:
        if isinstance(sinks, (TopicSpec, str)):
            raise ConfigError(f"agent {agent!r}: sinks= takes a list of topics: sinks=[{sinks!r}]")
        out: list[TopicSpec] = []
        for sink in sinks:
            self._check_topic(agent, sink, what="sink")
            if sink in out:
                raise ConfigError(f"agent {agent!r}: topic {sink.name!r} is listed twice in sinks")
            out.append(sink)
        return tuple(out)

    def _check_reads(self, agent: str, topic: TopicSpec, reads: Sequence[Table[Any]]) -> None:
        for table in reads:
            owner = self.tables.get(table.name)
            if owner is not None and owner[1] is not table:
                raise ConfigError(
                    f"agent {agent!r}: reads=[{table.name!r}] is another Table object than "
                    f"the one agent {owner[0].name!r} writes; pass that same Table"
                )
            if owner is None:
                raise ConfigError(
                    f"agent {agent!r}: reads=[{table.name!r}] names a table that no agent "
                    f"registered so far in app {self.id!r} owns; register the agent that "
                    "writes it (tables=[...]) first"
                )
            writer = owner[0]
            if writer.topic.partitions != topic.partitions:
                raise ConfigError(
                    f"agent {agent!r} (topic {topic.name!r}, {topic.partitions} partitions) "
                    f"cannot read table {table.name!r} of agent {writer.name!r} (topic "
                    f"{writer.topic.name!r}, {writer.topic.partitions} partitions): a table is "
                    "read in place, partition p by the event of partition p, so both topics "
                    "must have the same partition count (co-partitioned). Repartition one "
                    "topic, or send the events the reader needs to a topic partitioned alike"
                )

    def _check_topic(self, agent: str, topic: Any, *, what: str = "topic") -> None:
        if isinstance(topic, str):
            raise ConfigError(
                f"agent {agent!r}: {what} {topic!r} is a string; declare it with "
                f"`topic = app.topic({topic!r}, partitions=N)` and pass that"
            )
        if not isinstance(topic, TopicSpec):
            raise ConfigError(
                f"agent {agent!r}: {what} {topic!r} is not a topic; declare one with "
                "`app.topic(name, partitions=N)` and pass that"
            )
        known = self.topics.get(topic.name)
        if known is not None and known != topic:
            raise ConfigError(
                f"agent {agent!r}: {what} {topic.name!r} has {known.partitions} partitions in "
                f"app {self.id!r}, not {topic.partitions}; pass the spec `app.topic(...)` returned"
            )
        if known is None:
            raise ConfigError(
                f"agent {agent!r}: {what} {topic.name!r} ({topic.partitions} partitions) is "
                f"not a declared topic of app {self.id!r}; declare it with "
                f"`app.topic({topic.name!r}, partitions={topic.partitions})` on this app"
            )

    def changelog_topic(self, agent: Agent) -> str | None:
        """The changelog topic of ``agent``'s tables (None: the agent has no tables)."""
        return changelog_topic(self.id, agent.name) if agent.tables else None

    @property
    def members_topic(self) -> str:
        """The compacted topic where workers say which partitions they own and where
        their views answer (views forward a key to its owner through it)."""
        return f"{self.id}-members"

    def topic_plan(self, delayed_policy: str = "immediate") -> list[TopicPlan]:
        """Every topic the app reads or writes, with partitions and cleanup policy
        (``delayed_policy``: the setting; ``relay`` adds a delay topic per sink)."""
        plan: dict[str, TopicPlan] = {}
        for agent in self.agents.values():
            src = agent.topic
            role = TopicRole.SOURCE if agent.group_by is None else TopicRole.REPARTITION
            plan[src.name] = TopicPlan(src.name, src.partitions, role=role)
        for agent in self.agents.values():
            src = agent.topic
            changelog = self.changelog_topic(agent)
            if changelog is not None:
                plan[changelog] = TopicPlan(
                    changelog, src.partitions, compacted=True, role=TopicRole.CHANGELOG
                )
            for sink in agent.sinks:
                plan.setdefault(
                    sink.name, TopicPlan(sink.name, sink.partitions, role=TopicRole.OUTPUT)
                )
            park = parking(agent.on_failure)
            if park is not None:
                dest = park.destination
                plan.setdefault(dest, TopicPlan(dest, src.partitions, role=TopicRole.PARKING))
            policy = agent.on_failure
            if isinstance(policy, Retry):
                retry = policy.retry_topic(src.name)
                if retry is not None:
                    plan.setdefault(retry, TopicPlan(retry, src.partitions, role=TopicRole.RETRY))
                dlq = policy.dlq_topic(src.name)
                plan.setdefault(dlq, TopicPlan(dlq, src.partitions, role=TopicRole.DEAD_LETTER))
            if delayed_policy == "relay":
                for sink in agent.sinks:
                    name = delay_topic(sink.name)
                    plan.setdefault(name, TopicPlan(name, sink.partitions, role=TopicRole.DELAY))
        if plan:
            members = self.members_topic
            plan[members] = TopicPlan(members, 1, compacted=True, role=TopicRole.MEMBERS)
        return list(plan.values())
