"""Standby replicas on Kafka (setting ``standby_replicas``, issue 31): fail over warm.

Three workers of the reference orders app; a table of many keys over 8 partitions;
live load; ``kill -9`` of one worker. Measured from the kill: when the group gave the
dead worker's partitions out again, when every partition's key answered again (not
503), and how many changelog records the new owners restored, with one standby per
partition and without. With standbys the new owners restore only the tail their
standby had not applied; without, each restores its partition's whole changelog. The
table is exact afterwards, and so is every local copy left (actives and standbys).

Also: ``?stale_ok=1`` answers from a standby of the key's partition, with its lag and
``Streamapp-Stale: true``; without it a standby never answers (the owner does).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from agents.orders import orders as orders_topic
from streamapp.tables.partition import spaces_for
from streamapp.tables.store import RocksStore
from streamapp.web.owner import FORWARDED
from tables.orders import order_status
from tests.support.waits import frozen, until

from .harness import (
    WorkerProc,
    around_traceback,
    assert_exact,
    create_topics,
    order_events,
    produce,
    wait_caught_up,
    wait_group_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AGENT = "project_order_status"
KEYS = int(os.environ.get("STREAMAPP_TEST_STANDBY_KEYS", "100000"))
"""Keys of the table in ``make test`` (2 shared cores); the acceptance run has 2M."""
RATE = 1000.0
"""Live load, events per second, while a worker is killed."""


def _partition_of(key: str) -> int:
    return orders_topic.partition_of(key.encode())


def _probes(keys: list[str]) -> dict[int, str]:
    """One key of each partition: a partition answers or does not, every key of it alike."""
    out: dict[int, str] = {}
    for key in keys:
        out.setdefault(_partition_of(key), key)
        if len(out) == orders_topic.partitions:
            break
    return out


async def _get(http: aiohttp.ClientSession, url: str, **headers: str) -> tuple[int, Any, Any]:
    try:
        async with http.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as r:
            return r.status, await r.json(content_type=None), r.headers
    except (TimeoutError, aiohttp.ClientError):
        return 0, None, {}


async def _status(http: aiohttp.ClientSession, w: WorkerProc) -> dict[str, Any] | None:
    status, body, _ = await _get(http, f"http://127.0.0.1:{w.port}/status")
    return body if status == 200 else None


async def _answering(
    http: aiohttp.ClientSession,
    w: WorkerProc,
    keys: list[str],
    seen: list[Any],
    reasons: list[tuple[float, int, str]],
) -> float:
    """When a round of reads of ``keys`` from ``w`` first all answered (each routed to
    its partition's owner), on this process's monotonic clock; ``seen[0]`` the last
    round's statuses, ``reasons`` every answer but 200 on the way."""
    seen[:1] = [[]]
    while True:
        answers = [
            await _get(http, f"http://127.0.0.1:{w.port}/tables/order_status/{k}") for k in keys
        ]
        seen[0] = [status for status, _, _ in answers]
        at = time.monotonic()
        for key, (status, body, _) in zip(keys, answers, strict=True):
            if status != 200:  # why, for the report: (when, partition, reason)
                why = body.get("error") if isinstance(body, dict) else None
                reasons.append((at, _partition_of(key), f"{status} {why or '(no answer)'}"))
        if all(status == 200 for status, _, _ in answers):
            return at
        await asyncio.sleep(0.02)


def _owned(status: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {} if status is None else status["partitions"]


def _standbys(status: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Each standby partition's agent status (lag, position, serving) of a /status."""
    if status is None:
        return {}
    return {name: s["agents"][AGENT] for name, s in status.get("standbys", {}).items()}


async def _wait_standbys(workers: list[WorkerProc], expected: int) -> None:
    """Until the workers keep ``expected`` standbys together, each caught up (lag 0) and
    checked (serving); fails once their statuses stood still for 60 s."""
    seen: list[dict[str, Any] | None] = []
    async with aiohttp.ClientSession() as http:

        async def check() -> bool:
            seen[:] = [await _status(http, w) for w in workers]
            standbys = [s for st in seen for s in _standbys(st).values()]
            return len(standbys) == expected and all(
                s["lag"] == 0 and s["serving"] for s in standbys
            )

        await until(
            check,
            what=f"{expected} standbys caught up",
            progress=lambda: frozen([_standbys(s) for s in seen]),
            stalled_s=60,
            poll_s=0.3,
            detail=lambda: [_standbys(s) for s in seen],
        )


async def _settled(
    http: aiohttp.ClientSession, workers: list[WorkerProc], standbys: int
) -> list[dict[str, Any] | None]:
    """The workers' statuses once two looks 3 s apart agree on who owns and keeps what
    (a warm-up's probing rebalance may be under way), all partitions owned."""
    last: Any = None
    for _ in range(40):  # bounded: a warm-up ends within seconds on this table
        await wait_group_ready(workers, 8)
        if standbys:
            await _wait_standbys(workers, standbys)
        statuses = [await _status(http, w) for w in workers]
        now = [(sorted(_owned(s)), sorted(_standbys(s))) for s in statuses]
        if now == last:
            return statuses
        last = now
        await asyncio.sleep(3.0)
    raise AssertionError(f"ownership kept moving: {last}")


async def _scan(http: aiohttp.ClientSession, w: WorkerProc) -> dict[str, Any]:
    """The whole table as one worker's scan answers it (merged across the workers)."""
    out: dict[str, Any] = {}
    cursor = ""
    for _ in range(10_000):  # bounded: pages of 1,000
        url = f"http://127.0.0.1:{w.port}/tables/order_status?limit=1000&cursor={cursor}"

        async def page_of(url: str = url) -> Any:
            status, page, _ = await _get(http, url)
            assert status in (200, 503), (status, page)  # 503: a rebalance (a warm-up's)
            return page if status == 200 else None

        page = await until(page_of, what=f"a page of the scan of {w.port}", stalled_s=60)
        out.update((item["key"], item["value"]) for item in page["items"])
        cursor = page["cursor"] or ""
        if not cursor:
            return out
    raise AssertionError("the scan did not end")


def _local_copies(
    worker: WorkerProc, app_id: str, partitions: set[int]
) -> dict[int, dict[str, Any]]:
    """Each local store of ``partitions`` in a stopped worker's data directory."""
    out: dict[int, dict[str, Any]] = {}
    for p in sorted(partitions):
        store = RocksStore(worker.data_dir / app_id / AGENT / str(p), spaces_for([order_status]))
        try:
            values: dict[str, Any] = {}
            after = None
            while True:
                page = store.scan(order_status.data_space, after, 10_000)
                if not page:
                    break
                values.update((k.decode(), orjson.loads(v)) for k, v in page)
                after = page[-1][0]
            out[p] = values
        finally:
            store.close()
    return out


def _number(name: str) -> int:
    return int(name.rsplit("[", 1)[1].rstrip("]"))


async def _fail_over(
    kafka_bootstrap: str, tmp_path: Path, *, replicas: int, keys: int
) -> dict[str, float]:
    """The scenario of the module with ``replicas`` standbys per partition; its figures."""
    ns = f"sb{replicas}{uuid.uuid4().hex[:6]}-"
    app_id = f"{ns}orders"
    create_topics(kafka_bootstrap, ns)
    load = int(RATE * 40)
    events, expected = order_events(n_orders=keys, n_events=keys + load, seed=11)
    env = {"STREAMAPP_STANDBY_REPLICAS": str(replicas), "STREAMAPP_POLL_TIMEOUT_MS": "200"}
    workers = [
        WorkerProc(kafka_bootstrap, ns, tmp_path / n, tmp_path / f"{n}.log", extra_env=dict(env))
        for n in ("w1", "w2", "w3")
    ]
    producing: asyncio.Task[None] | None = None
    try:
        for w in workers:
            w.start()
        await wait_group_ready(workers, 8, stalled_s=120)
        await produce(kafka_bootstrap, f"{ns}orders", events[:keys])  # the table
        await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 120, workers)
        if replicas:
            await _wait_standbys(workers, 8 * replicas)
        victim, survivors = workers[0], workers[1:]
        async with aiohttp.ClientSession() as http:
            lost = {_number(n) for n in _owned(await _status(http, victim))}
            assert lost, "the victim owns no partition"
            producing = asyncio.create_task(
                produce(kafka_bootstrap, f"{ns}orders", events[keys:], rate=RATE)
            )
            await asyncio.sleep(3.0)  # under load
            assert not producing.done()
            victim.kill()
            killed = time.monotonic()
            probes = _probes(sorted(expected))
            figures: dict[str, float] = {}
            seen: list[Any] = []
            # Probed in a loop of its own, so that the answers are timed to a round of
            # 8 reads, not to a round that also waits for two /status bodies.
            reasons: list[tuple[float, int, str]] = []
            probing = asyncio.create_task(
                _answering(http, survivors[0], list(probes.values()), seen, reasons)
            )

            async def check() -> bool:
                owned: set[int] = set()
                handed_out: list[float] = []
                for w in survivors:
                    s = await _status(http, w)
                    received = time.monotonic()
                    owned |= {_number(n) for n in _owned(s)}
                    ago = None if s is None else s["last_rebalance_s_ago"]
                    if ago is not None:  # None: rebalancing
                        handed_out.append(received - ago)
                settled = len(handed_out) == len(survivors)
                if "assigned_s" not in figures and settled and owned == set(range(8)):
                    # the later hand-out of the two, each as its worker timed it
                    figures["assigned_s"] = max(handed_out) - killed
                seen[1:] = [sorted(owned)]
                return "assigned_s" in figures and probing.done()

            try:
                await until(
                    check,
                    what="every partition answering again after the kill",
                    progress=lambda: frozen(seen),
                    stalled_s=60,
                    poll_s=0.05,
                    detail=lambda: seen,
                )
            finally:
                probing.cancel()
            figures["answering_s"] = probing.result() - killed
            _why_unanswered(reasons, killed + figures["assigned_s"])
            statuses = [await _status(http, w) for w in survivors]
            figures["restored"] = sum(
                part["restored"]
                for s in statuses
                for name, part in _owned(s).items()
                if _number(name) in lost
            )
            figures["lost_partitions"] = len(lost)
            await producing
            producing = None
            await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 120, survivors)
            if replicas:
                await _wait_standbys(survivors, 8)
            assert_exact(await _scan(http, survivors[0]), expected)
            final = await _settled(http, survivors, 8 * replicas)
        partitions_of = [{_number(n) for n in (*_owned(s), *_standbys(s))} for s in final]
        for w in survivors:
            assert w.stop() == 0
        copies = 0
        for w, partitions in zip(survivors, partitions_of, strict=True):
            for p, values in _local_copies(w, app_id, partitions).items():
                want = {k: v for k, v in expected.items() if _partition_of(k) == p}
                assert_exact(values, want)
                copies += 1
        figures["exact_copies"] = copies
        return figures
    finally:
        if producing is not None:
            producing.cancel()
        for w in workers:
            if w.alive:
                w.kill()


def _why_unanswered(reasons: list[tuple[float, int, str]], assigned: float) -> None:
    """Print why keys went unanswered after the assignment: each reason with its
    partitions and the span of its answers, in seconds after the assignment."""
    spans: dict[str, tuple[set[int], float, float]] = {}
    for at, partition, why in reasons:
        if at >= assigned:
            parts, first, last = spans.get(why, (set(), at, at))
            spans[why] = (parts | {partition}, min(first, at), max(last, at))
    for why, (parts, first, last) in sorted(spans.items(), key=lambda kv: kv[1][1]):
        print(
            f"  after the assignment, {first - assigned:+.2f}s to {last - assigned:+.2f}s, "
            f"partitions {sorted(parts)}: {why}"
        )


def _report(replicas: int, keys: int, figures: dict[str, float]) -> None:
    load = os.getloadavg()
    print(
        f"standby_replicas={replicas}, {keys} keys, {RATE:.0f} events/s: new assignment "
        f"{figures['assigned_s']:.1f}s after the kill, every partition answering after "
        f"{figures['answering_s']:.1f}s ({figures['answering_s'] - figures['assigned_s']:.2f}s "
        f"after the assignment), {figures['restored']:.0f} changelog records restored by the "
        f"new owners of {figures['lost_partitions']:.0f} partitions; "
        f"{figures['exact_copies']:.0f} local copies exact; load average {load[0]:.2f}"
    )


@pytest.mark.acceptance  # make acceptance: three workers under load, alone on the machine
@pytest.mark.timeout(900)
@pytest.mark.parametrize("replicas", [1, 0])
async def test_kill_one_of_three_workers_with_and_without_standbys(
    replicas: int, kafka_bootstrap: str, tmp_path: Path
) -> None:
    figures = await _fail_over(kafka_bootstrap, tmp_path, replicas=replicas, keys=KEYS)
    _report(replicas, KEYS, figures)
    per_partition = KEYS / 8
    if replicas:  # promoted standbys: the tail only (a few seconds of load at most)
        assert figures["restored"] < per_partition * figures["lost_partitions"] / 10, figures
    else:  # each new owner restores its partitions in full
        assert figures["restored"] >= per_partition * figures["lost_partitions"] * 0.9, figures
    assert figures["exact_copies"] >= 8 * (1 + replicas), figures


@pytest.mark.acceptance  # make acceptance: 2M keys, too heavy for make test on two cores
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("replicas", [1, 0])
async def test_kill_one_of_three_workers_two_million_keys(
    replicas: int, kafka_bootstrap: str, tmp_path: Path
) -> None:
    keys = 2_000_000
    figures = await _fail_over(kafka_bootstrap, tmp_path, replicas=replicas, keys=keys)
    _report(replicas, keys, figures)
    if replicas:
        assert figures["restored"] < keys / 8 * figures["lost_partitions"] / 10, figures


async def test_stale_ok_answers_from_a_standby_and_nothing_else_does(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"sbv{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=500, n_events=2_000, seed=4)
    env = {"STREAMAPP_STANDBY_REPLICAS": "1"}
    workers = [
        WorkerProc(kafka_bootstrap, ns, tmp_path / n, tmp_path / f"{n}.log", extra_env=dict(env))
        for n in ("a", "b")
    ]
    try:
        for w in workers:
            w.start()
        await wait_group_ready(workers, 8, stalled_s=120)
        await produce(kafka_bootstrap, f"{ns}orders", events)
        await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 120, workers)
        await _wait_standbys(workers, 8)
        a = workers[0]
        async with aiohttp.ClientSession() as http:
            standby_here = {_number(n) for n in _standbys(await _status(http, a))}
            owned_here = {_number(n) for n in _owned(await _status(http, a))}
            assert standby_here, owned_here
            assert not standby_here & owned_here, (standby_here, owned_here)
            keys = [k for k in sorted(expected) if _partition_of(k) in standby_here][:50]
            base = f"http://127.0.0.1:{a.port}/tables/order_status/"
            for key in keys:
                status, body, headers = await _get(http, base + key + "?stale_ok=1&meta=1")
                assert status == 200, (status, body)
                assert headers["Streamapp-Stale"] == "true"
                assert "X-Streamapp-Forwarded-To" not in headers  # answered here
                assert body["phase"] == "standby"
                assert body["standby"]["lag"] == 0 == int(headers["Streamapp-Standby-Lag"])
                assert (body["value"]["version"], body["value"]["status"]) == expected[key]
                # without stale_ok: the owner answers (forwarded), never the standby
                status, body, headers = await _get(http, base + key)
                assert status == 200, (status, body)
                assert "Streamapp-Stale" not in headers
                assert headers["X-Streamapp-Forwarded-To"], headers
                # and a request that may not be forwarded is not this worker's to answer
                status, body, headers = await _get(http, base + key, **{FORWARDED: "test"})
                assert status == 421, (status, body)
                assert "Streamapp-Stale" not in headers
        for w in workers:
            assert w.stop() == 0
        for w in workers:
            assert "Traceback" not in w.log_text(), around_traceback(w.log_text())
        print(f"{len(keys)} keys answered from worker {a.port}'s standbys with stale_ok=1")
    finally:
        for w in workers:
            if w.alive:
                w.kill()


@pytest.mark.acceptance  # make acceptance: three workers under load, alone on the machine
@pytest.mark.timeout(900)
async def test_scale_out_moves_only_what_it_must_after_warm_ups(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """2 -> 3 workers with ``standby_replicas=1`` under live load: the two partitions
    balance needs move, each once its warm-up standby caught up (its new owner restores
    the tail only); the longest run of 503s of any partition is measured."""
    keys = KEYS // 2
    ns = f"sbs{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=keys, n_events=keys + int(RATE * 60), seed=12)
    env = {"STREAMAPP_STANDBY_REPLICAS": "1", "STREAMAPP_POLL_TIMEOUT_MS": "200"}
    workers = [
        WorkerProc(kafka_bootstrap, ns, tmp_path / n, tmp_path / f"{n}.log", extra_env=dict(env))
        for n in ("w1", "w2", "w3")
    ]
    producing: asyncio.Task[None] | None = None
    try:
        for w in workers[:2]:
            w.start()
        await wait_group_ready(workers[:2], 8, stalled_s=120)
        await produce(kafka_bootstrap, f"{ns}orders", events[:keys])
        await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 120, workers[:2])
        async with aiohttp.ClientSession() as http:
            before = await _settled(http, workers[:2], 8)
            owner_before = {_number(n): i for i, s in enumerate(before) for n in _owned(s)}
            producing = asyncio.create_task(
                produce(kafka_bootstrap, f"{ns}orders", events[keys:], rate=RATE)
            )
            probes = _probes(sorted(expected))
            worst: dict[int, float] = dict.fromkeys(probes, 0.0)
            since: dict[int, float | None] = dict.fromkeys(probes, None)
            asking = True

            async def ask() -> None:
                url = f"http://127.0.0.1:{workers[0].port}/tables/order_status/"
                while asking:
                    for p, key in probes.items():
                        status = (await _get(http, url + key))[0]
                        now = time.monotonic()
                        if status == 200:
                            since[p] = None
                        elif since[p] is None:
                            since[p] = now
                        start = since[p]
                        if start is not None:
                            worst[p] = max(worst[p], now - start)
                    await asyncio.sleep(0.02)

            asker = asyncio.create_task(ask())
            await asyncio.sleep(2.0)
            workers[2].start()
            after = await _settled(http, workers, 8)
            asking = False
            await asker
            owner_after = {_number(n): i for i, s in enumerate(after) for n in _owned(s)}
            moved = {p for p in range(8) if owner_after[p] != owner_before[p]}
            restored = sum(part["restored"] for name, part in _owned(after[2]).items())
            await producing
            producing = None
            await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 120, workers)
            assert_exact(await _scan(http, workers[0]), expected)
        assert len(moved) == 2, (owner_before, owner_after)  # 4 + 4 -> 3 + 3 + 2
        assert all(owner_after[p] == 2 for p in moved), owner_after
        assert "warm-up standbys of" in workers[2].log_text()
        assert restored < keys / 8 * len(moved) / 10, restored  # the tails only
        for w in workers:
            assert w.stop() == 0
        print(
            f"scale-out 2 -> 3, {keys} keys, {RATE:.0f} events/s: moved {sorted(moved)}, "
            f"restored {restored} records there; longest 503 run per partition "
            f"{ {p: round(s, 2) for p, s in sorted(worst.items())} }; load average "
            f"{os.getloadavg()[0]:.2f}"
        )
    finally:
        if producing is not None:
            producing.cancel()
        for w in workers:
            if w.alive:
                w.kill()


