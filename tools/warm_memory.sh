#!/usr/bin/env bash
# Touches most of this machine's free memory once, then frees it.
#
# On a virtual machine the first write to a guest-physical page traps to the
# hypervisor, which backs it then: on the development VM such first writes
# run at 0.33 GB/s against 7-11 GB/s for memory the guest has touched
# before (measured with memfd writes, docs/benchmarks.md). A host that has
# run for a while has touched its memory; a freshly booted VM has not, and
# every benchmark that allocates would measure the hypervisor instead.
# Benchmarks run this first so that both sides of a comparison start from
# the same, steady state. It takes about a minute per 20 GiB the first time
# and seconds afterwards.
#
#   bash tools/warm_memory.sh [GiB to leave free, default 2]
set -euo pipefail
leave=${1:-2}
/usr/bin/python3 - "$leave" <<'PY'
import sys, time
import numpy as np
leave = int(sys.argv[1]) << 30
avail = 0
for line in open("/proc/meminfo"):
    if line.startswith("MemAvailable:"):
        avail = int(line.split()[1]) * 1024
n = max(0, (avail - leave) >> 30)
start = time.time()
chunks = []
for _ in range(n):
    chunks.append(np.ones(1 << 30, dtype=np.uint8))  # written, not just mapped
print(f"warmed {n} GiB of memory in {time.time() - start:.1f} s")
PY
