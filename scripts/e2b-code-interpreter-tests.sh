#!/usr/bin/env bash
# E2B's code-interpreter SDK suite against koder-sandbox: python/tests (sync, async and the two
# top-level files) of e2b-dev/code-interpreter at CI_REV, run by the e2b-code-interpreter SDK of
# scripts/lib/e2b-venv.sh against a real daemon this script starts, as
# scripts/e2b-upstream-tests.sh runs E2B's own SDK suite (same host-name set-up, resolver and
# verdict: scripts/lib/e2b-upstream.sh).
#
# E2B's code is never copied into this repository: E2B_CI_GIT_DIR names a clone (or bare mirror)
# of https://github.com/e2b-dev/code-interpreter that holds CI_REV, e.g.
#   git clone --bare https://github.com/e2b-dev/code-interpreter /srv/e2b-ci.git
#   E2B_CI_GIT_DIR=/srv/e2b-ci.git scripts/e2b-code-interpreter-tests.sh
# Without it the script says so and skips. scripts/e2b-code-interpreter-expected.txt lists the
# tests not expected to pass here, with reasons; the run fails when another test fails.
# Closes with "e2b-code-interpreter: N passed, M failed, K skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
EXPECTED=scripts/e2b-code-interpreter-expected.txt
# e2b-dev/code-interpreter main of 2026-08-21.
CI_REV=7df1757bfd5baa037f909ce97c2dbe014da973c0

. scripts/lib/e2b-upstream.sh
upstream_can_run e2b-code-interpreter e2b-dev/code-interpreter "$CI_REV" E2B_CI_GIT_DIR

. scripts/lib/e2b-venv.sh
e2b_venv

. scripts/lib/daemon.sh
upstream_extract "$E2B_CI_GIT_DIR" "$CI_REV" python/tests python/pytest.ini
upstream_daemon e2b-code-interpreter

status=0
upstream_pytest "$UPSTREAM_WORK/python" tests/sync tests/async tests/charts tests/images tests/test_execute_timeout.py \
  tests/test_sandbox_url.py -o addopts="--import-mode=importlib" "$@" || status=$?

upstream_verdict e2b-code-interpreter "$UPSTREAM_WORK/results.json" "$EXPECTED" "$status" || exit 1
[ "$status" -le 1 ] || daemon_log_tail
