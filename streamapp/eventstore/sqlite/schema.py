"""The SQLite store's file: its schema, and what opening a file does (WAL mode, the
schema made or brought up to date from an older streamapp's, retried while another
process creates the same new file)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from ...errors import ConfigError
from ...settings.store_url import SETTING
from ..sql import STORED_TWICE_SQL, log_indexed

SCHEMA = """
CREATE TABLE IF NOT EXISTS streamapp_events (
    position INTEGER PRIMARY KEY,
    stream_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    payload BLOB NOT NULL,
    source TEXT,
    event_id TEXT,
    UNIQUE (stream_id, version)
);
CREATE TABLE IF NOT EXISTS streamapp_forwarder_checkpoints (
    name TEXT PRIMARY KEY,
    next_position INTEGER NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS streamapp_forwarder_marks (
    name TEXT NOT NULL,
    topic TEXT NOT NULL,
    kafka_partition INTEGER NOT NULL,
    kafka_offset INTEGER NOT NULL,
    position INTEGER NOT NULL,
    PRIMARY KEY (topic, kafka_partition, kafka_offset, name)
);
CREATE TABLE IF NOT EXISTS streamapp_parked (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    destination TEXT NOT NULL,
    key BLOB,
    value BLOB,
    headers TEXT NOT NULL,
    parked_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS streamapp_parked_destination ON streamapp_parked (destination, id);
CREATE TABLE IF NOT EXISTS streamapp_resent (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    app_id TEXT NOT NULL,
    run TEXT NOT NULL,
    parked_id INTEGER NOT NULL,
    sent_at REAL NOT NULL,
    outcome TEXT,
    UNIQUE (app_id, run, parked_id)
);
CREATE INDEX IF NOT EXISTS streamapp_resent_app ON streamapp_resent (app_id, id);
CREATE TABLE IF NOT EXISTS streamapp_ledger (
    app_id TEXT NOT NULL, key TEXT NOT NULL, value BLOB, PRIMARY KEY (app_id, key)
);
CREATE TABLE IF NOT EXISTS streamapp_store (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    id TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);
INSERT OR IGNORE INTO streamapp_store (one, id) VALUES (1, lower(hex(randomblob(16))));
"""
"""``streamapp_store`` holds the store's identity (one row, a random id made with the
schema, or at the first open by a streamapp that has it). ``source`` and ``event_id`` (the
CloudEvent's, indexed by :data:`EVENT_KEY_INDEX`) let appends skip events already stored;
a store made before them gets them at its first open (:func:`_add_event_keys`)."""
EVENT_KEY_INDEX = (
    "CREATE INDEX IF NOT EXISTS streamapp_events_source_id ON streamapp_events (source, event_id)"
)


def connect(path: Path, busy_timeout_s: float, url: str, create: bool) -> sqlite3.Connection:
    """A connection to the store file at ``path`` (made when ``create``), in WAL mode with
    the schema current; a file that is not a store, or cannot be opened, is refused naming
    the setting."""
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        _prepare(conn, busy_timeout_s, url)
    except (sqlite3.Error, OSError) as exc:
        raise ConfigError(
            f"setting {SETTING} = {url!r}: cannot open the SQLite store {path}: {exc}. "
            "Check the path is writable and the file is a streamapp event store."
        ) from exc
    return conn


def _add_event_keys(conn: sqlite3.Connection, url: str) -> None:
    """Give a store made before event keys its ``source`` and ``event_id`` columns, filled
    from the stored payloads (once, inside the schema's transaction), and say how many
    events were already stored twice."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(streamapp_events)")}
    if "event_id" in columns:
        return
    conn.execute("ALTER TABLE streamapp_events ADD COLUMN source TEXT")
    conn.execute("ALTER TABLE streamapp_events ADD COLUMN event_id TEXT")
    conn.execute(
        "UPDATE streamapp_events SET source = json_extract(CAST(payload AS TEXT), '$.source'), "
        "event_id = json_extract(CAST(payload AS TEXT), '$.id')"
    )
    conn.execute(EVENT_KEY_INDEX)
    (twice,) = conn.execute(STORED_TWICE_SQL).fetchone()
    log_indexed(url, int(twice))


def _add_resent_outcome(conn: sqlite3.Connection) -> None:
    """Give a store made before resend outcomes its ``streamapp_resent.outcome`` column
    (entries an older streamapp ran have none: they are listed as pending)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(streamapp_resent)")}
    if "outcome" not in columns:
        conn.execute("ALTER TABLE streamapp_resent ADD COLUMN outcome TEXT")


def _prepare(conn: sqlite3.Connection, busy_timeout_s: float, url: str) -> None:
    """WAL mode and the schema. Switching to WAL does not wait on the busy handler, so
    processes that create the same new file at once retry here until the busy timeout."""
    deadline = time.monotonic() + busy_timeout_s
    delay = 0.01
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript("BEGIN IMMEDIATE;" + SCHEMA)
            _add_event_keys(conn, url)
            _add_resent_outcome(conn)
            conn.execute(EVENT_KEY_INDEX)
            conn.execute("COMMIT")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
