# shellcheck shell=bash
# One real daemon for the client test scripts (E2B SDKs, Python/Go SDKs, MCP): source this file
# from the repository root, then `start_daemon NAME [serve flags...]`. It makes a 711 temp dir
# (sandbox uids traverse it to reach their layers), a config with its own cgroup parent and no
# warm pool, starts target/debug/koder-sandbox on a free loopback port with two tenants' keys,
# (plus \$DAEMON_EXTRA_CONFIG, TOML tables appended to it) waits for /healthz and sets DAEMON_URL, DAEMON_KEY1, DAEMON_KEY2 (E2B-shaped keys: the same
# key works on both APIs), DAEMON_TMP and DAEMON_LOG. The EXIT trap stops the daemon by PID and
# removes its cgroups and temp dir; `daemon_log_tail` prints the log's end for failed runs.

daemon_pid=""
daemon_parent=""

stop_daemon() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid"
    wait "$daemon_pid" 2>/dev/null || true
  fi
  daemon_pid=""
  if [ -n "$daemon_parent" ]; then
    for d in /sys/fs/cgroup/*/"$daemon_parent" /sys/fs/cgroup/"$daemon_parent"; do
      [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
    done
  fi
  [ -n "${DAEMON_TMP:-}" ] && rm -rf "$DAEMON_TMP"
  return 0
}

daemon_key() { echo "e2b_$(/usr/bin/python3 -c 'import secrets; print(secrets.token_hex(20))')"; }

start_daemon() {
  local name=$1
  shift
  DAEMON_TMP=$(mktemp -d "/tmp/koder-$name-XXXXXX")
  chmod 711 "$DAEMON_TMP"
  daemon_parent="koder-test-$name-$$"
  trap stop_daemon EXIT
  local port
  port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  DAEMON_KEY1=$(daemon_key)
  DAEMON_KEY2=$(daemon_key)
  DAEMON_URL="http://127.0.0.1:$port"
  DAEMON_LOG="$DAEMON_TMP/daemon.log"
  cat > "$DAEMON_TMP/config.toml" <<TOML
[jail]
cgroup_parent = "$daemon_parent"
[sessions]
pool = {}
${DAEMON_EXTRA_CONFIG:-}
TOML
  target/debug/koder-sandbox serve --config "$DAEMON_TMP/config.toml" --listen "127.0.0.1:$port" \
    --data-dir "$DAEMON_TMP/data" --api-key "t1:$DAEMON_KEY1" --api-key "t2:$DAEMON_KEY2" "$@" \
    >"$DAEMON_LOG" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 100); do
    /usr/bin/python3 -c "import urllib.request as u; u.urlopen('$DAEMON_URL/healthz', timeout=1)" \
      2>/dev/null && return 0
    kill -0 "$daemon_pid" 2>/dev/null || { cat "$DAEMON_LOG"; return 1; }
    sleep 0.1
  done
  echo "$name: the daemon did not answer /healthz"
  daemon_log_tail
  return 1
}

daemon_log_tail() {
  echo "$daemon_parent: daemon log tail:"
  tail -n 30 "$DAEMON_LOG"
}
