#!/usr/bin/env bash
# Installs what koder-sandbox and its tests need on a Debian host. Idempotent: installs only
# what is missing, so it is cheap to run before every test run.
set -euo pipefail
cd "$(dirname "$0")"

# Debian package = a file that proves it is installed.
./install-missing.sh \
  python3=/usr/bin/python3 `# interpreter used inside host-image sandboxes` \
  nodejs=/usr/bin/node `# ditto` \
  chromium=/usr/bin/chromium `# browser tests of the web console (scripts/console-tests.sh)` \
  npm=/usr/bin/npm `# the E2B JavaScript SDKs (scripts/e2b-js-tests.sh)` \
  python3.11-venv=/usr/lib/python3.11/ensurepip/__init__.py `# venv of the E2B SDK suite (scripts/e2b-tests.sh)` \
  iproute2=/usr/sbin/ip \
  util-linux=/usr/bin/unshare \
  mmdebstrap=/usr/bin/mmdebstrap `# language packs (ksandbox image build python|node|bash)` \
  bubblewrap=/usr/bin/bwrap `# one-shot sandbox baseline of the benchmark (scripts/bench.sh)` \
  e2fsprogs=/usr/sbin/mkfs.ext4 `# per-session disk quota images, volume images` \
  btrfs-progs=/usr/bin/btrfs `# btrfs volume backend (its tests make a btrfs filesystem)` \
  nftables=/usr/sbin/nft `# egress redirect inside sandboxes with network access (loaded by the agent or, ahead, by the daemon)` \
  binutils=/usr/bin/readelf `# checks the agent scripts/lib/static-agent.sh builds is static` \
  libc6-dev=/usr/include/stdio.h `# its libc.a: glibc linked statically into that agent` \
  python3-matplotlib=/usr/lib/python3/dist-packages/matplotlib/__init__.py `# interpreter rich output` \
  python3-pandas=/usr/lib/python3/dist-packages/pandas/__init__.py \
  python3-plotly=/usr/lib/python3/dist-packages/plotly/__init__.py
# Interpreters of Java and R contexts and the compiler TypeScript contexts strip types with, in
# host-image sandboxes (their recommends are compilers and documentation no context needs).
./install-missing.sh --no-recommends \
  openjdk-17-jdk-headless=/usr/bin/jshell \
  r-base-core=/usr/bin/Rscript \
  node-typescript=/usr/share/nodejs/typescript/package.json
