"""A standby gives way to the partitions its worker owns while they restore (issue 31).

A fail-over hands out new standbys in the very assignment that promotes the old ones:
each restores a whole store and, sharing the event loop, would delay the openings that
make the lost keys answer again. So a standby applies nothing while a partition its
worker owns restores, and goes on once none does (Kafka Streams updates standbys only
when no active task restores).

A worker of the reset app fills the ``tally`` changelog on real Kafka and stops; then a
:class:`StandbyReplica` of partition 0 follows that changelog here, first while its
worker says a partition of its own restores, then once none does.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from streamapp import App, Event, Table, TableView
from streamapp.settings.settings import Settings
from streamapp.tables.rocksdb.store import rocks_opener
from streamapp.transports.kafka.standby import YIELD_S, StandbyReplica
from tests.conftest import Services
from tests.support.waits import run_watched, until

from .harness import ROOT, WorkerProc, app_env, produce, streamapp_cmd, wait_ready
from .test_reset import APP, wait_tally, workload

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def rs_app(ns: str) -> App:
    """The reset app's ``tally`` agent as ``tests.apps.reset_app`` declares it (its id,
    topic and table name its changelog)."""
    app = App(f"{ns}rs")
    events = app.topic(f"{ns}rs-events", partitions=4)

    @app.agent(events, tables=[Table("tally")])
    async def tally(event: Event, view: TableView[dict[str, Any]]) -> None:
        raise AssertionError("a standby never runs its agent")

    return app


async def test_a_standby_applies_nothing_while_a_partition_of_its_worker_restores(
    services: Services, tmp_path: Path
) -> None:
    ns = f"sbw{uuid.uuid4().hex[:6]}-"
    bootstrap = services.kafka
    env = app_env(bootstrap, ns)
    made = run_watched(streamapp_cmd("topics", "create", "-A", APP), env=env, cwd=ROOT)
    assert made.returncode == 0, made.stderr
    events, expected = workload()
    await produce(bootstrap, f"{ns}rs-events", events)
    owner = WorkerProc(bootstrap, ns, tmp_path / "owner", tmp_path / "owner.log", app_ref=APP)
    owner.start()
    try:
        await wait_ready(owner)
        await wait_tally(owner, expected, "v1")
    finally:
        assert owner.stop() == 0, owner.log_text()[-3000:]

    app = rs_app(ns)
    agent = app.agents["tally"]
    settings = Settings.from_env(
        app.id, {"STREAMAPP_KAFKA_BOOTSTRAP": bootstrap, "STREAMAPP_DATA_DIR": str(tmp_path)}
    )
    restoring, asked = [True], [0]

    def owned_restoring() -> bool:
        asked[0] += 1
        return restoring[0]

    replica = StandbyReplica(
        TopicPartition(f"{ns}rs-events", 0),
        [agent],
        app,
        bootstrap=bootstrap,
        opener=lambda a, p: rocks_opener(settings, app.id, a.name, p),
        identity=None,
        restoring=owned_restoring,
    )
    (store,) = replica.stores
    try:
        # it reached the point where it would apply (its store open, its changelog's end
        # read) and has been giving way for 20 looks, about a second
        await until(
            lambda: asked[0] >= 20,
            what="the standby giving way",
            progress=lambda: (asked[0], store.tables is not None),
            stalled_s=30,
            poll_s=YIELD_S,
        )
        assert store.applied == 0
        assert replica.lag() == -1  # nothing fetched: not even its lag is known

        restoring[0] = False
        await until(
            lambda: store.lag == 0 and store.checked,
            what="the standby caught up once nothing restores",
            progress=lambda: (store.applied, store.lag),
            stalled_s=30,
            poll_s=0.05,
        )
        assert store.applied > 0
        copy = replica.copy("tally")
        assert copy is not None
        assert copy.lag == 0
        view = copy.tables.view("tally")
        mine = {k: v for k, v in expected.items() if agent.topic.partition_of(k.encode()) == 0}
        assert mine
        for key, want in mine.items():
            got = view.get(key) or {}
            assert (got.get("n"), got.get("sum")) == (want["n"], want["sum"]), key
    finally:
        await replica.close()
