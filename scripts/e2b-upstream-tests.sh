#!/usr/bin/env bash
# E2B's own test suite against koder-sandbox: the sync and async tests of E2B's Python SDK
# (packages/python-sdk/tests/sync and tests/async of e2b-dev/E2B at the revision pinned in
# scripts/lib/e2b-upstream.sh, templates excluded: scripts/e2b-template-tests.sh runs E2B's
# template suite) run with the SDK's own pytest.ini, by the SDK of scripts/lib/e2b-venv.sh,
# against a real daemon this script starts. scripts/e2b-upstream-js-tests.sh runs the JS SDK's.
#
# E2B's code is never copied into this repository: E2B_GIT_DIR names a clone (or bare mirror)
# of https://github.com/e2b-dev/E2B that holds the revision, e.g.
#   git clone --bare https://github.com/e2b-dev/E2B /srv/e2b.git
#   E2B_GIT_DIR=/srv/e2b.git scripts/e2b-upstream-tests.sh
# Without it the script says so and skips.
#
# How the SDK's host names reach the daemon and why nothing leaves the machine:
# scripts/lib/e2b-upstream.sh; scripts/lib/e2b_upstream_plugin.py is the resolver in the test
# process and records outcomes. scripts/e2b-upstream-expected.txt lists the tests not expected
# to pass here, with reasons. The run fails when a test outside that list fails.
# Closes with "e2b-upstream: N passed, M failed, K skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
EXPECTED=scripts/e2b-upstream-expected.txt

. scripts/lib/e2b-upstream.sh
upstream_can_run e2b-upstream

. scripts/lib/e2b-venv.sh
e2b_venv

. scripts/lib/daemon.sh
upstream_extract "$E2B_GIT_DIR" "$E2B_REV" packages/python-sdk/tests packages/python-sdk/pytest.ini
upstream_daemon e2b-upstream

deselect=()
while read -r id; do
  deselect+=(--deselect "$id")
done < <(upstream_not_run "$EXPECTED")

status=0
upstream_pytest "$UPSTREAM_WORK/packages/python-sdk" tests/sync tests/async \
  --ignore=tests/sync/template_sync --ignore=tests/async/template_async \
  "${deselect[@]}" "$@" || status=$?

upstream_verdict e2b-upstream "$UPSTREAM_WORK/results.json" "$EXPECTED" "$status" || exit 1
[ "$status" -le 1 ] || daemon_log_tail
