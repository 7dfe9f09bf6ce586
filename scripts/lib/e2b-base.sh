# shellcheck shell=bash
# The base image E2B templates build on, for a test daemon that reaches no registry: the Debian
# bash pack of the test cache (scripts/test.sh builds it), packed as a `docker save` archive by
# tests/e2b/pack_archive.py and imported into the daemon's image store. Source from the
# repository root; scripts/e2b-template-tests.sh and scripts/e2b-upstream-js-tests.sh use it.

# The daemon config that runs the `base` template (and the bash language) on the image e2b-base.
E2B_BASE_CONFIG='[images]
language_packs = { bash = "e2b-base" }'

# The bash pack's root tree in the test cache; fails (quietly) when there is none.
e2b_base_pack() {
  local cache=${KODER_PACK_CACHE:-${KODER_TEST_CACHE:-/var/cache/koder-sandbox-test}/packs}
  local pack
  pack=$(readlink "$cache/store/names/bash") || return 1
  echo "$cache/store/$pack/rootfs"
}

# Imports the pack at ROOT into the started daemon (scripts/lib/daemon.sh) as each NAME.
e2b_base_import() {
  local root=$1 name
  shift
  /usr/bin/python3 tests/e2b/pack_archive.py "$root" "$DAEMON_TMP/base.tar"
  for name in "$@"; do
    target/debug/ksandbox image import "$DAEMON_TMP/base.tar" --name "$name" \
      --images-dir "$DAEMON_TMP/data/images" >/dev/null
  done
  rm -f "$DAEMON_TMP/base.tar"
}
