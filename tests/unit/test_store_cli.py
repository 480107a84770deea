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
from streamapp.eventstore.sqlite.store import SqliteEventStore

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


BAD_LINES = [
    (b"{not json", "is not valid JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"id": "x", "type": "t"}', "lacks required attribute(s): source, specversion"),
    (line(specversion="0.3"), "unsupported specversion '0.3'"),
    (line(None), "has no stream id: set its streamid extension (or subject)"),
    (line("o1", version=5), "expected version 4, actual version 1"),
    (line(streamversion="x"), "streamversion 'x' is not a positive integer"),
]


# named by the message: a line holds a fresh id and time, and pytest-xdist's processes
# must collect the same test names
@pytest.mark.parametrize(("bad", "message"), BAD_LINES, ids=[m for _, m in BAD_LINES])
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
    """``store parked`` prints what an embedded worker parked: text when UTF-8, else
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


def test_parked_replay_sends_rows_back_once_per_run_and_keeps_a_mark(
    env: dict[str, str],
) -> None:
    """``store parked replay`` appends the rows to the store's resend log (what the
    worker applies): a dry run lists them and sends nothing, a run sends each row once,
    the next run only what was parked since, and a row the app has no agent for stops
    the run (exit 1) naming it, after the rows before it went back."""
    import asyncio

    from agents.orders import PARKING
    from streamapp.eventstore import open_store

    env = {**env, "STREAMAPP_BROKER": "none"}

    async def park(*rows: tuple[str, bytes]) -> None:
        es = await open_store(env["STREAMAPP_EVENT_STORE"])
        try:
            for name, source in rows:
                headers = [("streamapp-agent", name.encode()), ("streamapp-source", source)]
                await es.park(PARKING, b"{}", key=b"o1", headers=headers)
        finally:
            await es.close()

    async def log() -> list[int]:
        es = await open_store(env["STREAMAPP_EVENT_STORE"])
        try:
            return [entry.parked.id for entry in await es.resent("orders", 0, 100)]
        finally:
            await es.close()

    asyncio.run(
        park(("project_order_status", b"orders/3/17"), ("project_order_status", b"orders/1/2"))
    )
    dry = run(env, "parked", "replay", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would send parked row 1 (orders/3/17) back to agent project_order_status" in dry.stdout
    assert "dry run: would send 2 parked rows back (project_order_status: 2)" in dry.stdout
    assert asyncio.run(log()) == []

    sent = run(env, "parked", "replay")
    assert sent.exit_code == 0, sent.output
    assert "sent 2 parked rows back to their agents (project_order_status: 2)" in sent.stdout
    assert asyncio.run(log()) == [1, 2]
    again = run(env, "parked", "replay")
    assert "sent 0 parked rows back" in again.stdout

    asyncio.run(park(("project_order_status", b"orders/0/5"), ("gone", b"orders/0/6")))
    asyncio.run(park(("project_order_status", b"orders/0/7")))
    stopped = run(env, "parked", "replay")
    assert stopped.exit_code == 1
    assert "sent 1 parked row back" in stopped.stdout
    assert "parked row 4 of orders.parked cannot go back: it names agent 'gone'" in stopped.output
    assert "--from 5 skips it" in stopped.output
    assert asyncio.run(log()) == [1, 2, 3]
    rest = run(env, "parked", "replay", "--from", "5")
    assert "sent 1 parked row back" in rest.stdout
    everything = run(env, "parked", "replay", "--from", "1", "--until", "3")
    assert "sent 2 parked rows back" in everything.stdout
    assert asyncio.run(log()) == [1, 2, 3, 5, 1, 2]
    before = CliRunner().invoke(main, ["store", "parked", "-A", APP, "replay"], env=env)
    assert "sent 0 parked rows back" in before.stdout, before.output  # -A before replay too
    misplaced = CliRunner().invoke(
        main, ["store", "parked", "--destination", PARKING, "replay", "-A", APP], env=env
    )
    assert misplaced.exit_code == 2
    assert "give --destination after `replay`" in misplaced.output


def test_parked_replay_on_a_broker_points_to_the_broker_command(env: dict[str, str]) -> None:
    result = run({**env, "STREAMAPP_BROKER": "kafka"}, "parked", "replay")
    assert result.exit_code == 2
    assert "streamapp parked replay -A agents.orders:app --topic DESTINATION" in result.output


def test_a_run_sent_again_adds_nothing(tmp_path: Path) -> None:
    """A run's rows appended twice (a commit whose reply was lost, retried) are sent once."""
    import asyncio

    async def main_() -> tuple[int, int, int, int, list[int], int]:
        es = await SqliteEventStore.open(f"sqlite:///{tmp_path}/e.db")
        try:
            for _ in range(3):
                await es.park("p", b"v", headers=[("streamapp-source", b"t/0/1")])
            first = await es.resend("a", "run-1", [1, 3])
            twice = await es.resend("a", "run-1", [1, 3], again=True)
            other = await es.resend("a", "run-2", [3, 2])  # another run at once: 2 only
            await es.resend("b", "run-3", [2])
            again = await es.resend("a", "run-4", [1], again=True)  # --from: sent again
            entries = [e.parked.id for e in await es.resent("a", 0, 10)]
            return first, twice, other, again, entries, await es.resent_through("a", "p")
        finally:
            await es.close()

    assert asyncio.run(main_()) == (2, 0, 1, 1, [1, 3, 2, 1], 3)


