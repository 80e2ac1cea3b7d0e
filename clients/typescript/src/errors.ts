// gRPC status codes mapped to errors that say whether to retry: the Python
// client's table, in one place (DESIGN §1). The consumer's rule: ack only
// after a Decision; on an error do not ack, unless the error is poison:
// then dead-letter the message and ack. `actionFor(err)` says which.
import { status as Status } from "@grpc/grpc-js";

/** gRPC's names of the status codes (INVALID_ARGUMENT, CANCELLED, ...). */
export const CODE_NAMES = [
  "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
  "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
] as const;

export function codeName(code: number): string {
  return CODE_NAMES[code] ?? `CODE_${code}`;
}

/** Every error of an RPC: the status code, the sidecar's message (it names
 * the field or cause), whether a redelivery can succeed, whether the message
 * itself is bad. Codes outside the table (UNAUTHENTICATED, UNIMPLEMENTED,
 * ...) are a plain GateError: a deployment problem, not a message problem. */
export class GateError extends Error {
  readonly retryable: boolean = false;
  readonly poison: boolean = false;
  constructor(
    readonly code: number,
    readonly details: string,
  ) {
    super(`${codeName(code)}: ${details}`);
    this.name = new.target.name;
  }
  get codeName(): string {
    return codeName(this.code);
  }
}

/** INVALID_ARGUMENT: bad input, nothing written. Dead-letter, then ack. */
export class InvalidSubmission extends GateError {
  override readonly poison = true;
}
/** FAILED_PRECONDITION: the key was used for a different submission.
 * Dead-letter, then ack; investigate the producer. */
export class KeyReused extends GateError {
  override readonly poison = true;
}
/** FAILED_PRECONDITION "lease lost": the effect's lease token is no longer
 * the record's lease. Do not Complete. */
export class LeaseLost extends GateError {}
/** RESOURCE_EXHAUSTED about a size on an effect call: no retry fixes it. */
export class TooLarge extends GateError {
  override readonly poison = true;
}
/** Transient: do not ack; the redelivery (or a retry) resolves it.
 * ABORTED, INTERNAL, UNKNOWN, CANCELLED are this class itself. */
export class Retryable extends GateError {
  override readonly retryable = true;
}
/** UNAVAILABLE: the sidecar or its store is unreachable. */
export class Unavailable extends Retryable {}
/** RESOURCE_EXHAUSTED: over the in-flight or size limit; back off. */
export class ResourceExhausted extends Retryable {}
/** DEADLINE_EXCEEDED: the next Submit resolves whether it committed. */
export class DeadlineExceeded extends Retryable {}

type ErrorClass = new (code: number, details: string) => GateError;

/** The table: status code -> error class. */
const BY_CODE = new Map<number, ErrorClass>([
  [Status.INVALID_ARGUMENT, InvalidSubmission],
  [Status.FAILED_PRECONDITION, KeyReused],
  [Status.UNAVAILABLE, Unavailable],
  [Status.RESOURCE_EXHAUSTED, ResourceExhausted],
  [Status.DEADLINE_EXCEEDED, DeadlineExceeded],
  [Status.ABORTED, Retryable],
  [Status.INTERNAL, Retryable],
  [Status.UNKNOWN, Retryable],
  [Status.CANCELLED, Retryable],
]);

/** The error for a status code and message. */
export function errorForStatus(code: number, details: string): GateError {
  if (code === Status.FAILED_PRECONDITION && details.startsWith("lease lost")) {
    return new LeaseLost(code, details);
  }
  const cls = BY_CODE.get(code) ?? GateError;
  return new cls(code, details);
}

/** What a grpc-js call failed with, as a GateError. */
export function fromServiceError(err: { code?: number; details?: string; message?: string }): GateError {
  return errorForStatus(err.code ?? Status.UNKNOWN, err.details ?? err.message ?? "");
}

// A size in the message: the sidecar's "request is N bytes, the limit is M
// bytes", tonic's "found N bytes, the limit is: M bytes", grpc's "larger than max".
const SIZE_MESSAGE = /bytes, the limit is|larger than max/;

/** On an effect call, RESOURCE_EXHAUSTED about a size is TooLarge. */
export function effectError(err: GateError): GateError {
  if (err instanceof ResourceExhausted && SIZE_MESSAGE.test(err.details)) {
    return new TooLarge(err.code, err.details);
  }
  return err;
}

/** What a consumer does with a delivery after a call. */
export type Action = "ack" | "dead-letter" | "retry" | "hold";

/** The consumer's rule: no error -> ack; poison -> dead-letter (then ack);
 * retryable -> retry (no ack); anything else -> hold (no ack, alert: a
 * deployment problem). An error that is not a GateError is retry. */
export function actionFor(err: unknown): Action {
  if (err === undefined || err === null) return "ack";
  if (!(err instanceof GateError)) return "retry";
  if (err.poison) return "dead-letter";
  return err.retryable ? "retry" : "hold";
}
