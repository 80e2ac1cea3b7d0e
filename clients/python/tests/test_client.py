"""The Python client against a running sidecar: every outcome of the contract.

Each test that takes `gate` or `make_gate` runs twice: with the synchronous
`oncegate.Gate` and with the asyncio `oncegate.aio.Gate` (see conftest.py).
"""

from __future__ import annotations

import re
import urllib.request
import uuid

import grpc
import pytest

from conftest import health_status, start_sidecar
from oncegate import (
    Decision,
    GateError,
    InvalidSubmission,
    KeyReused,
    Outcome,
    ResourceExhausted,
    ServingStatus,
    Submission,
    Tier,
    derive_idempotency_key,
)

pytestmark = pytest.mark.sidecar

TS = "2026-11-29T10:57:45Z"
RECORDED_AT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
MIB = 1024 * 1024


def fresh(unique: str, n: int = 0, **overrides) -> Submission:
    fields = dict(
        award_id=f"AWD-{unique}",
        submission_timestamp=TS,
        payload=f'{{"unique":"{unique}","n":{n}}}'.encode(),
        amount_cents=1250 + n,
    )
    fields.update(overrides)
    return Submission(**fields)


def submit(gate, s: Submission) -> Decision:
    return gate.submit(
        award_id=s.award_id,
        submission_timestamp=s.submission_timestamp,
        payload=s.payload,
        amount_cents=s.amount_cents,
        idempotency_key=s.idempotency_key,
    )


def test_claimed_then_duplicate(gate, unique):
    s = fresh(unique)
    first = submit(gate, s)
    assert first.outcome is Outcome.CLAIMED and first.claimed
    assert first.idempotency_key == derive_idempotency_key(s.award_id, TS, s.payload)
    assert first.decided_by is Tier.DATABASE
    d = first.disbursement
    assert d is not None and d.id
    assert (d.award_id, d.amount_cents, d.sequence) == (s.award_id, s.amount_cents, 1)
    assert RECORDED_AT.match(d.recorded_at), d.recorded_at
    assert d.recorded_at_datetime.utcoffset().total_seconds() == 0

    for _ in range(3):
        again = submit(gate, s)
        assert again.outcome is Outcome.DUPLICATE and again.duplicate
        assert again.idempotency_key == first.idempotency_key
        assert again.disbursement == first.disbursement  # identical stored result
        assert again.decided_by in (Tier.LOCAL_CACHE, Tier.REDIS, Tier.DATABASE)


def test_sequence_is_per_award_in_commit_order(gate, unique):
    decisions = [submit(gate, fresh(unique, n)) for n in range(4)]
    assert [d.outcome for d in decisions] == [Outcome.CLAIMED] * 4
    assert [d.disbursement.sequence for d in decisions] == [1, 2, 3, 4]
    assert len({d.disbursement.id for d in decisions}) == 4
    other = submit(gate, fresh(unique + "-other"))
    assert other.disbursement.sequence == 1


def test_changed_payload_is_a_new_key_and_processed(gate, unique):
    a = submit(gate, fresh(unique, payload=b"v1"))
    b = submit(gate, fresh(unique, payload=b"v2"))
    assert a.idempotency_key != b.idempotency_key
    assert (a.outcome, b.outcome) == (Outcome.CLAIMED, Outcome.CLAIMED)


def test_timestamp_is_used_verbatim(gate, unique):
    a = submit(gate, fresh(unique, submission_timestamp="2026-11-29T10:57:45Z"))
    b = submit(gate, fresh(unique, submission_timestamp="2026-11-29T10:57:45.000Z"))
    c = submit(gate, fresh(unique, submission_timestamp="2026-11-29T11:57:45+01:00"))
    assert len({a.idempotency_key, b.idempotency_key, c.idempotency_key}) == 3
    assert {a.outcome, b.outcome, c.outcome} == {Outcome.CLAIMED}


INVALID = [
    ("award_id", dict(award_id="")),
    ("award_id", dict(award_id="AWD|1")),
    ("award_id", dict(award_id="x" * 129)),
    ("award_id", dict(award_id="AWD\n1")),
    ("award_id", dict(award_id="AWD\x001")),
    ("submission_timestamp", dict(submission_timestamp="")),
    ("submission_timestamp", dict(submission_timestamp="yesterday")),
    ("submission_timestamp", dict(submission_timestamp="2026-11-29")),
    ("submission_timestamp", dict(submission_timestamp="2026-13-29T10:57:45Z")),
    ("amount_cents", dict(amount_cents=0)),
    ("amount_cents", dict(amount_cents=-1250)),
]


@pytest.mark.parametrize("field,override", INVALID, ids=[f"{f}={v!r}"[:40] for f, o in INVALID for v in o.values()])
def test_invalid_argument_names_the_field_and_writes_nothing(gate, unique, field, override):
    s = fresh(unique, **override)
    with pytest.raises(InvalidSubmission) as info:
        submit(gate, s)
    err = info.value
    assert err.retryable is False
    assert field in err.message, f"message should name {field!r}: {err.message!r}"
    assert gate.lookup(s.key()) is None, "an invalid submission must write nothing"


def test_award_id_boundaries_accepted(gate, unique):
    long_id = (unique + "x" * 128)[:128]
    assert submit(gate, fresh(unique, award_id=long_id)).claimed
    assert submit(gate, fresh(unique, award_id="Förderung-助成金-🚀")).claimed


