# shellcheck shell=bash
# What E2B's own suites need around them (scripts/e2b-upstream-tests.sh for the Python SDK's,
# scripts/e2b-upstream-js-tests.sh for the JS SDK's). Source from the repository root after
# scripts/lib/daemon.sh.
#
# The daemon serves the sandbox domain by host name over HTTPS (a throwaway CA and wildcard
# certificate, port 443 of a loopback address of this run's own) so that the SDKs'
# `https://<port>-<id>.<domain>` URLs reach it. The test processes resolve those names to it
# themselves (scripts/lib/e2b_upstream_plugin.py, scripts/lib/e2b_upstream_dns.cjs) and refuse
# every name off this machine. Expected-failure files list the tests not expected to pass here,
# with reasons; those marked `not-run` would make a sandbox reach public addresses, so they
# never run (and count as failed).

# e2b-dev/E2B main of 2026-08-21 (python-sdk 2.45.1 and js-sdk 2.45.0 tests).
E2B_REV=b8029973aa7da5f741f7bb1a9f833b38a0885438
E2B_DOMAIN_NAME=sbx.koder.test

# Says why and exits 0 when suite NAME cannot run here: not root, or no clone of REPO holding
# REV in the directory the variable GIT_DIR_VAR names (default: e2b-dev/E2B, E2B_REV,
# E2B_GIT_DIR).
upstream_can_run() {
  local name=$1 repo=${2:-e2b-dev/E2B} rev=${3:-$E2B_REV} var=${4:-E2B_GIT_DIR}
  local dir=${!var:-}
  if [ "$(id -u)" -ne 0 ]; then
    echo "$name: skipped (jail sandboxes and port 443 need root)"
    echo "$name: 0 passed, 0 failed, 1 skipped"
    exit 0
  fi
  if [ -z "$dir" ] || ! git --git-dir="$dir" cat-file -e "$rev^{commit}" 2>/dev/null; then
    echo "$name: skipped (set $var to a clone of $repo holding $rev)"
    echo "$name: 0 passed, 0 failed, 1 skipped"
    exit 0
  fi
}

# Extracts PATH... of revision REV from the clone GIT_DIR into a new work directory,
# UPSTREAM_WORK, which the EXIT trap removes.
upstream_extract() {
  local git_dir=$1 rev=$2
  shift 2
  UPSTREAM_WORK=$(mktemp -d /tmp/koder-e2b-upstream-XXXXXX)
  trap 'rm -rf "$UPSTREAM_WORK"' EXIT
  git --git-dir="$git_dir" archive "$rev" "$@" | tar -x -C "$UPSTREAM_WORK"
}

# Starts the daemon for suite NAME with certificates made in UPSTREAM_WORK (and the TOML tables
# EXTRA in its config); sets UPSTREAM_CA (the CA file the test process trusts) and
# UPSTREAM_HOSTS (`<domain>=<address>` for the resolvers). The EXIT trap then also stops the
# daemon (daemon.sh's own trap, which this replaces, would leave the work directory).
upstream_daemon() {
  local name=$1 extra=${2:-} work=$UPSTREAM_WORK
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=koder-sandbox e2b-upstream test CA" -keyout "$work/ca.key" -out "$work/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=*.$E2B_DOMAIN_NAME" \
    -keyout "$work/host.key" -out "$work/host.csr" 2>/dev/null
  printf 'subjectAltName=DNS:*.%s,DNS:%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' \
    "$E2B_DOMAIN_NAME" "$E2B_DOMAIN_NAME" >"$work/host.ext"
  openssl x509 -req -in "$work/host.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
    -CAcreateserial -days 2 -extfile "$work/host.ext" -out "$work/host.pem" 2>/dev/null

  # Port 443 (the SDK's URLs name no port) of a loopback address of this run's own.
  local address=127.$((RANDOM % 250 + 1)).$((RANDOM % 250 + 1)).$((RANDOM % 250 + 1))
  # No resolver for sandboxes either: nothing they do reaches a name server off this machine.
  DAEMON_EXTRA_CONFIG="[network]
system_resolver = false
[e2b]
domain = \"$E2B_DOMAIN_NAME\"
[server]
tls_listen = \"$address:443\"
tls_cert = \"$work/host.pem\"
tls_key = \"$work/host.key\"
$extra"
  start_daemon "$name"
  trap 'stop_daemon; rm -rf "$UPSTREAM_WORK"' EXIT
  UPSTREAM_CA="$work/ca.pem"
  UPSTREAM_HOSTS="$E2B_DOMAIN_NAME=$address"
}

# Runs pytest of the SDK venv (scripts/lib/e2b-venv.sh) in DIR with ARGS... against the daemon:
# the SDK pointed at it, the resolver plugin loaded, outcomes recorded in
# UPSTREAM_WORK/results.json. Returns pytest's status.
upstream_pytest() {
  local dir=$1 lib=$PWD/scripts/lib
  shift
  (
    cd "$dir"
    E2B_API_URL="$DAEMON_URL" E2B_SANDBOX_URL="$DAEMON_URL" E2B_API_KEY="$DAEMON_KEY1" \
      SSL_CERT_FILE="$UPSTREAM_CA" KODER_E2B_HOSTS="$UPSTREAM_HOSTS" \
      KODER_E2B_RESULTS="$UPSTREAM_WORK/results.json" PYTHONPATH="$lib" \
      "$E2B_PYTHON" -m pytest -p e2b_upstream_plugin -p no:cacheprovider -q -rfEs "$@"
  )
}

# The `not-run` test ids of EXPECTED, one per line.
upstream_not_run() {
  awk -F'|' '!/^#/ && NF >= 2 {
    id = $1; kind = $2
    gsub(/^[ \t]+|[ \t]+$/, "", id); gsub(/^[ \t]+|[ \t]+$/, "", kind)
    if (kind == "not-run") print id
  }' "$1"
}

# Judges RESULTS (`{test id: "passed" | "failed" | "skipped"}`) against EXPECTED: fails on a
# failure the file does not list, or when the runner's own STATUS says it broke outside any
# test (anything above 1). Closes with "NAME: N passed, M failed, K skipped".
upstream_verdict() {
  /usr/bin/python3 - "$@" <<'PY'
import json
import sys

name, results, expected_file, runner_status = sys.argv[1:5]
expected = {}
for line in open(expected_file):
    if line.strip() and not line.startswith("#"):
        test, kind, reason = (part.strip() for part in line.split("|", 2))
        expected[test] = (kind, reason)

not_run = [t for t, (kind, _) in expected.items() if kind == "not-run"]
# A runner that reports the tests it left out (as skipped) does not count them twice.
outcomes = {t: o for t, o in json.load(open(results)).items() if t not in not_run}
passed = [t for t, o in outcomes.items() if o == "passed"]
failed = [t for t, o in outcomes.items() if o == "failed"]
skipped = [t for t, o in outcomes.items() if o == "skipped"]

unexpected = [t for t in failed if t not in expected]
now_passing = [t for t in passed if t in expected]
for t in unexpected:
    print(f"{name}: UNEXPECTED failure {t}")
for t in now_passing:
    print(f"{name}: now passes (drop it from {expected_file}): {t}")
total_failed = len(failed) + len(not_run)
ran = len(passed) + total_failed
print(f"{name}: {len(not_run)} not run (they would reach public addresses), counted as failed")
print(f"{name}: {len(passed)} passed, {total_failed} failed, {len(skipped)} skipped"
      f" ({100 * len(passed) / max(ran, 1):.1f} % of {ran})")
sys.exit(1 if unexpected or int(runner_status) > 1 else 0)
PY
}
