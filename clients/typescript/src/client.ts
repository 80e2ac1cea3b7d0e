// The idiomatic layer over the generated stubs: plain values in and out,
// a deadline on every call, errors as GateError subclasses (errors.ts),
// promises.
import * as grpc from "@grpc/grpc-js";
import { create } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Gate as GateService, LookupRequestSchema, SubmissionSchema, SubmitBatchRequestSchema } from "./gen/oncegate/v1/gate_pb.js";
import type { Decision as DecisionPb, Result as ResultPb } from "./gen/oncegate/v1/gate_pb.js";
import { BeginRequestSchema, CompleteRequestSchema, Effects as EffectsService, ReleaseRequestSchema } from "./gen/oncegate/v1/effects_pb.js";
import { Outcome as OutcomePb, Tier as TierPb } from "./gen/oncegate/v1/gate_pb.js";
import { effectError, errorForStatus, fromServiceError, GateError, InvalidSubmission, TooLarge } from "./errors.js";
import { payloadBytes, type Payload } from "./key.js";
import { stubClass, type MethodsOf, type StubMethods } from "./stub.js";
import { amountOf, type Submission } from "./validate.js";

export const DEFAULT_TARGET = "127.0.0.1:50051";
/** Milliseconds: the deadline of a call given none. An expired call is
 * DeadlineExceeded (retryable), it never hangs the loop. */
export const DEFAULT_TIMEOUT_MS = 10_000;
/** Largest effect request and response (DESIGN §9). */
export const EFFECT_MAX_BYTES = 1024 * 1024;

export type Outcome = "CLAIMED" | "DUPLICATE";
export type Tier = "LOCAL_CACHE" | "REDIS" | "DATABASE";
export interface Disbursement {
  id: string;
  awardId: string;
  amountCents: bigint;
  /** RFC 3339 UTC with microseconds. */
  recordedAt: string;
  /** Per award, 1, 2, 3, ... in commit order. */
  sequence: bigint;
}
/** The sidecar's answer to a delivery: CLAIMED (first time, committed now) or
 * DUPLICATE (committed before), with the stored disbursement, identical on
 * the first answer and every duplicate. Either way: commit or ack. */
export interface Decision {
  outcome: Outcome;
  /** The key the sidecar used: derived (64 hex characters) or the producer's. */
  idempotencyKey: string;
  /** Always present: the sidecar answers no Decision without its row. */
  disbursement: Disbursement;
  /** The tier that answered. */
  decidedBy: Tier;
}
/** Begin's answer: this caller holds the lease, or the stored response. */
export type Begun =
  | { acquired: true; leaseToken: string; attempt: number }
  | { acquired: false; response: Uint8Array; completedAt: string; attempt: number; decidedBy: Tier };

export interface CallOptions {
  /** Milliseconds; default: the client's. */
  timeoutMs?: number;
  /** W3C trace context to continue (the broker message's header, say). */
  traceparent?: string;
  signal?: AbortSignal;
}

export interface GateOptions {
  timeoutMs?: number;
  /** TLS; default plaintext ("https://" targets: TLS with the system roots). */
  credentials?: grpc.ChannelCredentials;
  channelOptions?: grpc.ClientOptions;
}

const GateStub = stubClass(GateService);
const EffectsStub = stubClass(EffectsService);
type Unary<Req, Res> = (req: Req, md: grpc.Metadata, opts: grpc.CallOptions, cb: (e: grpc.ServiceError | null, r?: Res) => void) => grpc.ClientUnaryCall;

/** Client of one sidecar (`oncegate.v1.Gate` and `oncegate.v1.Effects`). */
export class Gate {
  /** The bare generated stubs underneath. */
  readonly stub: grpc.Client & StubMethods<MethodsOf<typeof GateService>>;
  readonly effectsStub: grpc.Client & StubMethods<MethodsOf<typeof EffectsService>>;
  readonly timeoutMs: number;

  /** `target`: "host:port", "http://host:port" or "https://host:port". */
  constructor(readonly target: string = DEFAULT_TARGET, options: GateOptions = {}) {
    let address = target.replace(/\/$/, "");
    let credentials = options.credentials;
    if (address.startsWith("http://")) address = address.slice(7);
    else if (address.startsWith("https://")) {
      address = address.slice(8);
      credentials ??= grpc.credentials.createSsl();
    }
    credentials ??= grpc.credentials.createInsecure();
    this.stub = new GateStub(address, credentials, options.channelOptions);
    this.effectsStub = new EffectsStub(address, credentials, { ...options.channelOptions, channelOverride: this.stub.getChannel() });
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  }

