#!/usr/bin/env bash
# E2B compatibility end to end: the real `e2b` and `e2b-code-interpreter` SDKs from PyPI drive
# a real daemon (tests/e2b). Needs root (jail sandboxes and cgroups) and the binaries in
# target/debug (scripts/test.sh builds them first). Closes with "N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "e2b-tests: skipped (jail sandboxes need root)"
  echo "e2b: 0 passed, 0 failed, 1 skipped"
  exit 0
fi

. scripts/lib/e2b-venv.sh
e2b_venv

tmp=$(mktemp -d /tmp/koder-e2b-XXXXXX)
# Sandbox uids traverse it to reach their layers.
chmod 711 "$tmp"
parent="koder-test-e2b-$$"
daemon=""
cleanup() {
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    kill -TERM "$daemon"
    wait "$daemon" 2>/dev/null || true
  fi
  for d in /sys/fs/cgroup/*/"$parent" /sys/fs/cgroup/"$parent"; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
key() { echo "e2b_$(/usr/bin/python3 -c 'import secrets; print(secrets.token_hex(20))')"; }
key1=$(key)
key2=$(key)
cat > "$tmp/config.toml" <<TOML
[jail]
cgroup_parent = "$parent"
[sessions]
pool = {}
TOML
target/debug/koder-sandbox serve --config "$tmp/config.toml" --listen "127.0.0.1:$port" \
  --data-dir "$tmp/data" --api-key "t1:$key1" --api-key "t2:$key2" >"$tmp/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do
  /usr/bin/python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" \
    2>/dev/null && break
  kill -0 "$daemon" 2>/dev/null || { cat "$tmp/daemon.log"; exit 1; }
  sleep 0.1
done

status=0
E2B_API_URL="http://127.0.0.1:$port" E2B_SANDBOX_URL="http://127.0.0.1:$port" \
  E2B_VOLUME_API_URL="http://127.0.0.1:$port" \
  E2B_API_KEY="$key1" KODER_E2B_OTHER_KEY="$key2" \
  "$E2B_PYTHON" -m pytest tests/e2b -q -p no:cacheprovider "$@" || status=$?
if [ "$status" -ne 0 ]; then
  echo "e2b-tests: daemon log tail:"
  tail -n 30 "$tmp/daemon.log"
fi
exit "$status"
