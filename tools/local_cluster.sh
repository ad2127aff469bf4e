#!/usr/bin/env bash
# A ptc cluster on this machine: one ptc-coordinator and N ptcd on loopback,
# with all state under DIR.
#
#   tools/local_cluster.sh up DIR [--ha] [HOSTS] [GPUS_PER_HOST] [MEMORY_PER_HOST]
#   tools/local_cluster.sh down DIR
#   tools/local_cluster.sh kill-leader DIR    (--ha: SIGKILL the leading coordinator)
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
# --ha: the control plane as a cluster would run it for high availability
# (docs/high-availability.md): a 3-member etcd (mutual TLS with a CA of its
# own under DIR/etcd-certs) and two coordinators over it, each started
# again when it exits (as systemd does); COORDINATOR lists both.
set -euo pipefail
cmd=${1:-}
dir=${2:-}
ha=0
args=()
for a in "${@:3}"; do
  if [[ $a == --ha ]]; then ha=1; else args+=("$a"); fi
done
set -- "$cmd" "$dir" "${args[@]}"
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

# Free loopback ports, $1 of them.
free_ports() {
  python3 -c 'import socket,sys
s=[socket.socket() for _ in range(int(sys.argv[1]))]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))' "$1"
}

# etcd's flags for the members and etcdctl's, with TLS unless INSECURE.
etcd_tls() {
  local e="$dir/etcd-certs"
  [[ "${INSECURE:-0}" == 1 ]] && return 0
  case $1 in
    member) echo --cert-file "$e/etcd-$2.pem" --key-file "$e/etcd-$2.key" \
      --trusted-ca-file "$e/ca.pem" --client-cert-auth --peer-cert-file "$e/etcd-$2.pem" \
      --peer-key-file "$e/etcd-$2.key" --peer-trusted-ca-file "$e/ca.pem" --peer-client-cert-auth ;;
    coordinator) echo --etcd-ca "$e/ca.pem" --etcd-cert "$e/etcd-client-coordinator.pem" \
      --etcd-key "$e/etcd-client-coordinator.key" ;;
    ctl) echo --cacert "$e/ca.pem" --cert "$e/etcd-client-coordinator.pem" \
      --key "$e/etcd-client-coordinator.key" ;;
  esac
}

# --ha: three etcd members and two supervised coordinators; sets
# $coordinator to both addresses.
start_control_plane_ha() {
  command -v etcd >/dev/null || { echo "local_cluster: --ha needs etcd (tools/setup.sh installs it)" >&2; exit 1; }
  local scheme=https ports i
  [[ "${INSECURE:-0}" == 1 ]] && scheme=http
  if [[ "${INSECURE:-0}" != 1 && ! -f "$dir/etcd-certs/ca.pem" ]]; then
    "$root/tools/ptc-certs" "$dir/etcd-certs" ca >/dev/null
    "$root/tools/ptc-certs" "$dir/etcd-certs" etcd-client coordinator >/dev/null
    for i in 0 1 2; do "$root/tools/ptc-certs" "$dir/etcd-certs" etcd "e$i" >/dev/null; done
  fi
  read -r -a ports <<< "$(free_ports 8)"
  local initial="" endpoints=""
  for i in 0 1 2; do
    initial+="${initial:+,}e$i=$scheme://127.0.0.1:${ports[$((3 + i))]}"
    endpoints+="${endpoints:+,}127.0.0.1:${ports[$i]}"
  done
  for i in 0 1 2; do
    # shellcheck disable=SC2046
    etcd --name "e$i" --data-dir "$dir/etcd/e$i" \
      --listen-client-urls "$scheme://127.0.0.1:${ports[$i]}" \
      --advertise-client-urls "$scheme://127.0.0.1:${ports[$i]}" \
      --listen-peer-urls "$scheme://127.0.0.1:${ports[$((3 + i))]}" \
      --initial-advertise-peer-urls "$scheme://127.0.0.1:${ports[$((3 + i))]}" \
      --initial-cluster "$initial" --initial-cluster-state new \
      --initial-cluster-token "ptc-local-$$" $(etcd_tls member "e$i") \
      >>"$dir/logs/etcd$i.log" 2>&1 &
    echo "etcd$i $!" >> "$dir/pids"
  done
  coordinator="127.0.0.1:${ports[6]},127.0.0.1:${ports[7]}"
  for i in 0 1; do
    # Started again a second after it exits (a coordinator that lost the
    # lead exits and comes back as a standby), until `down`.
    # shellcheck disable=SC2046
    (
      trap 'kill -TERM $child 2>/dev/null; wait $child; exit 0' TERM
      while true; do
        "$bin/coordinator/ptc-coordinator" --listen "127.0.0.1:${ports[$((6 + i))]}" \
          --etcd "$endpoints" --etcd-lease 3 --host-timeout 3 --log-level info \
          $(etcd_tls coordinator) $(tls coordinator) ${COORDINATOR_FLAGS:-} \
          >>"$dir/logs/coordinator$i.log" 2>&1 &
        child=$!
        echo "$child" > "$dir/coordinator$i.pid"
        wait $child || true
        sleep 1
      done
    ) </dev/null >>"$dir/logs/coordinator$i.log" 2>&1 &
    echo "coordinator$i $!" >> "$dir/pids"
  done
  printf 'ETCD_ENDPOINTS=%s\nCOORDINATOR0=127.0.0.1:%s\nCOORDINATOR1=127.0.0.1:%s\n' \
    "$endpoints" "${ports[6]}" "${ports[7]}" > "$dir/etcd.env"
  for _ in $(seq 1 400); do
    "$bin/tools/ptcctl" jobs --coordinator "$coordinator" --json >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "local_cluster: no coordinator served; see $dir/logs/coordinator*.log" >&2
  exit 1
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
    if [[ $ha == 1 ]]; then
      start_control_plane_ha
    else
      # shellcheck disable=SC2046
      "$bin/coordinator/ptc-coordinator" --listen 127.0.0.1:0 --state-dir "$dir/coordinator" \
        --port-file "$dir/coordinator.port" --host-timeout 3 --log-level warn $(tls coordinator) ${COORDINATOR_FLAGS:-} \
        >"$dir/logs/coordinator.log" 2>&1 &
      echo "coordinator $!" >> "$dir/pids"
      wait_for_file "$dir/coordinator.port"
      coordinator="127.0.0.1:$(cat "$dir/coordinator.port")"
    fi
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
  kill-leader)
    # shellcheck disable=SC1091
    source "$dir/etcd.env"
    security
    # shellcheck disable=SC2046
    leader=$(ETCDCTL_API=3 etcdctl --endpoints "$ETCD_ENDPOINTS" $(etcd_tls ctl) \
      get /ptc/leader --print-value-only)
    for i in 0 1; do
      address=COORDINATOR$i
      if [[ $leader == "${!address}" ]]; then
        kill -KILL "$(cat "$dir/coordinator$i.pid")"
        echo "killed the leader, coordinator$i at $leader"
      fi
    done
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
  *) echo "usage: $0 up|down|kill-host|start-host|kill-leader DIR [...]" >&2; exit 2 ;;
esac
