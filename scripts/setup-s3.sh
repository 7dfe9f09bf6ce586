#!/usr/bin/env bash
# Installs s3s-fs, a small S3-protocol server on a local directory, for the S3 tests of
# koder-blobs (crates/blobs/tests/s3.rs finds it at $S3S_FS_BIN or the path below).
# Idempotent: does nothing when the binary exists. The version is pinned to one whose
# rust-version this toolchain meets (0.15+ want a newer rustc).
set -euo pipefail

S3S_FS_VERSION=0.14.0
ROOT=${S3S_FS_ROOT:-/var/cache/koder-sandbox-test/s3s}

if [ -x "$ROOT/bin/s3s-fs" ]; then
  exit 0
fi
echo "setup-s3: cargo install s3s-fs $S3S_FS_VERSION into $ROOT (several minutes)"
CARGO_INCREMENTAL=0 cargo install --locked --quiet --root "$ROOT" \
  --features binary s3s-fs --version "$S3S_FS_VERSION"
