#!/usr/bin/env bash
# ptc as a GPU user installs it: the client wheel in a venv of a Python that
# does not see Debian's packages, with PyTorch 2.x from PyPI, and the
# cluster's daemons from the relocatable tarball; then the Python client's
# and ptc.torch's tests against them.
#
#   bash tools/venv_check.sh [PYTEST_ARGS...]
#
# The interpreter is $PTC_VENV_PYTHON, else the first python3 on PATH that
# is not Debian's /usr/bin/python3 (pyenv's, conda's, a python.org build),
# else Debian's own in a venv without its system packages. PyTorch is
# $PTC_VENV_TORCH (default torch==2.11.0, what the GPU machines have). The
# venv is made once per interpreter and PyTorch version, in
# ~/.cache/ptc/venv-PYTHON-TORCH (PyTorch's wheels from PyPI are ~2.6 GB);
# the wheel is reinstalled every time. Ends with pytest's summary line.
set -euo pipefail
cd "$(dirname "$0")/.."

torch_req=${PTC_VENV_TORCH:-torch==2.11.0}
python=${PTC_VENV_PYTHON:-}
if [[ -z "$python" ]]; then
  while read -r candidate; do
    if [[ "$(realpath "$candidate")" != /usr/bin/python3* ]]; then
      python=$candidate
      break
    fi
  done < <(type -ap python3)
fi
python=${python:-/usr/bin/python3}
# pyenv's shims answer for the version pyenv selects: use the real binary.
python=$("$python" -c "import sys; print(sys.executable)")
pyver=$("$python" -c "import sys; print('%d.%d.%d' % sys.version_info[:3])")
venv="$HOME/.cache/ptc/venv-$pyver-${torch_req//[^A-Za-z0-9.]/_}"
echo "venv check: Python $pyver ($python), $torch_req, venv $venv"

if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch, numpy, pytest" 2>/dev/null; then
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  echo "venv check: installing $torch_req, numpy and pytest from PyPI (once)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$torch_req" numpy pytest
fi
"$venv/bin/python" -c "import torch; print('venv check: torch', torch.__version__)"

dist=$(mktemp -d)
farm=$(mktemp -d)
trap 'rm -rf "$dist" "$farm"' EXIT
bash tools/package.sh "$dist" | grep "^package:"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
  "$dist"/ptc-*.whl
tar -C "$farm" -xzf "$dist"/ptc-*-linux-x86_64.tar.gz
# The tests find the daemons where Bazel puts them (PTC_BIN_DIR).
bash tools/internal/bin_dir.sh "$farm"/ptc-* "$farm/bin"

tests=(tests/python/test_client.py tests/python/test_layout_spec.py
       tests/python/test_torch_api.py tests/python/test_torch_grouped.py
       tests/python/test_torch_state_loss.py tests/python/test_launcher.py)
# Run from outside the checkout, so that nothing of it is importable.
root=$PWD
cd "$farm"
PTC_BIN_DIR="$farm/bin" PTC_INSTALLED_CLIENT=1 \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$root/tests/python" \
  "${tests[@]/#/$root/}" "$@"
