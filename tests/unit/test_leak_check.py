"""The leak check of tests/conftest.py fails a test that leaves an asyncio task pending
or a thread (not daemon) running, and passes one whose loop threads end with it."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.waits import run_watched

ROOT = Path(__file__).resolve().parents[2]

LEAKING = """
import asyncio
import threading


async def test_leaves_a_task() -> None:
    asyncio.create_task(asyncio.sleep(60), name="forgotten")


def test_leaves_a_thread() -> None:
    done = threading.Event()
    threading.Thread(target=done.wait, args=(6,), name="lingering").start()


async def test_leaves_a_thread_from_async() -> None:
    done = threading.Event()
    threading.Thread(target=done.wait, args=(6,), name="lingering-async").start()


async def test_clean_with_to_thread() -> None:
    task = asyncio.create_task(asyncio.sleep(0.1))
    await asyncio.to_thread(sum, [1, 2])
    await task
"""


def test_leaked_tasks_and_threads_fail_the_test_that_left_them(tmp_path: Path) -> None:
    (tmp_path / "test_leaking.py").write_text(LEAKING)
    done = run_watched(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "-p",
         "tests.conftest", "-p", "no:cacheprovider", "-q", "-rE", str(tmp_path)],
        cwd=ROOT,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 1, out
    assert "4 passed, 3 errors" in out, out
    assert "test_leaves_a_task left asyncio tasks pending: forgotten (sleep)" in out, out
    assert "test_leaves_a_thread left threads running: lingering" in out, out
    assert "test_leaves_a_thread_from_async left threads running: lingering-async" in out, out
    assert "test_clean_with_to_thread left" not in out, out
