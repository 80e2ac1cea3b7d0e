"""A thin, typed, synchronous client for the oncegate sidecar."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc

from . import _stubs
from .errors import GateError, error_for_status, from_rpc_error
from .key import Payload, payload_bytes
from .types import Decision, Disbursement, Outcome, Submission, Tier

DEFAULT_TARGET = "127.0.0.1:50051"
#: Per-call deadline in seconds. A consumer should always have one: an
#: expired call raises DeadlineExceeded (retryable), never hangs the loop.
DEFAULT_TIMEOUT = 10.0

BatchItem = Submission | Mapping[str, Any]


def _channel_for(target: str, credentials: grpc.ChannelCredentials | None, options) -> grpc.Channel:
    # Accept the URL form the `oncegate submit --target` CLI uses.
    secure = credentials is not None
    if target.startswith("http://"):
        target = target[len("http://") :]
    elif target.startswith("https://"):
        target = target[len("https://") :]
        secure = True
    target = target.rstrip("/")
    if secure:
        return grpc.secure_channel(target, credentials or grpc.ssl_channel_credentials(), options)
    return grpc.insecure_channel(target, options)


class Gate:
    """Client for ``oncegate.v1.Gate``.

    >>> gate = Gate("127.0.0.1:50051")
    >>> decision = gate.submit(award_id="A-1", submission_timestamp="2026-11-29T10:00:00Z",
    ...                        payload=b"...", amount_cents=1250)

    Every RPC error is raised as a :class:`oncegate.errors.GateError` subclass
    whose ``retryable`` attribute says whether a redelivery can succeed.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        channel: grpc.Channel | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        options: Sequence[tuple[str, Any]] | None = None,
    ):
        self.target = target
        self.timeout = timeout
        self._owns_channel = channel is None
        self._channel = channel or _channel_for(target, credentials, options)
        self._stub = _stubs.gate_pb2_grpc.GateStub(self._channel)

    # -- RPCs ---------------------------------------------------------------

    def submit(
        self,
        award_id: str,
        submission_timestamp: str,
        payload: Payload,
        amount_cents: int,
        idempotency_key: str | None = None,
        *,
        timeout: float | None = None,
    ) -> Decision:
        """Decide one delivery. Returns CLAIMED or DUPLICATE; raises GateError."""
        request = _submission_pb(
            Submission(award_id, submission_timestamp, payload, amount_cents, idempotency_key)
        )
        response = self._call(self._stub.Submit, request, timeout)
        return _decision(response)

    def submit_batch(
        self, submissions: Iterable[BatchItem], *, timeout: float | None = None
    ) -> list[Decision | GateError]:
        """Decide many deliveries: one result per item, in order.

        A per-item failure is *returned* as a GateError instance (not raised);
        a failure of the whole call is raised.
        """
        items = [_as_submission(s) for s in submissions]
        request = _stubs.gate_pb2.SubmitBatchRequest(submissions=[_submission_pb(s) for s in items])
        response = self._call(self._stub.SubmitBatch, request, timeout)
        results: list[Decision | GateError] = []
        for result in response.results:
            kind = result.WhichOneof("result")
            if kind == "decision":
                results.append(_decision(result.decision))
            elif kind == "error":
                results.append(error_for_status(result.error.code, result.error.message))
            else:
                results.append(
                    error_for_status(grpc.StatusCode.UNKNOWN, "sidecar returned an empty result")
                )
        return results

    def lookup(self, idempotency_key: str, *, timeout: float | None = None) -> Decision | None:
        """The stored result for a key (outcome DUPLICATE), or None if not found."""
        request = _stubs.gate_pb2.LookupRequest(idempotency_key=idempotency_key)
        response = self._call(self._stub.Lookup, request, timeout)
        if not response.found:
            return None
        return _decision(response.decision)

    # -- plumbing -----------------------------------------------------------

    def _call(self, method, request, timeout: float | None):
        try:
            return method(request, timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Gate({self.target!r})"


def _as_submission(item: BatchItem) -> Submission:
    if isinstance(item, Submission):
        return item
    if isinstance(item, Mapping):
        return Submission(**item)
    raise TypeError(f"submit_batch items must be Submission or mapping, not {type(item).__name__}")


def _submission_pb(s: Submission):
    fields: dict[str, Any] = dict(
        award_id=s.award_id,
        submission_timestamp=s.submission_timestamp,
        payload=payload_bytes(s.payload),
        amount_cents=s.amount_cents,
    )
    if s.idempotency_key is not None:
        fields["idempotency_key"] = s.idempotency_key
    return _stubs.gate_pb2.Submission(**fields)


def _decision(pb) -> Decision:
    disbursement = None
    if pb.HasField("disbursement"):
        d = pb.disbursement
        disbursement = Disbursement(
            id=d.id,
            award_id=d.award_id,
            amount_cents=d.amount_cents,
            recorded_at=d.recorded_at,
            sequence=d.sequence,
        )
    return Decision(
        outcome=Outcome(_stubs.gate_pb2.Outcome.Name(pb.outcome)),
        idempotency_key=pb.idempotency_key,
        disbursement=disbursement,
        decided_by=Tier(_stubs.gate_pb2.Tier.Name(pb.decided_by)),
    )
