#!/usr/bin/env bash
# Reconfiguration benchmark (not a test): a GPT-3 350M job with fp16
# weights and ZeRO-1 fp32 Adam state (~4.9 GB) moved between the ptcd of a
# local cluster, RUNS times per case and transport (UCX, gRPC stream),
# against ucx_perftest bandwidth between two processes measured in the
# same run.
#
# Then the same two changes with the Tenplex-style per-rank plan run by the
# same engine (--strategy tenplex), against ptc's plan, on the gRPC stream
# (STRATEGY_TRANSPORTS="ucx grpc" for both transports).
#
#   bash tools/reconfigure_benchmark.sh [RUNS]
#   PARTS=strategies bash tools/reconfigure_benchmark.sh   (only the second)
#   PARTS=local bash tools/reconfigure_benchmark.sh   tp=4 -> tp=2,pp=2 within
#                   host0 (local copies only; both versions on one host: each
#                   ptcd may hold ${HOST_MEMORY:-12GiB} then, else 8GiB)
#   TRANSPORTS=ucx PARTS=transports bash tools/reconfigure_benchmark.sh 1
#   PREPARE=1 ...   before each measured change, `ptcctl prepare --wait` has
#                   the target host prepare the memory it will stage (each
#                   ptcd gets --spare-pool ${SPARE_POOL:-6GiB}); not timed
#   PTCD_FLAGS="..." ...   extra flags for every ptcd
#   BIN=DIR ...   the binaries of another build (a bazel-bin), not built here
#   RESULTS=FILE ...   also appends a JSON line per measured change to FILE
#                   (tools/compare_builds.sh reads them)
#   LOGS=DIR ...   keeps the daemons' logs (copied into DIR at the end), to
#                   look into a run far from the others
#   WARMUP=1 ...   one change to host1 and back before the measured ones, not
#                   timed: the first change into a ptcd's fresh memory on a VM
#                   waits for the hypervisor to back it (measured: 15.9 s
#                   against 5.1 s for the next two; 80% of the target ptcd's
#                   samples zeroing new shared-memory pages)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
if [[ -z "${BIN:-}" ]]; then
  bazel build -c opt //tools:ptcctl //tools:synthetic_job //ptcd:ptcd \
    //coordinator:ptc-coordinator >/dev/null 2>&1
fi
export BIN=${BIN:-$PWD/bazel-bin}
ptcctl=$BIN/tools/ptcctl
dir=$(mktemp -d /tmp/ptc-bench-XXXXXX)
keep_logs() {
  [[ -n "${LOGS:-}" ]] || return 0
  mkdir -p "$LOGS" && cp -r "$dir/logs/." "$LOGS/" && echo "logs kept in $LOGS" >&2
}
trap 'tools/local_cluster.sh down "$dir" >/dev/null; keep_logs; rm -rf "$dir"' EXIT

perftest() {  # $1: UCX_TLS, $2: port, $3: test, $4: bytes, $5: iterations -> MB/s
  UCX_TLS=$1 ucx_perftest -t "$3" -s "$4" -n "$5" -p "$2" >/dev/null 2>&1 &
  local srv=$!
  sleep 1
  UCX_TLS=$1 timeout 120 ucx_perftest 127.0.0.1 -t "$3" -s "$4" -n "$5" -p "$2" 2>/dev/null |
    awk '/^Final:/ {print $(NF-2)}'
  wait $srv 2>/dev/null || true
}
# Three shared-memory limits: put_bw copies into memory UCX allocated and
# maps in both processes (with 16 MiB messages both buffers stay in this
# machine's 32 MiB L3; 1 GiB ones go to DRAM); tag_bw of 1 GiB messages
# is the path ptc's sends take (a rendezvous: the receiver reads the
# sender's own memory with CMA on one machine, RDMA on a cluster).
ucx_shm=$(perftest posix,cma,self 13511 ucp_put_bw 16777216 200)
ucx_put_dram=$(perftest posix,cma,self 13513 ucp_put_bw 1073741824 10)
ucx_tag=$(perftest posix,cma,self 13514 tag_bw 1073741824 10)
ucx_tcp=$(perftest tcp 13512 ucp_put_bw 16777216 200)
echo "ucx_perftest between two processes, shared memory: put_bw 16 MiB messages ${ucx_shm} MB/s, put_bw 1 GiB ${ucx_put_dram} MB/s, tag_bw 1 GiB ${ucx_tag} MB/s; loopback TCP put_bw 16 MiB ${ucx_tcp} MB/s"
# The other physical limit: staging writes into memory the store has just
# allocated, which a VM backs on first write (WARMUP=1 above).
fresh=$(/usr/bin/python3 - <<'PY'
import time
import numpy as np
src = np.ones(1 << 30, dtype=np.uint8)
rates = []
for _ in range(3):
    t = time.perf_counter(); dst = np.empty_like(src); dst[:] = src
    rates.append(src.nbytes / (time.perf_counter() - t) / 1e6); del dst
print(f"{sorted(rates)[1]:.0f}")
PY
)
echo "memcpy of 1 GiB into freshly allocated memory (median of 3): ${fresh} MB/s"

[[ -n "${PREPARE:-}" ]] && export SPARE_POOL=${SPARE_POOL:-6GiB}
parts=${PARTS:-transports,strategies}
memory=8GiB
[[ $parts == *local* ]] && memory=${HOST_MEMORY:-12GiB}
tools/local_cluster.sh up "$dir" 4 4 $memory >/dev/null
set -a; source "$dir/env"; set +a
c="--coordinator $COORDINATOR"
model=gpt3-350m
start=tp=4,pp=1,dp=1,zero=1
$ptcctl register $c --job bench --model $model --config $start --hosts host0 >/dev/null
PTC_JOB_TOKEN=$($ptcctl token $c bench)
export PTC_JOB_TOKEN
$BIN/tools/synthetic_job save $c --job bench --host host0 --socket "$HOST0_SOCKET" --step 1

