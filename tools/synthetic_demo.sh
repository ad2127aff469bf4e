#!/usr/bin/env bash
# The synthetic demo (the main job before the training job existed): a ptc cluster on this machine (a coordinator and four ptcd
# "hosts" with 4 GPUs each, on loopback), a GPT-style job whose ranks save
# synthetic state through shared memory, and a sequence of
# reconfigurations (a TP change, a PP change, a DP scale-up, a redeploy to
# other hosts, a scale-down), each verified element by element.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
echo "== building"
if ! bazel build //tools:ptcctl //tools:synthetic_job //ptcd:ptcd \
    //coordinator:ptc-coordinator > /tmp/ptc-build.log 2>&1; then
  cat /tmp/ptc-build.log; exit 1
fi
ptcctl=bazel-bin/tools/ptcctl
job_tool=bazel-bin/tools/synthetic_job
dir=$(mktemp -d /tmp/ptc-cluster-XXXXXX)
trap 'tools/local_cluster.sh down "$dir" >/dev/null; rm -rf "$dir"' EXIT

echo "== starting a local cluster"
tools/local_cluster.sh up "$dir" 4 4 3GiB
set -a; source "$dir/env"; set +a
c="--coordinator $COORDINATOR"
$ptcctl hosts $c

model="gpt:layers=8,hidden=768,heads=12,ffn=3072,vocab=16384,positions=1024"
echo
echo "== a GPT job (8 layers, hidden 768, fp16 weights + fp32 Adam) at tp=2,pp=2,dp=1 on host0"
$ptcctl register $c --job demo --model "$model" --config tp=2,pp=2,dp=1 --hosts host0
# The job's processes show its token to their host's ptcd.
PTC_JOB_TOKEN=$($ptcctl token $c demo)
export PTC_JOB_TOKEN
$job_tool save $c --job demo --host host0 --socket "$HOST0_SOCKET" --step 1
$job_tool verify $c --job demo

step() {
  echo
  echo "== $1: to $2 on $3"
  $ptcctl reconfigure $c --job demo --to "$2" --hosts "$3"
  $job_tool verify $c --job demo
}
step "TP change" tp=4,pp=1,dp=1 host0
step "PP change" tp=1,pp=4,dp=1 host0
step "DP scale-up" tp=1,pp=4,dp=2 host0,host1
step "redeploy to other hosts" tp=1,pp=4,dp=2 host2,host3
step "scale-down" tp=2,pp=1,dp=1 host3
echo
$ptcctl jobs $c
echo
echo "all reconfigurations committed and verified"
