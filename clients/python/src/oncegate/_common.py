"""What the synchronous and the asyncio client share, so they cannot drift apart.

``oncegate.Gate`` (``grpc``) and ``oncegate.aio.Gate`` (``grpc.aio``) differ
only in whether a call is awaited. Everything else lives here, once: the
target forms, the channel, building requests from plain values, turning
responses into :mod:`oncegate.types`, and the per-item batch errors. The
status -> exception mapping is :func:`oncegate.errors.from_rpc_error`, used by
both clients' ``_call``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, duration_pb2, message_factory

from . import _stubs
from .errors import GateError, TooLarge, error_for_status
from .key import Payload, payload_bytes
from .types import Acquired, Completed, Decision, Disbursement, Outcome, ServingStatus, Submission, Tier

DEFAULT_TARGET = "127.0.0.1:50051"
#: Per-call deadline in seconds. A consumer should always have one: an
#: expired call raises DeadlineExceeded (retryable), never hangs the loop.
DEFAULT_TIMEOUT = 10.0

BatchItem = Submission | Mapping[str, Any]

HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"

try:  # optional: with the OpenTelemetry API installed, the current context is sent
    from opentelemetry import propagate as _otel_propagate
except ImportError:  # pragma: no cover - depends on the environment
    _otel_propagate = None


# -- trace context ------------------------------------------------------------


def trace_metadata(traceparent: str | None) -> tuple[tuple[str, str], ...] | None:
    """The W3C trace context sent with a ``Submit``: ``traceparent`` when the
    caller gives one (e.g. the header of the broker message being handled),
    else the current OpenTelemetry context when ``opentelemetry`` is
    installed, else none. The sidecar's server span continues it and the
    outbox event carries it on."""
    if traceparent:
        return (("traceparent", traceparent),)
    if _otel_propagate is None:
        return None
    carrier: dict[str, str] = {}
    _otel_propagate.inject(carrier)
    sent = tuple((k, v) for k, v in carrier.items() if k in ("traceparent", "tracestate"))
    return sent or None


# -- channel ------------------------------------------------------------------


def split_target(target: str, credentials: grpc.ChannelCredentials | None):
    """``host:port``, ``http://host:port`` or ``https://host:port`` (the form
    the ``oncegate submit --target`` CLI takes) -> (address, credentials or
    None for plaintext)."""
    secure = credentials is not None
    if target.startswith("http://"):
        target = target[len("http://") :]
    elif target.startswith("https://"):
        target = target[len("https://") :]
        secure = True
    target = target.rstrip("/")
    if secure:
        return target, credentials or grpc.ssl_channel_credentials()
    return target, None


def open_channel(grpc_module: ModuleType, target: str, credentials, options):
    """A channel from ``grpc`` or ``grpc.aio`` (same factory signatures)."""
    address, creds = split_target(target, credentials)
    if creds is not None:
        return grpc_module.secure_channel(address, creds, options)
    return grpc_module.insecure_channel(address, options)


class GateBase:
    """State shared by both clients. Subclasses set ``_grpc`` (``grpc`` or
    ``grpc.aio``) and implement ``_call``, sync or async."""

    _grpc: ModuleType

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        channel=None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        options: Sequence[tuple[str, Any]] | None = None,
    ):
        self.target = target
        self.timeout = timeout
        self._owns_channel = channel is None
        self._channel = channel or open_channel(self._grpc, target, credentials, options)
        self._stub = _stubs.gate_pb2_grpc.GateStub(self._channel)
        self._effects = _stubs.effects_pb2_grpc.EffectsStub(self._channel)
        self._health_check = self._channel.unary_unary(
            HEALTH_CHECK_METHOD,
            request_serializer=_HealthCheckRequest.SerializeToString,
            response_deserializer=_HealthCheckResponse.FromString,
        )

    def _deadline(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def __repr__(self) -> str:
        return f"{type(self).__module__}.{type(self).__qualname__}({self.target!r})"


# -- requests -----------------------------------------------------------------


def as_submission(item: BatchItem) -> Submission:
    if isinstance(item, Submission):
        return item
    if isinstance(item, Mapping):
        return Submission(**item)
    raise TypeError(f"submit_batch items must be Submission or mapping, not {type(item).__name__}")


def submission_pb(s: Submission):
    fields: dict[str, Any] = dict(
        award_id=s.award_id,
        submission_timestamp=s.submission_timestamp,
        payload=payload_bytes(s.payload),
        amount_cents=s.amount_cents,
    )
    if s.idempotency_key is not None:
        fields["idempotency_key"] = s.idempotency_key
    return _stubs.gate_pb2.Submission(**fields)


def submit_request(
    award_id: str,
    submission_timestamp: str,
    payload: Payload,
    amount_cents: int,
    idempotency_key: str | None,
):
    return submission_pb(
        Submission(award_id, submission_timestamp, payload, amount_cents, idempotency_key)
    )


def submit_batch_request(submissions: Iterable[BatchItem]):
    items = [as_submission(s) for s in submissions]
    return _stubs.gate_pb2.SubmitBatchRequest(submissions=[submission_pb(s) for s in items])


def lookup_request(idempotency_key: str):
    return _stubs.gate_pb2.LookupRequest(idempotency_key=idempotency_key)


def health_request(service: str):
    return _HealthCheckRequest(service=service)


# -- responses ----------------------------------------------------------------


def decision(pb) -> Decision:
    """The Decision; a GateError (UNKNOWN) is raised for one without its
    disbursement, which the sidecar never sends: not an answer to act on."""
    if not pb.HasField("disbursement"):
        raise error_for_status(grpc.StatusCode.UNKNOWN, "sidecar answered a Decision without its disbursement")
    d = pb.disbursement
    return Decision(
        outcome=Outcome(_stubs.gate_pb2.Outcome.Name(pb.outcome)),
        idempotency_key=pb.idempotency_key,
        disbursement=Disbursement(
            id=d.id,
            award_id=d.award_id,
            amount_cents=d.amount_cents,
            recorded_at=d.recorded_at,
            sequence=d.sequence,
        ),
        decided_by=Tier(_stubs.gate_pb2.Tier.Name(pb.decided_by)),
    )


def batch_results(response) -> list[Decision | GateError]:
    """One per item, in order: a Decision or a GateError *instance*."""
    results: list[Decision | GateError] = []
    for result in response.results:
        kind = result.WhichOneof("result")
        if kind == "decision":
            try:
                results.append(decision(result.decision))
            except GateError as e:
                results.append(e)
        elif kind == "error":
            results.append(error_for_status(result.error.code, result.error.message))
        else:
            results.append(
                error_for_status(grpc.StatusCode.UNKNOWN, "sidecar returned an empty result")
            )
    return results


def lookup_result(response) -> Decision | None:
    if not response.found:
        return None
    return decision(response.decision)


def serving_status(response) -> ServingStatus:
    return ServingStatus(_HealthCheckResponse.ServingStatus.Name(response.status))


# -- effects (DESIGN §9) ---------------------------------------------------------


#: Largest effect ``request`` and ``response`` (DESIGN §9). The sidecar
#: refuses more with RESOURCE_EXHAUSTED; checked here before sending, as
#: ``TooLarge``, because no retry can succeed.
EFFECT_MAX_BYTES = 1024 * 1024


def effect_bytes(field: str, value: Payload) -> bytes:
    """``value`` as bytes; ``TooLarge`` (naming ``field`` and both sizes, as
    the sidecar does) over :data:`EFFECT_MAX_BYTES`."""
    data = payload_bytes(value)
    if len(data) > EFFECT_MAX_BYTES:
        raise TooLarge(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{field} is {len(data)} bytes, the limit is {EFFECT_MAX_BYTES} bytes",
        )
    return data


def begin_request(namespace: str, idempotency_key: str, request: Payload, lease_ttl: float | None):
    fields: dict[str, Any] = dict(
        namespace=namespace,
        idempotency_key=idempotency_key,
        request=effect_bytes("request", request),
    )
    if lease_ttl is not None:
        ttl = duration_pb2.Duration()
        ttl.FromNanoseconds(int(round(lease_ttl * 1e9)))
        fields["lease_ttl"] = ttl
    return _stubs.effects_pb2.BeginRequest(**fields)


def begin_result(response) -> Acquired | Completed:
    kind = response.WhichOneof("outcome")
    if kind == "acquired":
        return Acquired(lease_token=response.acquired.lease_token, attempt=response.acquired.attempt)
    if kind == "completed":
        c = response.completed
        return Completed(
            response=c.response,
            completed_at=c.completed_at,
            attempt=c.attempt,
            decided_by=Tier(_stubs.gate_pb2.Tier.Name(c.decided_by)),
        )
    raise error_for_status(grpc.StatusCode.UNKNOWN, "sidecar answered Begin without an outcome")


def complete_request(namespace: str, idempotency_key: str, lease_token: str, response: Payload):
    return _stubs.effects_pb2.CompleteRequest(
        namespace=namespace,
        idempotency_key=idempotency_key,
        lease_token=lease_token,
        response=effect_bytes("response", response),
    )


def release_request(namespace: str, idempotency_key: str, lease_token: str, reason: str):
    return _stubs.effects_pb2.ReleaseRequest(
        namespace=namespace, idempotency_key=idempotency_key, lease_token=lease_token, reason=reason
    )


class Effect:
    """What ``Gate.effect`` yields: one effect, performed at most once.

    ``acquired``: this block holds the lease and must perform the effect and
    set ``result`` (the provider's response, bytes or str); on leaving the
    block it is committed with ``Complete`` (a result over 1 MiB raises
    ``TooLarge`` instead and leaves the lease to expire). An exception in the block
    releases the lease (the effect is taken not to have happened) and
    propagates. Not ``acquired``: the effect was done before; ``response``
    is its stored response and the block should do nothing.
    After the block, ``response`` and ``completed_at`` are the record's.
    """

    def __init__(self, namespace: str, idempotency_key: str, begun: Acquired | Completed):
        self.namespace = namespace
        self.idempotency_key = idempotency_key
        self.acquired = isinstance(begun, Acquired)
        self.attempt = begun.attempt
        self.lease_token = begun.lease_token if isinstance(begun, Acquired) else None
        self.response: bytes | None = None if isinstance(begun, Acquired) else begun.response
        self.completed_at: str | None = None if isinstance(begun, Acquired) else begun.completed_at
        self.result: Payload | None = None

    def __repr__(self) -> str:
        state = "acquired" if self.acquired else "completed"
        return f"Effect({self.namespace!r}, {self.idempotency_key!r}, {state}, attempt={self.attempt})"


def effect_exit(fx: Effect, exc: BaseException | None):
    """What leaving ``Gate.effect``'s block calls for: ``("complete",
    request)``, ``("release", request)`` or ``None``. A block that held the
    lease and set no result, without an exception, is an error: whether the
    effect happened is unknown, so the lease is left to expire (the next
    attempt is told, attempt > 1) and ``ValueError`` is raised."""
    if not fx.acquired:
        return None
    if exc is not None:
        if not isinstance(exc, Exception):
            # KeyboardInterrupt, SystemExit, task cancellation: like a crash,
            # whether the effect happened is unknown; the lease expires.
            return None
        reason = f"{type(exc).__name__}: {exc}"
        reason = "".join(c for c in reason if c.isprintable())[:256]
        return "release", release_request(fx.namespace, fx.idempotency_key, fx.lease_token, reason)
    if fx.result is None:
        raise ValueError(
            "the effect block held the lease but set no result: set fx.result to the provider's "
            "response (the lease is left to expire; the next attempt will ask the provider)"
        )
    # Over 1 MiB: TooLarge here, and (the effect having happened) the lease
    # is left to expire.
    request = complete_request(fx.namespace, fx.idempotency_key, fx.lease_token, fx.result)
    fx.response = request.response
    return "complete", request


# -- grpc.health.v1 messages ----------------------------------------------------
# The two messages of grpc.health.v1.Health/Check, built from a descriptor in
# a private pool: no runtime dependency on grpcio-health-checking, and no clash
# with it in the default pool when an application also imports it.


def _health_messages():
    f = descriptor_pb2.FileDescriptorProto(
        name="oncegate/_health_check.proto", package="grpc.health.v1", syntax="proto3"
    )
    request = f.message_type.add(name="HealthCheckRequest")
    request.field.add(
        name="service", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    response = f.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    response.field.add(
        name="status", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_ENUM,
        type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse")),
    )


_HealthCheckRequest, _HealthCheckResponse = _health_messages()
