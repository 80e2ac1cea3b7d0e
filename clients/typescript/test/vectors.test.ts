// Parity with the shared vectors (clients/vectors/) and with the sidecar.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { after, before, test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { Metadata, type ServiceError } from "@grpc/grpc-js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import {
  actionFor, deriveIdempotencyKey, errorForStatus, Gate, GateError, payloadDigest, validate, type Submission,
} from "../src/index.js";
import { BeginRequestSchema } from "../src/gen/oncegate/v1/effects_pb.js";
import { binary, startSidecar, vectorsPath, type Sidecar } from "./sidecar.js";

type Json = Record<string, any>;
const load = (name: string): Json => JSON.parse(readFileSync(vectorsPath(name), "utf8"));

function bytes(req: Json, name: string): Buffer {
  const one = Buffer.from(req[`${name}_b64`] ?? "", "base64");
  return Buffer.concat(Array(req[`${name}_repeat`] ?? 1).fill(one));
}

function submissionOf(req: Json): Submission {
  return {
    awardId: req.award_id, submissionTimestamp: req.submission_timestamp, payload: bytes(req, "payload"),
    amountCents: BigInt(req.amount_cents), idempotencyKey: req.idempotency_key,
  };
}

let sidecar: Sidecar;
let gate: Gate;
before(async () => {
  sidecar = await startSidecar();
  gate = new Gate(sidecar.target, { timeoutMs: 30_000 });
});
after(async () => {
  gate.close();
  await sidecar.stop();
});

test("key vectors: digest, derived key, key, and the sidecar's Decision", async () => {
  const keys: Json[] = load("keys.json").keys;
  assert.ok(keys.length >= 60, `${keys.length} key vectors`);
  for (const v of keys) {
    const s = submissionOf(v);
    assert.equal(payloadDigest(s.payload), v.payload_sha256, v.name);
    assert.equal(deriveIdempotencyKey(s.awardId, s.submissionTimestamp, s.payload), v.derived_key, v.name);
    assert.equal(validate(s), null, `${v.name}: a valid vector refused`);
  }
  const decided = await Promise.all(keys.map((v) => gate.submit(submissionOf(v))));
  decided.forEach((d, i) => assert.equal(d.idempotencyKey, keys[i]!.key, keys[i]!.name));
  console.log(`parity: ${keys.length} key vectors (digest, derived key, key; the sidecar's Decision)`);
});

test("validate() gives every Submit rejection vector's code and message", () => {
  const vs: Json[] = load("rejections.json").rejections.filter((v: Json) => v.rpc === "Submit");
  for (const v of vs) {
    const err = validate(submissionOf(v.request), v.max_payload_bytes);
    assert.ok(err, `${v.name}: validate accepted it`);
    assert.deepEqual([err.codeName, err.details], [v.code, v.message], v.name);
  }
  console.log(`parity: validate() == ${vs.length} Submit rejection vectors`);
});

test("the sidecar refuses every rejection vector through the client, with its code and message", async () => {
  const vs: Json[] = load("rejections.json").rejections;
  let viaStub = 0;
  for (const v of vs) {
    const [err, stub] = await send(v);
    assert.ok(err instanceof GateError, `${v.name}: ${String(err)}`);
    assert.deepEqual([err.codeName, err.details], [v.code, v.message], `${v.name} (${v.rpc})`);
    if (v.code === "INVALID_ARGUMENT") assert.equal(actionFor(err), "dead-letter", v.name);
    if (stub) viaStub++;
  }
  console.log(`parity: the sidecar refused ${vs.length} rejection vectors with their code and message `
    + `(${vs.length - viaStub} through the client, ${viaStub} through the generated stub)`);
});

/** The vector's call; [its error, whether it went through the bare stub
 * because Begin's millisecond lease_ttl cannot express it]. */
async function send(v: Json): Promise<[unknown, boolean]> {
  const r = v.request;
  const fail = (p: Promise<unknown>) => p.then(() => undefined, (e: unknown) => e);
  switch (v.rpc) {
    case "Submit": return [await fail(gate.submit(submissionOf(r))), false];
    case "SubmitBatch": return [await fail(gate.submitBatch(Array(r.count).fill(submissionOf(r.submission)))), false];
    case "Lookup": return [await fail(gate.lookup(r.idempotency_key)), false];
    case "Complete":
      return [await fail(gate.complete(r.namespace, r.idempotency_key, r.lease_token, bytes(r, "response"))), false];
    case "Release": return [await fail(gate.release(r.namespace, r.idempotency_key, r.lease_token, r.reason)), false];
    case "Begin": return begin(r);
  }
  throw new Error(`${v.name}: unknown rpc ${v.rpc}`);
}

