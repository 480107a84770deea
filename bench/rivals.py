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
order's version must equal its number of events (N // M, N a multiple of M).

Both rivals run with their framework's default processing guarantee (at-least-once) unless
``--exactly-once`` is given; streamapp's projection always runs with a transactional
changelog.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from typing import Any

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


def check(state: dict[str, Any], n_events: int, n_orders: int) -> tuple[bool, str]:
    want = expected_versions(n_events, n_orders)
    got = {k: (v or {}).get("version") for k, v in state.items()}
    if got == want:
        return True, f"all {len(want)} orders have version == their event count"
    missing = sorted(set(want) - set(got))[:3]
    wrong = [(k, got[k], want[k]) for k in sorted(want) if k in got and got[k] != want[k]][:3]
    return False, f"{len(got)}/{len(want)} orders in state; missing {missing}; wrong {wrong}"


class Clock:
    """Counts processed events; the rate excludes the first event, as the streamapp bench."""

    def __init__(self, n_events: int) -> None:
        self.n_events = n_events
        self.seen = 0
        self.first = 0.0
        self.last = 0.0

    def tick(self) -> bool:
        """Count one event; True when the Nth has been processed."""
        self.seen += 1
        if self.seen == 1:
            self.first = time.perf_counter()
        if self.seen >= self.n_events:
            if self.seen == self.n_events:
                self.last = time.perf_counter()
            return True
        return False

    @property
    def rate(self) -> float:
        if self.seen < 2 or self.last <= self.first:
            return 0.0
        return (self.n_events - 1) / (self.last - self.first)


# --------------------------------------------------------------------------- faust


def run_faust(args: argparse.Namespace) -> dict[str, Any]:
    import logging

    import faust
    from faust.stores import rocksdb as faust_rocksdb

    if faust_rocksdb.rocksdb is not None or faust_rocksdb.rocksdict is not None:
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

    @app.agent(source)
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
    exact, note = check(result.get("state", {}), args.events, args.orders)
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
        "wall_s": round(wall, 2),
        "note": f"final state read back from Quix's RocksDB stores: {note}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("framework", choices=("faust", "quix"))
    parser.add_argument(
        "--bootstrap", default=os.environ.get("STREAMAPP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    parser.add_argument("--topic", required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--orders", type=int, required=True)
    parser.add_argument("--data-dir", default=None, help="state directory (default: a temp dir)")
    parser.add_argument(
        "--exactly-once", action="store_true", help="run the rival with transactions"
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
        run = run_faust if args.framework == "faust" else run_quix
        out = run(args)
    out["rate"] = round(out["rate"], 1)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
