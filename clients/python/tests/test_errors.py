"""Status code -> exception mapping, and real transport errors without the
sidecar, for both clients (sync and asyncio: the `make_gate` fixture)."""

from __future__ import annotations

import socket

import grpc
import pytest

from conftest import free_port
from oncegate import (
    DeadlineExceeded,
    GateError,
    InvalidSubmission,
    KeyReused,
    ResourceExhausted,
    Retryable,
    TooLarge,
    Unavailable,
    error_for_status,
)
from oncegate.errors import effect_error

TABLE = [
    (grpc.StatusCode.INVALID_ARGUMENT, InvalidSubmission, False),
    (grpc.StatusCode.FAILED_PRECONDITION, KeyReused, False),
    (grpc.StatusCode.UNAVAILABLE, Unavailable, True),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhausted, True),
    (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceeded, True),
    (grpc.StatusCode.ABORTED, Retryable, True),
    (grpc.StatusCode.INTERNAL, Retryable, True),
    (grpc.StatusCode.UNKNOWN, Retryable, True),
    (grpc.StatusCode.UNAUTHENTICATED, GateError, False),
    (grpc.StatusCode.PERMISSION_DENIED, GateError, False),
    (grpc.StatusCode.UNIMPLEMENTED, GateError, False),
]


@pytest.mark.parametrize("code,cls,retryable", TABLE)
def test_mapping(code, cls, retryable):
    for raw in (code, code.value[0]):  # by enum and by wire number (batch items)
        err = error_for_status(raw, "field award_id: must not be empty")
        assert type(err) is cls
        assert isinstance(err, GateError)
        assert err.retryable is retryable
        assert err.code is code
        assert err.message == "field award_id: must not be empty"
        assert "award_id" in str(err)
    assert issubclass(cls, Retryable) == retryable


def test_poison_only_for_message_errors():
    assert InvalidSubmission.poison and KeyReused.poison
    assert not Unavailable.poison and not GateError.poison


@pytest.mark.parametrize(
    "message",
    [
        "request is 1048577 bytes, the limit is 1048576 bytes",
        "Error, decoded message length too large: found 100012 bytes, the limit is: 65536 bytes",
        "Sent message larger than max (1048600 vs. 1048576)",
    ],
)
def test_an_effect_calls_size_refusal_is_too_large(message):
    err = effect_error(error_for_status(grpc.StatusCode.RESOURCE_EXHAUSTED, message))
    assert type(err) is TooLarge and err.message == message
    assert (err.retryable, err.poison) == (False, True)
    assert not isinstance(err, Retryable)


def test_an_effect_call_over_the_in_flight_limit_stays_retryable():
    busy = error_for_status(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "more than 4096 requests in flight; retry with backoff"
    )
    assert effect_error(busy) is busy and busy.retryable
    other = error_for_status(grpc.StatusCode.INVALID_ARGUMENT, "request is required")
    assert effect_error(other) is other


def test_unreachable_sidecar_is_unavailable_and_retryable(make_gate):
    with make_gate(f"127.0.0.1:{free_port()}", timeout=5) as gate:
        with pytest.raises(Unavailable) as info:
            gate.submit(award_id="A", submission_timestamp="2026-01-01T00:00:00Z",
                        payload=b"x", amount_cents=1)
    assert info.value.retryable is True
    assert isinstance(info.value.__cause__, grpc.RpcError)


def test_silent_server_is_deadline_exceeded_and_retryable(make_gate):
    # Accepts TCP connections and never speaks HTTP/2: the call can only time out.
    with socket.socket() as black_hole:
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(16)
        target = f"127.0.0.1:{black_hole.getsockname()[1]}"
        with make_gate(target, timeout=0.3) as gate:
            with pytest.raises(DeadlineExceeded) as info:
                gate.submit("A", "2026-01-01T00:00:00Z", b"x", 1)
    assert info.value.retryable is True


def test_http_target_form_is_accepted(make_gate):
    with make_gate(f"http://127.0.0.1:{free_port()}/", timeout=5) as gate:
        with pytest.raises(Unavailable):
            gate.lookup("0" * 64)


def test_a_decision_without_its_disbursement_is_not_an_answer():
    """The sidecar always sends a Decision's disbursement (the type says so):
    one without is an UNKNOWN error, raised, or an item's error in a batch."""
    from oncegate import _common, _stubs

    pb = _stubs.gate_pb2
    whole = pb.Decision(outcome=pb.CLAIMED, idempotency_key="k", decided_by=pb.DATABASE,
                        disbursement=pb.Disbursement(id="d", award_id="A", amount_cents=1,
                                                     recorded_at="2026-11-29T10:57:45.000000Z", sequence=1))
    assert _common.decision(whole).disbursement.id == "d"
    bare = pb.Decision(outcome=pb.CLAIMED, idempotency_key="k", decided_by=pb.DATABASE)
    with pytest.raises(GateError, match="without its disbursement") as raised:
        _common.decision(bare)
    assert raised.value.code == grpc.StatusCode.UNKNOWN and not raised.value.poison
    batch = pb.SubmitBatchResponse(results=[pb.Result(decision=whole), pb.Result(decision=bare)])
    first, second = _common.batch_results(batch)
    assert first.disbursement.id == "d"
    assert isinstance(second, GateError) and "without its disbursement" in second.message