async function begin(r: Json): Promise<[unknown, boolean]> {
  const fail = (p: Promise<unknown>) => p.then(() => undefined, (e: unknown) => e);
  const ttl = r.lease_ttl;
  if (!ttl) return [await fail(gate.begin(r.namespace, r.idempotency_key, bytes(r, "request"))), false];
  const seconds = BigInt(ttl.seconds);
  if (ttl.nanos % 1_000_000 === 0 && ttl.nanos >= 0 && ttl.nanos < 1e9 && seconds >= 0n && seconds < 2n ** 40n) {
    const ms = Number(seconds) * 1000 + ttl.nanos / 1e6;
    if (create(BeginRequestSchema, { leaseTtl: durationFromMs(ms) }).leaseTtl!.seconds === seconds) {
      return [await fail(gate.begin(r.namespace, r.idempotency_key, bytes(r, "request"), ms)), false];
    }
  }
  const request = create(BeginRequestSchema, {
    namespace: r.namespace, idempotencyKey: r.idempotency_key, request: bytes(r, "request"),
    leaseTtl: { seconds, nanos: ttl.nanos },
  });
  const err = await new Promise<ServiceError | null>((ok) => gate.effectsStub.begin(request, new Metadata(), {}, (e) => ok(e)));
  return [err ? errorForStatus(err.code, err.details) : undefined, true];
}

test("1,000 random submissions: TypeScript == oncegate key == the sidecar's Decision", async () => {
  const subs = corpus(1000);
  const input = subs.map((s) => JSON.stringify({ award_id: s.awardId, submission_timestamp: s.submissionTimestamp,
    payload_b64: Buffer.from(s.payload as Uint8Array).toString("base64") })).join("\n") + "\n";
  const cli = spawnSync(binary(), ["key", "--jsonl"], { input, encoding: "utf8", maxBuffer: 1 << 26 });
  assert.equal(cli.status, 0, cli.stderr);
  const keys = cli.stdout.trimEnd().split("\n");
  assert.equal(keys.length, subs.length);
  const fresh = await startSidecar();
  const g = new Gate(fresh.target, { timeoutMs: 30_000 });
  try {
    for (let i = 0; i < subs.length; i += 8) {
      const chunk = subs.slice(i, i + 8);
      const decided = await Promise.all(chunk.map((s) => g.submit(s)));
      chunk.forEach((s, j) => {
        const want = deriveIdempotencyKey(s.awardId, s.submissionTimestamp, s.payload);
        assert.deepEqual([keys[i + j], decided[j]!.idempotencyKey, decided[j]!.outcome], [want, want, "CLAIMED"],
          `award ${JSON.stringify(s.awardId)} ts ${s.submissionTimestamp}`);
      });
    }
    for (const s of subs.slice(0, 50)) assert.equal((await g.submit(s)).outcome, "DUPLICATE");
  } finally {
    g.close();
    await fresh.stop();
  }
  console.log(`parity: ${subs.length} random submissions, TypeScript == oncegate key == the sidecar's Decision`);
});

// Printable characters from several planes (as the Python tests' pool).
const POOL = (() => {
  const pool: string[] = [];
  for (const [lo, hi] of [[0x21, 0x7e], [0xa1, 0x24f], [0x370, 0x4ff], [0x4e00, 0x4fff], [0x1f300, 0x1f64f], [0x10400, 0x1044f]]) {
    for (let c = lo!; c <= hi!; c++) {
      const ch = String.fromCodePoint(c);
      if (ch !== "|" && /^[\p{L}\p{M}\p{N}\p{P}\p{S}]$/u.test(ch) && validate({ awardId: ch, submissionTimestamp: "2026-01-01T00:00:00Z", payload: "", amountCents: 1 }) === null) pool.push(ch);
    }
  }
  return pool;
})();

function corpus(n: number): Submission[] {
  let seed = Number(process.env.ONCEGATE_TEST_SEED) || Math.floor(Math.random() * 2 ** 31);
  console.log(`parity corpus seed: ONCEGATE_TEST_SEED=${seed}`);
  const rnd = (k: number) => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return Math.floor(((seed >>> 8) / 2 ** 24) * k);
  };
  const two = (k: number) => String(k).padStart(2, "0");
  const subs: Submission[] = [];
  for (let i = 0; i < n; i++) {
    const award = Array.from({ length: 1 + rnd(32) }, () => POOL[rnd(POOL.length)]).join("");
    let ts = `${1970 + rnd(130)}-${two(1 + rnd(12))}-${two(1 + rnd(28))}T${two(rnd(24))}:${two(rnd(60))}:${two(rnd(60))}`;
    const digits = [0, 0, 1, 3, 6, 9][rnd(6)]!;
    if (digits) ts += "." + Array.from({ length: digits }, () => rnd(10)).join("");
    ts += ["Z", "+00:00", "-00:00", "+05:30", "-08:00", "+14:00", "-12:00", "+09:45"][rnd(8)];
    const size = [0, 1, 2, 16, 64, 255, 1024, rnd(8193)][rnd(8)]!;
    subs.push({ awardId: award, submissionTimestamp: ts, payload: Uint8Array.from({ length: size }, () => rnd(256)), amountCents: 1 + rnd(1e9) });
  }
  subs[0] = { awardId: "A", submissionTimestamp: "2026-11-29T10:57:45Z", payload: new Uint8Array(), amountCents: 1 };
  subs[1] = { awardId: "x".repeat(128), submissionTimestamp: "2026-11-29T10:57:45.123456789+05:30", payload: new Uint8Array(1024), amountCents: 2 };
  subs[2] = { awardId: "🚀".repeat(32), submissionTimestamp: "1999-12-31T23:59:59-00:00", payload: "grüße", amountCents: 3 };
  return subs;
}

