"""The worker's garbage-collector threshold (setting ``gc_threshold``): set at start,
the interpreter's put back at stop, left alone with 0, refused below 0."""

from __future__ import annotations

import gc

import pytest

from streamapp import ConfigError
from streamapp.settings.settings import Settings
from streamapp.worker import tune_collector


def test_the_threshold_is_set_for_the_worker_and_put_back_after() -> None:
    before = gc.get_threshold()
    undo = tune_collector(50_000)
    try:
        assert gc.get_threshold() == (50_000, *before[1:])
    finally:
        undo()
    assert gc.get_threshold() == before


def test_zero_leaves_the_interpreters_threshold() -> None:
    before = gc.get_threshold()
    undo = tune_collector(0)
    assert gc.get_threshold() == before
    undo()
    assert gc.get_threshold() == before


def test_a_negative_threshold_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="gc_threshold"):
        Settings(app_id="a", gc_threshold=-1)
    assert Settings(app_id="a").gc_threshold == 50_000
