// Bundles the console into agentenv/console/assets: one script, one stylesheet and the
// page, each also gzipped so the server sends the smaller file when the browser takes it.
import { build } from "esbuild";
import { copyFileSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "agentenv", "console", "assets");

rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
await build({
  entryPoints: { app: join(here, "src", "main.tsx") },
  bundle: true,
  minify: true,
  sourcemap: false,
  format: "esm",
  target: ["chrome110", "firefox115", "safari16"],
  jsx: "automatic",
  jsxImportSource: "preact",
  outdir: out,
  legalComments: "none",
  logLevel: "warning",
});
copyFileSync(join(here, "src", "index.html"), join(out, "index.html"));
const sizes = {};
for (const name of readdirSync(out)) {
  const raw = readFileSync(join(out, name));
  const packed = gzipSync(raw, { level: 9 });
  writeFileSync(join(out, name + ".gz"), packed);
  sizes[name] = { bytes: raw.length, gzipped: packed.length };
}
writeFileSync(join(out, "sizes.json"), JSON.stringify(sizes, null, 1) + "\n");
console.log(Object.entries(sizes).map(([n, s]) => `${n} ${s.gzipped} B gzipped`).join("\n"));