def test_payload_size_limit(gate, unique):
    at_limit = fresh(unique, payload=b"\x01" * MIB)
    assert submit(gate, at_limit).claimed
    over = fresh(unique, payload=b"\x02" * (MIB + 1))
    with pytest.raises(GateError) as info:
        submit(gate, over)
    # DESIGN §1: RESOURCE_EXHAUSTED "over the in-flight or size limit".
    assert isinstance(info.value, ResourceExhausted), repr(info.value)
    assert "payload" in info.value.message
    assert gate.lookup(over.key()) is None


def test_explicit_key_reuse(gate, unique):
    key = str(uuid.uuid4())
    s = fresh(unique, idempotency_key=key)
    first = submit(gate, s)
    assert first.claimed and first.idempotency_key == key
    assert submit(gate, s).duplicate
    # The fingerprint is (award_id, amount, payload digest): the timestamp is not part of it.
    same_fingerprint = fresh(unique, idempotency_key=key, submission_timestamp="2027-01-01T00:00:00Z")
    dup = submit(gate, same_fingerprint)
    assert dup.duplicate and dup.disbursement == first.disbursement

    for change in (dict(amount_cents=s.amount_cents + 1), dict(payload=b"other"),
                   dict(award_id=f"AWD-{unique}-other")):
        with pytest.raises(KeyReused) as info:
            submit(gate, fresh(unique, idempotency_key=key, **change))
        assert info.value.retryable is False
        assert "reused" in info.value.message.lower(), info.value.message
    # The stored result is untouched.
    assert gate.lookup(key).disbursement == first.disbursement


def test_derived_key_with_different_amount_is_key_reuse(gate, unique):
    # Same award, timestamp and payload => same derived key; a different amount
    # is a different submission and must not be silently answered DUPLICATE.
    s = fresh(unique)
    assert submit(gate, s).claimed
    with pytest.raises(KeyReused):
        submit(gate, fresh(unique, amount_cents=s.amount_cents + 100))


def test_lookup(gate, unique):
    s = fresh(unique)
    assert gate.lookup(s.key()) is None
    first = submit(gate, s)
    found = gate.lookup(s.key())
    assert found is not None
    assert found.idempotency_key == s.key()
    assert found.outcome is Outcome.DUPLICATE  # proto: stored result, outcome DUPLICATE
    assert found.disbursement == first.disbursement
    assert gate.lookup(uuid.uuid4().hex * 2) is None


def test_submit_batch_per_item_results(gate, unique):
    key = str(uuid.uuid4())
    a, b = fresh(unique, 1), fresh(unique, 2)
    items = [
        a,
        fresh(unique, 3, amount_cents=0),                    # invalid
        a,                                                   # duplicate within the batch
        b,
        fresh(unique, 4, idempotency_key=key),
        fresh(unique, 5, idempotency_key=key),               # same key, different submission
        dict(award_id="", submission_timestamp=TS, payload=b"", amount_cents=1),  # mapping form, invalid
    ]
    results = gate.submit_batch(items)
    assert len(results) == len(items)
    r_a, r_inv, r_dup, r_b, r_k, r_reuse, r_inv2 = results

    assert isinstance(r_a, Decision) and r_a.claimed
    assert isinstance(r_inv, InvalidSubmission) and "amount_cents" in r_inv.message
    assert isinstance(r_dup, Decision) and r_dup.duplicate
    assert r_dup.disbursement == r_a.disbursement
    assert isinstance(r_b, Decision) and r_b.claimed
    assert r_b.disbursement.sequence == r_a.disbursement.sequence + 1
    assert isinstance(r_k, Decision) and r_k.claimed and r_k.idempotency_key == key
    assert isinstance(r_reuse, KeyReused)
    assert isinstance(r_inv2, InvalidSubmission) and "award_id" in r_inv2.message

    # Committed items are visible; the invalid one wrote nothing.
    assert gate.lookup(a.key()).disbursement == r_a.disbursement
    assert gate.lookup(b.key()).disbursement == r_b.disbursement
    assert gate.lookup(fresh(unique, 3, amount_cents=0).key()) is None
    # A later batch sees the earlier commits as duplicates.
    again = gate.submit_batch([b])
    assert again[0].duplicate and again[0].disbursement == r_b.disbursement


def test_health_reports_both_service_names(sidecar):
    assert health_status(sidecar.target, "") == "SERVING"
    assert health_status(sidecar.target, "oncegate.v1.Gate") == "SERVING"


def test_health_method(gate):
    assert gate.health() is ServingStatus.SERVING
    assert gate.health("oncegate.v1.Gate") is ServingStatus.SERVING
    with pytest.raises(GateError) as info:
        gate.health("no.such.Service")
    assert info.value.code is grpc.StatusCode.NOT_FOUND
    assert info.value.retryable is False and info.value.poison is False


def test_metrics_endpoint(sidecar, gate, unique):
    submit(gate, fresh(unique))
    with urllib.request.urlopen(f"http://{sidecar.metrics_addr}/metrics", timeout=10) as response:
        assert response.status == 200
        body = response.read().decode()
    assert body.strip(), "metrics endpoint returned an empty body"


def test_sigterm_drains_and_exits_zero(oncegate_bin, make_gate, tmp_path, unique):
    sc = start_sidecar(oncegate_bin, tmp_path / "sigterm")
    try:
        with make_gate(sc.target, timeout=30) as g:
            assert submit(g, fresh(unique)).claimed
    finally:
        code = sc.stop(grace=30)
    assert code == 0, f"exit code {code} after SIGTERM; log:\n{sc.log_tail()}"
    # The commit survived the restart on the same SQLite file.
    sc2 = start_sidecar(oncegate_bin, tmp_path / "sigterm")
    try:
        with make_gate(sc2.target, timeout=30) as g:
            again = submit(g, fresh(unique))
            assert again.duplicate and again.decided_by is Tier.DATABASE
    finally:
        sc2.stop()
