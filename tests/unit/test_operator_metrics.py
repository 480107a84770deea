"""The operators' metrics in the Prometheus text format: publish failures per sink,
destination and outcome; the retry chain's hop histogram; the relays' held copies and
lag (read from the relay at each scrape); and the same figures for ``/status``."""

from __future__ import annotations

from streamapp.web.metrics import WorkerMetrics


class _Relay:
    """A relay's two readings, as the worker's relays expose them."""

    def __init__(self) -> None:
        self.held_copies = 0
        self.lags: dict[tuple[str, int], int] = {}

    def lag(self) -> dict[tuple[str, int], int]:
        return dict(self.lags)


def test_publish_failures_are_counted_per_sink_destination_and_outcome() -> None:
    metrics = WorkerMetrics()
    metrics.publish_failed("rabbitmq", "orders", "returned")
    metrics.publish_failed("rabbitmq", "orders", "returned", 2)
    metrics.publish_failed("kafka", "parked", "timed_out", 4)
    metrics.publish_failed("kafka", "parked", "failed", 0)  # nothing failed: no sample
    text = metrics.render().decode()
    assert "# TYPE streamapp_publish_failures_total counter" in text
    assert (
        'streamapp_publish_failures_total{destination="orders",outcome="returned",'
        'sink="rabbitmq"} 3.0'
    ) in text
    assert (
        'streamapp_publish_failures_total{destination="parked",outcome="timed_out",'
        'sink="kafka"} 4.0'
    ) in text
    assert 'outcome="failed"' not in text
    assert metrics.operations()["sinks"] == {
        "kafka": {"parked": {"timed_out": 4}},
        "rabbitmq": {"orders": {"returned": 3}},
    }


def test_retry_hops_are_a_histogram_per_agent_and_kind() -> None:
    metrics = WorkerMetrics()
    metrics.hop("summer", "retried", 1, 2)
    metrics.hop("summer", "retried", 3, 1)
    metrics.hop("summer", "dead_lettered", 3, 1)
    text = metrics.render().decode()
    assert "# TYPE streamapp_retry_hop histogram" in text
    retried = 'agent="summer",kind="retried"'
    assert f'streamapp_retry_hop_bucket{{{retried},le="1.0"}} 2.0' in text
    assert f'streamapp_retry_hop_bucket{{{retried},le="2.0"}} 2.0' in text
    assert f'streamapp_retry_hop_bucket{{{retried},le="3.0"}} 3.0' in text
    assert f"streamapp_retry_hop_count{{{retried}}} 3.0" in text
    assert f"streamapp_retry_hop_sum{{{retried}}} 5.0" in text
    assert 'streamapp_retry_hop_count{agent="summer",kind="dead_lettered"} 1.0' in text
    assert metrics.operations()["retry_hops"] == {
        "summer": {"retried": {"1": 2, "3": 1}, "dead_lettered": {"3": 1}}
    }


def test_relay_gauges_are_read_at_each_scrape() -> None:
    metrics = WorkerMetrics()
    assert "streamapp_relay_held_copies" not in metrics.render().decode()  # no relay
    relay = _Relay()
    metrics.watch_relay("kafka", relay)
    relay.held_copies = 2
    relay.lags = {("in-retry", 0): 5, ("in-retry", 1): 0}
    text = metrics.render().decode()
    assert "# TYPE streamapp_relay_held_copies gauge" in text
    assert 'streamapp_relay_held_copies{relay="kafka"} 2.0' in text
    assert 'streamapp_relay_lag{partition="0",topic="in-retry"} 5.0' in text
    assert 'streamapp_relay_lag{partition="1",topic="in-retry"} 0.0' in text
    relay.held_copies, relay.lags = 0, {("in-retry", 0): 1}
    text = metrics.render().decode()
    assert 'streamapp_relay_held_copies{relay="kafka"} 0.0' in text
    assert 'streamapp_relay_lag{partition="0",topic="in-retry"} 1.0' in text
    assert metrics.operations()["relays"] == [
        {"kind": "kafka", "held_copies": 0, "lag": {"in-retry/0": 1}}
    ]
