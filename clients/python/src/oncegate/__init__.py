"""oncegate: exactly-once effect for message consumers, via the oncegate sidecar.

    from oncegate import Gate, GateError
    gate = Gate("127.0.0.1:50051")
    decision = gate.submit(award_id=..., submission_timestamp=..., payload=..., amount_cents=...)
    # ack the broker now (CLAIMED or DUPLICATE); on GateError do not ack.

``oncegate.aio.Gate`` is the same client for asyncio (``grpc.aio``).
``Gate.effect(namespace, key, request)`` runs an effect outside the ledger
(a payment call, a notice) at most once, through ``oncegate.v1.Effects``.
``derive_idempotency_key`` and the exceptions work without the generated stubs;
``Gate`` and ``oncegate.aio`` need them (see generate.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import (
    DeadlineExceeded,
    GateError,
    InvalidSubmission,
    KeyReused,
    LeaseLost,
    ResourceExhausted,
    Retryable,
    TooLarge,
    Unavailable,
    error_for_status,
)
from .key import derive_idempotency_key
from .types import Acquired, Completed, Decision, Disbursement, Outcome, ServingStatus, Submission, Tier

if TYPE_CHECKING:
    from .client import Gate

__version__ = "1.0.0"

__all__ = [
    "Gate",
    "Acquired",
    "Completed",
    "Decision",
    "Disbursement",
    "Outcome",
    "ServingStatus",
    "Submission",
    "Tier",
    "GateError",
    "InvalidSubmission",
    "KeyReused",
    "LeaseLost",
    "Retryable",
    "Unavailable",
    "ResourceExhausted",
    "TooLarge",
    "DeadlineExceeded",
    "derive_idempotency_key",
    "error_for_status",
]


def __getattr__(name: str):
    # Gate needs the generated stubs; import it lazily so the key derivation
    # and the error types are usable (and testable) without them.
    if name == "Gate":
        from .client import Gate

        return Gate
    raise AttributeError(f"module 'oncegate' has no attribute {name!r}")
