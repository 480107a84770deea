"""``streamapp store append | head | read`` on a SQLite store: counts, versions, bad lines."""

from __future__ import annotations

import base64
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result

from streamapp import Event
from streamapp.cli import main
from streamapp.codecs.structured import to_json
from streamapp.eventstore.lines import LinesReport, append_lines
from streamapp.eventstore.sqlite import SqliteEventStore

APP = "agents.orders:app"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"STREAMAPP_EVENT_STORE": f"sqlite:///{tmp_path}/events.db"}


def line(stream: str | None = "o1", version: int | None = None, **attrs: object) -> bytes:
    event = Event.create("order.placed", stream_id=stream or "x", data={"n": 1}, version=version)
    body = orjson.loads(to_json(event))
    if stream is None:
        del body["streamid"]
    body.update(attrs)
    return orjson.dumps({k: v for k, v in body.items() if v is not None})


def run(env: dict[str, str], *args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(main, ["store", *args, "-A", APP], input=stdin, env=env)


def read(env: dict[str, str]) -> list[dict[str, object]]:
    result = run(env, "read", "--limit", "1000")
    assert result.exit_code == 0, result.output
    return [orjson.loads(x) for x in result.stdout.splitlines()]


def test_append_assigns_versions_and_prints_count_and_head(env: dict[str, str]) -> None:
    lines = [line("o1"), line("o2"), line("o1"), b"", line("o1", version=3)]
    result = run(env, "append", "-", stdin=b"\n".join(lines) + b"\n")
    assert result.exit_code == 0, result.output
    assert "appended 4 events; head position 4" in result.stdout
    rows = read(env)
    assert [(r["position"], r["event"]["streamid"], r["event"]["streamversion"]) for r in rows] == [  # type: ignore[index]
        (1, "o1", "1"),
        (2, "o2", "1"),
        (3, "o1", "2"),
        (4, "o1", "3"),
    ]
    head = run(env, "head")
    assert head.exit_code == 0
    assert head.stdout.strip() == "4"


def test_subject_is_the_stream_id_fallback(env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(line(None, subject="o9") + b"\n")
    result = run(env, "append", str(path))
    assert result.exit_code == 0, result.output
    (row,) = read(env)
    assert row["event"]["streamid"] == "o9"  # type: ignore[index]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (b"{not json", "is not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"id": "x", "type": "t"}', "lacks required attribute(s): source, specversion"),
        (line(specversion="0.3"), "unsupported specversion '0.3'"),
        (line(None), "has no stream id: set its streamid extension (or subject)"),
        (line("o1", version=5), "expected version 4, actual version 1"),
        (line(streamversion="x"), "streamversion 'x' is not a positive integer"),
    ],
)
def test_bad_line_names_its_number_keeps_earlier_lines_and_fails(
    env: dict[str, str], bad: bytes, message: str
) -> None:
    text = b"\n".join([line("o1"), line("o2"), bad, line("o3")]) + b"\n"
    result = run(env, "append", "-", stdin=text)
    assert result.exit_code == 1
    assert "appended 2 events; head position 2" in result.stdout
    assert "line 3: " in result.stderr
    assert message in result.stderr
    assert "Lines before line 3 are appended" in result.stderr
    assert "tail -n +3" in result.stderr
    assert [r["event"]["streamid"] for r in read(env)] == ["o1", "o2"]  # type: ignore[index]


def test_conflict_with_a_stream_already_in_the_store(env: dict[str, str]) -> None:
    assert run(env, "append", "-", stdin=line("o1") + b"\n").exit_code == 0
    result = run(env, "append", "-", stdin=line("o2") + b"\n" + line("o1", version=1) + b"\n")
    assert result.exit_code == 1
    assert "line 2: stream 'o1': expected version 0, actual version 1" in result.stderr
    assert "appended 1 events; head position 2" in result.stdout


def test_conflict_deep_in_a_chunk_keeps_the_lines_before_it(env: dict[str, str]) -> None:
    lines = [line(f"s{i}") for i in range(4500)] + [line("s7", version=7)] + [line("z")]
    result = run(env, "append", "-", stdin=b"\n".join(lines))
    assert result.exit_code == 1
    assert "line 4501: stream 's7'" in result.stderr
    assert "appended 4500 events; head position 4500" in result.stdout


def test_sixty_thousand_lines_all_go_in(env: dict[str, str]) -> None:
    text = b"\n".join(line(f"order-{i % 5000}") for i in range(60_000))
    result = run(env, "append", "-", stdin=text)
    assert result.exit_code == 0, result.output
    assert "appended 60000 events; head position 60000" in result.stdout


async def test_lines_go_in_one_transaction_per_chunk_not_per_line(tmp_path: Path) -> None:
    """What makes a large append fast, observed on SQLite: 20,000 lines, 10 commits."""
    store = await SqliteEventStore.open(f"sqlite:///{tmp_path}/events.db")
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    try:
        lines = (line(f"order-{i % 5000}") for i in range(20_000))
        report = await append_lines(store, lines, chunk=2000)
        assert report == LinesReport(20_000)
        assert await store.head() == 20_000
    finally:
        await store.close()
    assert statements.count("BEGIN IMMEDIATE") == statements.count("COMMIT") == 10


def test_help_says_earlier_lines_stay(env: dict[str, str]) -> None:
    result = CliRunner().invoke(main, ["store", "append", "--help"])
    assert "every line before it stays appended" in " ".join(result.output.split())


def test_bad_store_url_names_the_setting() -> None:
    result = run({"STREAMAPP_EVENT_STORE": "sqlite://nope"}, "head")
    assert result.exit_code != 0
    assert "STREAMAPP_EVENT_STORE" in result.output


def test_parked_prints_json_lines_in_park_order(env: dict[str, str]) -> None:
    """``store parked`` prints what a store-only worker parked: text when UTF-8, else
    base64, so the bytes can be recovered exactly; the app's Park destination by default."""
    import asyncio

    from agents.orders import PARKING
    from streamapp.eventstore import open_store

    async def park() -> None:
        es = await open_store(env["STREAMAPP_EVENT_STORE"])
        try:
            reason = [("streamapp-park-reason", b"RuntimeError: boom")]
            source = [("streamapp-source", b"orders/3/17")]
            await es.park(PARKING, b'{"id":"e1"}', key=b"o1", headers=reason + source)
            await es.park("elsewhere", b"x")
            await es.park(PARKING, b"\xff\x00", headers=[("x-bin", b"\xfe")])
        finally:
            await es.close()

    asyncio.run(park())
    result = run(env, "parked")
    assert result.exit_code == 0, result.output
    first, second = (orjson.loads(x) for x in result.stdout.splitlines())
    assert first["destination"] == PARKING
    assert (first["reason"], first["source"]) == ("RuntimeError: boom", "orders/3/17")
    assert (first["key"], first["value"]) == ("o1", '{"id":"e1"}')
    assert first["headers"][0] == {"name": "streamapp-park-reason", "value": "RuntimeError: boom"}
    assert first["id"] < second["id"]
    assert first["parked_at"].endswith("+00:00")
    assert second["key"] is None
    assert base64.b64decode(second["value_base64"]) == b"\xff\x00"
    assert second["headers"] == [
        {"name": "x-bin", "value_base64": base64.b64encode(b"\xfe").decode()}
    ]

    other = run(env, "parked", "--destination", "elsewhere")
    assert other.exit_code == 0, other.output
    assert [orjson.loads(x)["value"] for x in other.stdout.splitlines()] == ["x"]
    none = run(env, "parked", "--destination", "nothing-here")
    assert (none.exit_code, none.stdout) == (0, "")
