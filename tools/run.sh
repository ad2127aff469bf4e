#!/usr/bin/env bash
# The main job: a ptc cluster on this machine (a coordinator and four ptcd
# "hosts" with 2 GPUs each, on loopback) and a real PyTorch GPT training
# job (tensor, pipeline and data parallelism on gloo) that changes its
# parallelism while it runs: 4 processes (tp=2,dp=2), then 8
# (tp=2,pp=2,dp=2), then 2 (tp=1,pp=1,dp=2). After each change it prints
# the reconfiguration report and checks that the state is bit-identical,
# the loss continues as in an uninterrupted run, and every sample is
# consumed exactly once. Then a plain MLP job (data parallelism 2 -> 4 ->
# 1) does the same. Both keep their state in ptc through ptc.torch.
# Extra arguments go to examples/elastic/run.py (the GPT job).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
echo "== building"
if ! bazel build //tools:ptcctl //ptcd:ptcd //coordinator:ptc-coordinator \
    //client:python_package > /tmp/ptc-build.log 2>&1; then
  cat /tmp/ptc-build.log; exit 1
fi
/usr/bin/python3 examples/elastic/run.py --job gpt "$@"
echo
echo "== the MLP job (data parallelism)"
exec /usr/bin/python3 examples/elastic/run.py --job mlp
