"""Rivals of bench/orders_projection.py: the same order_status projection in another framework.

Runs ONE rival over an existing topic of order CloudEvents (Kafka binary content mode, as
written by ``produce`` in bench/orders_projection.py) and prints one JSON line:

    {"framework": ..., "events": N, "rate": ev/s, "exact": bool, ...}

    .venv/bin/python bench/rivals.py faust --topic T --events 100000 --orders 1000 --data-dir D
    .venv/bin/python bench/rivals.py quix  --topic T --events 100000 --orders 1000 --data-dir D

Per event, both do what ``agents.orders.project_order_status`` does: decode the CloudEvent
from the ``ce_*`` headers (id, type, streamid) and the JSON value, read the order's row
from a RocksDB-backed table with a changelog (the framework's default), and write
``{"status", "version": previous + 1, "last_event_id"}``. Each run uses a fresh consumer
group / app id and reads the topic from the earliest offset. The rate is counted like
bench/orders_projection.py: from the first processed event to the Nth, the first excluded.
At the end, the final state is read back from the framework's store and checked: every
order's version must equal its number of events (N // M, N a multiple of M). The JSON line
also gives the CPU time (user + system, all threads) over the timed span, ``span_cpu_s``;
the harness takes the whole process's from ``os.wait4`` (bench/child.py).

Both rivals run with their framework's default processing guarantee (at-least-once) unless
``--exactly-once`` is given; streamapp's projection always runs with a transactional
changelog.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, cast

import orjson

PARTITIONS = 8
EVENT_TYPES = frozenset({"order.placed", "order.paid", "order.shipped", "order.cancelled"})


def expected_versions(n_events: int, n_orders: int) -> dict[str, int]:
    """order id -> number of events the producer wrote for it (round-robin over orders)."""
    counts: dict[str, int] = {}
    for i in range(n_events):
        oid = f"order-{i % n_orders:05d}"
        counts[oid] = counts.get(oid, 0) + 1
    return counts


def check(
    state: dict[str, Any], n_events: int, n_orders: int, topic_events: int | None = None
) -> tuple[bool, str]:
    """Every order's version equals its event count. When the run read only the first
    ``n_events`` of the topic's ``topic_events`` (faust), the partitions were read in some
    interleaving, so: the versions add up to ``n_events`` (none lost, none applied twice)
    and none is above its order's count in the whole topic."""
    got = {k: (v or {}).get("version") for k, v in state.items()}
    if topic_events is not None and topic_events > n_events:
        whole = expected_versions(topic_events, n_orders)
        total = sum(v or 0 for v in got.values())
        over = [(k, v, whole.get(k)) for k, v in got.items() if (v or 0) > whole.get(k, 0)][:3]
        if total == n_events and not over:
            return True, f"{len(got)} orders' versions add up to the {n_events} events read"
        return False, f"versions add up to {total}, want {n_events}; above the topic's {over}"
    want = expected_versions(n_events, n_orders)
    if got == want:
        return True, f"all {len(want)} orders have version == their event count"
    missing = sorted(set(want) - set(got))[:3]
    wrong = [(k, got[k], want[k]) for k in sorted(want) if k in got and got[k] != want[k]][:3]
    return False, f"{len(got)}/{len(want)} orders in state; missing {missing}; wrong {wrong}"


def cpu_now() -> float:
    """This process's user + system CPU time so far (all its threads: librdkafka's too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Clock:
    """Counts processed events; the rate excludes the first event, as the streamapp bench,
    and the CPU time over the same span is taken (``span_cpu_s``)."""

    def __init__(self, n_events: int) -> None:
        self.n_events = n_events
        self.seen = 0
        self.first = 0.0
        self.last = 0.0
        self.cpu_first = 0.0
        self.cpu_last = 0.0

    def tick(self) -> bool:
        """Count one event; True when the Nth has been processed."""
        self.seen += 1
        if self.seen == 1:
            self.first = time.perf_counter()
            self.cpu_first = cpu_now()
        if self.seen >= self.n_events:
            if self.seen == self.n_events:
                self.last = time.perf_counter()
                self.cpu_last = cpu_now()
            return True
        return False

    @property
    def rate(self) -> float:
        if self.seen < 2 or self.last <= self.first:
            return 0.0
        return (self.n_events - 1) / (self.last - self.first)

    def span(self) -> dict[str, Any]:
        """The timed span's CPU time and events (the first excluded, as the rate)."""
        if self.seen < self.n_events:
            return {"span_cpu_s": None, "span_events": None}
        return {
            "span_cpu_s": round(self.cpu_last - self.cpu_first, 4),
            "span_events": self.n_events - 1,
        }


