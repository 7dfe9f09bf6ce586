// Bundles the console into dist/ (checked in: the daemon embeds it, so a Rust-only build serves
// it). Run through scripts/console-build.sh, which installs the pinned packages first. A file is
// rewritten only when its content changes, so an unchanged build leaves the daemon's build fresh.
import { build, transform } from "esbuild";
import { mkdir, readFile, writeFile } from "node:fs/promises";

const here = new URL(".", import.meta.url).pathname;
const dist = `${here}dist`;

async function put(name, content) {
  const old = await readFile(`${dist}/${name}`, "utf8").catch(() => null);
  if (old !== content) await writeFile(`${dist}/${name}`, content);
}

await mkdir(dist, { recursive: true });
const js = await build({
  entryPoints: [`${here}src/main.ts`],
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  // Licences go to dist/LICENSES.txt, not into the served files.
  legalComments: "none",
  write: false,
  outfile: `${dist}/console.js`,
  logLevel: "warning",
});
await put("console.js", js.outputFiles[0].text);
const xterm = await readFile(`${here}node_modules/@xterm/xterm/css/xterm.css`, "utf8");
const own = await readFile(`${here}src/console.css`, "utf8");
const css = await transform(`${xterm}\n${own}`, { loader: "css", minify: true, legalComments: "none" });
await put("console.css", css.code);
await put("index.html", await readFile(`${here}src/index.html`, "utf8"));
const licences = await Promise.all(
  ["@xterm/xterm", "@xterm/addon-fit"].map(async (p) => `${p}\n\n${await readFile(`${here}node_modules/${p}/LICENSE`, "utf8")}`),
);
await put("LICENSES.txt", licences.join("\n\n"));
