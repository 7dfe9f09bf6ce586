#!/usr/bin/env bash
# Installs what the microVM runtime needs on a Debian host: QEMU (the `microvm` machine) and the
# tools the image build uses. Idempotent: installs only what is missing. (QEMU guests reach their
# agent over virtio-serial, so no vsock backend is needed.)
set -euo pipefail
cd "$(dirname "$0")"

./install-missing.sh --no-recommends \
  qemu-system-x86=/usr/bin/qemu-system-x86_64 \
  qemu-system-common=/usr/lib/qemu/virtiofsd `# volumes: Debian 12's virtiofsd (a package of its own later)` \
  binutils=/usr/bin/strip `# strips the agent packed into the guest initrd` \
  e2fsprogs=/usr/sbin/mkfs.ext4 `# guest root and scratch disks` \
  util-linux=/usr/bin/unshare `# private mount namespace of the root-disk build`
