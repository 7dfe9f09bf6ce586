#!/usr/bin/env bash
# The web console in a real browser: Debian's chromium (scripts/setup.sh installs it), driven by
# playwright-core from npm (never a downloaded browser), against a real daemon
# (tests/console, node's built-in test runner). Builds the console first (scripts/console-build.sh:
# the pinned npm packages, cached outside the clone). Screenshots of every view are kept in
# $CONSOLE_SHOTS (default target/console-screenshots); `--update-docs` copies them to
# docs/console/. Needs root (jail sandboxes) and target/debug. Closes with
# "console: N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "console: 0 passed, 0 failed, 1 skipped (jail sandboxes need root)"
  exit 0
fi
[ -x /usr/bin/chromium ] || { echo "console: /usr/bin/chromium is missing (run scripts/setup.sh)"; exit 1; }

scripts/console-build.sh
# The daemon embeds console/dist when it is compiled: a build older than the files would test
# the previous console.
for f in console/dist/index.html console/dist/console.js console/dist/console.css; do
  if [ "$f" -nt target/debug/koder-sandbox ]; then
    cargo build -p koder-sandbox --locked
    break
  fi
done
# ES modules resolve packages next to the importing file: the tests see the console's install.
ln -sfn "$(readlink console/node_modules)" tests/console/node_modules
export CONSOLE_SHOTS="${CONSOLE_SHOTS:-$PWD/target/console-screenshots}"
rm -rf "$CONSOLE_SHOTS"

. scripts/lib/daemon.sh
KODER_ADMIN_KEY="admin-$(/usr/bin/python3 -c 'import secrets; print(secrets.token_hex(16))')"
start_daemon console --admin-key "$KODER_ADMIN_KEY"

status=0
report="$DAEMON_TMP/tap.txt"
DAEMON_URL="$DAEMON_URL" DAEMON_KEY1="$DAEMON_KEY1" KODER_ADMIN_KEY="$KODER_ADMIN_KEY" \
  timeout 180 node --test --test-reporter=tap tests/console/*.test.mjs >"$report" 2>&1 || status=$?
grep -E '^# (pass|fail)' "$report" >/dev/null || cat "$report"
if [ "$status" -ne 0 ]; then
  grep -B2 -A30 'not ok' "$report" | head -200
  daemon_log_tail
fi
if [ "${1:-}" = "--update-docs" ] && [ "$status" -eq 0 ]; then
  mkdir -p docs/console
  cp "$CONSOLE_SHOTS"/*.png docs/console/
fi
passed=$(sed -n 's/^# pass //p' "$report")
failed=$(sed -n 's/^# fail //p' "$report")
echo "console: ${passed:-0} passed, ${failed:-?} failed (screenshots in $CONSOLE_SHOTS)"
exit "$status"
