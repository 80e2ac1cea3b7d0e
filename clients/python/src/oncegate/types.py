"""Plain, typed values for the oncegate API (no protobuf in user code)."""

from __future__ import annotations

import datetime as _dt
import enum
from dataclasses import dataclass

from .key import Payload, derive_idempotency_key, payload_bytes


class Outcome(enum.Enum):
    UNSPECIFIED = "OUTCOME_UNSPECIFIED"
    #: First delivery: the side effect was committed by this call.
    CLAIMED = "CLAIMED"
    #: Already committed earlier; the stored original result is returned.
    DUPLICATE = "DUPLICATE"


class Tier(enum.Enum):
    """Which tier answered the decision."""

    UNSPECIFIED = "TIER_UNSPECIFIED"
    LOCAL_CACHE = "LOCAL_CACHE"
    REDIS = "REDIS"
    DATABASE = "DATABASE"


class ServingStatus(enum.Enum):
    """A ``grpc.health.v1`` answer, as returned by ``Gate.health``."""

    UNKNOWN = "UNKNOWN"
    SERVING = "SERVING"
    #: Draining (SIGTERM) or not ready: send nothing new to this sidecar.
    NOT_SERVING = "NOT_SERVING"
    SERVICE_UNKNOWN = "SERVICE_UNKNOWN"


@dataclass(frozen=True)
class Submission:
    """One delivery, as handed to ``Gate.submit_batch``."""

    award_id: str
    submission_timestamp: str
    payload: Payload
    amount_cents: int
    idempotency_key: str | None = None

    def key(self) -> str:
        """The key the sidecar will use: the explicit one, else the derived one."""
        if self.idempotency_key is not None:
            return self.idempotency_key
        return derive_idempotency_key(self.award_id, self.submission_timestamp, self.payload)

    @property
    def payload_bytes(self) -> bytes:
        return payload_bytes(self.payload)


@dataclass(frozen=True)
class Disbursement:
    """The ledger row written by the first delivery; identical on every duplicate."""

    id: str
    award_id: str
    amount_cents: int
    #: RFC 3339 UTC with microseconds, verbatim from the sidecar.
    recorded_at: str
    #: Per-award sequence number, 1, 2, 3, ... in commit order.
    sequence: int

    @property
    def recorded_at_datetime(self) -> _dt.datetime:
        return _dt.datetime.fromisoformat(self.recorded_at.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Decision:
    """The sidecar's answer. Any Decision means: ack the broker."""

    outcome: Outcome
    idempotency_key: str
    #: Always there: the row the first delivery wrote, the same on every duplicate.
    disbursement: Disbursement
    decided_by: Tier

    @property
    def claimed(self) -> bool:
        return self.outcome is Outcome.CLAIMED

    @property
    def duplicate(self) -> bool:
        return self.outcome is Outcome.DUPLICATE


@dataclass(frozen=True)
class Acquired:
    """``Effects.Begin``: this caller holds the record's lease. Perform the
    effect (passing the same idempotency key to the provider), then
    ``complete`` with its response, or ``release`` if it certainly did not
    happen. ``attempt > 1``: an earlier attempt may have reached the
    provider; ask it (with the same key) before acting again."""

    lease_token: str
    attempt: int


@dataclass(frozen=True)
class Completed:
    """``Effects.Begin``: the effect is done; its stored response."""

    response: bytes
    #: RFC 3339 UTC with microseconds.
    completed_at: str
    attempt: int
    decided_by: Tier
