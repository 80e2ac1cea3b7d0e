// npm's prepare step: builds dist/ (generated code, ES module and CommonJS
// builds). npm runs it on `npm install` here, and in a checkout's directory
// when a project installs or packs it (`npm install /path/to/clients/typescript`),
// where npm does not install this package's devDependencies: the build tools
// (buf, protoc-gen-es, tsc) are then installed from package-lock.json first.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL("..", import.meta.url));
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const run = (...args) => execFileSync(npm, args, { cwd: here, stdio: "inherit" });
const tools = ["buf", "protoc-gen-es", "tsc"].map((t) => `node_modules/.bin/${t}`);
if (!tools.every((t) => existsSync(new URL(`../${t}`, import.meta.url)))) {
  // --ignore-scripts: not this prepare again (buf runs without its postinstall).
  run("ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline", "--include=dev");
}
run("run", "build");
