#!/usr/bin/env bash
# The main job. Until the cluster exists, a planning run: how the state of
# a GPT-3 6.7B job (fp16 weights and fp32 Adam state, ~94 GB) would move
# when it scales up from 16 GPUs on two hosts to 32 GPUs on four, and when
# one of its hosts then dies, compared with the Tenplex-style plan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build //tools:ptcctl 2>&1 | grep -E "^(ERROR|FAILED)" && exit 1
ptcctl=bazel-bin/tools/ptcctl

echo
echo "== scale-up: tp=4,pp=2,dp=2 on 2 hosts x 8 GPUs -> tp=4,pp=2,dp=4 on 4 hosts x 8 GPUs"
$ptcctl plan --model gpt3-6.7b --from tp=4,pp=2,dp=2 --to tp=4,pp=2,dp=4 \
  --hosts 2x8 --to-hosts 4x8 --baseline tenplex
echo
echo "== re-partition: tp=4,pp=2,dp=4 -> tp=8,pp=1,dp=4 on the same 4 hosts, ZeRO-1 optimizer"
$ptcctl plan --model gpt3-6.7b --from tp=4,pp=2,dp=4,zero=1 --to tp=8,pp=1,dp=4,zero=1 \
  --hosts 4x8 --baseline tenplex
echo
echo "== failure: host3 dies; tp=4,pp=2,dp=4 -> tp=4,pp=2,dp=3 on the 3 hosts left"
$ptcctl plan --model gpt3-6.7b --from tp=4,pp=2,dp=4 --to tp=4,pp=2,dp=3 \
  --hosts 4x8 --dead-hosts host3 --baseline tenplex
