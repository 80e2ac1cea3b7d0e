"""Effects outside the ledger (DESIGN §9) through the Python client: the
plain calls and the ``gate.effect`` context manager. Every test runs against
the synchronous and the asyncio client (see conftest.py)."""

from __future__ import annotations

import pytest

from conftest import start_sidecar
from oncegate import Acquired, Completed, InvalidSubmission, KeyReused, LeaseLost, Tier, TooLarge

pytestmark = pytest.mark.sidecar

MIB = 1024 * 1024


class Bank:
    """A payment provider that deduplicates on the idempotency key, as a
    real one does, and counts what it actually did."""

    def __init__(self) -> None:
        self.payments: dict[str, bytes] = {}
        self.calls = 0

    def pay(self, instruction: bytes, idempotency_key: str) -> bytes:
        self.calls += 1
        return self.payments.setdefault(idempotency_key, b"receipt:" + instruction)


def test_a_payment_is_made_exactly_once(gate, unique):
    bank = Bank()
    key = f"pay-{unique}"
    instruction = b"award AWD-1: $1,250.00 to account 42"
    seen = []
    for _ in range(3):  # the broker redelivers
        with gate.effect("payments", key, instruction) as fx:
            if fx.acquired:
                fx.result = bank.pay(instruction, idempotency_key=key)
        seen.append((fx.acquired, fx.attempt, fx.response))
        assert fx.completed_at
    assert bank.calls == 1
    assert seen == [
        (True, 1, b"receipt:" + instruction),
        (False, 1, b"receipt:" + instruction),
        (False, 1, b"receipt:" + instruction),
    ]


def test_an_exception_in_the_block_releases_and_the_next_attempt_acquires(gate, unique):
    key = f"notice-{unique}"
    with pytest.raises(RuntimeError, match="smtp down"):
        with gate.effect("notices", key, b"mail") as fx:
            assert fx.acquired and fx.attempt == 1
            raise RuntimeError("smtp down")
    with gate.effect("notices", key, b"mail") as fx:
        assert fx.acquired and fx.attempt == 2, "released: acquired at once, attempt + 1"
        fx.result = "sent"
    assert fx.response == b"sent"


def test_a_block_that_sets_no_result_leaves_the_lease_to_expire(gate, unique):
    key = f"silent-{unique}"
    with pytest.raises(ValueError, match="set no result"):
        with gate.effect("notices", key, b"mail", lease_ttl=0.5) as fx:
            assert fx.acquired
    with gate.effect("notices", key, b"mail", timeout=10) as fx:
        assert fx.acquired and fx.attempt == 2, "after the lease expired"
        fx.result = b"ok"


def test_plain_calls_fencing_and_refusals(gate, unique):
    key = f"plain-{unique}"
    first = gate.begin("ledger-x", key, b"req")
    assert isinstance(first, Acquired) and first.attempt == 1
    gate.release("ledger-x", key, first.lease_token, "provider refused")
    second = gate.begin("ledger-x", key, b"req")
    assert isinstance(second, Acquired) and second.attempt == 2
    with pytest.raises(LeaseLost):
        gate.complete("ledger-x", key, first.lease_token, b"late")
    at = gate.complete("ledger-x", key, second.lease_token, b"done")
    assert gate.complete("ledger-x", key, second.lease_token, b"done") == at
    stored = gate.begin("ledger-x", key, b"req")
    assert isinstance(stored, Completed)
    assert (stored.response, stored.completed_at, stored.attempt) == (b"done", at, 2)
    assert stored.decided_by in (Tier.LOCAL_CACHE, Tier.REDIS, Tier.DATABASE)
    with pytest.raises(KeyReused, match="different request"):
        gate.begin("ledger-x", key, b"another request")
    other = gate.begin("ledger-y", key, b"req")
    assert isinstance(other, Acquired) and other.attempt == 1, "another namespace, another record"
    gate.release("ledger-y", key, other.lease_token)
    with pytest.raises(InvalidSubmission, match="namespace"):
        gate.begin("Not Valid", key, b"req")


def test_oversized_request_and_response_are_too_large_and_not_retryable(gate, unique):
    key = f"big-{unique}"
    with pytest.raises(TooLarge) as info:
        gate.begin("payments", key, b"r" * (MIB + 1))
    err = info.value
    assert (err.retryable, err.poison, err.code.name) == (False, True, "RESOURCE_EXHAUSTED")
    assert err.message == f"request is {MIB + 1} bytes, the limit is {MIB} bytes"
    begun = gate.begin("payments", key, b"r" * MIB)
    assert isinstance(begun, Acquired) and begun.attempt == 1, "exactly 1 MiB; nothing written before"
    with pytest.raises(TooLarge, match="response is"):
        gate.complete("payments", key, begun.lease_token, b"x" * (MIB + 1))
    assert gate.complete("payments", key, begun.lease_token, b"x" * MIB), "the lease still holds"
    other = f"big-result-{unique}"
    with pytest.raises(TooLarge, match="response is"):
        with gate.effect("payments", other, b"r", lease_ttl=0.5) as fx:
            fx.result = b"x" * (MIB + 1)
    with gate.effect("payments", other, b"r", timeout=10) as fx:
        assert fx.acquired and fx.attempt == 2, "not completed: the lease was left to expire"
        fx.result = b"ok"


def test_a_message_over_the_sidecars_limit_is_too_large(oncegate_bin, make_gate, tmp_path, unique):
    limits = {"ONCEGATE_MAX_MESSAGE_BYTES": "65536", "ONCEGATE_MAX_PAYLOAD_BYTES": "16384"}
    sc = start_sidecar(oncegate_bin, tmp_path / "small", limits)
    try:
        with make_gate(sc.target, timeout=10) as small:
            with pytest.raises(TooLarge) as info:
                small.begin("payments", f"whole-{unique}", b"r" * 100_000)
            assert info.value.retryable is False and "too large" in info.value.message
            begun = small.begin("payments", f"whole-{unique}", b"r")
            assert isinstance(begun, Acquired) and begun.attempt == 1
    finally:
        sc.stop()
