"""Issue 17's scenario on real RabbitMQ: 3 workers and the forwarder, the store's history
and a live load of 1,000 ev/s; ``order_status`` v2 added by a rolling restart (the
members' heartbeats carry their table versions), the switch, v1 retired; then with a
``kill -9`` while v2 builds and another at the switch. The reader's rules are
:mod:`tests.integration.versions_world`'s."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.conftest import Services

from .harness import StreamappProc, WorkerProc
from .versions_world import APP, Deployment, deploy_v2_and_retire_v1

# make acceptance runs it (scripts/acceptance): too heavy for make test on two cores.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.acceptance]


def _deployment(amqp: str, tmp_path: Path, n_workers: int = 3) -> Deployment:
    ns = f"tvr{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    env = {
        "STREAMAPP_BROKER": "rabbitmq",
        "STREAMAPP_AMQP_URL": amqp,
        "STREAMAPP_EVENT_STORE": url,
        "VERSIONS_VARIANT": "v1",
        "STREAMAPP_AMQP_HEARTBEAT_MS": "300",
        "STREAMAPP_AMQP_SESSION_TIMEOUT_MS": "3000",
    }
    workers = [
        WorkerProc(
            "127.0.0.1:1", ns, tmp_path / f"w{i}", tmp_path / f"w{i}.log", APP,
            extra_env=dict(env),
        )
        for i in range(n_workers)
    ]  # fmt: skip
    forwarder = StreamappProc(
        ("forward", "-A", APP), "127.0.0.1:1", ns, tmp_path / "forwarder.log", dict(env)
    )
    return Deployment(workers, url, forwarder)


@pytest.mark.timeout(1800)  # a hang's last resort: loaded, it ran past 600 s, progressing
@pytest.mark.parametrize("kills", [False, True], ids=["rolling", "kill9"])
async def test_v2_built_beside_v1_switch_and_retire_on_rabbitmq(
    services: Services, tmp_path: Path, kills: bool
) -> None:
    d = _deployment(services.amqp, tmp_path)
    try:
        reader = await deploy_v2_and_retire_v1(d, n_keys=600, n_events=40_000, kills=kills)
        assert reader.rounds >= 3
    finally:
        d.kill_all()
