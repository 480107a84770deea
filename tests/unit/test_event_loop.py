"""The worker's event loop (setting ``event_loop``): asyncio's by default, uvloop when
asked and installed, refused with the setting's name otherwise."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from streamapp import ConfigError
from streamapp.settings.event_loop import run
from streamapp.settings.settings import Settings


async def _loop_type() -> type[asyncio.AbstractEventLoop]:
    return type(asyncio.get_running_loop())


def test_asyncio_is_the_default_and_uvloop_runs_when_asked() -> None:
    assert Settings(app_id="a").event_loop == "asyncio"
    assert not issubclass(run(_loop_type(), "asyncio"), uvloop.Loop)
    assert issubclass(run(_loop_type(), "uvloop"), uvloop.Loop)


def test_an_unknown_loop_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"setting event_loop must be one of asyncio, uvloop"):
        Settings(app_id="a", event_loop="trio")
    main = _loop_type()
    with pytest.raises(ConfigError, match="event_loop"):
        run(main, "tokio")


def test_uvloop_not_installed_is_refused_with_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[uvloop\]'"):
        Settings(app_id="a", event_loop="uvloop")
