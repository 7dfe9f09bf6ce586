# shellcheck shell=bash
# The one Python venv with the E2B SDKs (scripts/e2b-tests.sh runs tests/e2b in it,
# scripts/bench.sh drives the E2B benchmark with it). Source this file, then call `e2b_venv`
# from the repository root: it (re)creates the venv in the test cache outside the clone
# ($KODER_TEST_CACHE, default /var/cache/koder-sandbox-test) only when the pinned versions
# changed or an earlier install did not finish, and sets E2B_PYTHON to the venv's interpreter.

# Versions the E2B suite was verified with.
E2B=2.63.0
E2B_CODE_INTERPRETER=2.11.5
PYTEST=9.2.0
PYTEST_ASYNCIO=1.5.0

e2b_venv() {
  local venv="${KODER_TEST_CACHE:-/var/cache/koder-sandbox-test}/e2b-venv"
  mkdir -p "$(dirname "$venv")"
  local stamp="$venv/.installed-$E2B-$E2B_CODE_INTERPRETER-$PYTEST-$PYTEST_ASYNCIO"
  # The stamp is written last, so a half-made venv is rebuilt rather than trusted.
  if [ ! -f "$stamp" ]; then
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
      "e2b==$E2B" "e2b-code-interpreter==$E2B_CODE_INTERPRETER" \
      "pytest==$PYTEST" "pytest-asyncio==$PYTEST_ASYNCIO"
    touch "$stamp"
  fi
  E2B_PYTHON="$venv/bin/python"
}
