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
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from . import _stubs
from .errors import GateError, error_for_status
from .key import Payload, payload_bytes
from .types import Decision, Disbursement, Outcome, ServingStatus, Submission, Tier

DEFAULT_TARGET = "127.0.0.1:50051"
#: Per-call deadline in seconds. A consumer should always have one: an
#: expired call raises DeadlineExceeded (retryable), never hangs the loop.
DEFAULT_TIMEOUT = 10.0

BatchItem = Submission | Mapping[str, Any]

HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"


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


def batch_results(response) -> list[Decision | GateError]:
    """One per item, in order: a Decision or a GateError *instance*."""
    results: list[Decision | GateError] = []
    for result in response.results:
        kind = result.WhichOneof("result")
        if kind == "decision":
            results.append(decision(result.decision))
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
