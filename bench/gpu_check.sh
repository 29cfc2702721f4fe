#!/usr/bin/env bash
# bench/gpu_check.sh: the GPU check of fsdplab's CUDA backend, in one go (under 8 minutes).
#
#   bench/gpu_check.sh [--deps DIR] [--build DIR] [--out FILE] [--quick]
#   bench/gpu_check.sh --pack-deps DIR     # on a machine with Debian's packages: gather the
#                                          # dependencies into DIR to carry to a GPU machine
#
# On a machine with NVIDIA GPUs and the CUDA toolkit: configures and builds with the GPUs'
# architecture (-arch=sm_90 on Hopper), runs the device tests (fsdplab_cuda_tests), bench-gather
# over a size sweep, live steps of two sample traces, simulates the recorded traces and prints a
# compare table. Every measurement goes into one JSON file (--out, default
# build-gpu/gpu_check.json). Nothing is downloaded: fmt, nlohmann_json, simdjson, Boost headers
# and GoogleTest are taken from the system, or from --deps DIR (a prefix made by --pack-deps);
# NCCL from the CUDA toolkit or from the nvidia-nccl Python wheel. Without a GPU the script still
# builds and runs the CPU-side tests and says plainly that nothing was measured.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build-gpu"
OUT=""
DEPS=""
QUICK=0
START=$(date +%s)

log() { printf '[gpu_check %3ds] %s\n' "$(( $(date +%s) - START ))" "$*"; }

pack_deps() {
  # Copies what the build needs from Debian's packages into a relocatable prefix.
  local dir="$1"
  mkdir -p "$dir/include" "$dir/lib/cmake"
  cp -r /usr/include/fmt /usr/include/nlohmann /usr/include/simdjson.h "$dir/include/"
  cp -r /usr/include/gtest /usr/include/gmock "$dir/include/"
  cp -a /usr/lib/x86_64-linux-gnu/libfmt.so* /usr/lib/x86_64-linux-gnu/libsimdjson.so* \
    /usr/lib/x86_64-linux-gnu/libgtest*.a /usr/lib/x86_64-linux-gnu/libgmock*.a "$dir/lib/"
  for pkg in fmt nlohmann_json simdjson GTest; do
    [ -d "/usr/lib/x86_64-linux-gnu/cmake/$pkg" ] && cp -r "/usr/lib/x86_64-linux-gnu/cmake/$pkg" "$dir/lib/cmake/"
    [ -d "/usr/share/cmake/$pkg" ] && cp -r "/usr/share/cmake/$pkg" "$dir/lib/cmake/"
  done
  # Only the Boost headers Boost.Graph's adjacency_list and depth_first_search pull in.
  printf '#include <boost/graph/adjacency_list.hpp>\n#include <boost/graph/depth_first_search.hpp>\n' |
    g++ -std=c++20 -M -x c++ - 2>/dev/null | tr ' \\' '\n\n' | grep '^/usr/include/boost/' |
    sort -u | while read -r h; do
      mkdir -p "$dir/include/$(dirname "${h#/usr/include/}")"
      cp "$h" "$dir/include/${h#/usr/include/}"
    done
  cp /usr/include/boost/version.hpp "$dir/include/boost/"
  # The package configs name the system paths; point them at the prefix.
  grep -rl '/usr/lib/x86_64-linux-gnu\|/usr/include' "$dir/lib/cmake" 2>/dev/null |
    xargs -r sed -i "s#/usr/lib/x86_64-linux-gnu#\${CMAKE_CURRENT_LIST_DIR}/../..#g; s#/usr/include#\${CMAKE_CURRENT_LIST_DIR}/../../../include#g"
  du -sh "$dir"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --pack-deps) pack_deps "$2"; exit $? ;;
    --deps) DEPS="$(cd "$2" && pwd)"; shift ;;
    --build) BUILD="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --quick) QUICK=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown option $1" >&2; exit 1 ;;
  esac
  shift
done
OUT="${OUT:-$BUILD/gpu_check.json}"
mkdir -p "$BUILD" "$(dirname "$OUT")"
RESULTS="$BUILD/gpu_check.d"
rm -rf "$RESULTS"; mkdir -p "$RESULTS"

# ---- What the machine has
GPUS=0; ARCH=""; GPU_NAME=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  GPUS=$(nvidia-smi -L | grep -c '^GPU')
  CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  ARCH="$CC"
fi
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$NVCC" ] || { log "no nvcc: the CUDA toolkit is needed"; exit 4; }
CUDA_HOME="$(dirname "$(dirname "$NVCC")")"
NCCL_HOME_GUESS=""
if [ ! -e "$CUDA_HOME/include/nccl.h" ]; then
  NCCL_HOME_GUESS=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
fi
log "GPUs: $GPUS ${GPU_NAME:+($GPU_NAME, compute capability ${ARCH})}; nvcc: $NVCC; NCCL: ${NCCL_HOME_GUESS:-$CUDA_HOME}"

