#!/usr/bin/env bash
# Builds koder-sandbox and starts the daemon with embedded defaults (SQLite state, local data
# dir, host image). Extra arguments go to `koder-sandbox serve` (e.g. --listen, --api-key).
# Run as root for full isolation; unprivileged it runs rootless and says what it cannot enforce.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The daemon finds the agent binary next to itself, so both are built together.
cargo build --release --bins --locked
exec target/release/koder-sandbox serve "$@"
