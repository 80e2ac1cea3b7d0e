// The real oncegate sidecar for tests: `oncegate serve` on free loopback
// ports with embedded SQLite in a temporary directory, waited for until
// grpc.health.v1 answers SERVING.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, openSync, readFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { Gate } from "../src/index.js";

const REPO = resolve(import.meta.dirname, "../../../..");

/** ONCEGATE_BIN, or <repo>/target/debug/oncegate. */
export function binary(): string {
  const bin = process.env.ONCEGATE_BIN || join(REPO, "target/debug/oncegate");
  if (!existsSync(bin)) throw new Error(`no oncegate binary at ${bin} (run cargo build, or set ONCEGATE_BIN)`);
  return bin;
}

/** The shared vectors (clients/vectors/). */
export function vectorsPath(name: string): string {
  return join(REPO, "clients/vectors", name);
}

export function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as { port: number }).port;
      server.close(() => ok(port));
    });
    server.on("error", fail);
  });
}

export function tempDir(prefix = "oncegate-ts-"): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

export class Sidecar {
  private exited: Promise<number | null>;
  constructor(
    readonly target: string,
    readonly dir: string,
    readonly process: ChildProcess,
  ) {
    this.exited = new Promise((ok) => process.once("exit", (code) => ok(code)));
  }

  get logPath(): string {
    return join(this.dir, "oncegate.log");
  }

  logTail(n = 40): string {
    try {
      return readFileSync(this.logPath, "utf8").trimEnd().split("\n").slice(-n).join("\n");
    } catch {
      return "(no log)";
    }
  }

  /** SIGTERM, the drain, the exit code (SIGKILL after 25 s). */
  async stop(): Promise<number | null> {
    if (this.process.exitCode === null && this.process.signalCode === null) {
      this.process.kill("SIGTERM");
      const timer = setTimeout(() => this.process.kill("SIGKILL"), 25_000);
      const code = await this.exited;
      clearTimeout(timer);
      return code;
    }
    return this.process.exitCode;
  }
}

/** Starts a sidecar with the given extra environment and waits for SERVING
 * (in `dir` on `port` to start one again in place). */
export async function startSidecar(env: Record<string, string> = {}, dir = tempDir(), port?: number): Promise<Sidecar> {
  port ??= await freePort();
  const metricsPort = await freePort();
  const target = `127.0.0.1:${port}`;
  const clean = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !k.startsWith("ONCEGATE_") && k !== "DATABASE_URL" && k !== "REDIS_URL"),
  );
  const log = openSync(join(dir, "oncegate.log"), "a");
  const child = spawn(binary(), ["serve"], {
    cwd: dir,
    stdio: ["ignore", log, log],
    env: {
      ...clean,
      ONCEGATE_LISTEN: target,
      ONCEGATE_METRICS_LISTEN: `127.0.0.1:${metricsPort}`,
      ONCEGATE_SQLITE_PATH: join(dir, "oncegate.db"),
      ONCEGATE_INSTANCE_ID: `tstest-${port}`,
      RUST_LOG: "info",
      ...env,
    },
  });
  const sidecar = new Sidecar(target, dir, child);
  const gate = new Gate(target, { timeoutMs: 1000 });
  const deadline = Date.now() + 60_000;
  let last = "no answer";
  try {
    while (Date.now() < deadline) {
      if (child.exitCode !== null) throw new Error(`oncegate serve exited ${child.exitCode} before SERVING\n${sidecar.logTail()}`);
      try {
        if ((await gate.health()) === "SERVING") return sidecar;
      } catch (err) {
        last = String(err);
      }
      await new Promise((ok) => setTimeout(ok, 100));
    }
  } finally {
    gate.close();
  }
  child.kill("SIGKILL");
  throw new Error(`oncegate serve not SERVING after 60 s (${last})\n${sidecar.logTail()}`);
}
