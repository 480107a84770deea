"""The forwarder's /metrics text and its web port setting."""

from __future__ import annotations

import pytest

from streamapp.errors import ConfigError
from streamapp.settings.settings import Settings
from streamapp.web.forwarder import ForwarderSnapshot, render


def snap(**changes: object) -> ForwarderSnapshot:
    figures: dict[str, object] = {
        "forwarder": "orders",
        "topics": ["orders"],
        "lock_held": True,
        "published": 1200,
        "lag": 34,
        "lag_s": 12.5,
        "rate": 250.5,
        "consecutive_failures": 2,
        "checkpoint_position": 1201,
        "store_head": 1234,
    }
    figures.update(changes)
    return ForwarderSnapshot(**figures)  # type: ignore[arg-type]


def test_the_text_has_every_figure_labelled_by_forwarder() -> None:
    text = render(snap()).decode()
    for line in (
        "# TYPE streamapp_forwarder_published_total counter",
        'streamapp_forwarder_published_total{forwarder="orders"} 1200.0',
        'streamapp_forwarder_lag_events{forwarder="orders"} 34.0',
        'streamapp_forwarder_lag_seconds{forwarder="orders"} 12.5',
        'streamapp_forwarder_rate_events_per_second{forwarder="orders"} 250.5',
        'streamapp_forwarder_consecutive_failures{forwarder="orders"} 2.0',
        'streamapp_forwarder_lock_held{forwarder="orders"} 1.0',
        'streamapp_forwarder_checkpoint_position{forwarder="orders"} 1201.0',
        'streamapp_forwarder_store_head{forwarder="orders"} 1234.0',
    ):
        assert line in text.splitlines()


def test_unknown_figures_are_left_out_and_a_waiting_forwarder_shows_lock_0() -> None:
    unknown = {"lag": None, "lag_s": None, "checkpoint_position": None, "store_head": None}
    text = render(snap(lock_held=False, **unknown))
    lines = text.decode().splitlines()
    assert 'streamapp_forwarder_lock_held{forwarder="orders"} 0.0' in lines
    assert not any(line.startswith("streamapp_forwarder_lag_events{") for line in lines)
    assert not any(line.startswith("streamapp_forwarder_lag_seconds{") for line in lines)
    assert not any(line.startswith("streamapp_forwarder_store_head{") for line in lines)


def test_forwarder_web_port_default_env_and_bounds() -> None:
    assert Settings(app_id="a").forwarder_web_port == 6067
    env = {"STREAMAPP_FORWARDER_WEB_PORT": "-1"}
    assert Settings.from_env("a", env).forwarder_web_port == -1
    with pytest.raises(ConfigError, match="STREAMAPP_FORWARDER_WEB_PORT"):
        Settings(app_id="a", forwarder_web_port=-2)
