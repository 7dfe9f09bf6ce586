// Bundles the console into dist/ (checked in: the daemon embeds it, so a Rust-only build serves
// it). Run through scripts/console-build.sh, which installs the pinned packages first.
import { build, transform } from "esbuild";
import { copyFile, mkdir, readFile, writeFile } from "node:fs/promises";

const here = new URL(".", import.meta.url).pathname;
await mkdir(`${here}dist`, { recursive: true });
await build({
  entryPoints: [`${here}src/main.ts`],
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  // Licences go to dist/LICENSES.txt, not into the served files.
  legalComments: "none",
  outfile: `${here}dist/console.js`,
  logLevel: "warning",
});
const xterm = await readFile(`${here}node_modules/@xterm/xterm/css/xterm.css`, "utf8");
const own = await readFile(`${here}src/console.css`, "utf8");
const css = await transform(`${xterm}\n${own}`, { loader: "css", minify: true, legalComments: "none" });
await writeFile(`${here}dist/console.css`, css.code);
const licences = await Promise.all(
  ["@xterm/xterm", "@xterm/addon-fit"].map(async (p) => `${p}\n\n${await readFile(`${here}node_modules/${p}/LICENSE`, "utf8")}`),
);
await writeFile(`${here}dist/LICENSES.txt`, licences.join("\n\n"));
await copyFile(`${here}src/index.html`, `${here}dist/index.html`);
