#!/usr/bin/env bash
# Two commits side by side (a benchmark, not a test): builds BASE and HEAD
# optimized, each in its own git worktree (one bazel disk cache, so what did
# not change is built once), then runs the reconfiguration benchmark's UCX
# changes ROUNDS times, alternating the builds (base, head, base, head...)
# on the same machine in the same hour, and prints per change and phase
# the median of each build and head/base. This VM's speed varies by 2x
# from one hour to the next; only builds measured alternately in one run
# compare.
#
#   bash tools/compare_builds.sh BASE [HEAD] [ROUNDS]
#       HEAD: default HEAD; ROUNDS: default 3 (each: one invocation of
#       tools/reconfigure_benchmark.sh per build, RUNS changes each)
#   PARTS=local ...   its local change instead (default: transports)
#   RUNS=2 PREPARE=1 ...   passed on to reconfigure_benchmark.sh (WARMUP=1
#                   by default: one untimed change first, so that no build is
#                   measured into memory the VM has not backed yet)
#
# The benchmark script and its cluster script are HEAD's, run with each
# build's binaries (BIN=), so both builds are measured the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { sed -n 2,18p "$0"; exit 2; }
base=$(git rev-parse --verify "$1^{commit}")
head=$(git rev-parse --verify "${2:-HEAD}^{commit}")
rounds=${3:-3}
work=${COMPARE_DIR:-/tmp/ptc-compare}
cache=${BAZEL_DISK_CACHE:-$HOME/.cache/ptc/bazel-disk}
mkdir -p "$work" "$cache"
results=$work/results-$(date +%s).jsonl
: >"$results"

build() {  # $1: commit -> prints the build's bazel-bin
  local tree=$work/${1:0:12}
  if [[ ! -d $tree ]]; then
    git worktree add --detach "$tree" "$1" >&2
  fi
  echo "building ${1:0:12} (optimized) in $tree" >&2
  (cd "$tree" && bazel build -c opt --disk_cache="$cache" //tools:ptcctl \
    //tools:synthetic_job //ptcd:ptcd //coordinator:ptc-coordinator >&2)
  readlink -f "$tree/bazel-bin"
}
base_bin=$(build "$base")
head_bin=$(build "$head")

for round in $(seq 1 "$rounds"); do
  for side in base head; do
    if [[ $side == base ]]; then bin=$base_bin; else bin=$head_bin; fi
    echo "round $round/$rounds: $side" >&2
    BIN=$bin TRANSPORTS=ucx PARTS=${PARTS:-transports} WARMUP=${WARMUP:-1} \
      RESULTS=$results.$side LOGS=$results.logs/$round-$side \
      bash tools/reconfigure_benchmark.sh "${RUNS:-1}" >&2
  done
done

/usr/bin/python3 - "$results" "${base:0:12}" "${head:0:12}" <<'PY'
import json, statistics, sys
results, base, head = sys.argv[1:]
def load(side):
    by = {}
    with open(f"{results}.{side}") as f:
        for line in f:
            r = json.loads(line)
            by.setdefault(r["case"], []).append(r)
    return by
b, h = load("base"), load("head")
phases = [("staging", lambda r: r["staging_seconds"]),
          ("verifying", lambda r: r["verifying_seconds"]),
          ("the rest (plan, commit)", lambda r: r["seconds"] - r["staging_seconds"] - r["verifying_seconds"]),
          ("end to end", lambda r: r["seconds"])]
def mmm(xs):
    xs = sorted(xs)
    return f"{xs[0]:.2f}/{statistics.median(xs):.2f}/{xs[-1]:.2f}", statistics.median(xs)
print(f"base {base} vs head {head}: min/median/max seconds, alternated runs")
print("| change | phase | base | head | head/base |")
print("|---|---|---|---|---|")
for case in b:
    for name, get in phases:
        bs, bm = mmm([get(r) for r in b[case]])
        hs, hm = mmm([get(r) for r in h.get(case, [])] or [float("nan")])
        print(f"| {case} | {name} | {bs} | {hs} | {hm / bm:.2f} |" if bm > 0 else
              f"| {case} | {name} | {bs} | {hs} | - |")
    for side, runs in (("base", b[case]), ("head", h.get(case, []))):
        if not runs:
            continue
        # A local change's limit is memcpy, a transfer's ucx_perftest.
        key, limit = (("memcpy_fresh_mb_s", "memcpy into fresh memory") if "[local]" in case
                      else ("tag_bw_mb_s", "ucx_perftest tag_bw"))
        bound = statistics.median(r[key] for r in runs)
        rate = statistics.median(r["bytes_moved"] / r["staging_seconds"] / 1e6 for r in runs)
        print(f"  {side}: staging {rate:.0f} MB/s = {100 * rate / bound:.0f}% of {limit} "
              f"({bound:.0f} MB/s, measured in the same invocations)")
PY
echo "per-change records: $results.base, $results.head; daemon logs in $results.logs; worktrees in $work" \
  "(git worktree remove them when done)"
