#!/usr/bin/env bash
# A ptc cluster on this machine: one ptc-coordinator and N ptcd on loopback,
# with all state under DIR.
#
#   tools/local_cluster.sh up DIR [HOSTS] [GPUS_PER_HOST] [MEMORY_PER_HOST]
#   tools/local_cluster.sh down DIR
#
# `up` prints the coordinator's address and writes DIR/env (COORDINATOR=...,
# and HOSTn_SOCKET=...). Binaries come from BIN (default: bazel-bin).
# SPARE_POOL (e.g. 5GiB) sets each ptcd's --spare-pool: memory kept
# allocated and faulted in for the next puts of the sizes it saw.
# PTCD_FLAGS (e.g. "--ucx-gets all") are added to every ptcd's flags.
set -euo pipefail
cmd=${1:-}
dir=${2:-}
[[ -n "$cmd" && -n "$dir" ]] || { echo "usage: $0 up|down DIR [HOSTS] [GPUS] [MEMORY]" >&2; exit 2; }
bin=${BIN:-$(cd "$(dirname "$0")/.." && pwd)/bazel-bin}

wait_for_file() {
  for _ in $(seq 1 200); do [[ -s "$1" ]] && return 0; sleep 0.05; done
  echo "local_cluster: $1 did not appear" >&2; return 1
}

case "$cmd" in
  up)
    hosts=${3:-4}; gpus=${4:-4}; memory=${5:-4GiB}
    mkdir -p "$dir/coordinator" "$dir/logs"
    : > "$dir/pids"
    "$bin/coordinator/ptc-coordinator" --listen 127.0.0.1:0 --state-dir "$dir/coordinator" \
      --port-file "$dir/coordinator.port" --host-timeout 3 --log-level warn \
      >"$dir/logs/coordinator.log" 2>&1 &
    echo "coordinator $!" >> "$dir/pids"
    wait_for_file "$dir/coordinator.port"
    coordinator="127.0.0.1:$(cat "$dir/coordinator.port")"
    echo "COORDINATOR=$coordinator" > "$dir/env"
    for i in $(seq 0 $((hosts - 1))); do
      "$bin/tensor_store/ptcd" --listen 127.0.0.1:0 --socket "$dir/host$i.sock" \
        --port-file "$dir/host$i.port" --memory-limit "$memory" --coordinator "$coordinator" \
        --name "host$i" --gpus "$gpus" --log-level warn \
        ${SPARE_POOL:+--spare-pool "$SPARE_POOL"} ${PTCD_FLAGS:-} >"$dir/logs/host$i.log" 2>&1 &
      echo "host$i $!" >> "$dir/pids"
      echo "HOST${i}_SOCKET=$dir/host$i.sock" >> "$dir/env"
    done
    for i in $(seq 0 $((hosts - 1))); do wait_for_file "$dir/host$i.port"; done
    # Wait until every host has registered.
    for _ in $(seq 1 200); do
      n=$("$bin/tools/ptcctl" hosts --coordinator "$coordinator" --json 2>/dev/null | grep -c '"alive": true' || true)
      [[ "$n" -ge "$hosts" ]] && break
      sleep 0.05
    done
    echo "local cluster up: coordinator $coordinator, $hosts hosts x $gpus GPUs, state in $dir"
    ;;
  down)
    [[ -f "$dir/pids" ]] || exit 0
    while read -r name pid; do kill -TERM "$pid" 2>/dev/null || true; done < "$dir/pids"
    while read -r name pid; do
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
      kill -KILL "$pid" 2>/dev/null || true
    done < "$dir/pids"
    rm -f "$dir/pids"
    echo "local cluster down"
    ;;
  *) echo "usage: $0 up|down DIR [HOSTS] [GPUS] [MEMORY]" >&2; exit 2 ;;
esac
