// The error table, and every outcome of the API against the real sidecar.
import assert from "node:assert/strict";
import { test } from "node:test";
import { status } from "@grpc/grpc-js";
import {
  actionFor, DeadlineExceeded, deriveIdempotencyKey, EFFECT_MAX_BYTES, errorForStatus, Gate, GateError,
  InvalidSubmission, KeyReused, LeaseLost, ResourceExhausted, Retryable, TooLarge, Unavailable, type Submission,
} from "../src/index.js";
import { startSidecar } from "./sidecar.js";

test("the error table, code by code (the Python client's)", () => {
  const table: [number, string, Function, boolean, boolean, string][] = [
    [status.INVALID_ARGUMENT, "award_id is required", InvalidSubmission, false, true, "dead-letter"],
    [status.FAILED_PRECONDITION, "idempotency key reused with a different submission", KeyReused, false, true, "dead-letter"],
    [status.FAILED_PRECONDITION, "lease lost: the token does not hold this record's current lease", LeaseLost, false, false, "hold"],
    [status.UNAVAILABLE, "", Unavailable, true, false, "retry"],
    [status.RESOURCE_EXHAUSTED, "", ResourceExhausted, true, false, "retry"],
    [status.DEADLINE_EXCEEDED, "", DeadlineExceeded, true, false, "retry"],
    [status.ABORTED, "", Retryable, true, false, "retry"],
    [status.INTERNAL, "", Retryable, true, false, "retry"],
    [status.UNKNOWN, "", Retryable, true, false, "retry"],
    [status.CANCELLED, "", Retryable, true, false, "retry"],
    [status.UNAUTHENTICATED, "", GateError, false, false, "hold"],
    [status.PERMISSION_DENIED, "", GateError, false, false, "hold"],
    [status.UNIMPLEMENTED, "", GateError, false, false, "hold"],
    [status.NOT_FOUND, "", GateError, false, false, "hold"],
  ];
  for (const [code, message, cls, retryable, poison, action] of table) {
    const e = errorForStatus(code, message);
    assert.equal(e.constructor, cls, e.codeName);
    assert.deepEqual([e.retryable, e.poison, actionFor(e)], [retryable, poison, action], e.codeName);
  }
  assert.equal(actionFor(undefined), "ack");
  assert.equal(errorForStatus(status.CANCELLED, "").codeName, "CANCELLED");
});

const TS = "2026-11-29T10:57:45Z";
const sub = (awardId: string, submissionTimestamp: string, payload: string | Uint8Array, amountCents: number, idempotencyKey?: string): Submission =>
  ({ awardId, submissionTimestamp, payload, amountCents, idempotencyKey });

async function rejects<T extends GateError>(p: Promise<unknown>, cls: new (...a: any[]) => T, inMessage: string, what: string): Promise<T> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof cls, `${what}: ${String(err)}`);
  assert.ok((err as T).details.includes(inMessage), `${what}: ${(err as T).details}`);
  return err as T;
}

test("every outcome against the real sidecar, as the errors a TypeScript consumer sees", async () => {
  const sc = await startSidecar({ ONCEGATE_MAX_PAYLOAD_BYTES: "1000" });
  const gate = new Gate(sc.target);
  try {
    const first = await gate.submit(sub("AWD-1", TS, "p", 125_000));
    assert.equal(first.outcome, "CLAIMED");
    // (no ?.: the type says a Decision always carries its disbursement)
    assert.equal(first.disbursement.sequence, 1n);
    assert.equal(first.decidedBy, "DATABASE");
    const again = await gate.submit(sub("AWD-1", TS, "p", 125_000));
    assert.equal(again.outcome, "DUPLICATE");
    assert.deepEqual(again.disbursement, first.disbursement);
    assert.deepEqual((await gate.lookup(first.idempotencyKey))?.disbursement, first.disbursement);
    assert.equal(await gate.lookup(deriveIdempotencyKey("AWD-none", TS, "")), null);

    await rejects(gate.submit(sub("AWD-1", "yesterday", "p", 1)), InvalidSubmission, "submission_timestamp", "bad timestamp");
    const surrogate = await rejects(gate.submit(sub("AWD-\uD800", TS, "p", 1)), InvalidSubmission, "lone surrogate", "lone surrogate (never sent)");
    assert.equal(actionFor(surrogate), "dead-letter");
    await rejects(gate.submit(sub("AWD-1", TS, "p", 1.5)), InvalidSubmission, "amount_cents must be an int64", "a fractional amount (never sent)");
    await gate.submit(sub("AWD-2", TS, "one", 100, "intent-1"));
    await rejects(gate.submit(sub("AWD-2", TS, "one", 200, "intent-1")), KeyReused, "idempotency key reused", "key reuse");
    await rejects(gate.submit(sub("AWD-3", TS, new Uint8Array(1001), 1)), ResourceExhausted, "payload is 1001 bytes", "payload limit");
    await rejects(gate.submit(sub("AWD-4", TS, "p", 1), { timeoutMs: 0 }), DeadlineExceeded, "", "deadline");
    const unknown = await rejects(gate.health("no.such.Service"), GateError, "", "unknown health service");
    assert.equal(actionFor(unknown), "hold");
    assert.equal(await gate.health("oncegate.v1.Gate"), "SERVING");

    const batch = await gate.submitBatch([sub("AWD-5", TS, "a", 1), sub("AWD-5", TS, "a", 1), sub("", TS, "b", 1)]);
    assert.deepEqual(batch.slice(0, 2).map((r) => !(r instanceof GateError) && r.outcome), ["CLAIMED", "DUPLICATE"]);
    assert.ok(batch[2] instanceof InvalidSubmission);

    assert.equal(await sc.stop(), 0);
    const gone = await rejects(gate.submit(sub("AWD-6", TS, "p", 1)), Unavailable, "", "sidecar gone");
    assert.equal(actionFor(gone), "retry");
  } finally {
    gate.close();
    await sc.stop();
  }
});

test("effects: done once, a failed attempt released, a lost lease refused, too large refused before sending", async () => {
  const sc = await startSidecar();
  const gate = new Gate(sc.target);
  try {
    let calls = 0;
    for (let i = 0; i < 3; i++) {
      const got = await gate.effect("payments", "draw-1", "instr", async () => { calls++; return "receipt-1"; });
      assert.equal(Buffer.from(got).toString(), "receipt-1");
    }
    assert.equal(calls, 1, "the provider was called once");
    const refused = new Error("provider refused");
    await assert.rejects(gate.effect("payments", "draw-2", "i", async () => { throw refused; }), refused);
    const begun = await gate.begin("payments", "draw-2", "i");
    assert.ok(begun.acquired && begun.attempt === 2, "after a release the next Begin acquires, attempt 2");
    await gate.release("payments", "draw-2", begun.leaseToken, "test");
    await rejects(gate.complete("payments", "draw-2", begun.leaseToken, "late"), LeaseLost, "lease lost", "complete after release");
    const big = await rejects(gate.begin("payments", "draw-3", new Uint8Array(EFFECT_MAX_BYTES + 1)), TooLarge,
      "request is 1048577 bytes, the limit is 1048576 bytes", "request over 1 MiB");
    assert.equal(actionFor(big), "dead-letter");
  } finally {
    gate.close();
    await sc.stop();
  }
});
