#!/usr/bin/env bash
# The full benchmark (issue #9, speed round two): builds release binaries, then runs koder-bench,
# which starts its own daemons (work dirs and cgroup parents under /tmp, removed afterwards) and
# prints the markdown table. Results: target/bench/results.{md,json}. Needs root (real
# sandboxes/cgroups). Extra arguments go to koder-bench, e.g.
# `scripts/bench.sh --only exec,throughput --duration 5`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

# Baselines: Debian's runc (the `runc exec` baseline) and node (`node -v`), if missing.
missing=()
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing+=(runc)
[ -x /usr/bin/node ] || missing+=(nodejs)
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The E2B Python SDK, in the venv scripts/e2b-tests.sh makes (same versions and stamp, so one
# venv serves both).
E2B=2.63.0
E2B_CODE_INTERPRETER=2.11.5
PYTEST=9.2.0
PYTEST_ASYNCIO=1.5.0
venv=target/e2b-venv
stamp="$venv/.installed-$E2B-$E2B_CODE_INTERPRETER-$PYTEST-$PYTEST_ASYNCIO"
if [ ! -f "$stamp" ]; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "e2b==$E2B" "e2b-code-interpreter==$E2B_CODE_INTERPRETER" \
    "pytest==$PYTEST" "pytest-asyncio==$PYTEST_ASYNCIO"
  touch "$stamp"
fi

cargo build --release --locked -p koder-sandbox -p koder-agent -p koder-bench
mkdir -p target/bench
exec target/release/koder-bench --e2b-python "$PWD/$venv/bin/python" \
  --json target/bench/results.json --markdown target/bench/results.md "$@"
