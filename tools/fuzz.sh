#!/usr/bin/env bash
# Fuzzes ptc's request handling with libFuzzer (clang, ASan):
#   coordinator  the coordinator's RPCs (hosts, jobs, saves)
#   fragment     a fragment's validation before anything is staged
#   local        the local socket: frames, requests, a real LocalServer
#   store        the tensor store's RPCs
#
#   tools/fuzz.sh [SECONDS] [TARGET...]     default: 60 s each, all targets
#
# Builds with clang in its own Bazel output base (the gcc build is left
# alone), runs each target for SECONDS from fuzz/corpus/TARGET (seeds and
# past crashes) plus what earlier runs found (kept in ~/.cache/ptc-fuzz),
# and exits non-zero if a target crashed. A crashing input is copied into
# fuzz/corpus/TARGET/crash-*: fix the bug and commit it, and the replay test
# (bazel test //fuzz:TARGET_fuzz_replay_test) keeps it fixed. CI runs
# `tools/fuzz.sh 20`.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(coordinator fragment local store)
cache=${PTC_FUZZ_CACHE:-$HOME/.cache/ptc-fuzz}
mkdir -p "$cache"

labels=()
for t in "${targets[@]}"; do labels+=("//fuzz:${t}_fuzzer"); done
echo "== building ${#targets[@]} fuzz targets with clang + libFuzzer + ASan"
# This run's logs and crashing inputs; the corpus and the clang build are
# shared with other runs (two suites at once): the build, and the end of
# its Bazel server, one run at a time.
logs=$(mktemp -d "${TMPDIR:-/tmp}/ptc-fuzz-XXXXXX")
exec 9>"$cache/bazel.lock"
# --symlink_prefix=/: no convenience links, so the checkout's bazel-bin
# keeps pointing at the user's own (gcc) build.
flock 9
# Bazel runs with the lock's descriptor closed (9>&-): its server, which
# outlives the command, must not hold the lock, or a run killed while
# holding it (a CI run stopped) would leave it held until the server's idle
# end, hours on, and every later run's flock would wait that long.
if ! CC=clang CXX=clang++ bazel --output_base="$cache/bazel" build --config=fuzz \
    --symlink_prefix=/ "${labels[@]}" >"$logs/build.log" 2>&1 9>&-; then
  tail -30 "$logs/build.log"
  echo "fuzz: the fuzz targets did not build (log: $logs/build.log)"
  exit 1
fi
bin=$(CC=clang CXX=clang++ bazel --output_base="$cache/bazel" info --config=fuzz bazel-bin 2>/dev/null 9>&-)
flock -u 9

failed=0
for t in "${targets[@]}"; do
  work="$cache/corpus/$t"
  mkdir -p "$work" "$logs/artifacts/$t"
  log="$logs/$t.log"
  # -rss_limit_mb: the targets hold a real store; -timeout: a hang is a bug.
  ASAN_OPTIONS=detect_leaks=0 SPDLOG_LEVEL=off "$bin/fuzz/${t}_fuzzer" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
    -artifact_prefix="$logs/artifacts/$t/" "$work" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  runs=$(grep -aoE "#[0-9]+" "$log" | tail -1)
  cov=$(grep -aoE "cov: [0-9]+" "$log" | tail -1)
  if [[ $rc -ne 0 ]]; then
    failed=$((failed + 1))
    echo "   $t: CRASHED after ${runs:-?} runs ($cov); log $log"
    grep -aE "ERROR|SUMMARY|==[0-9]+==" "$log" | head -5
    for a in "$logs/artifacts/$t"/*; do
      [[ -f "$a" ]] && cp "$a" "fuzz/corpus/$t/$(basename "$a")" &&
        echo "   input saved as fuzz/corpus/$t/$(basename "$a")"
    done
  else
    echo "   $t: ${runs:-?} runs in ${seconds}s, $cov, no crash"
  fi
done
flock 9
CC=clang CXX=clang++ bazel --output_base="$cache/bazel" shutdown >/dev/null 2>&1 9>&-
flock -u 9
[[ $failed -eq 0 ]] && rm -rf "$logs"
echo "fuzz: ${#targets[@]} targets, $failed crashed"
[[ $failed -eq 0 ]]
