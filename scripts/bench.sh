#!/usr/bin/env bash
# The full benchmark (issue #9): builds release binaries, then runs koder-bench, which starts
# its own daemons (work dirs and cgroup parents under /tmp, removed afterwards) and prints the
# markdown table. Results: target/bench/results.{md,json}. Needs root (real sandboxes/cgroups).
# Extra arguments go to koder-bench, e.g. `scripts/bench.sh --only exec,throughput --duration 5`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --locked -p koder-sandbox -p koder-agent -p koder-bench
mkdir -p target/bench
exec target/release/koder-bench \
  --json target/bench/results.json --markdown target/bench/results.md "$@"
