"""The retirement ledger, the retire's refusals, and which local stores a worker drops
(real RocksDB stores, a real SQLite ledger)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamapp import App, ConfigError, Event, RetireRefusedError, Table, TableView
from streamapp.cli.retire import check
from streamapp.eventstore import open_store
from streamapp.tables.store import RocksStore
from streamapp.versions.ledger import (
    LedgerState,
    Retirement,
    RetirementWatch,
    StoreLedger,
    VersionRecord,
    drop_local,
    encode,
    inventory,
    label,
    local_stores,
    parse_label,
)
from streamapp.versions.retired import is_retired
from tests.support.waits import finished, until

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.-0123456789@v", min_size=1, max_size=20)


@given(NAMES.filter(lambda n: parse_label(n) == (n, 1)), st.integers(1, 10_000))
def test_a_label_gives_back_its_table_version(name: str, version: int) -> None:
    assert parse_label(label(name, version)) == (name, version)


def make_app(*versions: int) -> App:
    """``order_status`` in ``versions`` (agent ``status_vN``) and ``order_count``."""
    app = App("shop")
    topic = app.topic("orders", partitions=2)
    for v in versions:
        table: Table[Any] = Table("order_status", version=v)

        async def fold(event: Event, view: TableView[Any]) -> None: ...

        fold.__name__ = f"status_v{v}"
        app.agent(topic, tables=[table], name=f"status_v{v}")(fold)

    async def count(event: Event, view: TableView[Any]) -> None: ...

    app.agent(topic, tables=[Table("order_count")])(count)
    return app


def test_a_retirement_is_new_once_and_versions_are_kept() -> None:
    state = LedgerState()
    version = VersionRecord("order_status", 1, "status_v1", "shop-status_v1-changelog")
    retired = Retirement("order_status", 1, "2026-12-02T04:00:00+00:00", "status_v1", None)
    assert state.apply(version.key, encode(version)) is None
    assert state.apply(retired.key, encode(retired)) == retired
    assert state.apply(retired.key, encode(retired)) is None  # heard again: not new
    assert state.apply("worker-1", b"{}") is None  # a worker's record: not the ledger's
    assert state.versions == {("order_status", 1): version}
    assert state.retired == {("order_status", 1): retired}


def listing(*entries: tuple[int, str, list[str]]) -> dict[str, Any]:
    versions = [{"version": v, "state": s, "declared_by": by} for v, s, by in entries]
    return {"tables": [{"name": "order_status", "versions": versions}]}


URL = "http://127.0.0.1:6066"


def test_check_refuses_the_active_a_declared_an_in_code_and_an_unknown_version() -> None:
    app, state = make_app(2), LedgerState()
    state.versions[("order_status", 1)] = VersionRecord("order_status", 1, "status_v1", None)
    served = listing((1, "previous", []), (2, "active", ["w1"]))
    check(app, "m:app", ("order_status", 1), served, state, URL)  # allowed
    with pytest.raises(RetireRefusedError, match="it is the active version"):
        check(app, "m:app", ("order_status", 2), served, state, URL)
    declared = listing((1, "previous", ["w1", "w2"]), (2, "active", ["w1", "w2"]))
    with pytest.raises(RetireRefusedError, match=r"worker\(s\) w1, w2 still declare it"):
        check(app, "m:app", ("order_status", 1), declared, state, URL)
    with pytest.raises(RetireRefusedError, match="agent 'status_v1' of m:app still writes it"):
        check(make_app(1, 2), "m:app", ("order_status", 1), served, state, URL)
    with pytest.raises(RetireRefusedError, match=r"has no version 3 \(its versions: 1, 2\)"):
        check(app, "m:app", ("order_status", 3), served, state, URL)
    with pytest.raises(RetireRefusedError, match="did you mean order_status"):
        check(app, "m:app", ("order_stat", 1), served, state, URL)


def test_a_list_without_versions_counts_its_tables_as_declared_by_that_worker() -> None:
    old = {"tables": [{"name": "order_status"}, {"name": "order_status@v2"}]}
    with pytest.raises(RetireRefusedError, match=f"{URL} still declare it"):
        check(make_app(2), "m:app", ("order_status", 1), old, LedgerState(), URL)


def store(data: Path, agent: str, partition: int, *tables: str) -> None:
    spaces = ["meta", "versions", *(f"t:{t}" for t in tables)]
    made = RocksStore(data / "shop" / agent / str(partition), spaces, open_timeout_s=1)
    made.write({space: {b"k": b"1"} for space in spaces})  # a space never written goes
    made.close()


def test_only_unused_stores_whose_every_table_is_retired_go(tmp_path: Path) -> None:
    app = make_app(2)
    store(tmp_path, "status_v1", 0, "order_status")  # agent gone from the code: goes
    store(tmp_path, "status_v1", 1, "order_status")
    store(tmp_path, "status_v2", 0, "order_status@v2")  # v2: kept
    store(tmp_path, "count", 0, "order_count")  # another table: kept
    store(tmp_path, "both", 0, "order_status", "order_other")  # another table with it
    found = {f.directory.name: f for f in local_stores(app, tmp_path, [("order_status", 1)])}
    assert set(found) == {"status_v1", "both"}
    assert len(found["status_v1"].stores) == 2
    assert not found["status_v1"].kept
    assert "order_other" in found["both"].kept
    removed = drop_local(app, tmp_path, [("order_status", 1)])
    assert removed == [tmp_path / "shop" / "status_v1"]
    assert sorted(p.name for p in (tmp_path / "shop").iterdir()) == ["both", "count", "status_v2"]


def test_a_store_of_an_agent_of_the_code_or_held_open_is_kept(tmp_path: Path) -> None:
    store(tmp_path, "status_v1", 0, "order_status")
    in_code = local_stores(make_app(1, 2), tmp_path, [("order_status", 1)])
    assert [f.kept for f in in_code] == ["agent 'status_v1' of the code uses it"]
    held = RocksStore(tmp_path / "shop" / "status_v1" / "0", ["meta", "versions", "t:order_status"])
    try:
        assert drop_local(make_app(2), tmp_path, [("order_status", 1)]) == []
        assert (tmp_path / "shop" / "status_v1" / "0").is_dir()
    finally:
        held.close()


async def test_the_store_ledger_keeps_records_and_hands_new_ones_on(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    writer = StoreLedger(await open_store(url), "shop")
    reader = StoreLedger(await open_store(url), "shop", poll_s=0.01)
    other = StoreLedger(await open_store(url), "another-app")
    try:
        version = VersionRecord("order_status", 1, "status_v1", None)
        await writer.put(version.key, encode(version))
        assert await reader.records() == [(version.key, encode(version))]
        assert await other.records() == []
        retired = Retirement("order_status", 1, "now")
        await writer.put(retired.key, encode(retired))
        updates = reader.updates()
        got = await finished(anext(updates), what="the retirement read by the other ledger")
        assert got == [(retired.key, encode(retired))]
        await updates.aclose()
    finally:
        for ledger in (writer, reader, other):
            await ledger.close()


async def test_a_worker_whose_code_declares_a_retired_version_refuses_to_start(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    ledger = StoreLedger(await open_store(url), "shop")
    retired = Retirement("order_status", 1, "2026-12-02T04:00:00+00:00")
    await ledger.put(retired.key, encode(retired))
    app = make_app(1, 2)
    settings = app.settings(data_dir=tmp_path / "data", broker="none", event_store=url)
    watch = RetirementWatch(app, settings, "m:app", ledger, changelogs=False)
    try:
        with pytest.raises(ConfigError, match="agent 'status_v1' of m:app still writes it"):
            await watch.start()
    finally:
        await watch.stop()


def test_a_data_directory_says_what_it_holds_and_a_retire_names_the_others(
    tmp_path: Path,
) -> None:
    from streamapp.cli.retire import _elsewhere

    store(tmp_path / "here", "status_v1", 0, "order_status")
    store(tmp_path / "there", "status_v1", 0, "order_status")
    store(tmp_path / "there", "status_v2", 1, "order_status@v2")
    here, there = inventory("shop", tmp_path / "here"), inventory("shop", tmp_path / "there")
    assert there.tables == {"order_status": ["status_v1"], "order_status@v2": ["status_v2"]}
    state = LedgerState()
    for record in (here, there):
        state.apply(record.key, record.encode())
    assert list(state.stores.values()) == [here, there]
    assert _elsewhere(state, ("order_status", 1), tmp_path / "here") == (there,)
    assert _elsewhere(state, ("order_status", 2), tmp_path / "here") == (there,)
    assert _elsewhere(state, ("order_status", 2), tmp_path / "there") == ()


async def test_a_worker_learns_retirements_at_start_and_while_it_runs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    writer = StoreLedger(await open_store(url), "learns")
    first = Retirement("order_status", 1, "then")
    await writer.put(first.key, encode(first))
    app = make_app(2)
    app.id = "learns"
    settings = app.settings(data_dir=tmp_path / "data", broker="none", event_store=url)
    store(tmp_path / "data", "status_v0", 0, "order_status@v3")  # retired while running
    reader = StoreLedger(await open_store(url), "learns", poll_s=0.01)
    watch = RetirementWatch(app, settings, "m:app", reader, changelogs=False)
    try:
        await watch.start()
        assert is_retired("learns", "order_status", 1)
        assert not is_retired("learns", "order_status", 2)
        assert not is_retired("another-app", "order_status", 1)
        later = Retirement("order_status", 3, "now")
        await writer.put(later.key, encode(later))
        gone = tmp_path / "data" / "learns" / "status_v0"
        await until(  # progress: the two halves of the check, as each comes true
            lambda: is_retired("learns", "order_status", 3) and not gone.exists(),
            what="version 3 learnt retired and status_v0's store gone",
            progress=lambda: (is_retired("learns", "order_status", 3), gone.exists()),
            poll_s=0.01,
        )
        declared = await writer.records()
        assert VersionRecord("order_status", 2, "status_v2", None).key in dict(declared)
    finally:
        await watch.stop()
        await writer.close()
