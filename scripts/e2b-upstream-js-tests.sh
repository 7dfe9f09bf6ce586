#!/usr/bin/env bash
# E2B's own JS test suite against koder-sandbox: the tests of E2B's JS SDK (packages/js-sdk/tests
# of e2b-dev/E2B at the revision pinned in scripts/lib/e2b-upstream.sh) run by vitest against the
# SDK's own sources of that revision, against a real daemon this script starts. Only E2B_DOMAIN
# points the SDK at it, as a deployment's wildcard DNS record would: the control plane is
# `https://api.<domain>` and each sandbox's envd `https://<port>-<id>.<domain>`, both served by
# the daemon's HTTPS listener (the suite's mocked tests expect exactly those URLs). The
# template suite runs on the Debian bash pack of the test cache (scripts/lib/e2b-base.sh: the
# `base` template, and the stand-in for `ubuntu:22.04`), and is left out when the cache holds
# none. Left out too: the browser, Cloudflare, Deno and Bun runtimes (the SDK under other JS
# engines, not the server). The Python twin is scripts/e2b-upstream-tests.sh.
#
# E2B's code is never copied into this repository: E2B_GIT_DIR names a clone of
# https://github.com/e2b-dev/E2B that holds the revision (see scripts/e2b-upstream-tests.sh).
# The SDK's dependencies and vitest are installed once into the test cache outside the clone,
# at the versions E2B's own pnpm-lock.yaml pins for packages/js-sdk
# (scripts/lib/e2b-upstream-js.sh). The vitest config is ours:
# E2B's loads the browser runner's Playwright, which the node tests do not need.
#
# scripts/lib/e2b_upstream_dns.cjs, preloaded into every node process, is the resolver: E2B's
# host names go to the daemon, every other name is refused. scripts/e2b-upstream-js-expected.txt
# lists the tests not expected to pass here, by `<file> > <full name>`, with reasons; `not-run`
# ones would make a sandbox reach public addresses and never run (their describe blocks are
# left out by name). The run fails when a test outside that list fails.
# Closes with "e2b-upstream-js: N passed, M failed, K skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
EXPECTED=scripts/e2b-upstream-js-expected.txt

. scripts/lib/e2b-upstream.sh
. scripts/lib/e2b-upstream-js.sh
upstream_can_run e2b-upstream-js

. scripts/lib/daemon.sh
upstream_extract "$E2B_GIT_DIR" "$E2B_REV" packages/js-sdk pnpm-lock.yaml
work=$UPSTREAM_WORK
sdk="$work/packages/js-sdk"

# The SDK's runtime dependencies and the test runner, at the versions of E2B's lock file
# (error-stack-parser-es: a devDependency the sources import; the SDK's build bundles it).
upstream_js_modules "$sdk" "$sdk/package.json" "$work/pnpm-lock.yaml" packages/js-sdk \
  vitest msw dotenv error-stack-parser-es

# Describe blocks holding a not-run test are left out whole, by a name pattern vitest matches
# against every test's full name (`<describe> <title>`).
skip=$(upstream_not_run "$EXPECTED" | sed -E 's/^[^>]*> //; s/ > .*//' | sort -u |
  sed -E 's/[][\\.^$*+?(){}|/]/\\&/g' | paste -sd'|')
. scripts/lib/e2b-base.sh
base_root=$(e2b_base_pack) || echo "e2b-upstream-js: no bash pack in the test cache; the template suite is left out"
cat >"$sdk/koder.vitest.config.mts" <<'TS'
import { defineConfig } from 'vitest/config'

// As E2B's own projects: suites patch global fetch and mock modules, template builds are slow.
const common = {
  isolate: true,
  globals: false,
  environment: 'node',
  setupFiles: ['tests/globalFetchFallback.setup.ts'],
  deps: { interopDefault: true },
} as const

export default defineConfig({
  test: {
    projects: [
      { test: { ...common, name: 'unit', testTimeout: 30_000, include: ['tests/**/*.test.ts'],
          exclude: ['tests/runtimes/**', 'tests/template/**', 'tests/connectionConfig.browser.test.ts'] } },
      { test: { ...common, name: 'template', testTimeout: 180_000,
          include: ['tests/template/**/*.test.ts'] } },
    ],
  },
})
TS

# One vitest project on one daemon: the suite's sandboxes run on the host image (git, Python,
# Node), its template builds on the Debian pack, which serves as `base` only on a daemon of its
# own. The worst runner status wins.
status=0
run_project() {
  local project=$1 extra=$2 ran=0
  upstream_daemon "e2b-upstream-js-$project" "$extra"
  [ -z "$extra" ] || e2b_base_import "$base_root" e2b-base ubuntu:22.04
  (
    cd "$sdk"
    E2B_DOMAIN="$E2B_DOMAIN_NAME" E2B_API_KEY="$DAEMON_KEY1" \
      NODE_EXTRA_CA_CERTS="$UPSTREAM_CA" KODER_E2B_HOSTS="$UPSTREAM_HOSTS" \
      NODE_OPTIONS="--require $repo/scripts/lib/e2b_upstream_dns.cjs" \
      node_modules/.bin/vitest run --config koder.vitest.config.mts --project "$project" \
      --testNamePattern "^(?!($skip) )" --reporter=default --reporter=json \
      --outputFile.json="$work/vitest-$project.json" "${@:3}"
  ) || ran=$?
  [ "$ran" -le 1 ] || daemon_log_tail
  [ "$ran" -le "$status" ] || status=$ran
  stop_daemon
}
run_project unit "" "$@"
[ -z "$base_root" ] || run_project template "$E2B_BASE_CONFIG" "$@"

upstream_vitest_results "$sdk/" "$work"/vitest-*.json >"$work/results.json"
upstream_verdict e2b-upstream-js "$work/results.json" "$EXPECTED" "$status" || exit 1
