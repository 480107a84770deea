"""Table versions: ``Table(name, version=N)`` is its own identity, with its own data
space and changelog records; version 1 keeps the names of a table without a version;
an app refuses two writers of one version and takes two versions side by side."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamapp import App, ConfigError, Event, Table, TableView
from streamapp.agents.agent import Agent
from streamapp.codecs import kafka as codec
from streamapp.engine.factory import TaskFactory
from streamapp.engine.task_config import TaskConfig
from streamapp.errors import StateMismatchError
from streamapp.records import Delivery
from streamapp.tables.changelog import RestoreChunk, records
from streamapp.tables.checkpoint import Checkpoint
from streamapp.tables.partition import CHECKPOINT_KEY, META, PartitionTables, spaces_for
from streamapp.tables.store import MemoryStore
from streamapp.topics import TopicRole, TopicSpec
from tests.support.doubles import MemoryPort


def test_version_one_keeps_the_names_of_a_table_without_a_version() -> None:
    plain, first = Table("order_status"), Table("order_status", version=1)
    assert plain.version == first.version == 1
    assert plain.label == first.label == "order_status"
    assert plain.data_space == first.data_space == "t:order_status"
    assert repr(first) == "Table('order_status')"


def test_a_later_version_has_its_own_label_and_data_space() -> None:
    table = Table("order_status", version=2)
    assert (table.name, table.version) == ("order_status", 2)
    assert table.label == "order_status@v2"
    assert table.data_space == "t:order_status@v2"
    assert repr(table) == "Table('order_status', version=2)"


@given(st.one_of(st.integers(max_value=0), st.booleans(), st.floats(), st.text()))
def test_a_bad_version_is_refused_naming_the_table(version: Any) -> None:
    with pytest.raises(ValueError, match="table 'order_status': version="):
        Table("order_status", version=version)


async def _noop(event: Event, order_status: TableView[Any]) -> None:
    pass


def test_two_agents_writing_one_version_are_refused_naming_both() -> None:
    app = App("versions")
    topic = app.topic("orders", partitions=2)
    app.agent(topic, tables=[Table("order_status", version=2)], name="project_v2")(_noop)
    with pytest.raises(ConfigError) as info:
        app.agent(topic, tables=[Table("order_status", version=2)], name="again")(_noop)
    message = str(info.value)
    assert "agent 'again'" in message
    assert "agent 'project_v2'" in message
    assert "'order_status' version 2" in message
    assert "version=3" in message  # the next version, as the fix
    assert "again" not in app.agents


def test_two_versions_of_a_table_on_one_topic_are_the_normal_case() -> None:
    app = App("versions")
    topic = app.topic("orders", partitions=2)
    v1, v2 = Table("order_status"), Table("order_status", version=2)
    one = app.agent(topic, tables=[v1], name="project")(_noop)
    two = app.agent(topic, tables=[v2], name="project_v2")(_noop)
    assert app.tables == {"order_status": (one, v1), "order_status@v2": (two, v2)}
    assert app.versions_of("order_status") == {1: (one, v1), 2: (two, v2)}
    assert [a.name for a in app.agents_of("orders")] == ["project", "project_v2"]
    changelogs = [p for p in app.topic_plan() if p.role is TopicRole.CHANGELOG]
    # `streamapp topics create` makes each version's changelog, v1's under today's name
    assert [(p.name, p.partitions, p.compacted) for p in changelogs] == [
        ("versions-project-changelog", 2, True),
        ("versions-project_v2-changelog", 2, True),
    ]


def test_changelog_records_name_the_version_and_a_restore_keeps_versions_apart() -> None:
    v1, v2 = Table("order_status"), Table("order_status", version=2)
    store1, store2 = MemoryStore(spaces_for([v1])), MemoryStore(spaces_for([v2]))
    tables1, tables2 = PartitionTables([v1], store1, 0), PartitionTables([v2], store2, 0)
    tables1.view("order_status")["k"] = "v1 value"
    tables2.view("order_status@v2")["k"] = "v2 value"
    tables1.commit_event()
    tables2.commit_event()
    batch1, batch2 = tables1.take_batch(Checkpoint()), tables2.take_batch(Checkpoint())
    keys1 = [key for key, _ in records(batch1)]
    keys2 = [key for key, _ in records(batch2)]
    assert b"dorder_status\x00k" in keys1  # today's record key for version 1
    assert b"dorder_status@v2\x00k" in keys2
    tables2.write(batch2)
    assert store2.get("t:order_status@v2", b"k") == b'"v2 value"'

    # version 1's changelog records restored into version 2's store are not its data
    chunk = RestoreChunk(tables2)
    for key, value in records(batch1):
        chunk.apply(key, value)
    assert chunk.skipped == 1
    assert "t:order_status" not in chunk.changes


async def test_a_table_whose_version_changed_in_place_is_refused_with_the_way() -> None:
    v1, v2 = Table("order_status"), Table("order_status", version=2)
    memory = MemoryStore(spaces_for([v1, v2]))
    held = Checkpoint(live=5, partitions=1, tables=("order_status",))
    memory.write({META: {CHECKPOINT_KEY: held.encode()}})
    agent = Agent("project", _noop, TopicSpec("orders", 1), (v2,))

    async def park(delivery: Delivery, reason: str) -> bool:
        return False

    task = TaskFactory(
        config=TaskConfig(redeliver_pause_s=0.0),
        decode=lambda d: codec.decode(d.key, d.value, d.headers),
        park=lambda agent, name: park,
    ).create(agent, 0, MemoryPort(), name="orders[0]", open_store=lambda a, s: memory)
    with pytest.raises(StateMismatchError) as info:
        await task.open()
    message = str(info.value)
    assert "'order_status@v2'" in message
    assert "holds 'order_status'" in message
    assert "add an agent" in message


def test_a_table_switch_is_auto_or_manual() -> None:
    from streamapp import Table

    assert Table("t", version=2, switch="manual").switch == "manual"
    assert Table("t").switch == "auto"
    with pytest.raises(ValueError, match=r"switch='later'; give 'auto'"):
        Table("t", version=2, switch="later")
