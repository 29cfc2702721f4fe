#!/usr/bin/env bash
# Prints the `bench-gather --working-set` that keeps the host collectives' buffers cold in the
# caches, as a live step that walks many units' buffers finds them: 8x this machine's last-level
# cache, and at least 256M.
#
#   bash scripts/cold_working_set.sh        # e.g. "2400M" where the L3 is 300 MiB
#
# A fixed size is machine-specific: 256M is 8x a 32 MiB L3 but fits in the 1 GiB L3 of a
# stacked-cache server, where "cold" curves would come out hot. The cache size comes from sysfs
# (the kernel's cache topology, what lscpu prints), and from getconf only where sysfs has none:
# on some virtual machines getconf reports ten times the real L3 (320 MiB for a 32 MiB one),
# which asked for working sets of 2.5 GB, allocated per rank.
set -euo pipefail
to_bytes() {  # "32768K" / "1M" / "1024" -> bytes; anything else -> 0
  case "$1" in
    *[0-9]K) echo $(( ${1%K} * 1024 )) ;;
    *[0-9]M) echo $(( ${1%M} * 1048576 )) ;;
    *[0-9]G) echo $(( ${1%G} * 1073741824 )) ;;
    '' | *[!0-9]*) echo 0 ;;
    *) echo "$1" ;;
  esac
}
llc=0
for dir in /sys/devices/system/cpu/cpu0/cache/index*; do
  [ -r "$dir/size" ] || continue
  type="$(cat "$dir/type" 2>/dev/null || true)"
  [ "$type" = Instruction ] && continue
  size="$(to_bytes "$(cat "$dir/size" 2>/dev/null || true)")"
  [ "$size" -gt "$llc" ] && llc="$size"
done
if [ "$llc" -eq 0 ]; then
  for level in LEVEL3_CACHE_SIZE LEVEL2_CACHE_SIZE; do
    size="$(to_bytes "$(getconf "$level" 2>/dev/null || true)")"
    [ "$size" -gt "$llc" ] && llc="$size"
  done
fi
mib=$(( llc * 8 / 1048576 ))
[ "$mib" -lt 256 ] && mib=256
echo "${mib}M"
