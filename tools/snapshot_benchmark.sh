#!/usr/bin/env bash
# Snapshot benchmark (not a test): writing a job's committed version as a
# snapshot and restoring it under another config, against the disk's
# sequential write rate (dd, direct I/O) and against torch.save /
# torch.load plus re-slicing of the same shards (tools/snapshot_baseline.py),
# side by side in the same run, RUNS times per job.
#
# Jobs (synthetic values, ZeRO-1 fp32 Adam state beside fp16 weights):
#   gpt3-125m (~1.8 GB) and gpt3-350m (~4.9 GB, the reconfiguration
#   benchmark's job), saved at tp=2,dp=2 on host0+host1 (two writers),
#   restored at tp=1,pp=2,dp=2 on host2+host3.
# Every read starts from a cold page cache (drop_caches) where the
# machine lets us (root); the snapshot directory is on /var/tmp (disk).
#
#   bash tools/snapshot_benchmark.sh [RUNS]
#   MODELS=gpt3-125m bash tools/snapshot_benchmark.sh 1
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
bazel build -c opt //tools:ptcctl //tools:synthetic_job //ptcd:ptcd \
  //coordinator:ptc-coordinator >/dev/null 2>&1
ptcctl=bazel-bin/tools/ptcctl
dir=$(mktemp -d /var/tmp/ptc-snapbench-XXXXXX)
trap 'tools/local_cluster.sh down "$dir/cluster" >/dev/null 2>&1; rm -rf "$dir"' EXIT
mkdir -p "$dir/cluster"
tools/local_cluster.sh up "$dir/cluster" 4 2 12GiB >/dev/null
set -a; source "$dir/cluster/env"; set +a
c="--coordinator $COORDINATOR"
py=/usr/bin/python3

cold() {  # empties the page cache, so reads come from the disk
  sync
  echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
}
host_address() {
  $ptcctl hosts $c --json | $py -c "import json,sys
print([h['address'] for h in json.load(sys.stdin)['hosts'] if h['name'] == '$1'][0])"
}
targets() {  # the regions the restored job stores on host2 and host3
  $py - "$ptcctl" "$(host_address host2)" "$(host_address host3)" <<'PY'
import json, subprocess, sys
out = []
for address in sys.argv[2:]:
    ls = subprocess.run([sys.argv[1], "store", "ls", "--host", address, "--job", "bench",
                         "--regions", "--json"], check=True, capture_output=True, text=True)
    version = json.loads(ls.stdout)["jobs"][0]["versions"][-1]
    for t in version["tensors"]:
        out += [[t["key"], r["region"]] for r in t["regions"]]
json.dump(out, sys.stdout)
PY
}

for model in ${MODELS:-gpt3-125m gpt3-350m}; do
  dd_rates=() snap_rates=() save_secs=() snap_secs=() restore_secs=() load_secs=()
  bytes=0
  for run in $(seq 1 "$runs"); do
    $ptcctl register $c --job bench --model $model --config tp=2,pp=1,dp=2,zero=1 \
      --hosts host0,host1 >/dev/null
    PTC_JOB_TOKEN=$($ptcctl token $c bench) bazel-bin/tools/synthetic_job save $c \
      --job bench --host host0 --socket "$HOST0_SOCKET" --step 1 >/dev/null
    PTC_JOB_TOKEN=$($ptcctl token $c bench) bazel-bin/tools/synthetic_job save $c \
      --job bench --host host1 --socket "$HOST1_SOCKET" --step 1 >/dev/null
    # The disk's sequential write rate, as much as the snapshot writes.
    state=$($ptcctl jobs $c --json | $py -c "import json,sys
print([j['state_bytes'] for j in json.load(sys.stdin)['jobs'] if j['job'] == 'bench'][0])")
    dd_out=$(dd if=/dev/zero of="$dir/dd.bin" bs=64M count=$(((state >> 26) + 1)) \
      oflag=direct conv=fsync 2>&1 | tail -1)
    rm -f "$dir/dd.bin"
    dd_rates+=("$(echo "$dd_out" | $py -c "import sys,re
m = re.match(r'(\d+) bytes.* copied, ([\d.]+) s', sys.stdin.read())
print(int(m[1]) / float(m[2]) / 1e6)")")
    cold
    snap=$($ptcctl snapshot $c --job bench --to "$dir/snaps" --keep 1 --json)
    read -r secs b sdir < <(echo "$snap" | $py -c "import json,sys
s = json.load(sys.stdin); print(s['seconds'], s['bytes'], s['dir'])")
    bytes=$b
    snap_secs+=("$secs")
    snap_rates+=("$($py -c "print($b / $secs / 1e6)")")
    save_secs+=("$($py tools/snapshot_baseline.py save "$sdir" "$dir/torch")")
    # Restore into a cluster that forgot the job, under another config.
    $ptcctl forget $c bench >/dev/null
    cold
    report=$($ptcctl restore $c --job bench --from "$dir/snaps" \
      --config tp=1,pp=2,dp=2,zero=1 --hosts host2,host3 --json)
    restore_secs+=("$(echo "$report" | $py -c "import json,sys; print(json.load(sys.stdin)['seconds'])")")
    targets > "$dir/targets.json"
    cold
    load_secs+=("$($py tools/snapshot_baseline.py load "$sdir" "$dir/torch" "$dir/targets.json")")
    $ptcctl forget $c bench >/dev/null
    rm -rf "$dir/snaps" "$dir/torch"
  done
  $py - "$model" "$bytes" "${dd_rates[*]}" "${snap_secs[*]}" "${snap_rates[*]}" \
    "${save_secs[*]}" "${restore_secs[*]}" "${load_secs[*]}" <<'PY'
import statistics, sys
model, nbytes, dd, ss, sr, ts, rs, ls = sys.argv[1:]
def xs(s): return sorted(map(float, s.split()))
def mmm(s, fmt="{:.2f}"):
    v = xs(s); return "/".join(fmt.format(x) for x in (v[0], statistics.median(v), v[-1]))
med = lambda s: statistics.median(xs(s))
gb = int(nbytes) / 1e9
print(f"{model}: {gb:.2f} GB, saved at tp=2,dp=2 (2 hosts), restored at tp=1,pp=2,dp=2 "
      f"(2 other hosts); min/median/max over {len(xs(ss))} runs")
print(f"  disk, dd oflag=direct:        {mmm(dd, '{:.0f}')} MB/s")
print(f"  ptc snapshot:                 {mmm(ss)} s = {mmm(sr, '{:.0f}')} MB/s "
      f"({100 * med(sr) / med(dd):.0f}% of the disk)")
print(f"  torch.save of the same shards + fsync: {mmm(ts)} s = "
      f"{gb * 1e3 / med(ts):.0f} MB/s (median)")
print(f"  ptc restore (cold cache, verified):    {mmm(rs)} s")
print(f"  torch.load + re-slice (cold cache):    {mmm(ls)} s; "
      f"ptc restore is {med(ls) / med(rs):.1f}x faster")
PY
done
