#!/usr/bin/env bash
# Installs what the microVM runtime needs on a Debian host: QEMU (the `microvm` machine),
# vhost-device-vsock (virtio-vsock for QEMU guests, from crates.io) and the tools the image
# build uses. Idempotent: installs only what is missing.
set -euo pipefail

VHOST_VSOCK_VERSION=0.3.0

declare -A NEED=(
  [qemu-system-x86]=/usr/bin/qemu-system-x86_64
  [binutils]=/usr/bin/strip        # strips the agent packed into the guest initrd
  [e2fsprogs]=/usr/sbin/mkfs.ext4  # guest root and scratch disks
  [util-linux]=/usr/bin/unshare    # private mount namespace of the root-disk build
)
missing=()
for pkg in "${!NEED[@]}"; do
  [ -e "${NEED[$pkg]}" ] || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup-microvm: missing packages ${missing[*]}; run this script as root" >&2
    exit 1
  fi
  echo "setup-microvm: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Into /usr/local/bin: on every PATH, and executable by the VMs' unprivileged uids.
if ! command -v vhost-device-vsock >/dev/null 2>&1; then
  echo "setup-microvm: cargo install vhost-device-vsock $VHOST_VSOCK_VERSION (a few minutes)"
  cargo install --locked --quiet --root /usr/local vhost-device-vsock --version "$VHOST_VSOCK_VERSION"
fi
