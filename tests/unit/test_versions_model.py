"""The table-versions e2e's judge (tests/support/versions_model.py) passes exact answers
only: a stale, a future, a mixed or a wrong-version value is named as such."""

from __future__ import annotations

import random

from tests.apps.versions_app import fold_v1, fold_v2
from tests.integration.versions_world import history
from tests.support.versions_model import FoldModel


def _model() -> FoldModel:
    model = FoldModel()
    model.add(history(5, 60, seed=3))
    return model


def test_the_fold_at_any_position_between_seen_and_head_is_exact() -> None:
    model = _model()
    for key in model.streams():
        head = model.head(key)
        for n in range(1, head + 1):
            for version in (1, 2):
                value = model.value(version, key, n)
                assert model.check(version, key, value, n, head) is None
                assert model.check(version, key, value, 1, n) is None


def test_the_model_folds_with_the_apps_folds() -> None:
    model = _model()
    key = model.streams()[0]
    v1 = v2 = None
    for event in model.events[key]:
        v1, v2 = fold_v1(v1, event), fold_v2(v2, event)
    head = model.head(key)
    assert model.value(1, key, head) == v1
    assert model.value(2, key, head) == v2
    assert v2 is not None
    assert v2["items"] > 0
    assert v2 != v1


def test_stale_future_mixed_and_wrong_version_answers_are_refused() -> None:
    model = _model()
    key = max(model.streams(), key=model.head)
    head = model.head(key)
    mid = head // 2
    v1, v2 = model.value(1, key, mid), model.value(2, key, mid)
    assert "stale" in (model.check(1, key, v1, mid + 1, head) or "")
    assert "future" in (model.check(1, key, model.value(1, key, head), 1, head - 1) or "")
    assert "not the v1 fold" in (model.check(1, key, v2, 1, head) or "")  # v2 said v1
    assert "not the v2 fold" in (model.check(2, key, v1, 1, head) or "")  # v1 said v2
    mixed = {**v1, "items": v2["items"], "total": v2["total"]}  # v1 with v2's fields
    assert "not the v1 fold" in (model.check(1, key, mixed, 1, head) or "")
    skipped = dict(v1, last=model.events[key][mid - 2].id)  # an event lost
    assert "not the v1 fold" in (model.check(1, key, skipped, 1, head) or "")
    assert model.check(3, key, v1, 1, head) is not None
    assert model.check(1, key, {"status": "placed"}, 1, head) is not None


def test_a_reread_lower_position_refolds_from_the_start() -> None:
    model = _model()
    key = model.streams()[1]
    head = model.head(key)
    late = model.value(2, key, head)
    early = model.value(2, key, 1)  # below what the cache holds
    assert early["n"] == 1
    assert late["n"] == head
    assert model.value(2, key, head) == late
    random.Random(1).shuffle(model.streams())  # streams() is a copy: the model is intact
    assert model.head(key) == head
