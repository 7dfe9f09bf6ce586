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

. scripts/lib/daemon.sh
start_daemon e2b

status=0
E2B_API_URL="$DAEMON_URL" E2B_SANDBOX_URL="$DAEMON_URL" E2B_VOLUME_API_URL="$DAEMON_URL" \
  E2B_API_KEY="$DAEMON_KEY1" KODER_E2B_OTHER_KEY="$DAEMON_KEY2" \
  "$E2B_PYTHON" -m pytest tests/e2b -q -p no:cacheprovider "$@" || status=$?
[ "$status" -eq 0 ] || daemon_log_tail
exit "$status"
