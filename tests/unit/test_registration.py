"""``@app.agent(...)`` refuses what cannot work, naming the agent and what to change."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from streamapp import App, ConfigError, Event, Table, TableView, TopicSpec
from streamapp.testing import MemoryBroker

A: Table[Any] = Table("a")
B: Table[Any] = Table("b")


def register(handler: Any, tables: Any = (), *, topic: Any = None, app: App | None = None) -> Any:
    app = app or App("reg")
    return app.agent(app.topic("in") if topic is None else topic, tables=tables)(handler)


def names(tables: Any) -> list[str]:
    return [t.name for t in tables]


# --- async def ---------------------------------------------------------------------


def test_a_plain_function_is_refused() -> None:
    def project(event: Event) -> None:
        return None

    with pytest.raises(ConfigError, match="agent 'project'") as info:
        register(project)
    assert "async def project(event, ...)" in str(info.value)


def test_an_async_generator_is_refused() -> None:
    async def project(event: Event) -> AsyncIterator[int]:
        yield 1

    with pytest.raises(ConfigError, match=r"agent 'project': .*async generator"):
        register(project)


def test_a_lambda_returning_a_coroutine_is_refused() -> None:
    async def real(event: Event) -> None:
        return None

    with pytest.raises(ConfigError, match="not an async function"):
        register(lambda event: real(event))


def test_an_object_with_async_call_registers() -> None:
    class Projector:
        async def __call__(self, event: Event, a: TableView[Any]) -> None:
            return None

    assert names(register(Projector(), [A]).tables) == ["a"]


# --- parameters and tables -----------------------------------------------------------


async def ab(event: Event, a: TableView[Any], b: TableView[Any]) -> None:
    return None


async def ba(event: Event, b: TableView[Any], a: TableView[Any]) -> None:
    return None


async def xy(event: Event, x: TableView[Any], y: TableView[Any]) -> None:
    return None


def test_parameters_named_after_tables_bind_by_name_whatever_the_order() -> None:
    assert names(register(ab, [A, B]).tables) == ["a", "b"]
    assert names(register(ab, [B, A]).tables) == ["a", "b"]
    assert names(register(ba, [A, B]).tables) == ["b", "a"]  # Agent.tables: parameter order


def test_other_names_bind_by_position() -> None:
    assert names(register(xy, [B, A]).tables) == ["b", "a"]


async def test_binding_by_name_reaches_the_handler() -> None:
    app = App("byname")
    topic = app.topic("in", partitions=1)
    first: Table[int] = Table("first")
    second: Table[int] = Table("second")

    @app.agent(topic, tables=[first, second])
    async def project(event: Event, second: TableView[int], first: TableView[int]) -> None:
        first["k"] = 1
        second["k"] = 2

    broker = MemoryBroker(app)
    broker.send("in", Event.create("e", stream_id="k", data={}))
    await broker.process()
    assert (broker.table("first")["k"], broker.table("second")["k"]) == (1, 2)


@pytest.mark.parametrize(
    ("handler", "tables"),
    [(ab, [A]), (ab, []), (xy, [A, B, Table("c")])],
)
def test_a_count_mismatch_is_refused(handler: Any, tables: list[Table[Any]]) -> None:
    with pytest.raises(ConfigError, match=f"agent '{handler.__name__}'") as info:
        register(handler, tables)
    message = str(info.value)
    assert "table parameter(s) after the event" in message
    assert f"lists {len(tables)}" in message


def test_a_handler_without_tables_parameter_is_refused_when_tables_are_listed() -> None:
    async def project(event: Event) -> None:
        return None

    with pytest.raises(ConfigError, match="takes 0 table parameter"):
        register(project, [A])


def test_tables_listed_in_another_order_than_named_parameters_are_refused() -> None:
    async def project(event: Event, b: TableView[Any], other: TableView[Any]) -> None:
        return None

    with pytest.raises(ConfigError, match="agent 'project'") as info:
        register(project, [A, B])
    message = str(info.value)
    assert "parameter 'b' is named after table 'b'" in message
    assert "would receive table 'a'" in message
    assert "List the tables in parameter order" in message


def test_a_named_parameter_at_its_tables_position_binds_by_position() -> None:
    async def project(event: Event, a: TableView[Any], other: TableView[Any]) -> None:
        return None

    assert names(register(project, [A, B]).tables) == ["a", "b"]


def test_the_event_parameter_named_after_a_table_is_refused() -> None:
    async def project(a: TableView[Any], event: Event) -> None:
        return None

    with pytest.raises(ConfigError, match="the event comes first"):
        register(project, [A])


def test_star_args_take_the_tables_by_position() -> None:
    async def every(event: Event, *views: TableView[Any]) -> None:
        return None

    async def first_and_rest(event: Event, a: TableView[Any], *rest: TableView[Any]) -> None:
        return None

    assert names(register(every, [B, A]).tables) == ["b", "a"]
    assert names(register(every, []).tables) == []
    assert names(register(first_and_rest, [A, B]).tables) == ["a", "b"]
    with pytest.raises(ConfigError, match="parameter 'a' is named after table 'a'"):
        register(first_and_rest, [B, A])


def test_keyword_only_parameters_need_a_default() -> None:
    async def with_default(event: Event, *, retries: int = 3) -> None:
        return None

    async def without(event: Event, *, retries: int) -> None:
        return None

    assert register(with_default).tables == ()
    with pytest.raises(ConfigError, match=r"keyword-only parameter.*retries.*default"):
        register(without)


def test_a_handler_without_an_event_parameter_is_refused() -> None:
    async def project() -> None:
        return None

    with pytest.raises(ConfigError, match="no parameter for the event"):
        register(project)


def test_tables_must_be_a_list_of_distinct_tables() -> None:
    async def project(event: Event, a: TableView[Any]) -> None:
        return None

    with pytest.raises(
        ConfigError, match=r"tables= takes a list of tables: tables=\[Table\('a'\)\]"
    ):
        register(project, A)
    with pytest.raises(ConfigError, match="listed twice"):
        register(ab, [A, Table("a")])
    with pytest.raises(ConfigError, match="not a Table"):
        register(project, ["a"])


# --- topics --------------------------------------------------------------------------


async def noop(event: Event) -> None:
    return None


def test_a_topic_given_as_a_string_is_refused() -> None:
    with pytest.raises(ConfigError, match="agent 'noop': topic 'in' is a string") as info:
        register(noop, topic="in")
    assert "app.topic('in', partitions=N)" in str(info.value)


def test_an_undeclared_topic_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"agent 'noop': topic 'in' .* not a declared topic"):
        register(noop, topic=TopicSpec("in", 8))


def test_a_topic_of_another_app_is_refused() -> None:
    other = App("other").topic("theirs")
    with pytest.raises(ConfigError, match=r"'theirs' .* not a declared topic of app 'reg'"):
        register(noop, topic=other)


def test_a_topic_with_other_partitions_is_refused() -> None:
    app = App("reg")
    app.topic("in", partitions=4)
    with pytest.raises(ConfigError, match="'in' has 4 partitions in app 'reg', not 8"):
        register(noop, topic=TopicSpec("in", 8), app=app)


def test_declaring_a_topic_again_returns_the_same_spec() -> None:
    app = App("reg")
    assert app.topic("in", partitions=3) is app.topic("in", partitions=3)


def test_not_a_topic_is_refused() -> None:
    with pytest.raises(ConfigError, match="is not a topic"):
        register(noop, topic=42)


def test_a_refused_agent_is_not_registered() -> None:
    app = App("reg")
    with pytest.raises(ConfigError):
        register(ab, [A], app=app)
    assert app.agents == {}
    assert app.tables == {}


# --- the project's own apps still register ---------------------------------------------


def test_reference_app_registers() -> None:
    from agents.orders import app, project_order_status

    assert app.agents["project_order_status"] is project_order_status
    assert names(project_order_status.tables) == ["order_status"]
    assert dataclasses.is_dataclass(project_order_status)
