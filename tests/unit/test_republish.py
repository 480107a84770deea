"""What ``parked replay`` and ``dlq replay`` send back (:mod:`streamapp.failures.republish`),
and the options they refuse before reaching a broker. The brokers' side is
``tests/integration/test_parked_replay_kafka.py`` and ``..._rabbitmq.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from click.testing import CliRunner

from streamapp import Event, ReplayError
from streamapp.cli import main
from streamapp.codecs import kafka as codec
from streamapp.engine.delivery import park_headers
from streamapp.failures.outcomes import Retry
from streamapp.failures.republish import (
    REPLAYED,
    Held,
    Offsets,
    back_to_origin,
    origin_topic,
    replay,
    stripped,
)
from streamapp.failures.retry_chain import dead_letter
from streamapp.records import DeliveryRecord, Message

TOPICS = frozenset({"orders"})


def original() -> DeliveryRecord:
    key, value, headers = codec.encode(Event.create("order.placed", stream_id="o1", data={}))
    return DeliveryRecord("orders", 3, 17, key, value, [*headers, ("tenant", b"acme")])


def test_a_parked_copy_goes_back_as_first_sent() -> None:
    first = original()
    copy = Held("orders.parked/0/5", first.key, first.value, park_headers(first, "bad", "a"))
    assert origin_topic(copy.headers) == "orders"
    assert back_to_origin(copy, TOPICS) == Message(
        "orders", first.value, first.key, [*first.headers, (REPLAYED, b"orders.parked/0/5")]
    )


def test_a_dead_letter_goes_back_without_the_chain() -> None:
    first = original()
    dead = dead_letter(first, Retry(), "agent", 17, 8, "failed 17 times: boom")
    copy = Held("orders-dlq/1/2", dead.key, dead.value, dead.headers)
    assert any(n == "x-reconsume" for n, _ in copy.headers)
    assert back_to_origin(copy, TOPICS).headers == [*first.headers, (REPLAYED, b"orders-dlq/1/2")]
    assert stripped([("X-Retry-Hop", b"1"), ("Streamapp-Agent", b"a"), ("ce_id", b"1")]) == [
        ("ce_id", b"1")
    ]


def test_a_record_without_an_origin_of_the_app_is_refused() -> None:
    with pytest.raises(ReplayError, match="neither 'x-origin-topic' nor 'streamapp-source'"):
        back_to_origin(Held("t/0/1", None, b"x", [("tenant", b"a")]), TOPICS)
    other = Held("t/0/1", None, b"x", [("streamapp-source", b"payments/0/4")])
    with pytest.raises(ReplayError, match="topic 'payments', which no agent of the app reads"):
        back_to_origin(other, TOPICS)


def test_offsets_parse_and_refuse_by_option() -> None:
    given = Offsets.parse("--from", ["5", "2:7", "2:9"])
    assert (given.of(0), given.of(2), given.given) == (5, 9, True)
    assert not Offsets.parse("--until", []).given
    for bad in ("x", "-1", "1:-2", "a:3"):
        with pytest.raises(ReplayError, match="--until"):
            Offsets.parse("--until", [bad])


async def records(n: int) -> AsyncIterator[Held]:
    first = original()
    for i in range(n):
        yield Held(f"orders.parked/0/{i}", first.key, first.value, park_headers(first, "r", "a"))


async def test_a_run_stops_at_the_first_unconfirmed_record_naming_it() -> None:
    sent: list[Message] = []

    async def publish(message: Message) -> None:
        if len(sent) == 2:
            raise RuntimeError("not confirmed")
        sent.append(message)

    with pytest.raises(ReplayError) as caught:
        await replay(records(5), TOPICS, publish)
    assert caught.value.sent == 2
    assert "record orders.parked/0/2 was not confirmed" in str(caught.value)
    assert "2 record(s) were sent back before it" in str(caught.value)
    report = await replay(records(3), TOPICS, None)  # a dry run
    assert report.sent == 3
    assert len(sent) == 2


def test_the_command_names_the_topics_it_can_replay() -> None:
    runner = CliRunner()
    result = runner.invoke(
        main, ["parked", "replay", "-A", "agents.orders:app", "--topic", "orders"]
    )
    assert result.exit_code == 2
    assert "'orders' is not a parking destination of the app" in result.output
    assert "the app's parking destinations: orders.parked" in result.output
    result = runner.invoke(
        main, ["dlq", "replay", "-A", "agents.orders:app", "--topic", "orders.parked"]
    )
    assert result.exit_code == 2
    assert "it is a parking destination: use `streamapp parked replay`" in result.output


def test_the_embedded_mode_has_no_topic_to_replay() -> None:
    result = CliRunner().invoke(
        main,
        ["parked", "replay", "-A", "agents.orders:app", "--topic", "orders.parked"],
        env={"STREAMAPP_BROKER": "none"},
    )
    assert result.exit_code == 1
    assert "a parked record is a row of the event store" in result.output
