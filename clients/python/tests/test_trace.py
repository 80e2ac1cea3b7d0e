"""W3C trace context: the traceparent the client sends is continued by the
sidecar and carried on by the outbox event it records (here the Redis Streams
sink's `traceparent` field; the sidecar's own spans are tested in the Rust
suite against an OTLP receiver)."""

from __future__ import annotations

import time

import pytest

from conftest import start_sidecar

GIVEN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(scope="module")
def relayed(oncegate_bin, tmp_path_factory):
    """A sidecar whose relay publishes to a Redis stream of its own."""
    import os
    import uuid

    stream = f"oncegate-test-trace:{uuid.uuid4().hex[:12]}"
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
    sc = start_sidecar(
        oncegate_bin,
        tmp_path_factory.mktemp("traced"),
        {"ONCEGATE_RELAY_SINK": redis_url, "ONCEGATE_RELAY_STREAM": stream},
    )
    yield sc, stream
    sc.stop()


def event_of(redis_client, stream: str, award_id: str, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for _, fields in redis_client.xrange(stream):
            if fields.get(b"award_id") == award_id.encode():
                return {k.decode(): v.decode() for k, v in fields.items()}
        time.sleep(0.05)
    pytest.fail(f"no event for {award_id} in {stream}")


def test_a_given_traceparent_is_carried_by_the_event(relayed, make_gate, redis_client, unique):
    sidecar, stream = relayed
    award = f"TRACE-{unique}"
    with make_gate(sidecar.target, timeout=30.0) as gate:
        gate.submit(award, "2026-12-03T10:00:00Z", b"traced", 100, traceparent=GIVEN)
    assert event_of(redis_client, stream, award)["traceparent"] == GIVEN


def test_without_one_the_current_opentelemetry_context_is_sent(relayed, redis_client, unique):
    """The synchronous client: the context is the calling thread's (an
    asyncio caller's is its task's, which the test's loop thread is not)."""
    pytest.importorskip("opentelemetry")  # a test extra; optional for users
    from opentelemetry import context, trace

    from oncegate import Gate

    trace_id, span_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
    span = trace.NonRecordingSpan(
        trace.SpanContext(trace_id, span_id, is_remote=False, trace_flags=trace.TraceFlags(1))
    )
    sidecar, stream = relayed
    award = f"TRACE-{unique}"
    token = context.attach(trace.set_span_in_context(span))
    try:
        with Gate(sidecar.target, timeout=30.0) as gate:
            gate.submit(award, "2026-12-03T10:00:00Z", b"traced", 100)
    finally:
        context.detach(token)
    assert event_of(redis_client, stream, award)["traceparent"] == (
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    )
    untraced = f"PLAIN-{unique}"
    with Gate(sidecar.target, timeout=30.0) as gate:
        gate.submit(untraced, "2026-12-03T10:00:00Z", b"plain", 100)
    assert "traceparent" not in event_of(redis_client, stream, untraced)
