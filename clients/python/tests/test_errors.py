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
    Unavailable,
    error_for_status,
)

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
