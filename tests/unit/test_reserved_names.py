"""Reserved header and extension names are refused where an application sends them:
``Event.create`` (extensions), ``send(topic, event)`` and the sinks' ``publish``; the
headers streamapp writes itself (parks, chain copies) still go out."""

from __future__ import annotations

import pytest

from streamapp import App, Event
from streamapp.agents.outputs import Outbox, Send
from streamapp.codecs import amqp as amqp_codec
from streamapp.codecs.kafka import encode
from streamapp.errors import OutputError, PublishError, ReservedNameError
from streamapp.events import SPECVERSION
from streamapp.failures import retry_chain as chain
from streamapp.records import CHAIN, Stamped
from streamapp.settings.settings import Settings
from streamapp.transports.kafka.sink import KafkaSink
from streamapp.transports.rabbitmq.sink import RabbitSink

RESERVED = ["ce_tenant", "CE_Tenant", "cloudEvents_tenant", "cloudEvents:tenant"]
RESERVED += ["x-reconsume", "x-retry-hop", "x-deliver-at", "x-origin-topic", "x-origin"]
RESERVED += ["streamapp-park-reason"]


@pytest.mark.parametrize("name", RESERVED)
def test_event_create_refuses_a_reserved_extension_naming_it(name: str) -> None:
    with pytest.raises(ReservedNameError) as raised:
        Event.create("t", stream_id="s", extensions={name: "1"})
    message = str(raised.value)
    assert repr(name) in message
    assert "plain name such as 'app" in message
    assert isinstance(raised.value, ValueError)


def test_event_create_takes_a_free_extension() -> None:
    event = Event.create("t", stream_id="s", extensions={"tenant": "acme", "xretry": "1"})
    assert event.extensions["tenant"] == "acme"


@pytest.mark.parametrize("name", RESERVED)
def test_send_refuses_an_event_with_a_reserved_extension(name: str) -> None:
    app = App("reserved")
    out = app.topic("out", partitions=2)
    outbox = Outbox()
    send = Send("agent", [out], encode, outbox)
    event = Event("e1", "src", "t", SPECVERSION, extensions={"streamid": "s", name: "1"})
    with pytest.raises(OutputError) as raised:
        send(out, event)
    assert repr(name) in str(raised.value)
    assert "agent 'agent'" in str(raised.value)
    outbox.commit_event()
    assert outbox.take() == []  # nothing buffered


async def test_the_kafka_sink_refuses_a_chain_or_streamapp_header() -> None:
    sink = KafkaSink("127.0.0.1:1", timeout_s=0.2)
    for name in ("x-retry-hop", "streamapp-agent", "X-Reconsume"):
        with pytest.raises(ReservedNameError, match=repr(name)):
            await sink.publish("t", b"v", key=b"k", headers=[("tenant", b"a"), (name, b"1")])
    key, value, headers = encode(Event.create("t", stream_id="s"))
    with pytest.raises(PublishError):  # the event's own ce_ headers pass (then: no broker)
        await sink.publish("t", value, key=key, headers=headers)
    with pytest.raises(PublishError):  # streamapp's own (a chain copy) pass too
        await sink.publish("t", b"v", headers=Stamped([("x-retry-hop", b"1")]))
    await sink.stop()


async def test_the_rabbitmq_sink_refuses_a_chain_or_streamapp_header() -> None:
    sink = RabbitSink(Settings(app_id="a"), {"t": 1}, timeout_s=0.2)
    with pytest.raises(ReservedNameError, match="'x-dlq-reason'"):
        await sink.publish("t", b"v", headers=[("x-dlq-reason", b"no")])
    key, value, headers = amqp_codec.encode(Event.create("t", stream_id="s"))
    with pytest.raises(PublishError, match="not started"):  # cloudEvents_ headers pass
        await sink.publish("t", value, key=key, headers=headers)


def test_the_chain_writes_exactly_the_reserved_chain_headers() -> None:
    assert chain.CHAIN == CHAIN
