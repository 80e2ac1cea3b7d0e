// What the client layer costs per submit over the bare generated stub, on
// one channel to a real sidecar, in the same run: L1 duplicates (the sidecar
// answers from its in-process cache, so it is not the bottleneck), one call
// at a time, rounds interleaved (stub, client, ...), a warm-up first, medians
// of the rounds; wall time and this process's CPU time per call.
// ONCEGATE_OVERHEAD_CALLS and ONCEGATE_OVERHEAD_ROUNDS size it.
import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { Metadata } from "@grpc/grpc-js";
import { deriveIdempotencyKey, Gate, type Submission } from "../src/index.js";
import { SubmissionSchema } from "../src/gen/oncegate/v1/gate_pb.js";
import { startSidecar } from "./sidecar.js";

const envInt = (name: string, fallback: number) => Number(process.env[name]) || fallback;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

test("overhead per submit against the bare generated stub", async () => {
  const [calls, rounds] = [envInt("ONCEGATE_OVERHEAD_CALLS", 300), envInt("ONCEGATE_OVERHEAD_ROUNDS", 5)];
  const sc = await startSidecar();
  const gate = new Gate(sc.target);
  try {
    const s: Submission = { awardId: "AWD-bench", submissionTimestamp: "2026-11-29T10:57:45Z", payload: new Uint8Array(256), amountCents: 100 };
    const key = deriveIdempotencyKey(s.awardId, s.submissionTimestamp, s.payload);
    const raw = create(SubmissionSchema, { awardId: s.awardId, submissionTimestamp: s.submissionTimestamp, payload: s.payload as Uint8Array, amountCents: 100n });
    const stubOnce = () => new Promise<void>((ok, fail) =>
      gate.stub.submit(raw, new Metadata(), { deadline: Date.now() + 10_000 }, (err, d) =>
        err || d?.idempotencyKey !== key ? fail(err ?? new Error("wrong key")) : ok()));
    const clientOnce = async () => assert.equal((await gate.submit(s)).idempotencyKey, key);
    const loop = async (n: number, once: () => Promise<void>) => { for (let i = 0; i < n; i++) await once(); };
    const measure = async (once: () => Promise<void>): Promise<[number, number]> => {
      const [c0, t0] = [process.cpuUsage(), process.hrtime.bigint()];
      await loop(calls, once);
      const wall = Number(process.hrtime.bigint() - t0) / 1000 / calls;
      const c = process.cpuUsage(c0);
      return [wall, (c.user + c.system) / calls];
    };
    await clientOnce(); // claim it: from here on every call is an L1 duplicate
    await loop(calls / 2, stubOnce);
    await loop(calls / 2, clientOnce);
    const d = await gate.submit(s);
    assert.deepEqual([d.outcome, d.decidedBy], ["DUPLICATE", "LOCAL_CACHE"]);
    const [sw, cw, scpu, ccpu]: number[][] = [[], [], [], []];
    for (let r = 0; r < rounds; r++) {
      const [w1, c1] = await measure(stubOnce);
      const [w2, c2] = await measure(clientOnce);
      sw!.push(w1); scpu!.push(c1); cw!.push(w2); ccpu!.push(c2);
    }
    const [a, b, c, e] = [median(sw!), median(cw!), median(scpu!), median(ccpu!)];
    console.log(`overhead ts: per submit (L1 duplicate, ${calls} calls x ${rounds} rounds, medians): bare stub ${a.toFixed(1)} µs wall `
      + `${c.toFixed(1)} µs CPU; client ${b.toFixed(1)} µs wall ${e.toFixed(1)} µs CPU; overhead ${(b - a >= 0 ? "+" : "") + (b - a).toFixed(1)} µs wall `
      + `(${(b / a).toFixed(2)}x), ${(e - c >= 0 ? "+" : "") + (e - c).toFixed(1)} µs CPU (${(e / c).toFixed(2)}x)`);
  } finally {
    gate.close();
    await sc.stop();
  }
});
