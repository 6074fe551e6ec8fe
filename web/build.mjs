// Builds web/dist from web/src with esbuild: content-hashed assets under
// dist/static/, dist/index.html pointing at them, and the licence texts of
// every bundled package. Run through build.sh (npm ci first) or `npm run build`.

import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const root = dirname(fileURLToPath(import.meta.url));
const src = join(root, "src");
const dist = join(root, "dist");
const statics = join(dist, "static");
const BUDGET = 1024 * 1024; // bytes of JS + CSS the page may load

rmSync(dist, { recursive: true, force: true });
mkdirSync(statics, { recursive: true });

const common = {
  bundle: true,
  minify: true,
  format: "iife",
  target: ["chrome109", "firefox115", "safari16"],
  outdir: statics,
  entryNames: "[name]-[hash]",
  assetNames: "[name]-[hash]",
  legalComments: "none",
  metafile: true,
  logLevel: "warning",
  absWorkingDir: root,
};

const app = await esbuild.build({ ...common, entryPoints: { app: join(src, "main.ts") } });
const frame = await esbuild.build({ ...common, entryPoints: { frame: join(src, "frame.ts") } });

const outputs = (result) => Object.keys(result.metafile.outputs).map((p) => p.replace(/^dist\//, ""));
const pick = (list, re) => {
  const found = list.find((p) => re.test(p));
  if (!found) throw new Error(`build: no output matching ${re}`);
  return found;
};
const appOut = outputs(app);
const appJs = pick(appOut, /^static\/app-\w+\.js$/);
const appCss = pick(appOut, /^static\/app-\w+\.css$/);
const frameJs = pick(outputs(frame), /^static\/frame-\w+\.js$/);

const hashed = (name, data) => {
  const h = createHash("sha256").update(data).digest("hex").slice(0, 8).toUpperCase();
  const dot = name.lastIndexOf(".");
  return `static/${name.slice(0, dot)}-${h}${name.slice(dot)}`;
};

const favicon = readFileSync(join(src, "favicon.svg"));
const faviconPath = hashed("favicon.svg", favicon);
writeFileSync(join(dist, faviconPath), favicon);

// Licence texts of the packages that ended up in the bundle.
const packages = new Set();
for (const input of Object.keys(app.metafile.inputs)) {
  const m = /node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(input);
  if (m) packages.add(m[1]);
}
let notices = "Third-party software bundled in kernelgate's web front-end (static/app-*.js):\n";
for (const name of [...packages].sort()) {
  const dir = join(root, "node_modules", name);
  const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
  const file = readdirSync(dir).find((f) => /^(licen[cs]e|copying)(\.(md|txt))?$/i.test(f));
  notices += `\n${"=".repeat(72)}\n${name} ${pkg.version} (${pkg.license ?? "see below"})\n${"=".repeat(72)}\n`;
  notices += file ? readFileSync(join(dir, file), "utf8").trim() + "\n" : "(no licence file in the package)\n";
}
const noticesPath = hashed("licenses.txt", notices);
writeFileSync(join(dist, noticesPath), notices);

const page = readFileSync(join(src, "index.html"), "utf8")
  .replace("{{APP_JS}}", appJs)
  .replace("{{APP_CSS}}", appCss)
  .replace("{{FRAME_JS}}", frameJs)
  .replace("{{FAVICON}}", faviconPath)
  .replace("{{LICENSES}}", noticesPath);
if (/\{\{\w+\}\}/.test(page)) throw new Error("build: unreplaced placeholder in index.html");
writeFileSync(join(dist, "index.html"), page);

const size = (p) => readFileSync(join(dist, p)).length;
const total = size(appJs) + size(appCss) + size(frameJs);
for (const p of [appJs, appCss, frameJs, faviconPath, noticesPath, "index.html"]) {
  console.log(`${String(size(p)).padStart(8)}  dist/${p}`);
}
console.log(`${String(total).padStart(8)}  total JS + CSS`);
if (total > BUDGET) {
  console.error(`build: the bundle is ${total} bytes, over the ${BUDGET} byte budget`);
  process.exit(1);
}
if (!existsSync(join(dist, "index.html"))) process.exit(1);
