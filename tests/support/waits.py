"""Waits that end on observed progress, not on a wall-clock budget.

A test waits for a state (``check``) while something it can observe moves toward it
(``progress``: a count, an offset, a tuple of phases, a log's size). The wait fails only
when that observation stood still for ``stalled_s``: a loaded 2-core machine makes a
scenario slower, not stuck, and a wait sized for a quiet machine fails it anyway.
pytest-timeout stays the last resort against a hang (docs/testing.md).

Progress counts when ``progress()`` returns a value it has not returned before in this
wait, so a value that flaps (``None``, then a status, then ``None``) does not hold a
stuck wait open; make it monotone (a count, an offset) where it can go back. Without
``progress`` the check's own state is all there is: the wait fails ``stalled_s`` after
its start ("nothing happened").

Built on the same rule: :func:`finished` (an awaitable done, e.g. a source failing),
:func:`until_exit` (a process exited; progress: its log grows) and :func:`run_watched`
(a command run to its exit; progress: its output or the CPU it uses).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

import orjson

T = TypeVar("T")

STALLED_S = 60.0
"""The default bound for "nothing moved": far above any pause a loaded machine makes
between two steps of a scenario (a JVM's GC, a rebalance, a worker's start)."""


CLOCK_KEYS = frozenset({"lag_s", "stalled_s"})
"""Keys of a /status answer whose values change with the clock alone (a partition's lag
in seconds grows while it is stuck): left out of an observation, so a stuck scenario
does not look as if it moved."""


def frozen(value: object) -> bytes:
    """A hashable observation of a JSON-like value (a /status answer, a list of them):
    its JSON with sorted keys, without :data:`CLOCK_KEYS`."""
    return orjson.dumps(_timeless(value), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def _timeless(value: object) -> object:
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k not in CLOCK_KEYS}
    if isinstance(value, (list, tuple)):
        return [_timeless(v) for v in value]
    return value


class Stalled(AssertionError):
    """A wait's progress stood still for its ``stalled_s`` before its check held."""


class _Watch:
    """What one wait has observed: the progress values seen and when the last new one came."""

    def __init__(self, what: str | Callable[[], str], stalled_s: float) -> None:
        self.what, self.stalled_s = what, stalled_s
        self.started = self.moved = time.monotonic()
        self.seen: set[Hashable] = set()
        self.last: Hashable = None
        self.changes = 0

    def observe(self, value: Hashable) -> None:
        if value not in self.seen:
            self.seen.add(value)
            self.last, self.moved = value, time.monotonic()
            self.changes += 1

    def stalled(self) -> bool:
        return time.monotonic() - self.moved >= self.stalled_s

    def failure(self, detail: object) -> Stalled:
        what = self.what() if callable(self.what) else self.what
        waited = time.monotonic() - self.started
        last = repr(self.last)
        last = last if len(last) <= 600 else f"{last[:600]}..."
        moved = (
            f"progress stood at {last} for {self.stalled_s:g}s ({self.changes} values seen)"
            if self.changes
            else f"nothing observed moved for {self.stalled_s:g}s"
        )
        extra = "" if detail is None else f"\n{detail}"
        return Stalled(f"not {what} after {waited:.0f}s: {moved}{extra}")


async def _value(fn: Callable[[], Any]) -> Any:
    result = fn()
    return await result if inspect.isawaitable(result) else result


@overload
async def until(
    check: Callable[[], Awaitable[T | None]],
    *,
    what: str | Callable[[], str],
    progress: Callable[[], Any] | None = None,
    stalled_s: float = STALLED_S,
    poll_s: float = 0.1,
    detail: Callable[[], object] | None = None,
) -> T: ...


@overload
async def until(
    check: Callable[[], T | None],
    *,
    what: str | Callable[[], str],
    progress: Callable[[], Any] | None = None,
    stalled_s: float = STALLED_S,
    poll_s: float = 0.1,
    detail: Callable[[], object] | None = None,
) -> T: ...


async def until(
    check: Callable[[], Any],
    *,
    what: str | Callable[[], str],
    progress: Callable[[], Any] | None = None,
    stalled_s: float = STALLED_S,
    poll_s: float = 0.1,
    detail: Callable[[], object] | None = None,
) -> Any:
    """Poll ``check`` (sync or async) every ``poll_s`` until it returns a true value, and
    return that value; ``progress`` is observed after each check that did not hold.

    Fails (:class:`Stalled`, naming ``what``, the last progress and ``detail()``) once
    ``progress()`` (sync or async, a hashable observation) has given nothing new for
    ``stalled_s``. An exception of ``check`` or ``progress`` (a worker found dead) ends
    the wait at once."""
    watch = _Watch(what, stalled_s)
    while True:
        result = await _value(check)
        if result:
            return result
        if progress is not None:  # after the check: it may read what the check saw
            watch.observe(await _value(progress))
        if watch.stalled():
            raise watch.failure(None if detail is None else await _value(detail))
        await asyncio.sleep(poll_s)


