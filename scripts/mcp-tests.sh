#!/usr/bin/env bash
# The MCP server end to end: the official `mcp` client package from PyPI drives
# `target/debug/ksandbox mcp` over stdio and over streamable HTTP against a real daemon
# (tests/mcp). Needs root (jail sandboxes and cgroups) and the binaries in target/debug
# (scripts/test.sh builds them first). Closes with "mcp: N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "mcp-tests: skipped (jail sandboxes need root)"
  echo "mcp: 0 passed, 0 failed, 1 skipped"
  exit 0
fi
for bin in ksandbox koder-sandbox koder-agent; do
  [ -x "target/debug/$bin" ] || { echo "mcp-tests: target/debug/$bin is missing (cargo build --workspace --bins)"; exit 1; }
done

# Versions the suite was verified with.
MCP=2.3.0
PYTEST=9.2.0
venv="${KODER_TEST_CACHE:-/var/cache/koder-sandbox-test}/mcp-venv"
stamp="$venv/.installed-$MCP-$PYTEST"
# The stamp is written last, so a half-made venv is rebuilt rather than trusted.
if [ ! -f "$stamp" ]; then
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "mcp==$MCP" "pytest==$PYTEST"
  touch "$stamp"
fi

. scripts/lib/daemon.sh
start_daemon mcp

status=0
KSANDBOX_BIN="$PWD/target/debug/ksandbox" MCP_TEST_URL="$DAEMON_URL" \
  MCP_TEST_KEY="$DAEMON_KEY1" MCP_TEST_OTHER_KEY="$DAEMON_KEY2" \
  "$venv/bin/python" -m pytest tests/mcp -q -p no:cacheprovider "$@" || status=$?
[ "$status" -eq 0 ] || daemon_log_tail
exit "$status"
