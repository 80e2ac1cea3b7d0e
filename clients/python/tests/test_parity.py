"""Key parity: Python == `oncegate key` == the key the running sidecar reports.

1,000 random submissions: random bytes (empty to 8 KiB), unicode award ids
(ASCII, Latin, Greek, Cyrillic, CJK, emoji, astral planes), timestamps with
0-9 fractional digits and varied offsets.
"""

from __future__ import annotations

import base64
import json
import random
import subprocess

import pytest

from conftest import seed_from_env, start_sidecar
from helpers import random_submission
from oncegate import Outcome, Submission, derive_idempotency_key

pytestmark = pytest.mark.sidecar

N = 1000
SEED = seed_from_env()


@pytest.fixture(scope="module")
def corpus():
    print(f"parity corpus seed: ONCEGATE_TEST_SEED={SEED}")
    rng = random.Random(SEED)
    subs = [random_submission(rng) for _ in range(N)]
    # Edge cases always present.
    subs[0] = Submission("A", "2026-11-29T10:57:45Z", b"", 1)
    subs[1] = Submission("x" * 128, "2026-11-29T10:57:45.123456789+05:30", b"\x00" * 1024, 2)
    subs[2] = Submission("🚀" * 32, "1999-12-31T23:59:59-00:00", "grüße".encode(), 3)
    return subs


def cli_key(binary, *args, stdin: bytes | None = None) -> str:
    result = subprocess.run(
        [str(binary), "key", *args], input=stdin, capture_output=True, timeout=60
    )
    assert result.returncode == 0, (
        f"oncegate key {args!r} exited {result.returncode}: {result.stderr.decode(errors='replace')}"
    )
    out = result.stdout.decode()
    assert out.endswith("\n") and out.count("\n") == 1, f"expected one key and a newline, got {out!r}"
    return out.strip()


def test_cli_jsonl_matches_python(oncegate_bin, corpus):
    lines = "".join(
        json.dumps(
            {
                "award_id": s.award_id,
                "submission_timestamp": s.submission_timestamp,
                "payload_b64": base64.b64encode(s.payload).decode(),
            }
        )
        + "\n"
        for s in corpus
    ).encode()
    result = subprocess.run(
        [str(oncegate_bin), "key", "--jsonl"], input=lines, capture_output=True, timeout=120
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    got = result.stdout.decode().splitlines()
    assert len(got) == len(corpus), f"expected {len(corpus)} keys, got {len(got)}"
    mismatches = []
    for i, (s, g) in enumerate(zip(corpus, got, strict=True)):
        expected = derive_idempotency_key(s.award_id, s.submission_timestamp, s.payload)
        if g != expected:
            mismatches.append((i, s.award_id, s.submission_timestamp, len(s.payload), g, expected))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]}"


def test_cli_single_matches_python(oncegate_bin, corpus, tmp_path):
    for i, s in enumerate(corpus[:40]):
        expected = derive_idempotency_key(s.award_id, s.submission_timestamp, s.payload)
        # `--flag=value` so award ids starting with '-' stay values.
        args = [f"--award-id={s.award_id}", f"--timestamp={s.submission_timestamp}"]
        if i % 2:
            payload_file = tmp_path / f"payload-{i}"
            payload_file.write_bytes(s.payload)
            got = cli_key(oncegate_bin, *args, f"--payload-file={payload_file}")
        else:
            got = cli_key(oncegate_bin, *args, stdin=s.payload)
        assert got == expected, (s.award_id, s.submission_timestamp, len(s.payload))


@pytest.fixture
def empty_gate(oncegate_bin, make_gate, tmp_path):
    """The client under test (sync, then asyncio) on a sidecar with an empty
    store of its own, so every corpus submission is new to it."""
    sc = start_sidecar(oncegate_bin, tmp_path / "parity")
    try:
        with make_gate(sc.target, timeout=30.0) as g:
            yield g
    finally:
        sc.stop()


def test_sidecar_decision_key_matches_python(empty_gate, corpus):
    gate = empty_gate
    for s in corpus:
        expected = derive_idempotency_key(s.award_id, s.submission_timestamp, s.payload)
        decision = gate.submit(
            award_id=s.award_id,
            submission_timestamp=s.submission_timestamp,
            payload=s.payload,
            amount_cents=s.amount_cents,
        )
        assert decision.idempotency_key == expected, (s.award_id, s.submission_timestamp)
        assert decision.outcome is Outcome.CLAIMED, (s.award_id, s.submission_timestamp, decision)
        assert decision.disbursement is not None
        assert decision.disbursement.award_id == s.award_id
        assert decision.disbursement.amount_cents == s.amount_cents
    # A redelivery of each of a sample resolves to the same key and result.
    for s in corpus[:50]:
        again = gate.submit(s.award_id, s.submission_timestamp, s.payload, s.amount_cents)
        assert again.outcome is Outcome.DUPLICATE
        assert again.idempotency_key == derive_idempotency_key(
            s.award_id, s.submission_timestamp, s.payload
        )
