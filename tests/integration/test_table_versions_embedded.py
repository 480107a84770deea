"""Issue 17's scenario in embedded mode (``STREAMAPP_BROKER=none``, the event store
alone): one worker, v2 added by a restart while a live load appends, the switch, v1
retired (the running worker is asked); then with a ``kill -9`` while v2 builds and at
the switch. The reader's rules are :mod:`tests.integration.versions_world`'s."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from .harness import WorkerProc
from .versions_world import APP, Deployment, deploy_v2_and_retire_v1

# make acceptance runs it (scripts/acceptance): too heavy for make test on two cores.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.acceptance]


@pytest.mark.parametrize("attempt", range(5))  # a race: one run caught it in 3 of 9 (see below)
@pytest.mark.parametrize("kills", [False, True], ids=["restart", "kill9"])
async def test_v2_built_beside_v1_switch_and_retire_embedded(
    tmp_path: Path, kills: bool, attempt: int
) -> None:
    """Run five times: on 2026-12-03 a v2 built beside v1 in embedded mode ended some keys
    an event short (or folded wrong) in 3 of 9 runs of the restart case at ``57c6ced``
    (0 of 5 at ``acff598``): a build joining the store's followers below their read in
    flight got a share cut from the read's start (fixed in ``StoreFeed._dispatch``;
    ``tests/unit/test_lane_build.py`` holds it deterministically). One run alone let it
    through two times in three."""
    url = f"sqlite:///{tmp_path / 'events.db'}"
    env = {"STREAMAPP_BROKER": "none", "STREAMAPP_EVENT_STORE": url, "VERSIONS_VARIANT": "v1"}
    ns = f"tve{uuid.uuid4().hex[:6]}-"
    w = WorkerProc("127.0.0.1:1", ns, tmp_path / "w0", tmp_path / "w0.log", APP, extra_env=env)
    d = Deployment([w], url, forwarder=None, topics=False)
    try:
        reader = await deploy_v2_and_retire_v1(d, n_keys=600, n_events=40_000, kills=kills)
        assert reader.rounds >= 3
    finally:
        d.kill_all()
