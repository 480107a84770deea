"""Issue 17's scenario on real Kafka: 3 workers and the forwarder, 200k events in the
store and a live load of 1,000 ev/s; ``order_status`` v2 (another fold of the same
events) added by a rolling restart, the switch, v1 retired. A reader asks every key of
every worker throughout (:mod:`tests.integration.versions_world`): only exact v1 answers
before the switch and exact v2 answers after it on each worker, or a 503 with
Retry-After while a partition moves; never a 404 for a key that exists. Then the same
with a ``kill -9`` of a worker while v2 builds and of another at the switch."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from .harness import StreamappProc, WorkerProc
from .versions_world import APP, Deployment, deploy_v2_and_retire_v1

# make acceptance runs it (scripts/acceptance): too heavy for make test on two cores.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.acceptance]


def _deployment(bootstrap: str, tmp_path: Path, n_workers: int = 3) -> tuple[Deployment, str]:
    ns = f"tvk{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    env = {"STREAMAPP_EVENT_STORE": url, "VERSIONS_VARIANT": "v1"}
    workers = [
        WorkerProc(
            bootstrap, ns, tmp_path / f"w{i}", tmp_path / f"w{i}.log", APP, extra_env=dict(env)
        )
        for i in range(n_workers)
    ]
    forwarder = StreamappProc(
        ("forward", "-A", APP), bootstrap, ns, tmp_path / "forwarder.log", extra_env=dict(env)
    )
    return Deployment(workers, url, forwarder), ns


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


@pytest.mark.timeout(1800)  # a hang's last resort: loaded, it ran past 600 s, progressing
@pytest.mark.parametrize(
    ("n_events", "kills"),
    [(200_000, False), (60_000, True)],
    ids=["rolling-200k", "kill9-while-building-and-at-the-switch"],
)
async def test_v2_built_beside_v1_switch_and_retire_on_kafka(
    kafka_bootstrap: str, tmp_path: Path, n_events: int, kills: bool
) -> None:
    d, ns = _deployment(kafka_bootstrap, tmp_path)
    changelog_v1 = f"{ns}tv-status_v1-changelog"
    try:
        reader = await deploy_v2_and_retire_v1(d, n_keys=1000, n_events=n_events, kills=kills)
        assert reader.rounds >= 3
        topics = await _topics(kafka_bootstrap)
        assert changelog_v1 not in topics  # retired: its changelog topic is gone
        assert f"{ns}tv-status_v2-changelog" in topics
    finally:
        d.kill_all()
