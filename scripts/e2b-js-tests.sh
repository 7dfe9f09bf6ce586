#!/usr/bin/env bash
# E2B compatibility from JavaScript: the official `e2b` and `@e2b/code-interpreter` packages
# from npm drive a real daemon (tests/e2b-js, node's built-in test runner). The packages are
# installed once into the test cache outside the clone, keyed by tests/e2b-js/package.json.
# Needs root (jail sandboxes) and target/debug (scripts/test.sh builds it). Closes with
# "e2b-js: N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "e2b-js: 0 passed, 0 failed, 1 skipped (jail sandboxes need root)"
  exit 0
fi

key=$(sha256sum tests/e2b-js/package.json | cut -c1-16)
modules="${KODER_TEST_CACHE:-/var/cache/koder-sandbox-test}/e2b-js-$key"
# The stamp is written last, so a half-made install is redone rather than trusted.
if [ ! -f "$modules/.installed" ]; then
  rm -rf "$modules"
  mkdir -p "$modules"
  cp tests/e2b-js/package.json "$modules/"
  npm install --prefix "$modules" --no-audit --no-fund --loglevel=error >/dev/null
  touch "$modules/.installed"
fi
# ES modules resolve packages next to the importing file, so the tests see the cached install
# through a link (ignored by git).
ln -sfn "$modules/node_modules" tests/e2b-js/node_modules

# The "internet" of the network and secrets tests: a namespace of this run's own behind a veth
# pair, running a server that echoes the Authorization it got, or at /h its SHA-256 and the
# X-Team header (never any outside address).
ns="kjs$$"
veth="kjv$$"
net="10.250.$(($$ % 250))"
cleanup_net() {
  [ -n "${net_pid:-}" ] && kill "$net_pid" 2>/dev/null
  ip netns del "$ns" 2>/dev/null || true
  ip link del "$veth" 2>/dev/null || true
}
ip netns add "$ns"
ip link add "$veth" type veth peer name "kjp$$"
ip link set "kjp$$" netns "$ns"
ip addr add "$net.1/30" dev "$veth"
ip link set "$veth" up
ip -n "$ns" addr add "$net.2/30" dev "kjp$$"
ip -n "$ns" link set "kjp$$" up
ip -n "$ns" link set lo up
ip netns exec "$ns" /usr/bin/python3 -c '
import hashlib, http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        auth = self.headers.get("authorization") or ""
        if self.path == "/h":
            body = (hashlib.sha256(auth.encode()).hexdigest() + " team:" + (self.headers.get("x-team") or "")).encode()
        else:
            body = ("seen:" + auth).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
' &
net_pid=$!
for _ in $(seq 100); do
  /usr/bin/python3 -c "import socket; socket.create_connection(('$net.2', 8080), 0.2)" 2>/dev/null && break
  sleep 0.05
done
export DAEMON_EXTRA_CONFIG="[network]
internal = [\"$net.2/32\"]
system_resolver = false
hosts = { \"api.test\" = [\"$net.2\"] }"

. scripts/lib/daemon.sh
start_daemon e2b-js
trap 'stop_daemon; cleanup_net' EXIT

status=0
report="$DAEMON_TMP/tap.txt"
E2B_API_URL="$DAEMON_URL" E2B_SANDBOX_URL="$DAEMON_URL" E2B_API_KEY="$DAEMON_KEY1" \
  KODER_E2B_OTHER_KEY="$DAEMON_KEY2" KODER_TEST_NET="$net.2" \
  node --test --test-reporter=tap --test-concurrency=2 tests/e2b-js/*.test.mjs >"$report" 2>&1 \
  || status=$?
grep -E '^# (pass|fail)|^not ok|^ *not ok' "$report" >/dev/null || cat "$report"
if [ "$status" -ne 0 ]; then
  # The failing tests with their diagnostics, and the daemon's side of the story.
  grep -B2 -A25 'not ok' "$report" | head -200
  daemon_log_tail
fi
passed=$(sed -n 's/^# pass //p' "$report")
failed=$(sed -n 's/^# fail //p' "$report")
echo "e2b-js: ${passed:-0} passed, ${failed:-?} failed"
exit "$status"