  /** Decide one delivery: CLAIMED or DUPLICATE; rejects with a GateError. */
  async submit(s: Submission, options: CallOptions = {}): Promise<Decision> {
    const request = submissionPb(s);
    return decisionOf(await this.call(this.stub.submit, request, options));
  }

  /** One result per item, in order: a Decision or a GateError (per item,
   * resolved, not rejected); the call's own failure rejects. */
  async submitBatch(subs: Submission[], options: CallOptions = {}): Promise<(Decision | GateError)[]> {
    const request = create(SubmitBatchRequestSchema, { submissions: subs.map(submissionPb) });
    const response = await this.call(this.stub.submitBatch, request, options);
    return response.results.map(batchResult);
  }

  /** The stored result for a key (outcome DUPLICATE), or null. */
  async lookup(idempotencyKey: string, options: CallOptions = {}): Promise<Decision | null> {
    const response = await this.call(this.stub.lookup, create(LookupRequestSchema, { idempotencyKey }), options);
    return response.found && response.decision ? decisionOf(response.decision) : null;
  }

  /** grpc.health.v1 Check: "" the server, "oncegate.v1.Gate" the service. */
  health(service = "", options: CallOptions = {}): Promise<"UNKNOWN" | "SERVING" | "NOT_SERVING" | "SERVICE_UNKNOWN"> {
    const names = ["UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"] as const;
    return new Promise((resolve, reject) => {
      this.stub.makeUnaryRequest("/grpc.health.v1.Health/Check", encodeHealthRequest, decodeHealthStatus, service,
        new grpc.Metadata(), { deadline: this.deadline(options) }, (err, status) => {
          if (err) reject(fromServiceError(err));
          else resolve(names[status ?? 0] ?? "UNKNOWN");
        });
    });
  }

  /** Effects.Begin: the lease, or the stored response; waits (up to the
   * deadline) for a lease held elsewhere. `leaseTtlMs`: default 30 s. */
  async begin(namespace: string, idempotencyKey: string, request: Payload, leaseTtlMs?: number, options: CallOptions = {}): Promise<Begun> {
    const req = create(BeginRequestSchema, {
      namespace, idempotencyKey, request: checkSize("request", request),
      leaseTtl: leaseTtlMs === undefined ? undefined : durationFromMs(leaseTtlMs),
    });
    const r = await this.effectCall(this.effectsStub.begin, req, options);
    if (r.outcome.case === "acquired") return { acquired: true, leaseToken: r.outcome.value.leaseToken, attempt: r.outcome.value.attempt };
    if (r.outcome.case === "completed") {
      const c = r.outcome.value;
      return { acquired: false, response: c.response, completedAt: c.completedAt, attempt: c.attempt, decidedBy: TierPb[c.decidedBy] as Tier };
    }
    throw errorForStatus(grpc.status.UNKNOWN, "sidecar answered Begin without an outcome");
  }

  /** Effects.Complete: commits the response; resolves completed_at. A lease
   * taken over rejects with LeaseLost. */
  async complete(namespace: string, idempotencyKey: string, leaseToken: string, response: Payload, options: CallOptions = {}): Promise<string> {
    const req = create(CompleteRequestSchema, { namespace, idempotencyKey, leaseToken, response: checkSize("response", response) });
    return (await this.effectCall(this.effectsStub.complete, req, options)).completedAt;
  }

  /** Effects.Release: the effect certainly did not happen. */
  async release(namespace: string, idempotencyKey: string, leaseToken: string, reason = "", options: CallOptions = {}): Promise<void> {
    await this.effectCall(this.effectsStub.release, create(ReleaseRequestSchema, { namespace, idempotencyKey, leaseToken, reason }), options);
  }

  /** An effect performed at most once: completed before -> its stored
   * response (perform is not called); acquired -> perform(attempt), then
   * Complete with its result. A rejection of perform Releases the lease
   * (reject only when the provider certainly did not act) and is rethrown;
   * a crash leaves the lease to expire. */
  async effect(namespace: string, idempotencyKey: string, request: Payload,
    perform: (attempt: number) => Promise<Payload>, options: CallOptions = {}): Promise<Uint8Array> {
    const begun = await this.begin(namespace, idempotencyKey, request, undefined, options);
    if (!begun.acquired) return begun.response;
    let result: Payload;
    try {
      result = await perform(begun.attempt);
    } catch (err) {
      const reason = String(err instanceof Error ? `${err.name}: ${err.message}` : err).replace(/[^\P{C}]/gu, "").slice(0, 256);
      await this.release(namespace, idempotencyKey, begun.leaseToken, reason, options).catch((failed: unknown) => {
        if (err instanceof Error) err.message += ` (releasing the effect's lease failed too: ${String(failed)})`;
      });
      throw err;
    }
    const bytes = payloadBytes(result);
    await this.complete(namespace, idempotencyKey, begun.leaseToken, bytes, options);
    return bytes;
  }

