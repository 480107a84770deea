"""Pure codecs: CloudEvents to and from bytes, with no client library.

- :mod:`.kafka`: Kafka's binary content mode (``ce_`` headers) and structured mode;
- :mod:`.amqp`: AMQP 0-9-1 (``cloudEvents_`` headers, ``content_type``, the body);
- :mod:`.structured`: the structured JSON form (``application/cloudevents+json``), also
  what the event store keeps;
- :mod:`.data`: an event's ``data`` as bytes, by its content type;
- :mod:`.plain`: records of plain topics (a JSON or raw value and a key) as events.

Each transport adapts its client's messages to these (a header list and bytes); the
memory broker and the tests use them as they are. Decoders raise
:class:`~streamapp.errors.DecodeError` with a reason, never anything else.
"""