def until_sync(
    check: Callable[[], T | None],
    *,
    what: str | Callable[[], str],
    progress: Callable[[], Hashable] | None = None,
    stalled_s: float = STALLED_S,
    poll_s: float = 0.1,
    detail: Callable[[], object] | None = None,
) -> T:
    """:func:`until` for code without an event loop (blocking calls, ``time.sleep``)."""
    watch = _Watch(what, stalled_s)
    while True:
        result = check()
        if result:
            return result
        if progress is not None:
            watch.observe(progress())
        if watch.stalled():
            raise watch.failure(None if detail is None else detail())
        time.sleep(poll_s)


async def finished(
    awaitable: Awaitable[T],
    *,
    what: str | Callable[[], str],
    progress: Callable[[], Any] | None = None,
    stalled_s: float = STALLED_S,
    detail: Callable[[], object] | None = None,
) -> T:
    """Await ``awaitable`` (a source's ``wait()``, a worker's ``stop()``) while
    ``progress`` moves: its result, or the exception it raised. Fails (:class:`Stalled`,
    the awaitable cancelled) once ``progress`` gave nothing new for ``stalled_s``."""
    task = asyncio.ensure_future(awaitable)
    try:
        await until(task.done, what=what, progress=progress, stalled_s=stalled_s, detail=detail)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return task.result()


def group_cpu(pgid: int) -> dict[int, int]:
    """The live (not zombie) processes of process group ``pgid``: the CPU ticks (user +
    system) each used so far. It moves while a quiet command works (one that writes
    nothing until it is done, or whose children do the work: ``make``, ``pip``)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # from field 3, the state
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found[int(entry.name)] = int(fields[11]) + int(fields[12])  # utime + stime
    return found


def until_exit(
    proc: subprocess.Popen[Any],
    *,
    what: str | Callable[[], str],
    progress: Callable[[], Hashable] | None = None,
    stalled_s: float = STALLED_S,
    poll_s: float = 0.1,
    detail: Callable[[], object] | None = None,
) -> int:
    """Until ``proc`` has exited: its exit code. Fails (:class:`Stalled`, naming ``what``
    and ``detail()``, e.g. its log's tail; the process is left to the caller's clean-up)
    once it neither exited nor moved ``progress`` (e.g. its log's size: a worker logs
    each partition it closes) for ``stalled_s``."""
    (code,) = until_sync(
        lambda: None if proc.poll() is None else (proc.returncode,),
        what=what,
        progress=progress,
        stalled_s=stalled_s,
        poll_s=poll_s,
        detail=detail,
    )
    return int(code)


def run_watched(
    args: Sequence[str],
    *,
    stalled_s: float = STALLED_S,
    **popen: Any,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(args, capture_output=True, text=True)`` (``popen``: ``env``,
    ``cwd``) that waits while the command writes output or its process group uses CPU,
    instead of a wall-clock ``timeout``; fails (:class:`Stalled`, with its output so
    far, the group killed) once it did neither for ``stalled_s``."""
    with tempfile.TemporaryDirectory(prefix="run-watched-") as scratch:
        paths = Path(scratch, "stdout"), Path(scratch, "stderr")
        with paths[0].open("wb") as out, paths[1].open("wb") as err:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own group: what it starts is watched too
                **popen,
            )

        def text(path: Path) -> str:
            return path.read_text(errors="replace")

        cpu: list[Any] = [0.0, b""]  # when last read, what: a read scans /proc (~10 ms)

        def progress() -> Hashable:
            if time.monotonic() - cpu[0] >= 1.0:
                cpu[:] = time.monotonic(), frozen(group_cpu(proc.pid))
            return (*(p.stat().st_size for p in paths), cpu[1])

        try:
            code = until_exit(
                proc,
                what=f"{' '.join(map(str, args))} exited",
                progress=progress,
                stalled_s=stalled_s,
                detail=lambda: "\n".join(text(p)[-3000:] for p in paths),
            )
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return subprocess.CompletedProcess(list(args), code, text(paths[0]), text(paths[1]))