# ---- Configure and build
CMAKE_ARGS=(-S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFSDPLAB_BUILD_BENCH=OFF
  -DFSDPLAB_ENABLE_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" -DFSDPLAB_WITH_MPI=OFF)
[ -n "$ARCH" ] && CMAKE_ARGS+=(-DFSDPLAB_CUDA_ARCHS="$ARCH")  # 90 on Hopper: -arch=sm_90
[ -n "$DEPS" ] && CMAKE_ARGS+=(-DCMAKE_PREFIX_PATH="$DEPS" -DBOOST_ROOT="$DEPS"
  -DBoost_NO_BOOST_CMAKE=ON -DCMAKE_BUILD_RPATH="$DEPS/lib")
[ -n "$NCCL_HOME_GUESS" ] && export NCCL_HOME="$NCCL_HOME_GUESS"
GEN=(); command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
[ -f "$BUILD/CMakeCache.txt" ] && GEN=()
log "configure"
if ! cmake "${GEN[@]}" "${CMAKE_ARGS[@]}" >"$RESULTS/configure.log" 2>&1; then
  log "configure failed (see $RESULTS/configure.log):"; tail -15 "$RESULTS/configure.log"
  log "missing dependencies? make a prefix with '$0 --pack-deps DIR' where they are installed and pass --deps DIR"
  exit 2
fi
log "build"
JOBS=$(nproc 2>/dev/null || echo 4)
if ! cmake --build "$BUILD" -j"$JOBS" --target fsdplab fsdplab_cuda_tests >"$RESULTS/build.log" 2>&1; then
  log "build failed (see $RESULTS/build.log):"; grep -E 'error' "$RESULTS/build.log" | head -20
  exit 2
fi
[ -n "$DEPS" ] && export LD_LIBRARY_PATH="$DEPS/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -n "$NCCL_HOME_GUESS" ] && export LD_LIBRARY_PATH="$NCCL_HOME_GUESS/lib:${LD_LIBRARY_PATH:-}"
FSDPLAB="$BUILD/tools/fsdplab"

# ---- Device tests (CPU-side parts run everywhere; device parts skip without a GPU)
log "fsdplab_cuda_tests"
TESTS_RC=0
"$BUILD/tests/cuda/fsdplab_cuda_tests" --gtest_brief=1 --gtest_output="json:$RESULTS/tests.json" \
  >"$RESULTS/tests.log" 2>&1 || TESTS_RC=$?
tail -3 "$RESULTS/tests.log"
grep -m1 'no GPU:' "$RESULTS/tests.log" || true

stage() {  # stage NAME TIMEOUT_S CMD...: runs a step, keeps its output and exit code
  local name="$1" limit="$2"; shift 2
  log "$name"
  timeout "$limit" "$@" >"$RESULTS/$name.out" 2>"$RESULTS/$name.err"
  local rc=$?
  echo "$rc" >"$RESULTS/$name.rc"
  [ "$rc" -ne 0 ] && { log "$name: exit $rc"; tail -3 "$RESULTS/$name.err"; }
  return 0
}

if [ "$GPUS" -gt 0 ]; then
  W=$(( GPUS >= 2 ? 2 : 1 ))
  EMU=(); [ "$GPUS" -lt 2 ] && EMU=(--emulate-world-size 8)
  MAXSZ=$([ "$QUICK" = 1 ] && echo 64M || echo 1G)
  # nccl-tests on the same machine, if present, for the busbw comparison.
  if command -v all_gather_perf >/dev/null 2>&1; then
    stage nccl_tests 120 all_gather_perf -b 1M -e "$MAXSZ" -f 4 -g "$GPUS" -n 20 -w 5
  fi
  stage bench_gather 180 "$FSDPLAB" bench-gather --backend cuda -b 1M -e "$MAXSZ" -f 4 -n 20 -w 5 -c 1 \
    --world-size "$W" --json
  for t in gpt_small two_microbatches; do
    stage "record_$t" 120 "$FSDPLAB" record --backend cuda "$ROOT/traces/$t.json" --world-size "$W" \
      --steps 4 -o "$RESULTS/$t.recorded.json"
    stage "run_$t" 120 "$FSDPLAB" run --backend cuda "$ROOT/traces/$t.json" --world-size "$W" \
      --steps 4 --json -o "$RESULTS/$t.measured.json"
    stage "simulate_$t" 60 "$FSDPLAB" simulate "$RESULTS/$t.recorded.json" --world-size "$W" \
      --steps 4 --json -o "$RESULTS/$t.simulated.json"
    stage "compare_$t" 60 "$FSDPLAB" compare "$RESULTS/$t.simulated.json" "$RESULTS/$t.measured.json"
    cat "$RESULTS/compare_$t.out" 2>/dev/null
  done
else
  log "no GPU on this machine: nothing measured (device tests skipped; CPU-side tests ran)"
fi

# ---- One JSON with everything
python3 - "$RESULTS" "$OUT" "$GPUS" "$GPU_NAME" "$ARCH" "$TESTS_RC" "$(( $(date +%s) - START ))" <<'PY'
import json, os, sys
res, out, gpus, name, arch, tests_rc, secs = sys.argv[1:]
def read(p):
    try:
        with open(os.path.join(res, p)) as f: return f.read()
    except OSError: return None
def js(p):
    t = read(p)
    try: return json.loads(t) if t else None
    except ValueError: return t
doc = {"format": "fsdplab.gpu_check", "version": 1, "gpus": int(gpus), "gpu": name or None,
       "arch": ("sm_" + arch) if arch else None, "seconds": int(secs),
       "measured": int(gpus) > 0,
       "device_tests": {"exit": int(tests_rc), "results": js("tests.json")},
       "stages": {}}
if int(gpus) == 0:
    doc["note"] = "no GPU: device tests skipped, nothing measured"
for f in sorted(os.listdir(res)):
    if f.endswith(".rc"):
        n = f[:-3]
        doc["stages"][n] = {"exit": int(read(f) or 1), "stdout": js(n + ".out"),
                            "stderr": (read(n + ".err") or "")[-2000:]}
for f in sorted(os.listdir(res)):
    if f.endswith((".measured.json", ".simulated.json")):
        doc["stages"].setdefault("reports", {})[f] = js(f)
with open(out, "w") as f: json.dump(doc, f, indent=1)
print("gpu_check: results in", out)
PY
log "done"
[ "$TESTS_RC" -eq 0 ] || exit 3
