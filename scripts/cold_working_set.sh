#!/usr/bin/env bash
# Prints the `bench-gather --working-set` that finds the host collectives' buffers in the caches
# as a live step finds them.
#
#   bash scripts/cold_working_set.sh         # cold: 8x the last-level cache, at least 256M
#                                            # (e.g. "2400M" where the L3 is 300 MiB)
#   bash scripts/cold_working_set.sh BYTES   # a workload's: BYTES, the bytes its collectives walk
#                                            # (simulate's summary.collective_footprint_bytes),
#                                            # at most the cold size
#
# A live step walks its collectives' footprint, and a bench that walks more than that measures
# colder buffers than the step finds; one that walks less, hotter ones. What a process keeps in a
# shared last-level cache can be far less than the cache (where the L3 reads 480 MiB, shared with
# other tenants, a 24 MiB all-gather already ran cold over a 512M working set), so a workload's
# benches walk its own footprint, capped by the cold size. The measurements behind it are in
# bench/README.md ("Host bench-gather" and the grid's history).
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
if [ $# -gt 0 ]; then
  case "$1" in
    '' | *[!0-9]*)
      echo "cold_working_set.sh: '$1' is not a byte count (a workload's collective footprint)" >&2
      exit 2
      ;;
  esac
  walked=$(( ($1 + 1048575) / 1048576 ))
  [ "$walked" -lt 1 ] && walked=1
  [ "$walked" -lt "$mib" ] && mib="$walked"
fi
echo "${mib}M"
