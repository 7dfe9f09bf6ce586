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

# The E2B Python SDK (the venv scripts/e2b-tests.sh uses too).
. scripts/lib/e2b-venv.sh
e2b_venv

cargo build --release --locked -p koder-sandbox -p koder-agent -p koder-bench
. scripts/lib/static-agent.sh
static_agent release  # the agent the daemons it starts use, as scripts/serve.sh's does
mkdir -p target/bench
exec target/release/koder-bench --e2b-python "$E2B_PYTHON" \
  --json target/bench/results.json --markdown target/bench/results.md "$@"
