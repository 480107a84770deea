"""Held streams on real Kafka (``Park(destination, hold="stream")``), with real worker
processes: 1,000 streams, five poison events in the middle of five of them.

While the handler fails, the other 995 streams are exact and the five answer their last
applied value with ``Streamapp-Stream-Held``; a ``kill -9`` during the hold and a worker
on a fresh data directory (restored from the changelog) keeps them held, and their new
live events park behind; it is killed (``kill -9``) during the hold too. Then the handler
is fixed and one ``streamapp parked replay`` releases them while more live events of them
arrive: one on the topic ahead of the events sent back (the next worker parks it behind
the hold after the replay read the parking topic, so no replay sends it: the lane's own
copy does), one while the replay sends. That worker is killed (SIGKILL, by the handler
itself) at the first held event it applies; with no second replay, every stream then
equals the fixed handler's fold from scratch (``tests/integration/held_world.py``), and
``streamapp verify``'s rebuild of every stream from an event store holding the events
produced (the app's topic is fed directly here: the store is the test's, from scratch).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import pytest

from tests.support.waits import run_watched

from .harness import (
    ROOT,
    WorkerProc,
    app_env,
    append_to_store,
    create_topics,
    produce,
    streamapp_cmd,
    topic_size,
    wait_caught_up,
    wait_ready,
)
from .held_world import (
    POISONED,
    STREAMS,
    events,
    expected,
    held_meta,
    later,
    verify,
    wait_held,
    wait_killed,
    wait_table,
)

# make acceptance runs it (scripts/acceptance): several workers, 1,000 streams and kill -9s,
# too heavy beside make test's other files on two cores; make test keeps the lighter
# test_held_park_crash and test_held_release_* on this transport, and the embedded scenario.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.acceptance]

APP = "tests.apps.held_app:app"


def replay(bootstrap: str, ns: str, parking: str) -> int:
    """``streamapp parked replay``: how many records it sent back."""
    out = run_watched(
        streamapp_cmd("parked", "replay", "-A", APP, "--topic", parking),
        env=app_env(bootstrap, ns),
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    found = re.search(r"sent (\d+) records back", out.stdout)
    assert found is not None, out.stdout
    return int(found.group(1))


async def test_held_streams_are_exact_through_kill_9_and_released_in_order(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"hsk{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns, APP)
    source, parking, group = f"{ns}hs-moves", f"{ns}hs-moves.parked", f"{ns}hs"
    gate = tmp_path / "gate"
    gate.touch()
    env = {"STREAMAPP_TEST_HELD_GATE": str(gate)}

    def worker(data: str, **extra: str) -> WorkerProc:
        log = tmp_path / f"{data}.log"
        return WorkerProc(
            kafka_bootstrap, ns, tmp_path / data, log, app_ref=APP, extra_env=env | extra
        ).start()

    sent = events()
    await produce(kafka_bootstrap, source, sent)
    first = worker("one")
    try:
        await wait_ready(first)
        await wait_table(first, expected(sent, held=True), set(POISONED))
        await wait_held(first, 5, 10)  # each: its poison 2 and the 3 behind it
    finally:
        first.kill()  # kill -9 during the hold

    # A worker on an empty data directory: the holds come back from the changelog.
    second = worker("two")
    try:
        await wait_ready(second)
        await wait_held(second, 5, 10)
        live = later(4)
        await produce(kafka_bootstrap, source, live)  # live events of the held streams
        sent += live
        await wait_held(second, 5, 15)  # parked behind, not applied
        await wait_caught_up(kafka_bootstrap, group, source, 60, [second])
        await wait_table(second, expected(sent, held=True), set(POISONED))
        assert (await held_meta(second, POISONED[0]))["events"] == 3
        assert await topic_size(kafka_bootstrap, parking) == 15
    finally:
        second.kill()  # kill -9 during the hold, again

    gate.unlink()  # the handler is fixed
    # The release: live events of the held streams come while it is under way: one
    # before the held ones come back (on the topic ahead of them, parked after the
    # replay read the parking topic: no replay sends it), one while the replay sends.
    early = later(5)
    await produce(kafka_bootstrap, source, early)
    sent += early
    more = later(6)
    sending = asyncio.create_task(produce(kafka_bootstrap, source, more))
    assert await asyncio.to_thread(replay, kafka_bootstrap, ns, parking) == 15
    await sending
    sent += more
    releasing = worker("two", STREAMAPP_TEST_HELD_KILL=str(tmp_path / "killed"))
    try:
        await wait_killed(releasing)  # kill -9 at its first held event applied
    finally:
        releasing.kill()

    third = worker("two")
    try:
        await wait_ready(third)
        # One replay is enough: the live events of the held streams that came during
        # the release are applied right after the held ones, by that release.
        await wait_caught_up(kafka_bootstrap, group, source, 60, [third])
        await wait_held(third, 0, 0)
        await wait_table(third, expected(sent, held=False), set())
        assert len(expected(sent, held=False)) == STREAMS
        scratch = f"sqlite:///{tmp_path / 'truth.db'}"  # the events produced, as a store
        await append_to_store(scratch, sent)
        assert verify(third, env, scratch)["checked"] == STREAMS
        log = third.log_text()
        assert "is released: its held events are applied, in order" in log
        assert "moved on while it was held" not in log
    finally:
        assert third.stop() == 0
