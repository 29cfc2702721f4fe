#!/usr/bin/env bash
# The Python package as a user gets it: a wheel built (`pip wheel .`, scikit-build-core) from a
# clean checkout of HEAD, installed into a fresh virtual environment of Debian's python3 (its
# torch 1.13 visible) and into one layered on the torch 2.x environment (that environment's
# packages visible through a .pth file; the shared environment itself is not touched); in each,
# `fsdplab --help`, the README's one-liner and the API tests (tests/python/test_api.py: every
# function against the command installed beside it, the errors, the example).
#
#   bash scripts/test_python.sh [TORCH2_PYTHON]
#
# The clone and the wheel's build folder stay in build-python/ (the clone is refreshed, the build
# folder reused), compiled through ccache when it is installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
torch2_python="${1:-}"
work="$root/build-python"
src="$work/src"
mkdir -p "$work"
rm -rf "$src" "$work/dist" "$work/venv-debian" "$work/venv-torch2"
git clone -q --no-hardlinks "$root" "$src"
git -C "$src" checkout -q "$(git -C "$root" rev-parse HEAD)"
# Keep the wheel's build folder across runs: it lives outside the fresh clone.
mkdir -p "$work/build-wheel"
ln -s "$work/build-wheel" "$src/build-wheel"
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR="$src"
fi
start=$SECONDS
(cd "$src" && /usr/bin/python3 -m pip wheel --quiet --no-deps -w "$work/dist" .)
wheel="$(ls "$work"/dist/fsdplab-*.whl)"
echo "wheel: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB, built in $((SECONDS - start)) s"

check_env() {  # VENV_PYTHON NAME
  local py="$1" name="$2" bin
  bin="$(dirname "$py")"
  "$py" -m pip install --quiet "$wheel" pytest
  "$bin/fsdplab" --help >/dev/null
  (cd "$work" && "$py" -c "import fsdplab; print(fsdplab.simulate('$src/traces/gpt_small.json')['summary']['step_time_us'])")
  echo "-- API tests in $name"
  (cd "$src/tests/python" && PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -q -p no:cacheprovider test_api.py)
}

/usr/bin/python3 -m venv --system-site-packages "$work/venv-debian"
check_env "$work/venv-debian/bin/python" "Debian's python3 (torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'))"

if [ -n "$torch2_python" ]; then
  /usr/bin/python3 -m venv "$work/venv-torch2"
  site="$("$work/venv-torch2/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$torch2_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/torch2-env.pth"
  check_env "$work/venv-torch2/bin/python" "a venv on the torch 2.x environment (torch $("$work/venv-torch2/bin/python" -c 'import torch; print(torch.__version__)'))"
fi
