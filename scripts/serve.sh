#!/usr/bin/env bash
# Builds koder-sandbox and starts the daemon with embedded defaults (SQLite state, local data
# dir, host image; as root also the microVM guest image). Extra arguments go to
# `koder-sandbox serve` (e.g. --listen, --api-key).
# Run as root for full isolation; unprivileged it runs rootless and says what it cannot enforce.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The daemon finds an agent next to itself, so both are built together; it is started with the
# statically linked one below, which starts faster.
cargo build --release --bins --locked
# See the library for why the static agent is built apart.
. scripts/lib/static-agent.sh
static_agent release
if [ "$(id -u)" -eq 0 ]; then
  # runtime "microvm": QEMU and the guest kernel + root disk (about a minute
  # the first time, then nothing). Without them the daemon still serves jails and says why.
  if ! { scripts/setup-microvm.sh &&
         target/release/ksandbox image build --images-dir /var/lib/koder-sandbox/images; }; then
    echo "serve: microVM runtime not prepared; sessions with runtime \"microvm\" will answer 503" >&2
  fi
fi
exec target/release/koder-sandbox serve "$@"