# --------------------------------------------------------------------------- faust


def run_faust(args: argparse.Namespace) -> dict[str, Any]:
    import logging

    import faust
    from faust.stores import rocksdb as faust_rocksdb

    drivers = (getattr(faust_rocksdb, "rocksdb", None), getattr(faust_rocksdb, "rocksdict", None))
    if any(d is not None for d in drivers):
        store, store_name = (
            "rocksdb://",
            ("rocksdb (rocksdict driver)" if faust_rocksdb.USE_ROCKSDICT else "rocksdb"),
        )
    else:  # no RocksDB driver importable here
        store, store_name = "memory://", "memory"

    app = faust.App(
        f"rivals-faust-{uuid.uuid4().hex[:8]}",
        broker=f"kafka://{args.bootstrap}",
        store=store,
        datadir=args.data_dir,
        web_enabled=False,
        topic_partitions=PARTITIONS,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        processing_guarantee="exactly_once" if args.exactly_once else "at_least_once",
        **({"producer_linger": args.faust_linger_ms / 1000} if args.faust_linger_ms else {}),
    )
    source = app.topic(
        args.topic, key_serializer="raw", value_serializer="raw", partitions=PARTITIONS
    )
    order_status = app.Table("order_status", default=None, partitions=PARTITIONS)
    clock = Clock(args.events)
    result: dict[str, Any] = {}
    worker: faust.Worker | None = None

    @app.agent(source)  # type: ignore[untyped-decorator]  # faust is not type-checked
    async def project(stream: Any) -> None:
        async for event in stream.events():
            headers = event.headers  # dict: name -> bytes
            ce_type = headers["ce_type"].decode()
            if ce_type not in EVENT_TYPES:
                raise ValueError(f"unknown order event type {ce_type!r}")
            ce_id = headers["ce_id"].decode()
            order_id = headers["ce_streamid"].decode()
            _data = orjson.loads(event.value)  # the event's data (unused by the projection)
            current = order_status.get(order_id)
            order_status[order_id] = {
                "status": ce_type.removeprefix("order."),
                "version": (current["version"] if current else 0) + 1,
                "last_event_id": ce_id,
            }
            if clock.tick() and clock.seen == args.events:
                # the table as the store holds it (rocksdb: read back from the DB files)
                result["state"] = {k: v for k, v in order_status.items()}
                assert worker is not None
                worker._schedule_shutdown(signal.SIGTERM)  # what a SIGTERM does

    logging.getLogger("faust").setLevel(logging.ERROR)
    # mode's worker draws a spinner on its stdout: keep our stdout for the JSON line only
    worker = faust.Worker(app, loglevel="error", quiet=True, stdout=sys.stderr)
    started = time.perf_counter()
    with contextlib.suppress(SystemExit):  # mode's worker exits the interpreter
        worker.execute_from_commandline()
    exact, note = check(result.get("state", {}), args.events, args.orders, args.topic_events)
    return {
        "framework": f"faust-streaming {faust.__version__}",
        "events": clock.seen,
        "rate": clock.rate,
        "exact": exact,
        "store": store_name,
        "guarantee": app.conf.processing_guarantee.value,
        "producer_linger_ms": app.conf.producer_linger * 1000,
        "wall_s": round(time.perf_counter() - started, 2),
        "note": f"final state read from the faust Table: {note}",
        **clock.span(),
    }


# --------------------------------------------------------------------------- quix


