"""A thin, typed, synchronous client for the oncegate sidecar.

The asyncio client with the same methods is :class:`oncegate.aio.Gate`; both
build requests and read answers through :mod:`oncegate._common`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import grpc

from . import _common
from ._common import DEFAULT_TARGET, DEFAULT_TIMEOUT, BatchItem, Effect
from .errors import GateError, ResourceExhausted, effect_error, from_rpc_error
from .key import Payload
from .types import Acquired, Completed, Decision, ServingStatus

__all__ = ["Gate", "DEFAULT_TARGET", "DEFAULT_TIMEOUT"]


class Gate(_common.GateBase):
    """Client for ``oncegate.v1.Gate``.

    >>> gate = Gate("127.0.0.1:50051")
    >>> decision = gate.submit(award_id="A-1", submission_timestamp="2026-11-29T10:00:00Z",
    ...                        payload=b"...", amount_cents=1250)

    ``Gate(target="127.0.0.1:50051", *, channel=None, credentials=None,
    timeout=10.0, options=None)``: ``target`` also takes ``http://host:port``
    and ``https://host:port`` (TLS); ``credentials`` turn TLS on; ``timeout``
    is the default deadline per call in seconds; ``channel`` is a
    ``grpc.Channel`` of your own (then ``close`` leaves it open).

    Every RPC error is raised as a :class:`oncegate.errors.GateError` subclass
    whose ``retryable`` attribute says whether a redelivery can succeed.
    """

    _grpc = grpc

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
        traceparent: str | None = None,
    ) -> Decision:
        """Decide one delivery. Returns CLAIMED or DUPLICATE; raises GateError.

        ``traceparent`` (W3C) is the trace to continue; without it the current
        OpenTelemetry context is sent when ``opentelemetry`` is installed."""
        request = _common.submit_request(
            award_id, submission_timestamp, payload, amount_cents, idempotency_key
        )
        metadata = _common.trace_metadata(traceparent)
        return _common.decision(self._call(self._stub.Submit, request, timeout, metadata))

    def submit_batch(
        self,
        submissions: Iterable[BatchItem],
        *,
        timeout: float | None = None,
        traceparent: str | None = None,
    ) -> list[Decision | GateError]:
        """Decide many deliveries: one result per item, in order.

        A per-item failure is *returned* as a GateError instance (not raised);
        a failure of the whole call is raised.
        """
        request = _common.submit_batch_request(submissions)
        metadata = _common.trace_metadata(traceparent)
        return _common.batch_results(self._call(self._stub.SubmitBatch, request, timeout, metadata))

    def lookup(self, idempotency_key: str, *, timeout: float | None = None) -> Decision | None:
        """The stored result for a key (outcome DUPLICATE), or None if not found."""
        request = _common.lookup_request(idempotency_key)
        return _common.lookup_result(self._call(self._stub.Lookup, request, timeout))

    def health(self, service: str = "", *, timeout: float | None = None) -> ServingStatus:
        """``grpc.health.v1.Health/Check``: ``""`` is the whole server,
        ``"oncegate.v1.Gate"`` the Gate service. NOT_SERVING while draining.
        An unknown service raises GateError (NOT_FOUND)."""
        request = _common.health_request(service)
        return _common.serving_status(self._call(self._health_check, request, timeout))

    # -- Effects (DESIGN §9) -------------------------------------------------

    def begin(
        self,
        namespace: str,
        idempotency_key: str,
        request: Payload,
        *,
        lease_ttl: float | None = None,
        timeout: float | None = None,
    ) -> Acquired | Completed:
        """``Effects.Begin``: the lease (Acquired) or the stored response
        (Completed). Waits, up to ``timeout``, for a lease held elsewhere."""
        req = _common.begin_request(namespace, idempotency_key, request, lease_ttl)
        return _common.begin_result(self._effect_call(self._effects.Begin, req, timeout))

    def complete(
        self,
        namespace: str,
        idempotency_key: str,
        lease_token: str,
        response: Payload,
        *,
        timeout: float | None = None,
    ) -> str:
        """``Effects.Complete``: commits the response; returns completed_at.
        Raises LeaseLost when the token's lease was taken over."""
        req = _common.complete_request(namespace, idempotency_key, lease_token, response)
        return self._effect_call(self._effects.Complete, req, timeout).completed_at

    def release(
        self,
        namespace: str,
        idempotency_key: str,
        lease_token: str,
        reason: str = "",
        *,
        timeout: float | None = None,
    ) -> None:
        """``Effects.Release``: the effect certainly did not happen."""
        req = _common.release_request(namespace, idempotency_key, lease_token, reason)
        self._effect_call(self._effects.Release, req, timeout)

    @contextlib.contextmanager
    def effect(
        self,
        namespace: str,
        idempotency_key: str,
        request: Payload,
        *,
        lease_ttl: float | None = None,
        timeout: float | None = None,
    ) -> Iterator[Effect]:
        """An effect performed at most once (see :class:`oncegate._common.Effect`)::

            with gate.effect("payments", key, instruction) as fx:
                if fx.acquired:
                    fx.result = bank.pay(instruction, idempotency_key=key)
            receipt = fx.response
        """
        begun = self.begin(namespace, idempotency_key, request, lease_ttl=lease_ttl, timeout=timeout)
        fx = Effect(namespace, idempotency_key, begun)
        try:
            yield fx
        except BaseException as exc:
            self._finish(fx, _common.effect_exit(fx, exc), timeout, exc)
            raise
        self._finish(fx, _common.effect_exit(fx, None), timeout, None)

    def _finish(self, fx: Effect, action, timeout: float | None, exc: BaseException | None) -> None:
        if action is None:
            return
        kind, req = action
        try:
            if kind == "complete":
                fx.completed_at = self._effect_call(self._effects.Complete, req, timeout).completed_at
            else:
                self._effect_call(self._effects.Release, req, timeout)
        except GateError as failed:
            if exc is None:
                raise
            exc.add_note(f"releasing the effect's lease failed too: {failed!r}")

    # -- plumbing -----------------------------------------------------------

    def _call(self, method, request, timeout: float | None, metadata=None):
        try:
            return method(request, timeout=self._deadline(timeout), metadata=metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc

    def _effect_call(self, method, request, timeout: float | None):
        """``_call`` for ``oncegate.v1.Effects``: a size refusal is ``TooLarge``."""
        try:
            return self._call(method, request, timeout)
        except ResourceExhausted as exc:
            raise effect_error(exc) from exc.__cause__

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
