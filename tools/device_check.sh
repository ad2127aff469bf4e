#!/usr/bin/env bash
# ptc on a GPU, in one script: run it on a machine with an NVIDIA GPU (a
# driver for CUDA 13), x86-64 Linux with glibc >= the tarball's, and none of
# Debian's packages, from a checkout whose dist/ holds the tarball that
# `bash tools/package.sh` builds (on Debian 12, where ptc is built).
#
#   bash tools/device_check.sh [--dry-run] [RESULTS_DIR]
#
# PTC_DEVICE_PYTHON: the Python with PyTorch to test in (default python3;
# on Debian 12 /usr/bin/python3, whose PyTorch 1.13 the dry run then uses).
#
# Steps, each reported as PASS, FAIL or SKIP with its output in RESULTS_DIR
# (default: device-check/ ; $OUT where that is set; at most 8 files):
#   facts      the GPU, driver, glibc, Python and PyTorch of the machine
#   tarball    tools/tarball_check.sh: a coordinator and two ptcds from the
#              tarball, a change between them over UCX, every element verified
#   cuda-test  the C++ test of the CUDA path (client/device_copies_test): a
#              job's regions GPU -> store -> GPU bit for bit through
#              registered (pinned) store memory on a side stream
#   store-bench  tools/gpu_store_benchmark: a 1.1 GiB job saved from and
#              loaded into GPU memory through a ptcd from the tarball (its
#              spare pool sized as the deploy guide says: a save's memory is
#              ready), 5 runs, phase by phase, against cudaMemcpy from
#              cudaMallocHost in the same run
#   copy-bench tools/gpu_copy_benchmark: pageable vs registered vs pinned
#   python     the client wheel (dist/) installed for the machine's Python
#              and PyTorch (pip install --target, on PYTHONPATH): ptc.torch with the state on the
#              GPU (tests/python/test_torch_gpu.py: every dtype, and a tp=2
#              -> tp=1 -> tp=2 change, bit for bit) and the client's and
#              ptc.torch's CPU tests, against the tarball's daemons
#   pause-bench  tools/gpu_pause_benchmark.py: a 3.7 GiB GPU job's restart
#              through ptc vs DCP vs torch.save/load, and its tp=2 -> tp=1
#              change through ptc vs DCP (two processes on the GPU save,
#              one loads, DCP reshards), 3 runs, against GPU <-> pinned copies
# --dry-run runs what needs no GPU (facts, tarball, python) and skips the rest: it
# proves the script and the tarball on a machine without a GPU.
# Exits non-zero if a step failed. Takes about 5 minutes on an H100 host.
set -uo pipefail
cd "$(dirname "$0")/.."
# The machine's Python with PyTorch (a GPU machine's own).
python=${PTC_DEVICE_PYTHON:-python3}
dry=0
if [[ "${1:-}" == "--dry-run" ]]; then dry=1; shift; fi
results=${1:-${OUT:-device-check}}
mkdir -p "$results"
results=$(realpath "$results")
summary="$results/summary.txt"
: >"$summary"
failed=0

report() {  # STEP STATUS WHAT
  printf '%-12s %-5s %s\n' "$1" "$2" "$3" | tee -a "$summary"
  [[ "$2" == FAIL ]] && failed=1
  return 0
}
# Runs a step's command with a time limit, its output in RESULTS/STEP.log.
step() {  # STEP LIMIT_S WHAT COMMAND...
  local name=$1 limit=$2 what=$3
  shift 3
  echo "== $name: $what"
  if timeout "$limit" "$@" >"$results/$name.log" 2>&1; then
    report "$name" PASS "$what"
  else
    report "$name" FAIL "$what (exit $?; see $name.log)"
  fi
  tail -25 "$results/$name.log"
}

tarball=$(ls -t dist/ptc-*-linux-x86_64.tar.gz 2>/dev/null | head -1)
wheel=$(ls -t dist/ptc-*.whl 2>/dev/null | head -1)
if [[ -z "$tarball" ]]; then
  report tarball FAIL "no dist/ptc-*-linux-x86_64.tar.gz: run 'bash tools/package.sh' first"
  exit 1
fi
ptc=$(mktemp -d)/ptc
mkdir -p "$ptc"
tar -C "$ptc" --strip-components=1 -xzf "$tarball"

{
  echo "date: $(date -u +%FT%TZ)"
  echo "tarball: $(basename "$tarball") (built with glibc $(cat "$ptc/GLIBC"))"
  echo "host glibc: $(ldd --version 2>&1 | head -1)"
  echo "os: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  echo "cpus: $(nproc)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
      sed 's/^/gpu: /'
  else
    echo "gpu: none (no nvidia-smi)"
  fi
  echo "python: $("$python" --version 2>&1)"
  "$python" -c "import torch; print('torch:', torch.__version__, 'cuda', torch.version.cuda,
'available', torch.cuda.is_available())" 2>&1 | tail -1
} >"$results/facts.log" 2>&1
cat "$results/facts.log"
report facts PASS "$(grep -m1 '^gpu:' "$results/facts.log" || echo 'gpu: none')"