if [[ -n "${WARMUP:-}" ]]; then
  $ptcctl reconfigure $c --job bench --to tp=2,pp=2,dp=1,zero=1 --hosts host1 --json >/dev/null
  $ptcctl reconfigure $c --job bench --to $start --hosts host0 --json >/dev/null
fi

measure() {  # $1 name, $2 config, $3 hosts, $4 transport, [$5 strategy]
  local times=() stage_times=() verify_times=() rates=() stage_rates=()
  for i in $(seq 1 "$runs"); do
    if [[ -n "${PREPARE:-}" ]]; then
      $ptcctl prepare $c --job bench --to "$2" --hosts "$3" --wait >/dev/null
    fi
    out=$($ptcctl reconfigure $c --job bench --to "$2" --hosts "$3" --transport "$4" \
      --strategy "${5:-ptc}" --json)
    read -r secs stage verify cross < <(echo "$out" | /usr/bin/python3 -c 'import json,sys
r = json.load(sys.stdin)
# The bytes moved: from peers, and copied within a host (a local change).
print(r["seconds"], r["staging_seconds"], r["verifying_seconds"],
      r["bytes_from_peers"] + r["plan"]["copied_within_host_bytes"])')
    times+=("$secs"); stage_times+=("$stage"); verify_times+=("$verify")
    if [[ -n "${RESULTS:-}" ]]; then
      echo "{\"case\": \"$1\", \"seconds\": $secs, \"staging_seconds\": $stage," \
        "\"verifying_seconds\": $verify, \"bytes_moved\": $cross," \
        "\"tag_bw_mb_s\": ${ucx_tag:-0}, \"memcpy_fresh_mb_s\": ${fresh:-0}}" >>"$RESULTS"
    fi
    rates+=("$(/usr/bin/python3 -c "print($cross / $secs / 1e6)")")
    stage_rates+=("$(/usr/bin/python3 -c "print($cross / $stage / 1e6)")")
    $ptcctl reconfigure $c --job bench --to $start --hosts host0 --transport "$4" --json >/dev/null
  done
  /usr/bin/python3 - "$1" "$cross" "$ucx_shm" "$ucx_put_dram" "$ucx_tag" "${times[*]}" \
    "${rates[*]}" "${stage_times[*]}" "${stage_rates[*]}" "$fresh" "${verify_times[*]}" <<'PY'
import os, statistics, sys
name, cross, shm, put_dram, tag, times, rates, stimes, srates, fresh, vtimes = sys.argv[1:]
def mmm(xs, fmt):
    xs = sorted(map(float, xs.split()))
    return "/".join(fmt.format(x) for x in (xs[0], statistics.median(xs), xs[-1])), statistics.median(xs)
t, _ = mmm(times, "{:.2f}"); r, rmed = mmm(rates, "{:.0f}")
st, _ = mmm(stimes, "{:.2f}"); sr, smed = mmm(srates, "{:.0f}")
vt, vmed = mmm(vtimes, "{:.2f}")
prepared = " (target memory prepared beforehand)" if os.environ.get("PREPARE") else ""
local = "[local]" in name  # local copies: no transport, memcpy is the limit
where = "within one host" if local else "across hosts"
limits = "" if local else (
    f"ucx_perftest: {100*smed/float(tag):.0f}% of tag_bw 1 GiB, {100*smed/float(put_dram):.0f}% of "
    f"put_bw 1 GiB, {100*smed/float(shm):.0f}% of put_bw 16 MiB; ")
print(f"{name}: {int(cross)/1e9:.2f} GB {where}{prepared}\n"
      f"    end to end (staging + fingerprints of both versions + commit): time min/median/max "
      f"{t} s, throughput {r} MB/s\n"
      f"    staging (the bytes moving): time {st} s, throughput {sr} MB/s = {limits}"
      f"{100*smed/float(fresh):.0f}% of memcpy into fresh memory\n"
      f"    verifying (fingerprints of both versions): time {vt} s")
PY
}
if [[ $parts == *transports* ]]; then
  for transport in ${TRANSPORTS:-ucx grpc}; do
    measure "[$transport] tp=4 on host0 -> tp=2,pp=2 on host1" tp=2,pp=2,dp=1,zero=1 host1 $transport
    measure "[$transport] tp=4 on host0 -> tp=1,dp=4 on host1" tp=1,pp=1,dp=4,zero=1 host1 $transport
  done
fi
if [[ $parts == *strategies* ]]; then
  for t in ${STRATEGY_TRANSPORTS:-grpc}; do
    for strategy in ptc tenplex; do
      measure "[$strategy plan, $t] tp=4 on host0 -> tp=2,pp=2 on host1" tp=2,pp=2,dp=1,zero=1 \
        host1 $t $strategy
      measure "[$strategy plan, $t] tp=4 on host0 -> tp=1,dp=4 on host1" tp=1,pp=1,dp=4,zero=1 \
        host1 $t $strategy
    done
  done
fi
if [[ $parts == *local* ]]; then
  measure "[local] tp=4 on host0 -> tp=2,pp=2 on host0" tp=2,pp=2,dp=1,zero=1 host0 ucx
fi
