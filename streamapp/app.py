"""App: names the application and registers its topics, agents and tables.

The app id is the Kafka consumer group of its workers and prefixes its changelog topics.
Settings are read from ``STREAMAPP_*`` and validated when a worker starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .agent import Agent, Handler, TopicSpec
from .binding import bind_tables
from .errors import ConfigError
from .events import Event
from .history import History
from .outcomes import FailurePolicy, Redeliver, parking
from .settings import Settings, check_setting_names
from .tables.changelog import changelog_topic
from .tables.table import Table


@dataclass(frozen=True)
class TopicPlan:
    """A topic the app needs: what ``streamapp topics create`` makes."""

    name: str
    partitions: int
    compacted: bool = False
    role: str = "source"


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
        """Declare a source topic (declaring it again returns the same spec)."""
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
        filter: Callable[[Event], bool] | None = None,
        on_failure: FailurePolicy | None = None,
        history: History | None = None,
        name: str | None = None,
    ) -> Callable[[Handler], Agent]:
        """Register ``async def handler(event, *views)`` as an agent of ``topic``.

        With ``history=FromEventStore()`` each partition first replays its events from
        the event store into the tables, then hands over to ``topic`` (catch-up then live).

        Registration refuses (ConfigError naming the agent and what to change):

        - a handler that is not ``async def``;
        - a ``topic`` that is not declared by :meth:`topic` of this app (a string, say);
        - handler parameters that do not match ``tables``. After the event parameter
          comes one positional parameter per listed table (or fewer and ``*args``,
          which takes the rest); other parameters are keyword-only with defaults. When
          every table has a parameter of its exact name, tables bind by name, whatever
          the order of the list; otherwise by position, and a parameter named after a
          listed table must sit at that table's position (else the list and the
          parameters are in different orders). ``Agent.tables`` is in parameter order.
        """

        def register(handler: Handler) -> Agent:
            agent_name = name or getattr(handler, "__name__", None) or type(handler).__name__
            self._check_topic(agent_name, topic)
            bound = bind_tables(agent_name, handler, tables)
            if agent_name in self.agents:
                raise ConfigError(f"agent {agent_name!r} is registered twice in app {self.id!r}")
            for other in self.agents.values():
                if other.topic.name == topic.name:
                    raise ConfigError(
                        f"topic {topic.name!r} already feeds agent {other.name!r}; "
                        "one agent per source topic"
                    )
                shared = {t.name for t in other.tables} & {t.name for t in bound}
                if shared:
                    raise ConfigError(f"table(s) {sorted(shared)} belong to agent {other.name!r}")
            agent = Agent(
                name=agent_name,
                handler=handler,
                topic=topic,
                tables=bound,
                filter=filter,
                on_failure=on_failure or Redeliver(),
                history=history,
            )
            self.agents[agent_name] = agent
            self.tables.update({t.name: (agent, t) for t in agent.tables})
            return agent

        return register

    def _check_topic(self, agent: str, topic: Any) -> None:
        if isinstance(topic, str):
            raise ConfigError(
                f"agent {agent!r}: topic {topic!r} is a string; declare it with "
                f"`topic = app.topic({topic!r}, partitions=N)` and pass that"
            )
        if not isinstance(topic, TopicSpec):
            raise ConfigError(
                f"agent {agent!r}: {topic!r} is not a topic; declare one with "
                "`app.topic(name, partitions=N)` and pass that"
            )
        known = self.topics.get(topic.name)
        if known is not None and known != topic:
            raise ConfigError(
                f"agent {agent!r}: topic {topic.name!r} has {known.partitions} partitions in "
                f"app {self.id!r}, not {topic.partitions}; pass the spec `app.topic(...)` returned"
            )
        if known is None:
            raise ConfigError(
                f"agent {agent!r}: topic {topic.name!r} ({topic.partitions} partitions) is not "
                f"a declared topic of app {self.id!r}; declare it with "
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

    def topic_plan(self) -> list[TopicPlan]:
        """Every topic the app reads or writes, with partitions and cleanup policy."""
        plan: dict[str, TopicPlan] = {}
        for agent in self.agents.values():
            src = agent.topic
            plan[src.name] = TopicPlan(src.name, src.partitions)
            changelog = self.changelog_topic(agent)
            if changelog is not None:
                plan[changelog] = TopicPlan(
                    changelog, src.partitions, compacted=True, role="changelog"
                )
            park = parking(agent.on_failure)
            if park is not None:
                dest = park.destination
                plan.setdefault(dest, TopicPlan(dest, src.partitions, role="parking"))
        if plan:
            members = self.members_topic
            plan[members] = TopicPlan(members, 1, compacted=True, role="members")
        return list(plan.values())
