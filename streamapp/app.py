"""App: names the application and registers its topics, agents and tables.

The app id is the Kafka consumer group of its workers and prefixes its changelog topics.
Settings are read from ``STREAMAPP_*`` and validated when a worker starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .agents.agent import Agent, Handler, refuse_stream_handler
from .agents.binding import bind_tables
from .agents.group_by import check_key_function, forwarder_name, forwarding_handler
from .agents.history import History
from .agents.typed import EventTypes
from .errors import ConfigError
from .events import Event
from .failures.outcomes import FailurePolicy, Redeliver, Retry, parking
from .settings.settings import Settings, check_setting_names
from .tables.table import Table
from .topics import (
    GroupBy,
    KeyFunction,
    TopicPlan,
    TopicRole,
    TopicSpec,
    changelog_topic,
    delay_topic,
    members_topic,
    partitioner_of,
    repartition_topic,
    topic_format,
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
        """Every table version of the app by its label (``Table.label``: the name for
        version 1, ``name@vN`` above), with the agent that writes it."""

    def settings(self, **overrides: Any) -> Settings:
        """Validated settings: environment, then the app's own, then ``overrides``."""
        return Settings.from_env(self.id, **{**self._overrides, **overrides})

    def topic(
        self,
        name: str,
        *,
        partitions: int = 8,
        format: str = "cloudevents",
        type_field: str | None = None,
        stream_id_field: str | None = None,
        partitioner: str = "murmur2",
    ) -> TopicSpec:
        """Declare a topic the app reads or sends to (declaring it again returns the same
        spec). ``format="json"`` or ``"raw"``: its records are plain values with a key,
        not CloudEvents (:mod:`streamapp.codecs.plain`); with JSON, ``type_field`` and
        ``stream_id_field`` name the value's fields that give the event's type and
        stream id (else the topic's name and the record's key).

        ``partitioner`` names how the topic's producers place a key: ``"murmur2"``
        (Kafka's default: the Java client, Quix Streams, kafkajs, streamapp itself) or
        ``"crc32"`` (librdkafka's default: confluent-kafka, kcat, librdkafka clients in
        Go, C, .NET, Node). The table write check, view routing, the event-store replay
        and the sinks place the topic's keys by it (:mod:`streamapp.topics`)."""
        spec = TopicSpec(
            name,
            partitions,
            topic_format(name, format),
            type_field,
            stream_id_field,
            partitioner_of(name, partitioner),
        )
        known = self.topics.get(name)
        if known is not None:
            if known.partitions != partitions:
                raise ConfigError(f"topic {name!r} declared twice with different partition counts")
            if known != spec:
                raise ConfigError(
                    f"topic {name!r} declared twice with different formats, fields or "
                    "partitioners: "
                    f"{_shape(known)} and {_shape(spec)}"
                )
            return known
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
        blocking: bool = False,
        events: EventTypes | Mapping[str, type[Any]] | None = None,
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
        ``on_failure`` (see :mod:`streamapp.agents.group_by`).

        ``blocking=True`` runs the handler in a thread of its partition, off the event
        loop: a plain ``def`` handler (or an ``async def`` one that blocks), for CPU-heavy
        work or a blocking client library. Deliveries of one partition still run one at a
        time, in order; other partitions, the group heartbeats and the views go on
        meanwhile. Table reads and writes and ``send`` work as in an async handler and
        commit with the batch (docs/concepts.md: Blocking handlers).

        Registration refuses (ConfigError naming the agent and what to change):

        - a handler that is not ``async def`` (without ``blocking=True``), or a
          Faust-style one that iterates a stream (``async for event in stream``) or
          yields;
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
        - a table of another agent in ``tables`` (a table version has one writer:
          ``Table("t", version=2)`` is another table than ``Table("t")``, and an agent
          writing it beside the agent writing version 1, on the same topic, is how a
          projection changes with no downtime, docs/changing-a-projection.md);
        - a table in ``reads`` that no agent registered so far owns, or whose agent's
          topic has another partition count or partitioner (not co-partitioned);
        - a ``group_by`` that is not a function, ``group_by_partitions`` without
          ``group_by`` or below 1, ``group_by`` with ``history`` (the store is replayed
          by stream id), or a repartition topic name the app declares itself.
        """

        def register(handler: Handler) -> Agent:
            agent_name = name or getattr(handler, "__name__", None) or type(handler).__name__
            self._check_topic(agent_name, topic)
            if history is not None and topic.plain:
                raise ConfigError(
                    f"agent {agent_name!r}: history= on the plain topic {topic.name!r} "
                    f"(format={topic.format.value!r}): its records carry no stream versions, "
                    "so the catch-up cannot hand over to them without losing or repeating "
                    "events; read the store's CloudEvents topic instead, or drop history="
                )
            refuse_stream_handler(agent_name, handler, tables)
            outputs = self._check_sinks(agent_name, sinks)
            if not isinstance(blocking, bool):
                raise ConfigError(
                    f"agent {agent_name!r}: blocking={blocking!r}; give True or False"
                )
            bound = bind_tables(
                agent_name, handler, tables, reads, sends=bool(outputs), blocking=blocking
            )
            if agent_name in self.agents:
                raise ConfigError(f"agent {agent_name!r} is registered twice in app {self.id!r}")
            regroup = self._group_by(agent_name, topic, group_by, group_by_partitions, history)
            source = topic if regroup is None else regroup.topic
            own = tuple(t for t in bound if t in tuple(tables))
            read = tuple(t for t in bound if t not in own)
            self._check_writers(agent_name, own)
            self._check_reads(agent_name, source, read)
            policy = on_failure or Redeliver()
            types = _event_types(agent_name, events)
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
                blocking=blocking,
                events=types,
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
            self.tables.update({t.label: (agent, t) for t in agent.tables})
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
        must then be owned by one worker (Kafka: the assignor keeps them together)."""
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

    def _check_writers(self, agent: str, own: Sequence[Table[Any]]) -> None:
        """Refuse a table version that another agent writes already (one writer each)."""
        for table in own:
            known = self.tables.get(table.label)
            if known is None:
                continue
            other = known[0].name
            version = f" version {table.version}" if table.version > 1 else ""
            raise ConfigError(
                f"agent {agent!r}: table {table.name!r}{version} is written by agent "
                f"{other!r} already; a table version has one writer. List it in "
                f"reads=[...] to read it, or write the next version of it "
                f"(Table({table.name!r}, version={self._next_version(table.name)})) to "
                f"build a changed projection beside agent {other!r}'s"
            )

    def _next_version(self, name: str) -> int:
        return 1 + max(t.version for _, t in self.tables.values() if t.name == name)

    def versions_of(self, name: str) -> dict[int, tuple[Agent, Table[Any]]]:
        """The declared versions of table ``name``, each with the agent writing it."""
        found = {t.version: (a, t) for a, t in self.tables.values() if t.name == name}
        return dict(sorted(found.items()))

    def _check_reads(self, agent: str, topic: TopicSpec, reads: Sequence[Table[Any]]) -> None:
        for table in reads:
            owner = self.tables.get(table.label)
            if owner is not None and owner[1] is not table:
                raise ConfigError(
                    f"agent {agent!r}: reads=[{table.label!r}] is another Table object than "
                    f"the one agent {owner[0].name!r} writes; pass that same Table"
                )
            if owner is None:
                raise ConfigError(
                    f"agent {agent!r}: reads=[{table.label!r}] names a table that no agent "
                    f"registered so far in app {self.id!r} owns; register the agent that "
                    "writes it (tables=[...]) first"
                )
            writer = owner[0]
            if writer.topic.partitioner is not topic.partitioner:
                raise ConfigError(
                    f"agent {agent!r} (topic {topic.name!r}, partitioner="
                    f"{topic.partitioner.value!r}) cannot read table {table.name!r} of agent "
                    f"{writer.name!r} (topic {writer.topic.name!r}, partitioner="
                    f"{writer.topic.partitioner.value!r}): a table is read in place, partition "
                    "p by the event of partition p, so a key must belong to the same partition "
                    "of both topics (co-partitioned). Produce both topics with one partitioner "
                    "and declare it on both: app.topic(..., partitioner=...)"
                )
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
        return members_topic(self.id)

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


def _shape(spec: TopicSpec) -> str:
    shape = [f"format={spec.format.value!r}"]
    shape += [f"{f}={v!r}" for f in ("type_field", "stream_id_field") if (v := getattr(spec, f))]
    shape.append(f"partitioner={spec.partitioner.value!r}")
    return ", ".join(shape)


def _event_types(
    agent: str, events: EventTypes | Mapping[str, type[Any]] | None
) -> EventTypes | None:
    if events is None or isinstance(events, EventTypes):
        types = events
    elif isinstance(events, Mapping):
        try:
            types = EventTypes(events)
        except ConfigError as exc:
            raise ConfigError(f"agent {agent!r}: events=: {exc}") from None
    else:
        raise ConfigError(
            f"agent {agent!r}: events={events!r}; give EventTypes({{type: Model, ...}}) or a "
            "mapping of CloudEvent types to msgspec Structs or pydantic models"
        )
    if types is not None:
        try:
            types.check()
        except ConfigError as exc:
            raise ConfigError(f"agent {agent!r}: events=: {exc}") from None
    return types
