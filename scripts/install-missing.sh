#!/usr/bin/env bash
# Installs the Debian packages whose proof file is missing: install-missing.sh [--no-recommends]
# PACKAGE=FILE ... Idempotent and cheap when everything is there.
set -euo pipefail

apt_flags=()
if [ "${1:-}" = "--no-recommends" ]; then
  apt_flags+=(--no-install-recommends)
  shift
fi
missing=()
for pair in "$@"; do
  [ -e "${pair#*=}" ] || missing+=("${pair%%=*}")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages ${missing[*]}; run this script as root to install them" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_flags[@]}" "${missing[@]}"
