#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script).
# Jail tests need root (real namespaces and cgroups); unprivileged runs skip them and say so.
set -euo pipefail
cd "$(dirname "$0")/.."
# A suite run builds the workspace once: incremental caches would only double the debug target
# (~30 GB more), and CI's disk filled with them (exit 101, "No space left on device").
export CARGO_INCREMENTAL=0
scripts/setup.sh
scripts/setup-microvm.sh
scripts/setup-s3.sh  # the S3-protocol server the blob store's S3 tests run against (cached)
# A private PostgreSQL (Debian's package) the store's tests also run on; without it they would skip.
KODER_TEST_PG_URL=$(scripts/setup-postgres.sh | tail -n 1); export KODER_TEST_PG_URL KODER_TEST_REQUIRE_PG=1
# Style is part of the suite: formatting and every clippy warning fail it.
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Integration tests start the real agent binary, so every binary is built first.
cargo build --workspace --bins --locked
# ... and the agent as scripts/serve.sh runs it, statically linked: every daemon and jail test
# of the suite starts sandboxes with it (KODER_AGENT_BIN).
. scripts/lib/static-agent.sh
static_agent dev
# The microVM guest (kernel + root disk), built once into the test cache outside the clone and
# rebuilt when its recipe's version changes (minutes the first time).
export KODER_MICROVM_IMAGES="${KODER_TEST_CACHE:-/var/cache/koder-sandbox-test}/microvm-images"
target/debug/ksandbox image build --images-dir "$KODER_MICROVM_IMAGES"
# The language packs the image tests run on, built once into the test cache (keyed by recipe
# digest: a changed recipe is a new build, an unchanged one a look-up); tests link them into
# their data dirs.
export KODER_PACK_CACHE="${KODER_TEST_CACHE:-/var/cache/koder-sandbox-test}/packs"
for pack in python bash; do
  target/debug/ksandbox image build "$pack" --images-dir "$KODER_PACK_CACHE"
done
cargo test --workspace --locked
target/debug/koder-bench --smoke  # benchmark harness end to end, tiny counts, no timing asserted
scripts/e2b-tests.sh  # the real E2B SDKs from PyPI against the daemon (tests/e2b)
scripts/e2b-template-tests.sh  # E2B template builds through the real SDK on the cached bash pack (tests/e2b/test_templates.py)
scripts/e2b-js-tests.sh  # the real E2B JavaScript SDKs from npm against the daemon (tests/e2b-js)
scripts/go-sdk-tests.sh  # the Go SDK (sdks/go): go vet, unit tests, integration tests against the daemon
scripts/python-sdk-tests.sh  # the Python SDK (sdks/python) against the daemon
scripts/mcp-tests.sh  # the official MCP client from PyPI against `ksandbox mcp` (tests/mcp)
scripts/schemathesis-tests.sh  # schemathesis from PyPI against the daemon's /openapi.json (zero failures)
scripts/quickstart-tests.sh  # the README Quick start block, as typed, against the daemon
scripts/console-tests.sh  # the web console in headless Chromium (Playwright) against the daemon (tests/console)