  /** Closes the connection (both services share it); calls after this fail. */
  close(): void {
    this.stub.close();
  }

  private deadline(options: CallOptions): Date {
    return new Date(Date.now() + (options.timeoutMs ?? this.timeoutMs));
  }

  private call<Req, Res>(method: Unary<Req, Res>, request: Req, options: CallOptions): Promise<Res> {
    const metadata = new grpc.Metadata();
    if (options.traceparent) metadata.set("traceparent", options.traceparent);
    return new Promise((resolve, reject) => {
      const call = method.call(this.stub, request, metadata, { deadline: this.deadline(options) }, (err, response) => {
        if (err) reject(fromServiceError(err));
        else resolve(response!);
      });
      options.signal?.addEventListener("abort", () => call.cancel(), { once: true });
    });
  }

  private async effectCall<Req, Res>(method: Unary<Req, Res>, request: Req, options: CallOptions): Promise<Res> {
    try {
      return await this.call(method, request, options);
    } catch (err) {
      throw err instanceof GateError ? effectError(err) : err;
    }
  }
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** The request message. A string field with a lone surrogate cannot be sent
 * as it is (UTF-8 would make it U+FFFD, another award id): InvalidSubmission,
 * the message's fault, never a transport error to retry. */
function submissionPb(s: Submission) {
  for (const [field, value] of [["award_id", s.awardId], ["submission_timestamp", s.submissionTimestamp], ["idempotency_key", s.idempotencyKey ?? ""]] as const) {
    if (LONE_SURROGATE.test(value)) {
      throw new InvalidSubmission(grpc.status.INVALID_ARGUMENT, `${field} is not valid Unicode (a lone surrogate)`);
    }
  }
  const amount = amountOf(s.amountCents);
  if (amount === undefined) {
    throw new InvalidSubmission(grpc.status.INVALID_ARGUMENT, `amount_cents must be an int64, got ${String(s.amountCents)}`);
  }
  return create(SubmissionSchema, {
    awardId: s.awardId,
    submissionTimestamp: s.submissionTimestamp,
    payload: payloadBytes(s.payload),
    amountCents: amount,
    idempotencyKey: s.idempotencyKey,
  });
}

/** The Decision, or the GateError a Decision without its disbursement is (the
 * sidecar always sends it: one without is not an answer to act on). */
function decisionOrError(d: DecisionPb): Decision | GateError {
  const b = d.disbursement;
  if (!b) return errorForStatus(grpc.status.UNKNOWN, "sidecar answered a Decision without its disbursement");
  return {
    outcome: OutcomePb[d.outcome] as Outcome,
    idempotencyKey: d.idempotencyKey,
    disbursement: { id: b.id, awardId: b.awardId, amountCents: b.amountCents, recordedAt: b.recordedAt, sequence: b.sequence },
    decidedBy: TierPb[d.decidedBy] as Tier,
  };
}

function decisionOf(d: DecisionPb): Decision {
  const decision = decisionOrError(d);
  if (decision instanceof GateError) throw decision;
  return decision;
}

function batchResult(r: ResultPb): Decision | GateError {
  if (r.result.case === "decision") return decisionOrError(r.result.value);
  if (r.result.case === "error") return errorForStatus(r.result.value.code, r.result.value.message);
  return errorForStatus(grpc.status.UNKNOWN, "sidecar returned an empty result");
}

function checkSize(field: string, value: Payload): Uint8Array {
  const bytes = payloadBytes(value);
  if (bytes.length > EFFECT_MAX_BYTES) {
    throw new TooLarge(grpc.status.RESOURCE_EXHAUSTED, `${field} is ${bytes.length} bytes, the limit is ${EFFECT_MAX_BYTES} bytes`);
  }
  return bytes;
}

// grpc.health.v1: HealthCheckRequest { string service = 1 } and
// HealthCheckResponse { ServingStatus status = 1 }, by hand (two fields).
function encodeHealthRequest(service: string): Buffer {
  const s = Buffer.from(service, "utf8");
  return s.length === 0 ? Buffer.alloc(0) : Buffer.concat([Buffer.from([0x0a, ...varint(s.length)]), s]);
}
function decodeHealthStatus(b: Buffer): number {
  return b[0] === 0x08 ? (b[1] ?? 0) : 0;
}
function varint(n: number): number[] {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  out.push(n);
  return out;
}
