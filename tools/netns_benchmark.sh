#!/usr/bin/env bash
# Benchmark (not a test): ptc's plan against the Tenplex-style per-rank
# plan, both run by ptc's engine, when cross-host bytes dominate. Each ptcd
# runs in its own network namespace ("host"), joined to a bridge by a veth
# pair shaped with tc to RATE (default 1gbit) in each direction; the
# coordinator runs in the root namespace. UCX is limited to TCP so that no
# byte takes a shared-memory shortcut between the namespaces.
#
# The job (a GPT of ~0.8 GB: fp16 weights + fp32 Adam) is saved at
# tp=2,dp=2 on host0,host1 (one replica per host) and moved to tp=1,dp=4 on
# host2,host3 (two ranks per host, each holding a whole replica).
#
#   sudo bash tools/netns_benchmark.sh [RUNS]        (root: creates netns)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
rate=${RATE:-1gbit}
[[ $(id -u) -eq 0 ]] || { echo "netns_benchmark: needs root (ip netns, tc)" >&2; exit 1; }
bazel build //tools:ptcctl //tools:synthetic_job //ptcd:ptcd \
  //coordinator:ptc-coordinator >/dev/null 2>&1
bin=$PWD/bazel-bin
dir=$(mktemp -d /tmp/ptc-netns-XXXXXX)
hosts=4
pids=()

cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for i in $(seq 0 $((hosts - 1))); do ip netns del "ptc-h$i" 2>/dev/null || true; done
  ip link del ptcbr0 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

wait_for_file() {
  for _ in $(seq 1 200); do [[ -s "$1" ]] && return 0; sleep 0.05; done
  echo "netns_benchmark: $1 did not appear" >&2; return 1
}

ip link add ptcbr0 type bridge
ip addr add 10.77.0.1/24 dev ptcbr0
ip link set ptcbr0 up
for i in $(seq 0 $((hosts - 1))); do
  ns=ptc-h$i
  ip netns add $ns
  ip link add ptc-v$i type veth peer name eth0 netns $ns
  ip link set ptc-v$i master ptcbr0 up
  ip -n $ns addr add 10.77.0.$((10 + i))/24 dev eth0
  ip -n $ns link set eth0 up
  ip -n $ns link set lo up
  # Into the host (bridge -> veth) and out of it (eth0 in the namespace).
  tc qdisc add dev ptc-v$i root tbf rate "$rate" burst 512kb latency 100ms
  ip netns exec $ns tc qdisc add dev eth0 root tbf rate "$rate" burst 512kb latency 100ms
done

mkdir -p "$dir/coordinator"
"$bin/coordinator/ptc-coordinator" --listen 10.77.0.1:0 --state-dir "$dir/coordinator" \
  --port-file "$dir/coordinator.port" --host-timeout 10 --log-level warn --insecure \
  >"$dir/coordinator.log" 2>&1 &
pids+=($!)
wait_for_file "$dir/coordinator.port"
coordinator=10.77.0.1:$(cat "$dir/coordinator.port")
bw=$(/usr/bin/python3 -c "
r='$rate'; m={'kbit':1e3,'mbit':1e6,'gbit':1e9}
print(next(float(r[:-len(k)])*v/8 for k,v in m.items() if r.endswith(k)))")
for i in $(seq 0 $((hosts - 1))); do
  ip netns exec ptc-h$i env UCX_TLS=tcp,self "$bin/ptcd/ptcd" \
    --listen 10.77.0.$((10 + i)):0 --socket "$dir/host$i.sock" --port-file "$dir/host$i.port" \
    --memory-limit 8GiB --coordinator "$coordinator" --name host$i --gpus 2 \
    --bandwidth "$bw" --log-level warn --insecure >"$dir/host$i.log" 2>&1 &
  pids+=($!)
done
for i in $(seq 0 $((hosts - 1))); do wait_for_file "$dir/host$i.port"; done
sleep 1.5  # registrations
c="--coordinator $coordinator"
export PTC_INSECURE=1  # the shaped links are the subject here, not TLS
model="gpt:layers=6,hidden=768,heads=12,ffn=3072,vocab=16384,positions=1024"
echo "4 hosts in network namespaces, links shaped to $rate each way; job $model"

results=()
for run in $(seq 1 "$runs"); do
  for strategy in ptc tenplex; do
    job=$strategy-$run
    bazel-bin/tools/ptcctl register $c --job $job --model "$model" --config tp=2,dp=2 \
      --hosts host0,host1 >/dev/null
    for h in 0 1; do
      bazel-bin/tools/synthetic_job save $c --job $job --host host$h \
        --socket "$dir/host$h.sock" --step 1 >/dev/null
    done
    out=$(bazel-bin/tools/ptcctl reconfigure $c --job $job --to tp=1,pp=1,dp=4 \
      --hosts host2,host3 --strategy $strategy --json)
    # Correctness: the reconfiguration itself proves every tensor's
    # fingerprint (reading it all back through 1 Gbit/s would dominate).
    results+=("$(echo "$out" | /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin); p = r["plan"]
assert r["phase"] == "committed" and r["tensors_verified"] > 0, r
print(r["strategy"], r["seconds"], r["bytes_from_peers"], p["max_host_send_bytes"])')")
    echo "run $run $strategy: ${results[-1]}"
  done
done
/usr/bin/python3 - "${results[@]}" <<'PY'
import statistics, sys
rows = [l.split() for l in sys.argv[1:]]
def col(s, i): return sorted(float(r[i]) for r in rows if r[0] == s)
for s in ("ptc", "tenplex"):
    t, b, m = col(s, 1), col(s, 2), col(s, 3)
    print(f"{s:8s} time min/median/max {t[0]:.1f}/{statistics.median(t):.1f}/{t[-1]:.1f} s; "
          f"{b[0]/1e9:.2f} GB across hosts; busiest sender {m[0]/1e9:.2f} GB")
ratio = sorted(float(b[1]) / float(a[1]) for a, b in zip(rows[0::2], rows[1::2]))
print(f"tenplex/ptc time ratio min/median/max {ratio[0]:.2f}/{statistics.median(ratio):.2f}/"
      f"{ratio[-1]:.2f}")
PY
