#!/usr/bin/env bash
# Builds the web console (console/src → console/dist, which is checked in and embedded by
# crates/console) from the npm packages pinned in console/package-lock.json. The packages are
# installed once into the test cache outside the clone, keyed by the lock file; the build then
# type-checks (tsc), bundles (esbuild) and writes console/dist/SOURCES.sha256, the digests of the
# sources it was built from (a Rust test fails when dist/ is older than its sources).
set -euo pipefail
cd "$(dirname "$0")/.."

key=$(sha256sum console/package-lock.json | cut -c1-16)
modules="${KODER_TEST_CACHE:-/var/cache/koder-sandbox-test}/console-npm-$key"
# The stamp is written last, so a half-made install is redone rather than trusted.
if [ ! -f "$modules/.installed" ]; then
  rm -rf "$modules"
  mkdir -p "$modules"
  cp console/package.json console/package-lock.json "$modules/"
  # playwright-core never downloads a browser; the tests drive Debian's chromium.
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix "$modules" --no-audit --no-fund --loglevel=error >/dev/null
  touch "$modules/.installed"
fi
ln -sfn "$modules/node_modules" console/node_modules

(cd console && node_modules/.bin/tsc -p tsconfig.json)
node console/build.mjs
# LC_ALL=C: the same order everywhere (the Rust test reads the list, not its order).
# Rewritten only when it changes (scripts/console-tests.sh rebuilds the daemon when dist/ is newer).
find console/src console/package.json console/package-lock.json console/build.mjs console/tsconfig.json \
  -type f | LC_ALL=C sort | xargs sha256sum >console/dist/SOURCES.sha256.new
if cmp -s console/dist/SOURCES.sha256.new console/dist/SOURCES.sha256; then
  rm console/dist/SOURCES.sha256.new
else
  mv console/dist/SOURCES.sha256.new console/dist/SOURCES.sha256
fi
echo "console: built console/dist ($(du -sh console/dist | cut -f1))"
