#!/usr/bin/env bash
# E2B's code-interpreter JS suite against koder-sandbox: js/tests of e2b-dev/code-interpreter
# at the revision scripts/e2b-code-interpreter-tests.sh pins, run by vitest against that
# SDK's own sources, against a real daemon this script starts, the way
# scripts/e2b-upstream-js-tests.sh runs E2B's JS SDK suite (E2B_DOMAIN, the preloaded resolver,
# the verdict of scripts/lib/e2b-upstream.sh). Left out: the Bun and Deno runtimes (the SDK
# under other JS engines, not the server).
#
# E2B's code is never copied into this repository: E2B_CI_GIT_DIR names a clone of
# https://github.com/e2b-dev/code-interpreter holding the revision; without it the script says
# so and skips. scripts/e2b-code-interpreter-js-expected.txt lists the tests not expected to
# pass here, by `<file> > <full name>`, with reasons; the run fails when another test fails.
# Closes with "e2b-code-interpreter-js: N passed, M failed, K skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
EXPECTED=scripts/e2b-code-interpreter-js-expected.txt
CI_REV=$(sed -n 's/^CI_REV=//p' scripts/e2b-code-interpreter-tests.sh)

. scripts/lib/e2b-upstream.sh
. scripts/lib/e2b-upstream-js.sh
upstream_can_run e2b-code-interpreter-js e2b-dev/code-interpreter "$CI_REV" E2B_CI_GIT_DIR

. scripts/lib/daemon.sh
upstream_extract "$E2B_CI_GIT_DIR" "$CI_REV" js pnpm-lock.yaml
sdk="$UPSTREAM_WORK/js"
upstream_js_modules "$sdk" "$sdk/package.json" "$UPSTREAM_WORK/pnpm-lock.yaml" js vitest dotenv

cat >"$sdk/koder.vitest.config.mts" <<'TS'
import { defineConfig } from 'vitest/config'

// E2B's own config but for its .env file, which a run here does not have.
export default defineConfig({
  test: {
    include: ['tests/**/*.test.ts'],
    exclude: ['tests/runtimes/**'],
    globals: false,
    testTimeout: 60_000,
    environment: 'node',
    deps: { interopDefault: true },
  },
})
TS

upstream_daemon e2b-code-interpreter-js
status=0
(
  cd "$sdk"
  E2B_DOMAIN="$E2B_DOMAIN_NAME" E2B_API_KEY="$DAEMON_KEY1" \
    NODE_EXTRA_CA_CERTS="$UPSTREAM_CA" KODER_E2B_HOSTS="$UPSTREAM_HOSTS" \
    NODE_OPTIONS="--require $repo/scripts/lib/e2b_upstream_dns.cjs" \
    node_modules/.bin/vitest run --config koder.vitest.config.mts --reporter=default \
    --reporter=json --outputFile.json="$UPSTREAM_WORK/vitest.json" "$@"
) || status=$?
[ "$status" -le 1 ] || daemon_log_tail

upstream_vitest_results "$sdk/" "$UPSTREAM_WORK/vitest.json" >"$UPSTREAM_WORK/results.json"
upstream_verdict e2b-code-interpreter-js "$UPSTREAM_WORK/results.json" "$EXPECTED" "$status" ||
  exit 1