step tarball 180 "a cluster from the tarball: a change between two ptcds, verified" \
  bash tools/tarball_check.sh "$ptc"

if [[ $dry == 1 ]]; then
  for s in cuda-test store-bench copy-bench; do report "$s" SKIP "dry run: needs a GPU"; done
else
  step cuda-test 300 "C++ test of the CUDA path (device_copies_test)" \
    "$ptc/libexec/device_copies_test" --durations yes

  # The store benchmark against a coordinator and a ptcd from the tarball.
  work=$(mktemp -d)
  base=$((21000 + ($$ % 1000) * 4))
  "$ptc/bin/ptc-coordinator" --listen "127.0.0.1:$base" --state-dir "$work/c" --insecure \
    >"$work/coordinator.log" 2>&1 &
  cpid=$!
  "$ptc/bin/ptcd" --listen "127.0.0.1:$((base + 1))" --coordinator "127.0.0.1:$base" \
    --name host0 --gpus 1 --socket "$work/host0.sock" --memory-limit 16GiB --spare-pool 4GiB \
    --insecure \
    >"$work/ptcd.log" 2>&1 &
  dpid=$!
  store_bench() {
    export PTC_INSECURE=1  # the client side of --insecure; this step only
    for _ in $(seq 100); do
      "$ptc/bin/ptcctl" register --job bench \
        --model gpt:layers=4,hidden=1024,heads=16,vocab=32000,positions=1024 \
        --config tp=1 --hosts host0 --coordinator "127.0.0.1:$base" && break
      sleep 0.3
    done
    "$ptc/libexec/gpu_store_benchmark" --coordinator "127.0.0.1:$base" --job bench \
      --socket "$work/host0.sock" --runs 5
  }
  export ptc base work
  export -f store_bench
  step store-bench 300 "save/load of 1.1 GiB of GPU state through ptcd vs cudaMemcpy pinned" \
    bash -c store_bench
  kill "$dpid" "$cpid" 2>/dev/null
  wait "$dpid" "$cpid" 2>/dev/null
  if grep -q "store-bench  FAIL" "$summary"; then
    tail -20 "$work/coordinator.log" "$work/ptcd.log" >>"$results/store-bench.log"
  fi
  rm -rf "$work"

  step copy-bench 180 "GPU copies: pageable vs registered vs cudaMallocHost" \
    "$ptc/libexec/gpu_copy_benchmark" 5 256 1024
fi

# The Python client: the wheel installed for the machine's Python, beside
# its PyTorch (a folder on PYTHONPATH: a venv of a venv would not see the
# packages of the one the machine's python3 is).
site=$(mktemp -d)/site
bins=$(mktemp -d)
bash tools/internal/bin_dir.sh "$ptc" "$bins"
if [[ -z "$wheel" ]]; then
  report python FAIL "no dist/ptc-*.whl: run 'bash tools/package.sh' first"
elif ! "$python" -m pip install -q --no-index --no-deps --target "$site" "$wheel" \
       >"$results/python.log" 2>&1; then
  report python FAIL "installing $(basename "$wheel") (see python.log)"
else
  # Without openssl (no certificates for the test clusters) the tests' clusters
  # run plaintext on loopback.
  plain=0
  command -v openssl >/dev/null || plain=1
  echo "openssl: $(command -v openssl || echo 'none: test clusters in plaintext')" >>"$results/facts.log"
  py_tests() {
    cd "$bins" && PTC_BIN_DIR="$bins" PTC_INSTALLED_CLIENT=1 PTC_TEST_PLAINTEXT=$plain \
      PTC_REQUIRE_GPU=$((1 - dry)) PYTHONPATH="$site" \
      "$python" -m pytest -q -p no:cacheprovider -p no:xdist --rootdir "$root/tests/python" \
      "$root/tests/python/test_torch_gpu.py" "$root/tests/python/test_client.py" \
      "$root/tests/python/test_torch_api.py" "$root/tests/python/test_layout_spec.py"
  }
  root=$PWD
  export python site bins plain root dry
  export -f py_tests
  step python 300 "the wheel in $("$python" --version): ptc.torch on the GPU and the client's tests" \
    bash -c py_tests
  if [[ $dry == 1 ]]; then
    report pause-bench SKIP "dry run: needs a GPU"
  else
    step pause-bench 300 "a 3.7 GiB GPU job: restart and tp=2 -> tp=1 change, ptc vs DCP (and torch.save)" \
      env PYTHONPATH="$site" "$python" tools/gpu_pause_benchmark.py --bin "$bins" --runs 3 --layers 4
  fi
fi
echo "== summary"
cat "$summary"
exit $failed
