#!/usr/bin/env bash
# Prints the `bench-gather --working-set` that keeps the host collectives' buffers cold in the
# caches, as a live step that walks many units' buffers finds them: 8x this machine's last-level
# cache (the largest of L3 and L2 that getconf reports), and at least 256M.
#
#   bash scripts/cold_working_set.sh        # e.g. "2400M" where the L3 is 300 MiB
#
# A fixed size is machine-specific: 256M was 8x the 32 MiB L3 where it was chosen, but fits in
# the 300 MiB L3 of another machine, where the "cold" curves came out hot and the host
# predictions missed by up to 22% (issue 11; measured in docs/design.md).
set -euo pipefail
llc=0
for level in LEVEL3_CACHE_SIZE LEVEL2_CACHE_SIZE; do
  size="$(getconf "$level" 2>/dev/null || echo 0)"
  case "$size" in '' | *[!0-9]*) size=0 ;; esac
  [ "$size" -gt "$llc" ] && llc="$size"
done
mib=$(( llc * 8 / 1048576 ))
[ "$mib" -lt 256 ] && mib=256
echo "${mib}M"
