"""RabbitMQ settings: the broker is accepted, owned partitions parsed and checked."""

from __future__ import annotations

import pytest

from streamapp import App, ConfigError, Event, Settings
from streamapp.transports.rabbitmq.pinned import StaticMembership


def test_rabbitmq_settings_from_env() -> None:
    env = {
        "STREAMAPP_BROKER": "rabbitmq",
        "STREAMAPP_AMQP_URL": "amqp://u:p@h:5673/v",
        "STREAMAPP_AMQP_PREFETCH": "50",
        "STREAMAPP_AMQP_PARTITIONS": "0,2",
    }
    s = Settings.from_env("a", env)
    assert (s.broker, s.amqp_url, s.amqp_prefetch) == ("rabbitmq", "amqp://u:p@h:5673/v", 50)
    assert s.owned_partitions() == {0, 2}
    assert Settings("a").owned_partitions() is None
    assert Settings("a").amqp_url == "amqp://guest:guest@127.0.0.1:5672/"


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("amqp_partitions", "0,x", "STREAMAPP_AMQP_PARTITIONS"),
        ("amqp_partitions", "-1", "STREAMAPP_AMQP_PARTITIONS"),
        ("amqp_url", "http://h", "STREAMAPP_AMQP_URL"),
        ("amqp_prefetch", 0, "STREAMAPP_AMQP_PREFETCH"),
    ],
)
def test_bad_rabbitmq_settings_are_named(field: str, value: object, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Settings("a", **{field: value})


def test_static_membership_owns_the_named_partitions_of_every_topic() -> None:
    app = App("m")

    @app.agent(app.topic("big", partitions=4))
    async def big(event: Event) -> None:
        pass

    @app.agent(app.topic("small", partitions=2))
    async def small(event: Event) -> None:
        pass

    owned = StaticMembership(app, Settings("m", amqp_partitions="1,3")).owned
    assert owned == [("big", 1), ("big", 3), ("small", 1)]
    assert len(StaticMembership(app, Settings("m")).owned) == 6
    with pytest.raises(ConfigError, match=r"partition\(s\) \[4\]"):
        StaticMembership(app, Settings("m", amqp_partitions="4"))
