"""Every Kafka producer streamapp makes publishes with acks=all and idempotence."""

from __future__ import annotations

from typing import Any

import pytest

from streamapp import ConfigError
from streamapp.transports.kafka.sink import KafkaSink, producer_config


def test_durable_options_are_filled_in() -> None:
    assert producer_config() == {"acks": "all", "enable_idempotence": True}
    assert producer_config({"linger_ms": 5}) == {
        "linger_ms": 5,
        "acks": "all",
        "enable_idempotence": True,
    }


@pytest.mark.parametrize("acks", ["all", -1])
def test_acks_all_given_explicitly_is_kept(acks: Any) -> None:
    assert producer_config({"acks": acks})["acks"] == acks
    assert producer_config({"enable_idempotence": True})["enable_idempotence"] is True


@pytest.mark.parametrize("acks", [0, 1, "1", "0", "leader"])
def test_weaker_acks_is_refused_naming_the_option(acks: Any) -> None:
    with pytest.raises(ConfigError, match=f"option acks={acks!r} is refused") as info:
        producer_config({"acks": acks})
    assert "acks='all'" in str(info.value)


def test_idempotence_off_is_refused() -> None:
    with pytest.raises(ConfigError, match="option enable_idempotence=False is refused"):
        producer_config({"enable_idempotence": False})


def test_unknown_and_own_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="'lingers_ms' is not an aiokafka option; did you"):
        producer_config({"lingers_ms": 5})
    with pytest.raises(ConfigError, match="bootstrap_servers is streamapp's own"):
        producer_config({"bootstrap_servers": "elsewhere:9092"})


async def test_sink_producer_is_acks_all_and_idempotent() -> None:
    sink = KafkaSink("127.0.0.1:1", options={"compression_type": "gzip"})
    try:
        assert sink.config == {
            "linger_ms": 2,
            "compression_type": "gzip",
            "acks": "all",
            "enable_idempotence": True,
        }
        producer: Any = sink._producer  # what aiokafka made of it
        assert producer._sender._acks == -1  # "all"
        assert producer._txn_manager is not None  # idempotent
    finally:
        await sink.stop()  # never started: closes without connecting


async def test_sink_refuses_weaker_acks() -> None:
    with pytest.raises(ConfigError, match="acks=1"):
        KafkaSink("127.0.0.1:1", options={"acks": 1})
