"""gRPC status codes mapped to exceptions that say whether to retry.

The consumer's rule (DESIGN.md §1): ack the broker only after a Decision.
On any error do not ack. ``GateError.retryable`` tells the consumer whether a
redelivery can succeed; ``False`` on a per-message error (``InvalidSubmission``,
``KeyReused``) means redelivering will fail the same way forever, so
dead-letter the message (and then ack it).
"""

from __future__ import annotations

import re
from typing import ClassVar

import grpc

_CODES_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


class GateError(Exception):
    """Base class: the sidecar (or the transport) refused or failed the call."""

    retryable: ClassVar[bool] = False
    #: True when the error is about this message (dead-letter it), not about
    #: the sidecar or its deployment.
    poison: ClassVar[bool] = False

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code.name}, message={self.message!r})"


class InvalidSubmission(GateError):
    """INVALID_ARGUMENT: bad input, nothing written. Do not retry: dead-letter."""

    poison = True


class KeyReused(GateError):
    """FAILED_PRECONDITION: the idempotency key was already used for a different
    submission (award_id, amount or payload differ). Do not retry: dead-letter
    and investigate the producer."""

    poison = True


class LeaseLost(GateError):
    """FAILED_PRECONDITION, "lease lost": an effect's lease token is no longer
    the record's current lease (it expired and another attempt took it, or it
    was released). Do not Complete: the current holder decides the effect."""


class Retryable(GateError):
    """Transient: do not ack; the broker's redelivery (or a retry) resolves it."""

    retryable = True


class Unavailable(Retryable):
    """UNAVAILABLE: the sidecar or its authoritative store is unreachable."""


class ResourceExhausted(Retryable):
    """RESOURCE_EXHAUSTED: over the in-flight or size limit; back off."""


class TooLarge(GateError):
    """RESOURCE_EXHAUSTED over a size limit of an effect call: its ``request``
    or ``response`` is over 1 MiB (checked before sending), or the whole
    message is over the sidecar's message limit. No retry fixes it: dead-letter.
    (An effect call over the in-flight limit stays ``ResourceExhausted``.)"""

    poison = True


class DeadlineExceeded(Retryable):
    """DEADLINE_EXCEEDED: the call's deadline passed; the outcome is resolved by
    the next Submit of the same delivery."""


_BY_CODE: dict[grpc.StatusCode, type[GateError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidSubmission,
    grpc.StatusCode.FAILED_PRECONDITION: KeyReused,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    # Transient in gRPC's own sense: the same call may succeed later.
    grpc.StatusCode.ABORTED: Retryable,
    grpc.StatusCode.INTERNAL: Retryable,
    grpc.StatusCode.UNKNOWN: Retryable,
    grpc.StatusCode.CANCELLED: Retryable,
}


def error_for_status(code: grpc.StatusCode | int, message: str) -> GateError:
    """The exception for a status; codes outside the table (UNAUTHENTICATED,
    PERMISSION_DENIED, UNIMPLEMENTED, ...) give a plain, non-retryable
    ``GateError``: a deployment problem, not a message problem."""
    if isinstance(code, int):
        code = _CODES_BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    if code == grpc.StatusCode.FAILED_PRECONDITION and message.startswith("lease lost"):
        return LeaseLost(code, message)
    return _BY_CODE.get(code, GateError)(code, message)


# A size in the message: the sidecar's "request is N bytes, the limit is M
# bytes", tonic's "found N bytes, the limit is: M bytes" (the message limit),
# grpc's "... larger than max (N vs. M)".
_SIZE_MESSAGE = re.compile(r"bytes, the limit is|larger than max")


def effect_error(err: GateError) -> GateError:
    """An effect call's error: ``TooLarge`` for RESOURCE_EXHAUSTED about a
    size (the same call can never succeed), ``err`` otherwise."""
    if type(err) is ResourceExhausted and _SIZE_MESSAGE.search(err.message):
        return TooLarge(err.code, err.message)
    return err


def from_rpc_error(error: grpc.RpcError) -> GateError:
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return error_for_status(code or grpc.StatusCode.UNKNOWN, details or "")
