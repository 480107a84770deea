"""``streamapp reset`` on the command line: the dry run, an unknown agent, exactly the
agent's stores removed, and refusals while a process holds the state. Embedded mode
(``STREAMAPP_BROKER=none``, a SQLite event store): real RocksDB stores, no broker."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from streamapp.cli import main
from streamapp.eventstore import open_store
from streamapp.settings.settings import Settings
from streamapp.tables.store import rocks_opener
from tests.support.waits import until_exit

APP = "tests.apps.reset_world:app"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory holding real stores of tally and latest (4 partitions each),
    and another app's store, made the way a worker opens them."""
    monkeypatch.setenv("STREAMAPP_BROKER", "none")
    monkeypatch.setenv("STREAMAPP_EVENT_STORE", f"sqlite:///{tmp_path / 'events.db'}")
    data = tmp_path / "data"
    for app_id, agent in (("rw", "tally"), ("rw", "latest"), ("other", "tally")):
        settings = Settings(app_id, data_dir=data)
        for p in range(4):
            store = rocks_opener(settings, app_id, agent, p)([agent, "meta"])
            store.write({agent: {f"k{p}".encode(): b"v"}})
            store.close()
    return data


def reset(*args: str) -> Result:
    return CliRunner().invoke(main, ["reset", "-A", APP, *args])


def fingerprint(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` with a digest of its bytes."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_the_dry_run_lists_every_partition_store_and_touches_nothing(data: Path) -> None:
    before = fingerprint(data)
    result = reset("--data-dir", str(data), "--agent", "tally")
    assert result.exit_code == 1, result.output
    assert f"remove {data / 'rw' / 'tally'} (4 partition store(s): 0, 1, 2, 3)" in result.output
    assert "no changelog (STREAMAPP_BROKER=none)" in result.output
    assert "rebuilt on the next start by replaying the event store sqlite:///" in result.output
    assert f"left alone: {data / 'rw' / 'latest'}" in result.output
    assert "dry run: nothing removed; run again with --yes" in result.output
    assert fingerprint(data) == before


def test_an_unknown_agent_names_the_closest(data: Path) -> None:
    before = fingerprint(data)
    result = reset("--data-dir", str(data), "--agent", "talley", "--yes")
    assert result.exit_code == 2, result.output
    assert "app 'rw' has no agent 'talley'; did you mean tally?" in result.output
    assert "its agents: tally, latest, echo" in result.output
    result = reset("--data-dir", str(data), "--agent", "echo", "--yes")
    assert result.exit_code == 2, result.output
    assert "agent 'echo' of app 'rw' has no tables" in result.output
    assert "agents with tables: tally, latest" in result.output
    assert fingerprint(data) == before


def test_yes_removes_exactly_that_agents_stores(data: Path) -> None:
    kept = {d: fingerprint(data / d) for d in ("rw/latest", "other")}
    result = reset("--data-dir", str(data), "--agent", "tally", "--yes")
    assert result.exit_code == 0, result.output
    assert f"removed {data / 'rw' / 'tally'}" in result.output
    assert "reset done" in result.output
    assert not (data / "rw" / "tally").exists()
    assert sorted(p.name for p in (data / "rw").iterdir()) == ["latest"]
    assert {d: fingerprint(data / d) for d in kept} == kept  # byte for byte


def test_without_agent_every_agents_stores_go_and_strays_stay(data: Path) -> None:
    stray = data / "rw" / "renamed"
    (stray / "0").mkdir(parents=True)
    other = fingerprint(data / "other")
    result = reset("--data-dir", str(data), "--yes")
    assert result.exit_code == 0, result.output
    assert f"left alone: {stray}" in result.output
    assert sorted(p.name for p in (data / "rw").iterdir()) == ["renamed"]
    assert fingerprint(data / "other") == other
    again = reset("--data-dir", str(data), "--yes")
    assert again.exit_code == 0, again.output
    assert f"no local store in {data / 'rw' / 'tally'}" in again.output


def test_the_data_dir_setting_is_the_default(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMAPP_DATA_DIR", str(data))
    result = reset("--agent", "latest", "--yes")
    assert result.exit_code == 0, result.output
    assert not (data / "rw" / "latest").exists()
    assert (data / "rw" / "tally").exists()


@pytest.fixture
def holder(data: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process with partition 2 of tally open, as a worker holds it."""
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from streamapp.tables.store import RocksStore\n"
        f"s = RocksStore(Path({str(data / 'rw' / 'tally' / '2')!r}), ['tally', 'meta'])\n"
        "print('open', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "open"
    try:
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # it closes the store and exits
        until_exit(proc, what="the store holder exited")
        proc.stdout.close()


def test_a_store_open_in_another_process_refuses_naming_it(
    data: Path, holder: subprocess.Popen[str]
) -> None:
    before = fingerprint(data)
    result = reset("--data-dir", str(data), "--yes")
    assert result.exit_code == 1, result.output
    assert "reset refused, nothing removed: a worker of app 'rw' runs" in result.output
    assert f"pid {holder.pid} (" in result.output
    assert f"holds table stores open: {data / 'rw' / 'tally'} partitions 2\n" in result.output
    assert "Stop the workers named" in result.output
    assert fingerprint(data) == before


def test_the_embedded_worker_lock_refuses_naming_its_holder(data: Path, tmp_path: Path) -> None:
    before = fingerprint(data)

    async def held() -> Result:
        store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
        try:
            async with store.worker_lock("rw"):  # what an embedded worker holds
                return await asyncio.to_thread(reset, "--data-dir", str(data), "--yes")
        finally:
            await store.close()

    result = asyncio.run(held())
    assert result.exit_code == 1, result.output
    assert "the event store's worker lock is held" in result.output
    assert "another worker of app 'rw'" in result.output
    assert fingerprint(data) == before
    free = reset("--data-dir", str(data), "--yes")  # released: the reset goes on
    assert free.exit_code == 0, free.output


def test_the_plan_names_changelogs_on_kafka_and_hides_passwords(data: Path) -> None:
    from streamapp.cli.reset import plan_reset
    from tests.apps.reset_world import app

    settings = Settings(
        "rw", broker="kafka", data_dir=data, event_store="postgresql://u:s3cret@db/events"
    )
    lines = "\n".join(plan_reset(app, settings, None).lines())
    assert "delete changelog topic rw-tally-changelog and make it again empty (4 partitions" in (
        lines
    )
    assert "delete changelog topic rw-latest-changelog" in lines
    assert "rebuilt on the next start by replaying the event store postgresql://u:***@db/" in (
        lines
    )
    assert "s3cret" not in lines
    rabbit = "\n".join(plan_reset(app, settings.with_(broker="rabbitmq"), "tally").lines())
    assert "no changelog on RabbitMQ" in rabbit
    assert "changelog topic" not in rabbit
