#!/usr/bin/env bash
# E2B's own test suite against koder-sandbox: the sync and async tests of E2B's Python SDK
# (packages/python-sdk/tests/sync and tests/async of e2b-dev/E2B at the pinned revision below,
# templates excluded: scripts/e2b-template-tests.sh runs E2B's template suite) run with the SDK's
# own pytest.ini, by the SDK of scripts/lib/e2b-venv.sh, against a real daemon this script starts.
#
# E2B's code is never copied into this repository: E2B_GIT_DIR names a clone (or bare mirror)
# of https://github.com/e2b-dev/E2B that holds the revision, e.g.
#   git clone --bare https://github.com/e2b-dev/E2B /srv/e2b.git
#   E2B_GIT_DIR=/srv/e2b.git scripts/e2b-upstream-tests.sh
# Without it the script says so and skips.
#
# The daemon serves the sandbox domain by host name over HTTPS (a throwaway CA and wildcard
# certificate made here, port 443 of a loopback address of this run's own) so that the SDK's
# `https://<port>-<id>.<domain>` URLs reach it; scripts/lib/e2b_upstream_plugin.py resolves those
# names to it inside the test process, refuses every name off this machine and records outcomes.
# scripts/e2b-upstream-expected.txt lists the tests not expected to pass here, with reasons;
# those marked `not-run` would make a sandbox reach public addresses, so they never run (and
# count as failed). The run fails when a test outside that list fails.
# Closes with "e2b-upstream: N passed, M failed, K skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

# e2b-dev/E2B main of 2026-08-21 (python-sdk 2.45.1 tests), verified with the SDK pinned in
# scripts/lib/e2b-venv.sh.
E2B_REV=b8029973aa7da5f741f7bb1a9f833b38a0885438
DOMAIN=sbx.koder.test
EXPECTED=scripts/e2b-upstream-expected.txt

if [ "$(id -u)" -ne 0 ]; then
  echo "e2b-upstream: skipped (jail sandboxes and port 443 need root)"
  echo "e2b-upstream: 0 passed, 0 failed, 1 skipped"
  exit 0
fi
if [ -z "${E2B_GIT_DIR:-}" ] || ! git --git-dir="$E2B_GIT_DIR" cat-file -e "$E2B_REV^{commit}" 2>/dev/null; then
  echo "e2b-upstream: skipped (set E2B_GIT_DIR to a clone of e2b-dev/E2B holding $E2B_REV)"
  echo "e2b-upstream: 0 passed, 0 failed, 1 skipped"
  exit 0
fi

. scripts/lib/e2b-venv.sh
e2b_venv

work=$(mktemp -d /tmp/koder-e2b-upstream-XXXXXX)
. scripts/lib/daemon.sh
# daemon.sh's EXIT trap stops the daemon; this one also removes the suite and certificates.
cleanup() { stop_daemon; rm -rf "$work"; }

trap 'rm -rf "$work"' EXIT
git --git-dir="$E2B_GIT_DIR" archive "$E2B_REV" packages/python-sdk/tests packages/python-sdk/pytest.ini |
  tar -x -C "$work"

# A CA the test process trusts (SSL_CERT_FILE) and a certificate for *.$DOMAIN it signed.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=koder-sandbox e2b-upstream test CA" -keyout "$work/ca.key" -out "$work/ca.pem" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=*.$DOMAIN" \
  -keyout "$work/host.key" -out "$work/host.csr" 2>/dev/null
printf 'subjectAltName=DNS:*.%s,DNS:%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' \
  "$DOMAIN" "$DOMAIN" >"$work/host.ext"
openssl x509 -req -in "$work/host.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial \
  -days 2 -extfile "$work/host.ext" -out "$work/host.pem" 2>/dev/null

# Port 443 (the SDK's URLs name no port) of a loopback address of this run's own.
address=127.$((RANDOM % 250 + 1)).$((RANDOM % 250 + 1)).$((RANDOM % 250 + 1))
# No resolver for sandboxes either: nothing they do reaches a name server off this machine.
DAEMON_EXTRA_CONFIG="[network]
system_resolver = false
[e2b]
domain = \"$DOMAIN\"
[server]
tls_listen = \"$address:443\"
tls_cert = \"$work/host.pem\"
tls_key = \"$work/host.key\""
start_daemon e2b-upstream
trap cleanup EXIT

deselect=()
while IFS='|' read -r id kind _; do
  id=$(echo "$id" | xargs)
  [ "$(echo "$kind" | xargs)" = not-run ] && deselect+=(--deselect "$id")
done < <(grep -v '^#' "$EXPECTED" | grep -v '^\s*$')

status=0
(
  cd "$work/packages/python-sdk"
  E2B_API_URL="$DAEMON_URL" E2B_SANDBOX_URL="$DAEMON_URL" E2B_API_KEY="$DAEMON_KEY1" \
    SSL_CERT_FILE="$work/ca.pem" KODER_E2B_HOSTS="$DOMAIN=$address" \
    KODER_E2B_RESULTS="$work/results.json" PYTHONPATH="$repo/scripts/lib" \
    "$E2B_PYTHON" -m pytest tests/sync tests/async \
    --ignore=tests/sync/template_sync --ignore=tests/async/template_async \
    -p e2b_upstream_plugin -p no:cacheprovider -q -rfEs \
    "${deselect[@]}" "$@"
) || status=$?

"$E2B_PYTHON" - "$work/results.json" "$EXPECTED" "$status" <<'PY' || exit 1
import json
import sys

results, expected_file, pytest_status = sys.argv[1], sys.argv[2], int(sys.argv[3])
expected = {}
for line in open(expected_file):
    if line.strip() and not line.startswith("#"):
        test, kind, reason = (part.strip() for part in line.split("|", 2))
        expected[test] = (kind, reason)

outcomes = json.load(open(results))
passed = [t for t, o in outcomes.items() if o == "passed"]
failed = [t for t, o in outcomes.items() if o == "failed"]
skipped = [t for t, o in outcomes.items() if o == "skipped"]

not_run = [t for t, (kind, _) in expected.items() if kind == "not-run"]
unexpected = [t for t in failed if t not in expected]
now_passing = [t for t in passed if t in expected]
for t in unexpected:
    print(f"e2b-upstream: UNEXPECTED failure {t}")
for t in now_passing:
    print(f"e2b-upstream: now passes (drop it from {expected_file}): {t}")
total_failed = len(failed) + len(not_run)
ran = len(passed) + total_failed
print(f"e2b-upstream: {len(not_run)} not run (they would reach public addresses), counted as failed")
print(f"e2b-upstream: {len(passed)} passed, {total_failed} failed, {len(skipped)} skipped"
      f" ({100 * len(passed) / max(ran, 1):.1f} % of {ran})")
# pytest's own status also covers errors outside any test (collection, fixtures at exit).
sys.exit(1 if unexpected or (pytest_status not in (0, 1)) else 0)
PY
[ "$status" -le 1 ] || daemon_log_tail