def read_quix_state(state_dir: str, group: str, topic: str) -> dict[str, Any]:
    """The final state from Quix's RocksDB partition stores (after the app has stopped)."""
    from quixstreams.state.rocksdb.partition import RocksDBStorePartition

    state: dict[str, Any] = {}
    base = os.path.join(state_dir, group)
    for root, _dirs, files in os.walk(base):
        if "CURRENT" not in files:
            continue
        part = RocksDBStorePartition(path=root, options=None)
        try:
            for key, value in part._db.items():
                # keys: <json message key> | <json user key>; values: json
                if not isinstance(key, bytes) or b"|" not in key or key.startswith(b"__"):
                    continue
                prefix, _, user_key = key.partition(b"|")
                if user_key != b'"order"':
                    continue
                state[json.loads(prefix)] = json.loads(value)
        finally:
            part.close()
    return state


def run_quix(args: argparse.Namespace) -> dict[str, Any]:
    import logging

    import quixstreams
    from quixstreams import Application

    group = f"rivals-quix-{uuid.uuid4().hex[:8]}"
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        state_dir=args.data_dir,
        loglevel="WARNING",
        processing_guarantee="exactly-once" if args.exactly_once else "at-least-once",
        **({} if args.commit_interval is None else {"commit_interval": args.commit_interval}),
    )
    logging.getLogger("quixstreams").setLevel(logging.WARNING)
    topic = app.topic(args.topic, key_deserializer="str", value_deserializer="bytes")
    sdf = app.dataframe(topic)
    clock = Clock(args.events)

    def project(value: bytes, key: str, timestamp: int, headers: Any, state: Any) -> None:
        attrs = {name: raw for name, raw in headers or () if name[:3] == "ce_"}
        ce_type = attrs["ce_type"].decode()
        if ce_type not in EVENT_TYPES:
            raise ValueError(f"unknown order event type {ce_type!r}")
        ce_id = attrs["ce_id"].decode()
        _order_id = attrs["ce_streamid"].decode()  # == key: Quix scopes state by the key
        _data = orjson.loads(value)  # the event's data (unused by the projection)
        current = state.get("order")
        state.set(
            "order",
            {
                "status": ce_type.removeprefix("order."),
                "version": (current["version"] if current else 0) + 1,
                "last_event_id": ce_id,
            },
        )
        if clock.tick() and clock.seen == args.events:
            app.stop()  # the checkpoint in progress is committed on the way out

    sdf.update(project, stateful=True, metadata=True)
    started = time.perf_counter()
    app.run()
    wall = time.perf_counter() - started
    state = read_quix_state(args.data_dir, group, args.topic)
    exact, note = check(state, args.events, args.orders)
    return {
        "framework": f"quixstreams {quixstreams.__version__}",
        "events": clock.seen,
        "rate": clock.rate,
        "exact": exact,
        "store": "rocksdb",
        "guarantee": "exactly-once" if args.exactly_once else "at-least-once",
        "commit_interval_s": app.config.commit_interval,
        "wall_s": round(wall, 2),
        "note": f"final state read back from Quix's RocksDB stores: {note}",
        **clock.span(),
    }


# --------------------------------------------------------------------------- bytewax


