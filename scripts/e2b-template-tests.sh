#!/usr/bin/env bash
# E2B template builds end to end: the real `e2b` SDK builds templates (steps run in jails by
# koder-build) on a daemon whose `base` template runs on the Debian bash pack of the test cache
# (packed with tests/e2b/pack_archive.py and imported as the image `e2b-base`, which is also
# what `fromImage` names), then tests/e2b/test_templates.py. With E2B_GIT_DIR set (a clone of
# e2b-dev/E2B holding the revision scripts/lib/e2b-upstream.sh pins, as for
# scripts/e2b-upstream-tests.sh), E2B's own template_sync and template_async suites of that
# revision run against the same daemon too, judged against scripts/e2b-upstream-template-expected.txt.
# Needs root and the binaries in target/debug (scripts/test.sh builds them and the packs).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "e2b-template-tests: skipped (jail sandboxes need root)"
  exit 0
fi
. scripts/lib/e2b-base.sh
base_root=$(e2b_base_pack) || {
  echo "e2b-template-tests: no bash pack in the test cache (scripts/test.sh builds it)"
  exit 1
}

. scripts/lib/e2b-venv.sh
e2b_venv

. scripts/lib/e2b-upstream.sh
upstream=""
if [ -n "${E2B_GIT_DIR:-}" ] && git --git-dir="$E2B_GIT_DIR" cat-file -e "$E2B_REV^{commit}" 2>/dev/null; then
  upstream=yes
fi

. scripts/lib/daemon.sh
DAEMON_EXTRA_CONFIG=$E2B_BASE_CONFIG
start_daemon e2b-templates
# E2B's suites build on `fromImage("ubuntu:22.04")`, which the daemon cannot pull (it reaches
# no registry): the same Debian pack stands in for it, under that name.
e2b_base_import "$base_root" e2b-base ${upstream:+ubuntu:22.04}

export E2B_API_URL="$DAEMON_URL" E2B_SANDBOX_URL="$DAEMON_URL" E2B_API_KEY="$DAEMON_KEY1" \
  KODER_E2B_OTHER_KEY="$DAEMON_KEY2" KODER_E2B_TEMPLATES=1
status=0
"$E2B_PYTHON" -m pytest tests/e2b/test_templates.py -q -p no:cacheprovider "$@" || status=$?
if [ -n "$upstream" ]; then
  git --git-dir="$E2B_GIT_DIR" archive "$E2B_REV" packages/python-sdk/tests packages/python-sdk/pytest.ini |
    tar -x -C "$DAEMON_TMP"
  pytest_status=0 lib="$PWD/scripts/lib"
  (cd "$DAEMON_TMP/packages/python-sdk" && KODER_E2B_RESULTS="$DAEMON_TMP/upstream.json" \
    PYTHONPATH="$lib" "$E2B_PYTHON" -m pytest tests/sync/template_sync tests/async/template_async -q \
    -p e2b_upstream_plugin -p no:cacheprovider -o asyncio_default_fixture_loop_scope=function) ||
    pytest_status=$?
  upstream_verdict e2b-upstream-templates "$DAEMON_TMP/upstream.json" \
    scripts/e2b-upstream-template-expected.txt "$pytest_status" || status=1
fi
[ "$status" -eq 0 ] || daemon_log_tail
exit "$status"
