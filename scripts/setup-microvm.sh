#!/usr/bin/env bash
# Installs what the microVM runtime needs on a Debian host: QEMU (the `microvm` machine),
# vhost-device-vsock (virtio-vsock for QEMU guests, from crates.io) and the tools the image
# build uses. Idempotent: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")"

VHOST_VSOCK_VERSION=0.3.0

./install-missing.sh --no-recommends \
  qemu-system-x86=/usr/bin/qemu-system-x86_64 \
  binutils=/usr/bin/strip `# strips the agent packed into the guest initrd` \
  e2fsprogs=/usr/sbin/mkfs.ext4 `# guest root and scratch disks` \
  util-linux=/usr/bin/unshare `# private mount namespace of the root-disk build`

# Into /usr/local/bin: on every PATH, and executable by the VMs' unprivileged uids.
if ! command -v vhost-device-vsock >/dev/null 2>&1; then
  echo "setup-microvm: cargo install vhost-device-vsock $VHOST_VSOCK_VERSION (a few minutes)"
  cargo install --locked --quiet --root /usr/local vhost-device-vsock --version "$VHOST_VSOCK_VERSION"
fi
