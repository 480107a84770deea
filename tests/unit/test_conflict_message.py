"""A version conflict names the value to write: the event's ``streamversion``, not the
expected version (one less), on a SQLite store through ``streamapp store append`` and
through the store API."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from streamapp import Event
from streamapp.cli import main
from streamapp.codecs.structured import to_json
from streamapp.errors import ConcurrencyError
from streamapp.eventstore import open_store


def _line(stream: str, event_id: str, version: int | None = None) -> bytes:
    event = Event.create("order.placed", stream_id=stream, data={}, version=version, id=event_id)
    return orjson.dumps(orjson.loads(to_json(event)))


def test_store_append_conflict_names_the_streamversion_to_write(tmp_path: Path) -> None:
    env = {"STREAMAPP_EVENT_STORE": f"sqlite:///{tmp_path}/events.db"}
    first = b"\n".join([_line("o1", "e1"), _line("o1", "e2")]) + b"\n"
    runner = CliRunner()
    assert (
        runner.invoke(
            main, ["store", "append", "-A", "agents.orders:app", "-"], input=first, env=env
        ).exit_code
        == 0
    )
    again = _line("o1", "e3", version=2) + b"\n"  # the stream is at 2: e3 must carry 3
    result = runner.invoke(
        main, ["store", "append", "-A", "agents.orders:app", "-"], input=again, env=env
    )
    assert result.exit_code == 1
    assert "expected version 1, actual version 2" in result.stderr
    assert "give event e3 streamversion 3" in result.stderr
    assert "append with expected version 2" not in result.stderr


async def test_api_conflicts_name_the_values_to_write(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path}/events.db")
    try:
        await store.append("a", [Event.create("t", stream_id="a", data={}, id="a1")])
        carried = Event.create("t", stream_id="a", data={}, version=5, id="a5")
        with pytest.raises(ConcurrencyError) as info:
            await store.append("a", [carried])
        assert "give event a5 streamversion 2" in str(info.value)
        plain = Event.create("t", stream_id="a", data={}, id="a2")
        with pytest.raises(ConcurrencyError) as info:
            await store.append("a", [plain], expected_version=0)
        assert str(info.value).endswith("then append with expected version 1.")
        second = Event.create("t", stream_id="a", data={}, version=4, id="b3")
        with pytest.raises(ConcurrencyError) as info:
            await store.append("a", [plain, second], expected_version=1)
        assert "give event b3 streamversion 3" in str(info.value)
        assert await store.head() == 1
    finally:
        await store.close()