@pytest.mark.serial  # it freezes a worker process (SIGSTOP) of its own: run alone
@pytest.mark.timeout(600)
async def test_a_frozen_owner_woken_after_its_partitions_moved_neither_answers_nor_applies(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """``standby_replicas=1``: a worker frozen past the session timeout loses its
    partitions to the others' standbys; events come meanwhile. Woken, it answers none
    of its former keys from its own state before the group gives it partitions again,
    fences none of the new owners, and the table is exact."""
    ns = f"sbf{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=2_000, n_events=6_000, seed=21)
    env = {
        "STREAMAPP_STANDBY_REPLICAS": "1",
        "STREAMAPP_SESSION_TIMEOUT_MS": "6000",
        "STREAMAPP_HEARTBEAT_INTERVAL_MS": "1000",
    }
    workers = [
        WorkerProc(kafka_bootstrap, ns, tmp_path / n, tmp_path / f"{n}.log", extra_env=dict(env))
        for n in ("w1", "w2", "w3")
    ]
    frozen_w, live = workers[0], workers[1:]
    try:
        for w in workers:
            w.start()
        await wait_group_ready(workers, 8, stalled_s=120)
        await produce(kafka_bootstrap, f"{ns}orders", events[:3_000])
        await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 120, workers)
        async with aiohttp.ClientSession() as http:
            await _wait_standbys(workers, 8)
            lost = {_number(n) for n in _owned(await _status(http, frozen_w))}
            assert lost
            assert frozen_w.proc is not None
            frozen_w.proc.send_signal(signal.SIGSTOP)
            await wait_group_ready(live, 8, stalled_s=120)
            await produce(kafka_bootstrap, f"{ns}orders", events[3_000:])
            await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 120, live)
            frozen_w.proc.send_signal(signal.SIGCONT)
            # at once after waking: its former keys never answer from its own state
            keys = [k for k in sorted(expected) if _partition_of(k) in lost][:200]
            url = f"http://127.0.0.1:{frozen_w.port}/tables/order_status/"
            own_answers = 0
            for key in keys:
                status, body, headers = await _get(http, url + key)
                if status == 200 and "X-Streamapp-Forwarded-To" not in headers:
                    own_answers += 1
                    assert (body["version"], body["status"]) == expected[key], (key, body)
            await wait_group_ready(workers, 8, stalled_s=120)
            await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 120, workers)
            assert_exact(await _scan(http, live[0]), expected)
        for w in live:
            assert "another worker took the partition over" not in w.log_text(), w.log_text()[
                -3000:
            ]
        for w in workers:
            assert w.stop() == 0
        print(
            f"frozen owner of {sorted(lost)}: {own_answers} of {len(keys)} of its former keys "
            "answered by it after waking, each exact (a partition given back); no new owner "
            "fenced; table exact"
        )
    finally:
        for w in workers:
            if w.alive and w.proc is not None:
                w.proc.send_signal(signal.SIGCONT)
                w.kill()