def run_bytewax(args: argparse.Namespace) -> dict[str, Any]:
    """One worker (``run_main``), ``stateful_map`` keyed by order id. The source reads each
    partition to its end (``tail=False``): the dataflow stops once the topic, which holds
    exactly N events, is consumed. With ``--recovery`` the state and offsets are
    snapshotted to a local SQLite recovery partition every second (Bytewax's epoch)."""
    from datetime import timedelta
    from importlib.metadata import version

    import bytewax.operators as op
    from bytewax.connectors.kafka import KafkaSource
    from bytewax.dataflow import Dataflow, Stream
    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.testing import run_main

    clock = Clock(args.events)
    final: dict[str, dict[str, Any]] = {}

    def order_id(msg: Any) -> str:  # a KafkaSourceMessage (bytewax is not type-checked)
        for name, raw in msg.headers:
            if name == "ce_streamid":
                return str(raw.decode())
        raise ValueError("order event without ce_streamid")

    def project(current: dict[str, Any] | None, msg: Any) -> tuple[dict[str, Any] | None, Any]:
        attrs = {name: raw for name, raw in msg.headers if name[:3] == "ce_"}
        ce_type = attrs["ce_type"].decode()
        if ce_type not in EVENT_TYPES:
            raise ValueError(f"unknown order event type {ce_type!r}")
        ce_id = attrs["ce_id"].decode()
        _data = orjson.loads(msg.value or b"null")  # the event's data (unused)
        state = {
            "status": ce_type.removeprefix("order."),
            "version": (current["version"] if current else 0) + 1,
            "last_event_id": ce_id,
        }
        clock.tick()
        return state, state

    def keep(_step: str, item: tuple[str, dict[str, Any]]) -> None:
        final[item[0]] = item[1]  # the state stateful_map emitted last, per order

    flow = Dataflow(f"rivals-bytewax-{uuid.uuid4().hex[:8]}")
    source = KafkaSource(
        [args.bootstrap],
        [args.topic],
        tail=False,
    )
    # raise_on_errors (the default): a consumer error stops the run, none flows on
    messages = cast("Stream[Any]", op.input("kafka", flow, source))
    keyed = op.key_on("by_order", messages, order_id)
    states = op.stateful_map("order_status", keyed, project)
    op.inspect("final", states, keep)
    recovery = None
    snapshot = timedelta(seconds=1)
    db_dir = os.path.join(args.data_dir, "recovery")
    if args.recovery:
        os.makedirs(db_dir, exist_ok=True)
        init_db_dir(Path(db_dir), 1)
        recovery = RecoveryConfig(Path(db_dir), backup_interval=timedelta(0))
    started = time.perf_counter()
    run_main(flow, epoch_interval=snapshot, recovery_config=recovery)
    wall = time.perf_counter() - started
    snapshots = None
    if args.recovery:  # proof the recovery was on: the rows its last epochs left (no unpickling)
        with contextlib.closing(sqlite3.connect(os.path.join(db_dir, "part-0.sqlite3"))) as db:
            snapshots = db.execute("SELECT count(*) FROM snaps").fetchone()[0]
    exact, note = check(final, args.events, args.orders)
    if clock.seen != args.events:
        exact, note = False, f"read {clock.seen} events, want {args.events} (topic size?)"
    return {
        "framework": f"bytewax {version('bytewax')}",
        "events": clock.seen,
        "rate": clock.rate,
        "exact": exact,
        "store": "sqlite recovery, snapshots every 1 s" if recovery else "memory (no recovery)",
        "guarantee": "recovery (epoch snapshots)" if recovery else "none (recovery off)",
        "wall_s": round(wall, 2),
        "recovery_snapshot_rows": snapshots,
        "note": f"final state as emitted by stateful_map: {note}",
        **clock.span(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("framework", choices=("faust", "quix", "bytewax"))
    parser.add_argument(
        "--bootstrap", default=os.environ.get("STREAMAPP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    parser.add_argument("--topic", required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--orders", type=int, required=True)
    parser.add_argument(
        "--topic-events",
        type=int,
        default=None,
        help="events in the topic, when --events reads only the first of them (faust)",
    )
    parser.add_argument("--data-dir", default=None, help="state directory (default: a temp dir)")
    parser.add_argument(
        "--exactly-once", action="store_true", help="run the rival with transactions"
    )
    parser.add_argument(
        "--recovery",
        action="store_true",
        help="bytewax only: snapshot state to a SQLite recovery dir every second",
    )
    parser.add_argument(
        "--commit-interval",
        type=float,
        default=None,
        help="quix only: commit_interval in s (Quix's default is 5; the harness's "
        "quix-equal-freshness passes streamapp's measured commit cycle)",
    )
    parser.add_argument(
        "--faust-linger-ms",
        type=float,
        default=0.0,
        help="faust only: producer linger (faust's default is 0; librdkafka's, in Quix, is 5)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix=f"rivals-{args.framework}-") as tmp:
        if args.data_dir is None:
            args.data_dir = tmp
        os.makedirs(args.data_dir, exist_ok=True)
        run = {"faust": run_faust, "quix": run_quix, "bytewax": run_bytewax}[args.framework]
        out = run(args)
    out["rate"] = round(out["rate"], 1)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
