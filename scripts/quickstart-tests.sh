#!/usr/bin/env bash
# The README's Quick start, run as typed against a real daemon: the block's commands run
# verbatim in a scratch directory, except that its first line's two paths point at this run
# (the debug binaries scripts/test.sh built instead of scripts/serve.sh's release ones, and a
# key file of the test daemon instead of /var/lib/koder-sandbox/dev-api-key). Needs root (jail
# sandboxes). Closes with "quickstart: N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

if [ "$(id -u)" -ne 0 ]; then
  echo "quickstart: 0 passed, 0 failed, 1 skipped (jail sandboxes need root)"
  exit 0
fi

block=$(awk '/^## Quick start/{q=1} q&&/^```sh$/{b=1;next} b&&/^```$/{exit} b' README.md)
first=$(head -n1 <<<"$block")
expected='export PATH=$PWD/target/release:$PATH KSANDBOX_API_KEY=$(cat /var/lib/koder-sandbox/dev-api-key)'
fail() {
  echo "quickstart: $1"
  echo "quickstart: 0 passed, 1 failed"
  exit 1
}
[ "$first" = "$expected" ] || fail "the block's first line changed; update this script: $first"
# What that line assumes of the two set-up commands.
grep -q 'cargo build --release --bins' scripts/serve.sh || fail "serve.sh no longer builds target/release"
grep -q 'PathBuf::from("/var/lib/koder-sandbox")' crates/daemon/src/config.rs ||
  fail "the daemon's default data dir is no longer /var/lib/koder-sandbox"

. scripts/lib/daemon.sh
start_daemon quickstart
echo "$DAEMON_KEY1" >"$DAEMON_TMP/dev-api-key"
work=$(mktemp -d /tmp/koder-quickstart-XXXXXX)
trap 'stop_daemon; rm -rf "$work"' EXIT
script="${first//\$PWD\/target\/release/$repo/target/debug}"
script="${script//\/var\/lib\/koder-sandbox\/dev-api-key/$DAEMON_TMP/dev-api-key}"
script+=$'\n'"$(tail -n +2 <<<"$block")"

status=0
out=$(cd "$work" && KSANDBOX_URL="$DAEMON_URL" bash -euo pipefail -c "$script" 2>&1) || status=$?
echo "$out"
for want in '^42$' '^hello from the sandbox$' '^kept$'; do
  grep -q "$want" <<<"$out" || { echo "quickstart: no line matching $want"; status=1; }
done
if [ "$status" -ne 0 ]; then
  daemon_log_tail
  echo "quickstart: 0 passed, 1 failed"
  exit 1
fi
echo "quickstart: 1 passed, 0 failed"
