"""/metrics: Prometheus text from the worker's own registry, fed by the partition tasks."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from streamapp.web.metrics import WorkerMetrics
from streamapp.web.views import make_app
from tests.support.webworld import World, order, orders_app


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_counters_histograms_and_gauges_follow_the_engine() -> None:
    metrics = WorkerMetrics()
    world = World(orders_app(), metrics)
    await world.own(range(4))
    await world.send(*(order(f"order-{i}") for i in range(10)))
    await world.send(order("order-3", "boom"))  # the handler raises: redelivered
    p = world.partition_of("order-3")
    app = make_app(world.assignment, "w1", metrics=metrics)
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/metrics")
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        samples = _samples(await r.text())
    agent = (("agent", "project"),)
    assert samples[("streamapp_events_total", (*agent, ("outcome", "delivered")))] == 10
    assert samples[("streamapp_events_total", (*agent, ("outcome", "failed")))] == 1
    assert samples[("streamapp_handler_failures_total", agent)] == 1
    assert samples[("streamapp_redeliveries_total", agent)] == 1
    assert samples[("streamapp_batch_size_count", agent)] >= 4
    assert samples[("streamapp_batch_size_sum", agent)] == 11
    assert samples[("streamapp_commit_duration_seconds_count", agent)] >= 4
    assert samples[("streamapp_partitions", (("phase", "live"),))] == 4
    assert samples[("streamapp_partition_lag", (("partition", str(p)), ("topic", "orders")))] == 1
    assert samples[("streamapp_ready", ())] == 1
    keys = sum(v for (name, _), v in samples.items() if name == "streamapp_table_keys")
    assert keys == 10


async def test_registry_is_per_worker_not_global() -> None:
    one, two = WorkerMetrics(), WorkerMetrics()  # two workers in a process: no clash
    one.parked("a")
    assert REGISTRY.get_sample_value("streamapp_parked_total", {"agent": "a"}) is None
    assert b'streamapp_parked_total{agent="a"} 1.0' in one.render()
    assert b'streamapp_parked_total{agent="a"}' not in two.render()
