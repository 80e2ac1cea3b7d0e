"""The shared vectors (clients/vectors/) against the real sidecar through the
Python client: every key vector is CLAIMED with its key, then DUPLICATE; every
rejection vector raises the GateError its code maps to, with the exact
message, and writes nothing."""

from __future__ import annotations

import pytest

from oncegate import GateError, Outcome
from oncegate import _stubs
from vectors import key_vectors, rejections, request_body, submission_of

pytestmark = pytest.mark.sidecar

TIMEOUT = 60.0


def _lease_ttl(v):
    from google.protobuf import duration_pb2

    if "lease_ttl" not in v:
        return None
    return duration_pb2.Duration(seconds=int(v["lease_ttl"]["seconds"]), nanos=v["lease_ttl"]["nanos"])


def _effects_request(rpc: str, v: dict):
    pb = _stubs.effects_pb2
    fenced = dict(namespace=v["namespace"], idempotency_key=v["idempotency_key"])
    if rpc == "Begin":
        return pb.BeginRequest(**fenced, request=request_body(v, "request"), lease_ttl=_lease_ttl(v))
    if rpc == "Complete":
        return pb.CompleteRequest(**fenced, lease_token=v["lease_token"], response=request_body(v, "response"))
    return pb.ReleaseRequest(**fenced, lease_token=v["lease_token"], reason=v["reason"])


def answer(gate, rpc: str, v: dict):
    """Sends one vector's request as the client does (the effects' raw
    requests, so that every field reaches the sidecar as written)."""
    if rpc == "Submit":
        s = submission_of(v)
        return gate.submit(s.award_id, s.submission_timestamp, s.payload, s.amount_cents, s.idempotency_key,
                           timeout=TIMEOUT)
    if rpc == "SubmitBatch":
        return gate.submit_batch([submission_of(v["submission"])] * v["count"], timeout=TIMEOUT)
    if rpc == "Lookup":
        return gate.lookup(v["idempotency_key"], timeout=TIMEOUT)
    method = getattr(gate._effects, rpc)
    return gate._effect_call(method, _effects_request(rpc, v), TIMEOUT)


@pytest.mark.parametrize("r", rejections(), ids=lambda r: f"{r['rpc']}: {r['name']}")
def test_rejection_vector(sync_gate, r):
    with pytest.raises(GateError) as info:
        answer(sync_gate, r["rpc"], r["request"])
    err = info.value
    assert (err.code.name, err.message) == (r["code"], r["message"])
    # The table: INVALID_ARGUMENT is poison (dead-letter); a Submit over a size
    # limit stays retryable, an effect call's is TooLarge (poison).
    if r["code"] == "INVALID_ARGUMENT":
        assert err.poison and not err.retryable
    if r["rpc"] == "Submit" and r["code"] == "INVALID_ARGUMENT":
        s = submission_of(r["request"])
        if s.idempotency_key is None:
            assert sync_gate.lookup(s.key()) is None, "a rejected submission was written"


def test_key_vectors_are_claimed_with_their_keys(oncegate_bin, tmp_path):
    from conftest import start_sidecar
    from oncegate import Gate

    sidecar = start_sidecar(oncegate_bin, tmp_path / "vectors")
    try:
        with Gate(sidecar.target, timeout=TIMEOUT) as gate:
            for v in key_vectors():
                s = v.submission()
                d = gate.submit(s.award_id, s.submission_timestamp, s.payload, s.amount_cents, s.idempotency_key)
                assert (d.outcome, d.idempotency_key) == (Outcome.CLAIMED, v.key), v.name
                again = gate.submit(s.award_id, s.submission_timestamp, s.payload, s.amount_cents,
                                    s.idempotency_key)
                assert (again.outcome, again.disbursement) == (Outcome.DUPLICATE, d.disbursement), v.name
    finally:
        sidecar.stop()
