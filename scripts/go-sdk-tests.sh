#!/usr/bin/env bash
# The Go SDK (sdks/go) against a real daemon: `go vet` and `go test` (unit tests on httptest
# servers, integration tests on the daemon through KODER_URL/KODER_KEY/KODER_OTHER_KEY) with
# Debian's Go (golang-go, installed if missing). Needs the binaries in target/debug
# (scripts/test.sh builds them first); without root only vet and the unit tests run (jail
# sandboxes need root). Extra arguments go to `go test` (e.g. -run Files). Closes with
# "go-sdk: N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-missing.sh --no-recommends golang-go=/usr/bin/go
GO=/usr/bin/go

# Build cache and module dir in the test cache outside the clone, one per Go version (the
# build cache validates itself, so nothing needs a stamp). No module is ever fetched: the SDK
# has no dependencies, and GOPROXY=off makes a stray one fail instead of reaching out.
cache="${KODER_TEST_CACHE:-/var/cache/koder-sandbox-test}/go-sdk/$("$GO" env GOVERSION)"
mkdir -p "$cache/gocache" "$cache/gopath"
export GOCACHE="$cache/gocache" GOPATH="$cache/gopath" GOFLAGS="" GOPROXY=off GOSUMDB=off \
  GO111MODULE=on CGO_ENABLED=0
unset GOROOT

if [ "$(id -u)" -eq 0 ]; then
  . scripts/lib/daemon.sh
  # The webhook tests' receivers listen on loopback, which the daemon refuses by default.
  DAEMON_EXTRA_CONFIG=$'[webhooks]\nallow_private = true'
  start_daemon go-sdk
  export KODER_URL="$DAEMON_URL" KODER_KEY="$DAEMON_KEY1" KODER_OTHER_KEY="$DAEMON_KEY2"
else
  echo "go-sdk-tests: not root, integration tests skipped (jail sandboxes need root)"
  unset KODER_URL KODER_KEY KODER_OTHER_KEY
fi

log=$(mktemp /tmp/koder-go-sdk-log-XXXXXX)
vet=0
(cd sdks/go && "$GO" vet ./...) || vet=1
status=0
(cd sdks/go && "$GO" test -count=1 -v ./... "$@") 2>&1 | tee "$log" || status=$?

passed=$(grep -cE '^\s*--- PASS: ' "$log" || true)
failed=$(grep -cE '^\s*--- FAIL: ' "$log" || true)
skipped=$(grep -cE '^\s*--- SKIP: ' "$log" || true)
rm -f "$log"
# A build failure or a panic fails the run without a "--- FAIL" line of its own.
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1
fi
failed=$((failed + vet))
if [ "$status" -ne 0 ] && [ -n "${DAEMON_LOG:-}" ]; then
  daemon_log_tail
fi
summary="go-sdk: $passed passed, $failed failed"
[ "$skipped" -eq 0 ] || summary="$summary, $skipped skipped"
echo "$summary"
[ "$failed" -eq 0 ]
