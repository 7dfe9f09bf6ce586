#!/usr/bin/env bash
# The Python SDK (sdks/python) end to end: installs it from this clone into a cached venv,
# type-checks it (mypy --strict, with tests/typing_usage.py asserting the sync and async
# method types), and runs its pytest suite (every method, sync and async) against a real
# daemon. Needs root (jail sandboxes and cgroups) and the binaries in target/debug
# (scripts/test.sh builds them first). Closes with "python-sdk: N passed, M failed, K skipped"
# (the type check counts as one test).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "python-sdk-tests: skipped (jail sandboxes need root)"
  echo "python-sdk: 0 passed, 0 failed, 1 skipped"
  exit 0
fi

# Versions the SDK was verified with (its pyproject.toml allows ranges around them).
HTTPX=0.28.1
HTTPX_SSE=0.4.3
HTTPX_WS=0.9.0
TYPING_EXTENSIONS=4.16.0
PYTEST=9.2.0
PYTEST_ASYNCIO=1.5.0
HATCHLING=1.33.0
MYPY=2.4.1

venv="${KODER_TEST_CACHE:-/var/cache/koder-sandbox-test}/python-sdk-venv"
stamp="$venv/.installed-$HTTPX-$HTTPX_SSE-$HTTPX_WS-$TYPING_EXTENSIONS-$PYTEST-$PYTEST_ASYNCIO-$HATCHLING-$MYPY"
# The stamp is written last, so a half-made venv is rebuilt rather than trusted.
if [ ! -f "$stamp" ]; then
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "httpx==$HTTPX" "httpx-sse==$HTTPX_SSE" "httpx-ws==$HTTPX_WS" \
    "typing-extensions==$TYPING_EXTENSIONS" "pytest==$PYTEST" "pytest-asyncio==$PYTEST_ASYNCIO" \
    "hatchling==$HATCHLING" "mypy==$MYPY"
  touch "$stamp"
fi
py="$venv/bin/python"

# The SDK itself from this clone, every run; its dependencies are the cached ones (no
# network: no build isolation, no dependency resolution).
export PYTHONDONTWRITEBYTECODE=1
build_dir=$(mktemp -d /tmp/koder-python-sdk-build-XXXXXX)
cp -r sdks/python/. "$build_dir"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
  --force-reinstall "$build_dir"
rm -rf "$build_dir"

passed=0
failed=0
if (cd sdks/python && "$py" -m mypy --strict --cache-dir /dev/null src/koder_sandbox tests/typing_usage.py); then
  passed=1
else
  failed=1
fi

. scripts/lib/daemon.sh
DAEMON_ADMIN_KEY=$(daemon_key)
# The webhook tests' receiver listens on loopback, which the daemon refuses by default.
DAEMON_EXTRA_CONFIG=$'[webhooks]\nallow_private = true' \
  start_daemon python-sdk --admin-key "$DAEMON_ADMIN_KEY"

status=0
junit="$DAEMON_TMP/junit.xml"
(cd sdks/python && DAEMON_URL="$DAEMON_URL" DAEMON_KEY1="$DAEMON_KEY1" DAEMON_KEY2="$DAEMON_KEY2" \
  DAEMON_ADMIN_KEY="$DAEMON_ADMIN_KEY" \
  "$py" -m pytest tests -q -p no:cacheprovider --junitxml="$junit" "$@") || status=$?
[ "$status" -eq 0 ] || daemon_log_tail

read -r ok bad skipped < <("$py" - "$junit" <<'PY' || echo "0 1 0"
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
n = lambda k: int(suite.get(k, 0))
print(n("tests") - n("failures") - n("errors") - n("skipped"), n("failures") + n("errors"), n("skipped"))
PY
)
passed=$((passed + ok))
failed=$((failed + bad))
# No test run at all (pytest exit 5) is a failure too.
if [ "$status" -ne 0 ] && [ "$bad" -eq 0 ]; then failed=$((failed + 1)); fi
echo "python-sdk: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
