#!/usr/bin/env bash
# Installs what fsdplab needs from Debian's packages, only what is missing. Sourced by demo.sh and
# test.sh; safe to run again.
set -euo pipefail

FSDPLAB_PACKAGES=(cmake g++ make libboost-graph-dev nlohmann-json3-dev libfmt-dev
  libsimdjson-dev libgtest-dev libgmock-dev libbenchmark-dev clang-format python3-torch)

missing=()
for p in "${FSDPLAB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "fsdplab setup: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
