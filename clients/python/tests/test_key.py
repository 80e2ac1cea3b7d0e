"""derive_idempotency_key == DESIGN.md §1, without the sidecar: known answers,
the shared vectors (clients/vectors/keys.json, read by every client's tests)
and random input."""

from __future__ import annotations

import random
import re
from hashlib import sha256

import pytest

from helpers import random_submission
from oncegate import Submission, derive_idempotency_key
from vectors import key_vectors

# Known answers, checked independently with coreutils:
#   d=$(printf '%s' '{"amount":1250}' | sha256sum | cut -d' ' -f1)
#   printf '%s' "AWD-2026-0001|2026-11-29T10:57:45Z|$d" | sha256sum
VECTORS = [
    ("AWD-2026-0001", "2026-11-29T10:57:45Z", b'{"amount":1250}',
     "866c826b79c20a5313849a749f9aef04d49a5dffb30f97944814a543b705395d"),
    # The timestamp is used verbatim: the same instant written differently is a different key.
    ("AWD-2026-0001", "2026-11-29T10:57:45.000Z", b'{"amount":1250}',
     "be12239d735d6dc591a0a1dabcd9f691025f566463913b05758ab5d061b7947d"),
    ("Zuschuss-Ä€-🚀", "2026-11-29T10:57:45+01:00", b"",
     "5982f2356d33903b7bf01b666738ea30fa25602cc38815980cd19e1026b0cd22"),
    ("x", "2026-01-01T00:00:00Z", bytes(range(256)),
     "498dd030b5ca5302a77e723fbb5476e51bca425c66ed6ab6b38375de5945eef2"),
]


def design_reference(award_id: str, submission_timestamp: str, payload: bytes) -> str:
    # Verbatim from DESIGN.md §1.
    payload_digest = sha256(payload).hexdigest()
    key = sha256(f"{award_id}|{submission_timestamp}|{payload_digest}".encode()).hexdigest()
    return key


@pytest.mark.parametrize("award_id,timestamp,payload,expected", VECTORS)
def test_known_answers(award_id, timestamp, payload, expected):
    assert derive_idempotency_key(award_id, timestamp, payload) == expected


def test_shared_key_vectors():
    vectors = key_vectors()
    assert len(vectors) >= 90
    for v in vectors:
        payload = v.payload()
        assert sha256(payload).hexdigest() == v.payload_sha256, v.name
        assert derive_idempotency_key(v.award_id, v.submission_timestamp, payload) == v.derived_key, v.name
        assert v.submission().key() == v.key, v.name


def test_matches_design_reference_on_random_input():
    rng = random.Random(20261129)
    for _ in range(1000):
        s = random_submission(rng)
        key = derive_idempotency_key(s.award_id, s.submission_timestamp, s.payload)
        assert key == design_reference(s.award_id, s.submission_timestamp, s.payload)
        assert re.fullmatch(r"[0-9a-f]{64}", key)


def test_payload_types():
    expected = derive_idempotency_key("A", "2026-01-01T00:00:00Z", "grüße".encode())
    assert derive_idempotency_key("A", "2026-01-01T00:00:00Z", "grüße") == expected
    assert derive_idempotency_key("A", "2026-01-01T00:00:00Z", bytearray("grüße".encode())) == expected
    assert derive_idempotency_key("A", "2026-01-01T00:00:00Z", memoryview("grüße".encode())) == expected
    with pytest.raises(TypeError):
        derive_idempotency_key("A", "2026-01-01T00:00:00Z", 12)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        derive_idempotency_key(b"A", "2026-01-01T00:00:00Z", b"")  # type: ignore[arg-type]


def test_submission_key_prefers_explicit_key():
    s = Submission("A", "2026-01-01T00:00:00Z", b"p", 100)
    assert s.key() == derive_idempotency_key("A", "2026-01-01T00:00:00Z", b"p")
    assert Submission("A", "2026-01-01T00:00:00Z", b"p", 100, "my-uuid").key() == "my-uuid"
