"""The tests' progress-based waits (tests/support/waits.py): a wait returns once its check
holds, fails when its progress stands still for ``stalled_s``, and waits on, past any
wall-clock bound ``stalled_s`` alone would set, while its progress moves."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.waits import Stalled, finished, run_watched, until, until_exit, until_sync


async def test_returns_the_checks_value_once_it_holds() -> None:
    polls = itertools.count()

    async def check() -> dict[str, int] | None:
        n = next(polls)
        return {"at": n} if n >= 3 else None

    assert await until(check, what="three polls", poll_s=0.01) == {"at": 3}
    assert await until(lambda: 7, what="at once") == 7  # a sync check too


async def test_fails_on_a_stall_naming_what_and_the_last_progress() -> None:
    started = time.monotonic()
    with pytest.raises(Stalled) as failed:
        await until(
            lambda: False,
            what="the lag gone",
            progress=lambda: ("catching_up", 40),
            stalled_s=0.3,
            poll_s=0.02,
            detail=lambda: "worker log tail",
        )
    took = time.monotonic() - started
    assert 0.3 <= took < 2.0, took
    message = str(failed.value)
    assert "not the lag gone" in message, message
    assert "('catching_up', 40)" in message, message
    assert "worker log tail" in message, message
    assert isinstance(failed.value, AssertionError)  # pytest reports it as a failure


async def test_waits_on_while_progress_moves_past_what_stalled_s_alone_allows() -> None:
    started = time.monotonic()
    polls = itertools.count()

    async def progress() -> int:  # a count that grows on every poll
        return next(polls)

    def check() -> bool:
        return time.monotonic() - started > 1.0  # far past stalled_s from the start

    assert await until(check, what="done", progress=progress, stalled_s=0.2, poll_s=0.02)
    assert time.monotonic() - started > 1.0


async def test_progress_that_stops_after_moving_fails_after_stalled_s_of_stillness() -> None:
    polls = itertools.count()
    started = time.monotonic()
    with pytest.raises(Stalled, match=r"progress stood at 10 for 0\.3s \(11 values seen\)"):
        await until(
            lambda: False,
            what="x",
            progress=lambda: min(next(polls), 10),
            stalled_s=0.3,
            poll_s=0.02,
        )
    assert time.monotonic() - started >= 0.3 + 10 * 0.02


async def test_a_flapping_observation_is_no_progress() -> None:
    flap = itertools.cycle([None, "live", None, "restoring"])
    with pytest.raises(Stalled):
        async with asyncio.timeout(10):  # the time is what is tested: fail, don't hang
            await until(
                lambda: False,
                what="steady",
                progress=lambda: next(flap),
                stalled_s=0.3,
                poll_s=0.01,
            )


async def test_without_progress_the_bound_is_stalled_s_from_the_start() -> None:
    started = time.monotonic()
    with pytest.raises(Stalled, match=r"nothing observed moved for 0\.2s"):
        await until(lambda: None, what=lambda: "a worker up", stalled_s=0.2, poll_s=0.02)
    assert time.monotonic() - started >= 0.2


async def test_an_exception_of_the_check_ends_the_wait_at_once() -> None:
    def check() -> bool:
        raise AssertionError("worker died")

    started = time.monotonic()
    with pytest.raises(AssertionError, match="worker died"):
        await until(check, what="x", stalled_s=30)
    assert time.monotonic() - started < 1.0


def test_the_sync_twin_returns_fails_on_a_stall_and_waits_on_progress() -> None:
    polls = itertools.count()
    assert until_sync(lambda: next(polls) >= 2, what="two polls", poll_s=0.01)
    with pytest.raises(Stalled, match="not answering"):
        until_sync(lambda: False, what="answering", progress=lambda: 1, stalled_s=0.2, poll_s=0.01)
    started = time.monotonic()
    moving = itertools.count()
    assert until_sync(
        lambda: time.monotonic() - started > 0.8,
        what="done",
        progress=lambda: next(moving),
        stalled_s=0.2,
        poll_s=0.02,
    )


async def test_finished_returns_or_raises_what_the_awaitable_did_and_cancels_it_on_a_stall() -> (
    None
):
    async def answer() -> int:
        await asyncio.sleep(0.05)
        return 5

    async def fail() -> None:
        raise ValueError("source failed")

    assert await finished(answer(), what="answered", stalled_s=5) == 5
    with pytest.raises(ValueError, match="source failed"):
        await finished(fail(), what="failed", stalled_s=5)
    hang = asyncio.ensure_future(asyncio.Event().wait())
    with pytest.raises(Stalled, match=r"not the source failed .*stood at 1"):
        await finished(hang, what="the source failed", progress=lambda: 1, stalled_s=0.2)
    assert hang.cancelled()


def _python(code: str, out: Path) -> subprocess.Popen[bytes]:
    with out.open("ab") as log:
        return subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=log)


def test_until_exit_waits_while_the_log_grows_and_fails_when_it_stands_still(
    tmp_path: Path,
) -> None:
    log = tmp_path / "log"
    chatty = _python(
        "import time\nfor i in range(8):\n print(i, flush=True); time.sleep(0.1)\n"
        "raise SystemExit(3)",
        log,
    )
    size = lambda: log.stat().st_size if log.exists() else 0  # noqa: E731
    assert until_exit(chatty, what="chatty exited", progress=size, stalled_s=0.5) == 3
    quiet = _python("import time; time.sleep(60)", log)
    try:
        with pytest.raises(Stalled, match="not quiet exited"):
            until_exit(quiet, what="quiet exited", progress=size, stalled_s=0.3)
    finally:
        quiet.kill()
        quiet.wait()


def test_run_watched_captures_the_output_and_fails_a_silent_idle_command() -> None:
    done = run_watched([sys.executable, "-c", "import sys; print('out'); sys.exit(2)"])
    assert (done.returncode, done.stdout) == (2, "out\n")
    started = time.monotonic()
    with pytest.raises(Stalled, match="printed then slept"):
        run_watched(
            [sys.executable, "-c", "import time; print('printed then slept'); time.sleep(60)"],
            stalled_s=1.0,
        )
    assert time.monotonic() - started < 30  # the sleeper was killed, not waited for
