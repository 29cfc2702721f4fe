#!/usr/bin/env bash
# Installs what fsdplab needs from Debian's packages, only what is missing. Sourced by demo.sh and
# test.sh; safe to run again.
#
#   bash scripts/setup.sh            Debian's packages (python3-torch is torch 1.13)
#   bash scripts/setup.sh --torch2   also a virtual environment with torch 2.x and transformers
#                                    from PyPI, for the recorder's tests under current torch (real
#                                    FSDP2, checkpoint early stop, selective checkpoints) and the
#                                    FSDP2 grid (bench/fsdp2_grid.sh: HF Llama and GPT-2)
#
# The torch 2.x environment lives outside the clone, in
# ${XDG_CACHE_HOME:-$HOME/.cache}/fsdplab/torch2-venv (FSDPLAB_TORCH2_VENV overrides it), so every
# clone on the machine shares one. Made once: `pip install torch numpy` took 5 min 46 s here and
# the environment is 5.4 GB (PyPI's torch brings its CUDA libraries, unused on the CPU);
# transformers adds about 40 s and 210 MB. It is complete when its marker file lists what it
# holds; an interrupted install is removed and made again.
set -euo pipefail

# libopenmpi-dev and openmpi-bin: one process per rank for live runs (mpirun -np N fsdplab run).
# libgloo-dev: the same under torchrun's (or fsdplab's) variables, over a TCP rendezvous.
# libjs-chart.js: Chart.js, which the build inlines into the report page (fsdplab report, --html).
# chromium-headless-shell: the browser the report page's tests load each page in (label browser).
# python3-dev and ccache: the Python package's extension module (`pip install .`), built through
# ccache by scripts/test_python.sh.
FSDPLAB_PACKAGES=(cmake g++ make libboost-graph-dev nlohmann-json3-dev libfmt-dev
  libsimdjson-dev zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev clang-format python3-torch
  python3-venv python3-dev ccache libopenmpi-dev openmpi-bin libgloo-dev libjs-chart.js
  chromium-headless-shell)

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

if [ "${1:-}" = "--torch2" ]; then
  venv="${FSDPLAB_TORCH2_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdplab/torch2-venv}"
  marker="$venv/.fsdplab-complete"
  # What the environment holds: torch 2.x (real FSDP2) and HF transformers (bench/fsdp2_grid.sh
  # builds Llama and GPT-2 from config objects). The marker lists them, so that an environment
  # made before a package was added here gets it on the next run.
  want="torch transformers"
  imports() { "$venv/bin/python" -c "import ${1// /, }" >/dev/null 2>&1; }
  # transformers takes seconds to import: where the marker says it is there, finding it is enough.
  found() { "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('$1') is None)" \
    >/dev/null 2>&1; }
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ] && imports torch && found transformers; then
    :
  elif [ -x "$venv/bin/python" ] && imports torch; then
    # Made before this marker listed its packages (or by hand): kept, what is missing added.
    if ! imports transformers; then
      echo "fsdplab setup: adding transformers to $venv (once; about 40 s and 210 MB)" >&2
      "$venv/bin/python" -m pip install -q --disable-pip-version-check transformers >&2
    fi
    echo "$want" >"$marker"
  else
    echo "fsdplab setup: making $venv with torch 2.x and transformers from PyPI (once; about" \
      "7 min and 5.6 GB)" >&2
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    start=$SECONDS
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check torch numpy transformers >&2
    echo "$want" >"$marker"
    echo "fsdplab setup: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)')" \
      "in $((SECONDS - start)) s, $(du -sh "$venv" | cut -f1)" >&2
  fi
  echo "$venv/bin/python"
fi
