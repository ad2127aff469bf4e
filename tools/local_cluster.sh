#!/usr/bin/env bash
# A ptc cluster on this machine: one ptc-coordinator and N ptcd on loopback,
# with all state under DIR.
#
#   tools/local_cluster.sh up DIR [HOSTS] [GPUS_PER_HOST] [MEMORY_PER_HOST]
#   tools/local_cluster.sh down DIR
#   tools/local_cluster.sh kill-host DIR I    (SIGKILL host I's ptcd: a dead host)
#   tools/local_cluster.sh start-host DIR I   (host I again: a new, empty ptcd)
#
# `up` prints the coordinator's address and writes DIR/env (COORDINATOR=...,
# HOSTn_SOCKET=..., PTC_TLS_CA/PTC_TLS_CERT/PTC_TLS_KEY: the operator's
# certificate, for ptcctl and launchers; JOB_TLS_CERT/JOB_TLS_KEY: the
# certificate for a job's processes, which act on their job with the token
# `ptcctl register` prints, as PTC_JOB_TOKEN). Binaries come from BIN
# (default: bazel-bin).
# Every connection is mutual TLS: the cluster's CA and certificates (one
# per host, the coordinator's, an admin's, the jobs' "client") and the job
# token key are made under DIR/certs with tools/ptc-certs; every ptcd
# admits local clients with a job token only. INSECURE=1 runs it in
# plaintext, without tokens, instead.
# SPARE_POOL (e.g. 5GiB) sets each ptcd's --spare-pool: memory kept
# allocated and faulted in for the next puts of the sizes it saw.
# PTCD_FLAGS (e.g. "--spare-pool 2GiB") are added to every ptcd's flags,
# COORDINATOR_FLAGS (e.g. "--log-level info") to the coordinator's.
set -euo pipefail
cmd=${1:-}
dir=${2:-}
[[ -n "$cmd" && -n "$dir" ]] || { echo "usage: $0 up|down DIR [HOSTS] [GPUS] [MEMORY]" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$root/bazel-bin}

# Sets tls() for the cluster in $dir (certificates, or plaintext).
security() {
  certs="$dir/certs"
  tls() { echo --insecure; }
  if [[ "${INSECURE:-0}" != 1 ]]; then
    tls() {
      echo --tls-ca "$certs/ca.pem" --tls-cert "$certs/$1.pem" --tls-key "$certs/$1.key" \
        --token-key "$certs/tokens.key"
    }
  fi
}

# Starts host$1's ptcd (settings from $dir/settings).
start_host() {
  local i=$1
  # shellcheck disable=SC1091
  source "$dir/settings"
  rm -f "$dir/host$i.port"
  # shellcheck disable=SC2046
  "$bin/ptcd/ptcd" --listen 127.0.0.1:0 --socket "$dir/host$i.sock" \
    --port-file "$dir/host$i.port" --memory-limit "$memory" --coordinator "$coordinator" \
    --name "host$i" --gpus "$gpus" --log-level warn $(tls "host$i") \
    ${SPARE_POOL:+--spare-pool "$SPARE_POOL"} ${PTCD_FLAGS:-} >>"$dir/logs/host$i.log" 2>&1 &
  echo "host$i $!" >> "$dir/pids"
}

wait_for_file() {
  for _ in $(seq 1 200); do [[ -s "$1" ]] && return 0; sleep 0.05; done
  echo "local_cluster: $1 did not appear" >&2; return 1
}

case "$cmd" in
  up)
    hosts=${3:-4}; gpus=${4:-4}; memory=${5:-4GiB}
    mkdir -p "$dir/coordinator" "$dir/logs"
    : > "$dir/pids"
    security
    if [[ "${INSECURE:-0}" != 1 ]]; then
      if [[ ! -f "$certs/ca.pem" ]]; then
        "$root/tools/ptc-certs" "$certs" ca >/dev/null
        "$root/tools/ptc-certs" "$certs" coordinator >/dev/null
        "$root/tools/ptc-certs" "$certs" admin >/dev/null
        "$root/tools/ptc-certs" "$certs" client >/dev/null
        "$root/tools/ptc-certs" "$certs" token-key >/dev/null
      fi
      export PTC_TLS_CA="$certs/ca.pem" PTC_TLS_CERT="$certs/admin.pem" PTC_TLS_KEY="$certs/admin.key"
    else
      export PTC_INSECURE=1
    fi
    # shellcheck disable=SC2046
    "$bin/coordinator/ptc-coordinator" --listen 127.0.0.1:0 --state-dir "$dir/coordinator" \
      --port-file "$dir/coordinator.port" --host-timeout 3 --log-level warn $(tls coordinator) ${COORDINATOR_FLAGS:-} \
      >"$dir/logs/coordinator.log" 2>&1 &
    echo "coordinator $!" >> "$dir/pids"
    wait_for_file "$dir/coordinator.port"
    coordinator="127.0.0.1:$(cat "$dir/coordinator.port")"
    echo "COORDINATOR=$coordinator" > "$dir/env"
    printf 'coordinator=%s\ngpus=%s\nmemory=%s\n' "$coordinator" "$gpus" "$memory" \
      > "$dir/settings"
    if [[ "${INSECURE:-0}" != 1 ]]; then
      printf 'PTC_TLS_CA=%s\nPTC_TLS_CERT=%s\nPTC_TLS_KEY=%s\nJOB_TLS_CERT=%s\nJOB_TLS_KEY=%s\n' \
        "$PTC_TLS_CA" "$PTC_TLS_CERT" "$PTC_TLS_KEY" "$certs/client.pem" "$certs/client.key" \
        >> "$dir/env"
    else
      echo "PTC_INSECURE=1" >> "$dir/env"
    fi
    for i in $(seq 0 $((hosts - 1))); do
      if [[ "${INSECURE:-0}" != 1 && ! -f "$certs/host$i.pem" ]]; then
        "$root/tools/ptc-certs" "$certs" host "host$i" >/dev/null
      fi
      start_host "$i"
      echo "HOST${i}_SOCKET=$dir/host$i.sock" >> "$dir/env"
    done
    for i in $(seq 0 $((hosts - 1))); do wait_for_file "$dir/host$i.port"; done
    # Wait until every host has registered.
    for _ in $(seq 1 200); do
      n=$("$bin/tools/ptcctl" hosts --coordinator "$coordinator" --json 2>/dev/null | grep -c '"alive": true' || true)
      [[ "$n" -ge "$hosts" ]] && break
      sleep 0.05
    done
    echo "local cluster up: coordinator $coordinator, $hosts hosts x $gpus GPUs," \
      "$([[ "${INSECURE:-0}" != 1 ]] && echo "mutual TLS (certificates in $certs)" || echo "PLAINTEXT"), state in $dir"
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
  kill-host)
    i=${3:?host index}
    pid=$(awk -v h="host$i" '$1 == h {p = $2} END {print p}' "$dir/pids")
    [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null || true
    ;;
  start-host)
    i=${3:?host index}
    security
    start_host "$i"
    wait_for_file "$dir/host$i.port"
    ;;
  *) echo "usage: $0 up|down|kill-host|start-host DIR [...]" >&2; exit 2 ;;
esac
