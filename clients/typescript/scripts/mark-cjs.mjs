// dist/cjs holds the CommonJS build (for require(), and for a project `npm
// init` made, which is CommonJS); the package itself is "type": "module", so
// a package.json there tells Node and TypeScript that its .js and .d.ts
// files are CommonJS.
import { writeFileSync } from "node:fs";

writeFileSync(new URL("../dist/cjs/package.json", import.meta.url), JSON.stringify({ type: "commonjs" }) + "\n");
