#!/usr/bin/env bash
# Runs a small cluster from an unpacked ptc tarball (tools/package.sh) and
# checks that it works: a coordinator and two ptcds on loopback, a job
# saved on host0 by synthetic_job, changed onto host0 and host1 (bytes
# between the daemons over UCX), every element verified, and a restart of
# host1's ptcd seen by the coordinator.
#
#   bash tools/tarball_check.sh DIR [--only-glibc]
#
# DIR is the unpacked ptc-VERSION folder. --only-glibc (root; Debian's
# multiarch layout) runs the cluster in a mount namespace where the host's
# libraries are hidden but glibc's own: what a machine without Debian's
# packages has. Prints "tarball check: ok" at the end, or why not, and
# exits non-zero on failure.
set -euo pipefail
if [[ -n "${PTC_TARBALL_CHECK_INNER:-}" ]]; then
  set -- "$3" inner  # sourced in the mount namespace below: GLIBC SCRIPT DIR
fi
dir=$(realpath "${1:?usage: tarball_check.sh DIR [--only-glibc]}")
only_glibc=${2:-}
[[ -x "$dir/bin/ptcd" ]] || { echo "tarball check: $dir/bin/ptcd missing" >&2; exit 1; }

if [[ "$only_glibc" == "--only-glibc" && -z "${PTC_TARBALL_CHECK_INNER:-}" ]]; then
  multiarch=/usr/lib/x86_64-linux-gnu
  glibc=$(mktemp -d)
  trap 'rm -rf "$glibc"' EXIT
  for f in "$multiarch"/{libc,libm,libdl,libpthread,librt,libresolv,libutil,libanl}.so.* \
           "$multiarch"/ld-linux-x86-64.so.2 "$multiarch"/libnss_{files,dns}.so.2; do
    [[ -e "$f" ]] && cp -L "$f" "$glibc/"
  done
  # The inner shell was loaded before the mounts; every program started
  # after them sees glibc and nothing else: the check below runs only the
  # tarball's programs and coreutils that need nothing but libc (no grep).
  PTC_TARBALL_CHECK_INNER=1 exec unshare -m bash -c '
    set -e
    mount --make-rprivate /
    if [[ -d /usr/local/cuda ]]; then mount -t tmpfs none /usr/local/cuda; fi
    mount --bind "$1" /usr/lib/x86_64-linux-gnu
    source "$2"' bash "$glibc" "$0" "$dir"
fi

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "tarball check: FAILED: $*" >&2
  for f in "$work"/*.log; do echo "--- $f" >&2; tail -20 "$f" >&2; done
  exit 1
}

# Every port is the kernel's choice (:0), read back from --port-file: two
# checks at once, or other tests' connections, never collide.
port_of() {  # FILE: waits for a daemon's port file
  for _ in $(seq 400); do
    if [[ -s "$1" ]]; then cat "$1"; return; fi
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "a daemon exited"; done
    sleep 0.05
  done
  fail "$1 never appeared"
}
# Plaintext on loopback; nothing of the caller's cluster (certificates,
# coordinator, token) applies here.
for v in $(compgen -e); do
  if [[ $v == PTC_* ]]; then unset "$v"; fi
done
export PTC_INSECURE=1
ctl() { "$dir/bin/ptcctl" "$@" --coordinator "$coordinator"; }

"$dir/bin/ptc-coordinator" --listen 127.0.0.1:0 --port-file "$work/coordinator.port" \
  --state-dir "$work/coordinator" --insecure >"$work/coordinator.log" 2>&1 &
pids+=($!)
coordinator=127.0.0.1:$(port_of "$work/coordinator.port")
start_host() {
  local i=$1
  "$dir/bin/ptcd" --listen 127.0.0.1:0 --port-file "$work/host$i.port" \
    --coordinator "$coordinator" --name "host$i" --gpus 1 --socket "$work/host$i.sock" \
    --memory-limit 1GiB --metrics-listen 127.0.0.1:0 --insecure >>"$work/host$i.log" 2>&1 &
  pids+=($!)
}
start_host 0
start_host 1
# The number of live hosts, from ptcctl's JSON (bash alone: no grep).
alive() {
  local json n=0
  json=$(ctl hosts --json 2>/dev/null) || { echo 0; return; }
  while [[ "$json" =~ \"alive\":\ *true(.*) ]]; do
    n=$((n + 1))
    json=${BASH_REMATCH[1]}
  done
  echo $n
}
for _ in $(seq 300); do
  [[ $(alive) -eq 2 ]] && break
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "a daemon exited"; done
  sleep 0.2
done
[[ $(alive) -eq 2 ]] || fail "the two ptcds did not register"
echo "tarball check: coordinator and 2 ptcds up"

model=gpt:layers=2,hidden=64,heads=4,ffn=128,vocab=256,positions=16,pad=8
ctl register --job tarball --model "$model" --config tp=1,dp=1 --hosts host0 >/dev/null ||
  fail "register"
"$dir/libexec/synthetic_job" save --coordinator "$coordinator" --job tarball --host host0 \
  --socket "$work/host0.sock" --step 1 >"$work/save.log" 2>&1 || fail "save"
report=$(ctl reconfigure --job tarball --to tp=2 --hosts host0,host1 --json) ||
  fail "reconfigure: $report"
[[ "$report" =~ \"phase\":\ *\"committed\" ]] || fail "reconfigure: $report"
[[ "$report" =~ \"bytes_from_peers\":\ *([0-9]+) ]] && from_peers=${BASH_REMATCH[1]}
[[ "${from_peers:-0}" -gt 0 ]] || fail "no bytes moved between the daemons: $report"
"$dir/libexec/synthetic_job" verify --coordinator "$coordinator" --job tarball \
  >"$work/verify.log" 2>&1 || fail "verify: $(cat "$work/verify.log")"
echo "tarball check: tp=1 on host0 -> tp=2 on host0,host1 committed," \
  "$from_peers bytes between daemons, every element verified"
# host0's metrics port, from its log ("metrics on http://127.0.0.1:PORT/metrics").
log=$(<"$work/host0.log")
[[ "$log" =~ metrics\ on\ http://127\.0\.0\.1:([0-9]+)/metrics ]] ||
  fail "host0 did not say where its metrics are"
curl_metrics=$(exec 3<>"/dev/tcp/127.0.0.1/${BASH_REMATCH[1]}" &&
  printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && cat <&3) || true
[[ "$curl_metrics" == *$'\nptc_store_bytes_in_total '* ]] || fail "host0's metrics did not answer"
echo "tarball check: ok"
