#!/usr/bin/env bash
# The GPU save and load of two builds side by side (not a test): on a
# machine with an NVIDIA GPU, runs libexec/gpu_store_benchmark of each
# tarball against that tarball's own coordinator and ptcd, the builds
# alternated, for each ptcd setting:
#
#   bash tools/gpu_store_compare.sh BASE.tar.gz HEAD.tar.gz [RUNS]
#
# The tarballs are tools/package.sh's (build each at its commit on Debian
# 12). Settings: "pool" (--memory-limit 16GiB --spare-pool 4GiB: the next
# save's memory ready, as the deploy guide sizes it) and "small-pool"
# (--memory-limit 8GiB, whose default pool of 512 MiB holds less than one
# save), then "pool" again. Each benchmark saves and loads the
# `gpt:layers=4,hidden=1024,heads=16,vocab=32000,positions=1024` job (1.1
# GiB, one rank) RUNS times (default 5) and prints each phase's
# min/median/max; an older build's benchmark prints fewer phases. Which
# build goes first alternates from one setting to the next (base first,
# then head first, then base first): run on an H200, the second of a pair
# was faster even where the code did not differ (loads, by up to 0.04 s).
set -uo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: bash tools/gpu_store_compare.sh BASE.tar.gz HEAD.tar.gz [RUNS]" >&2
  exit 2
fi
runs=${3:-5}
unpack() {
  local d
  d=$(mktemp -d)
  tar -C "$d" --strip-components=1 -xzf "$1" || exit 1
  echo "$d"
}
base=$(unpack "$1")
head=$(unpack "$2")
failed=0
bench() {  # LABEL PTC_DIR PTCD_ARGS...
  local label=$1 ptc=$2
  shift 2
  local work port
  work=$(mktemp -d)
  port=$((21000 + RANDOM % 2000 * 4))
  # Plaintext on loopback, for this benchmark's own cluster only.
  PTC_INSECURE=1 "$ptc/bin/ptc-coordinator" --listen "127.0.0.1:$port" --state-dir "$work/c" \
    --insecure >"$work/coordinator.log" 2>&1 &
  local c=$!
  "$ptc/bin/ptcd" --listen "127.0.0.1:$((port + 1))" --coordinator "127.0.0.1:$port" \
    --name host0 --gpus 1 --socket "$work/host0.sock" --insecure "$@" >"$work/ptcd.log" 2>&1 &
  local d=$!
  for _ in $(seq 100); do
    PTC_INSECURE=1 "$ptc/bin/ptcctl" register --job bench \
      --model gpt:layers=4,hidden=1024,heads=16,vocab=32000,positions=1024 \
      --config tp=1 --hosts host0 --coordinator "127.0.0.1:$port" >/dev/null 2>&1 && break
    sleep 0.3
  done
  echo "== $label: ptcd $*"
  if ! PTC_INSECURE=1 timeout 300 "$ptc/libexec/gpu_store_benchmark" \
      --coordinator "127.0.0.1:$port" --job bench --socket "$work/host0.sock" --runs "$runs"; then
    failed=1
    tail -n 5 "$work/ptcd.log" "$work/coordinator.log"
  fi
  kill "$d" "$c" 2>/dev/null
  wait "$d" "$c" 2>/dev/null
  rm -rf "$work"
}
pair=0
for setting in "pool:--memory-limit 16GiB --spare-pool 4GiB" "small-pool:--memory-limit 8GiB" \
               "pool:--memory-limit 16GiB --spare-pool 4GiB"; do
  name=${setting%%:*}
  read -r -a args <<<"${setting#*:}"
  if ((pair++ % 2 == 0)); then
    bench "base $(basename "$1") $name" "$base" "${args[@]}"
    bench "head $(basename "$2") $name" "$head" "${args[@]}"
  else
    bench "head $(basename "$2") $name" "$head" "${args[@]}"
    bench "base $(basename "$1") $name" "$base" "${args[@]}"
  fi
done
exit $failed