def test_parked_shows_what_each_row_sent_back_came_to(env: dict[str, str]) -> None:
    """``store parked`` lists each row's outcome: null never sent back, pending until
    the worker recorded one, then the first one recorded for its last sending back;
    ``store parked replay`` prints a line per row with it."""
    import asyncio

    from agents.orders import PARKING
    from streamapp.eventstore import open_store

    env = {**env, "STREAMAPP_BROKER": "none"}

    async def park(n: int) -> None:
        es = await open_store(env["STREAMAPP_EVENT_STORE"])
        try:
            for i in range(n):
                source = f"orders/0/{i}".encode()
                headers = [
                    ("streamapp-agent", b"project_order_status"),
                    ("streamapp-source", source),
                ]
                await es.park(PARKING, b"{}", key=b"o1", headers=headers)
        finally:
            await es.close()

    async def record(outcomes: dict[int, str]) -> None:  # what the worker does
        es = await open_store(env["STREAMAPP_EVENT_STORE"])
        try:
            await es.record_resent("orders", outcomes)
        finally:
            await es.close()

    def listed() -> list[object]:
        result = run(env, "parked")
        assert result.exit_code == 0, result.output
        return [orjson.loads(x)["outcome"] for x in result.stdout.splitlines()]

    asyncio.run(park(3))
    assert listed() == [None, None, None]
    sent = run(env, "parked", "replay", "--until", "3")
    assert sent.exit_code == 0, sent.output
    assert "parked row 1 (orders/0/0) to agent project_order_status: pending" in sent.stdout
    assert "parked row 2 (orders/0/1) to agent project_order_status: pending" in sent.stdout
    assert listed() == ["pending", "pending", None]
    asyncio.run(record({1: "filtered", 2: "applied"}))
    asyncio.run(record({1: "applied"}))  # run again (a rebuilt table): the first one stands
    assert listed() == ["filtered", "applied", None]
    dry = run(env, "parked", "replay", "--from", "1", "--dry-run")
    assert "would send parked row 1 (orders/0/0) back to agent project_order_status " in dry.stdout
    assert "(sent back before: filtered)" in dry.stdout
    run(env, "parked", "replay", "--from", "1", "--until", "2")  # row 1 again: entry 3
    assert listed() == ["pending", "applied", None]
    asyncio.run(record({3: "parked again"}))
    assert listed() == ["parked again", "applied", None]


def test_a_store_made_before_outcomes_gets_the_column_at_open(tmp_path: Path) -> None:
    """A resend log of an older streamapp (no ``outcome`` column) gets it when opened:
    its entries list as pending, new ones record their outcome."""
    import asyncio
    import sqlite3

    url = f"sqlite:///{tmp_path}/old.db"

    async def sent_back() -> None:
        es = await SqliteEventStore.open(url)
        try:
            await es.park("p", b"v", headers=[("streamapp-source", b"t/0/1")])
            await es.resend("app", "run-1", [1])
        finally:
            await es.close()

    asyncio.run(sent_back())
    conn = sqlite3.connect(tmp_path / "old.db")
    conn.execute("ALTER TABLE streamapp_resent DROP COLUMN outcome")  # as an older one made it
    conn.close()

    async def reopened() -> tuple[dict[int, str], dict[int, str]]:
        es = await SqliteEventStore.open(url)
        try:
            before = await es.resent_outcomes("app", "p")
            await es.record_resent("app", {1: "applied"})
            return before, await es.resent_outcomes("app", "p")
        finally:
            await es.close()

    assert asyncio.run(reopened()) == ({1: "pending"}, {1: "applied"})
