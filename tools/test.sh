#!/usr/bin/env bash
# Runs every ptc test: the Bazel (Catch2) tests and the Python tests, and
# ends with one line "N passed, N failed" counting test cases. Exits
# non-zero if anything failed or did not build.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || exit 1
# Every daemon a test starts checks its lock order (common/mutex_checks.h).
export PTC_MUTEX_CHECKS=1

log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== bazel test //... (build and unit/integration tests)"
bazel test --keep_going //... >"$log" 2>&1
bazel_rc=$?
grep -a -E "^(//|FAIL|ERROR|Executed|INFO: Build)|error:" "$log"
testlogs=$(bazel info bazel-testlogs 2>/dev/null)

passed=0
failed=0
# Count Catch2 test cases per test target from its log; a target without a
# Catch2 summary (crashed, timed out, did not build) counts as one failure.
for target in $(bazel query 'tests(//...)' 2>/dev/null); do
  path=${target#//}
  path=${path/://}
  file="$testlogs/$path/test.log"
  if grep -q -E "FAILED TO BUILD|NO STATUS" <(grep -a -F "$target " "$log"); then
    echo "   $target did not build or run"
    failed=$((failed + 1))
    continue
  fi
  summary=$(grep -a -E "^(All tests passed|test cases:)" "$file" 2>/dev/null | tail -1)
  if [[ "$summary" =~ All\ tests\ passed\ \(.*\ in\ ([0-9]+)\ test\ case ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    continue
  fi
  if [[ "$summary" =~ test\ cases:\ +([0-9]+)\ \|\ +([0-9]+)\ passed\ \|\ +([0-9]+)\ failed ]]; then
    passed=$((passed + BASH_REMATCH[2]))
    failed=$((failed + BASH_REMATCH[3]))
  elif [[ "$summary" =~ test\ cases:\ +([0-9]+)\ \|\ +([0-9]+)\ failed ]]; then
    failed=$((failed + BASH_REMATCH[2]))
  else
    echo "   $target ended without a Catch2 summary (crash or timeout); see $file"
    failed=$((failed + 1))
  fi
  # A failure's own words (its expressions, INFO lines, a property test's
  # seed) are in the test's log, which CI does not keep: show them.
  echo "   --- $target, its failures:"
  { grep -a -E -B3 -A14 "FAILED:|due to a fatal error" "$file" 2>/dev/null || tail -30 "$file"; } |
    head -120 | sed 's/^/   | /'
done

echo "== fuzzing (libFuzzer, 15 s per target; tools/fuzz.sh for longer)"
fuzz_out=$(bash tools/fuzz.sh 15 2>&1)
fuzz_rc=$?
echo "$fuzz_out" | grep -v "libprotobuf" | tail -12
fuzz_passed=$(echo "$fuzz_out" | grep -c ": .* no crash$" || true)
fuzz_failed=$(echo "$fuzz_out" | grep -c ": CRASHED" || true)
if [[ $fuzz_rc -ne 0 && $fuzz_failed -eq 0 ]]; then fuzz_failed=1; fi  # did not build
passed=$((passed + fuzz_passed))
failed=$((failed + fuzz_failed))
# The fuzz build has an output base of its own; the checkout's bazel-bin
# must still be the user's build (ptcctl and the Python package there).
if [[ "$(readlink -f bazel-bin)" == "$(readlink -f "$(bazel info bazel-bin 2>/dev/null)")" ]]; then
  echo "   bazel-bin still points at this build after fuzzing"
  passed=$((passed + 1))
else
  echo "   bazel-bin was re-pointed by the fuzz build: $(readlink bazel-bin)"
  failed=$((failed + 1))
fi

# Adds a pytest run's counts (its output, its exit status) to the totals: a
# run that failed without a failing test (an import error, a crash) counts
# as one failure.
count_pytest() {
  local summary n run_passed run_failed=0
  summary=$(echo "$1" | tail -1)
  run_passed=$(echo "$summary" | grep -oE "[0-9]+ passed" | grep -oE "[0-9]+" || echo 0)
  for n in $(echo "$summary" | grep -oE "[0-9]+ (failed|errors?)" | grep -oE "^[0-9]+"); do
    run_failed=$((run_failed + n))
  done
  if [[ $2 -ne 0 && $run_failed -eq 0 ]]; then run_failed=1; fi
  passed=$((passed + run_passed))
  failed=$((failed + run_failed))
}

echo "== python tests (Debian's /usr/bin/python3)"
py_out=$(PTC_BIN_DIR="$(bazel info bazel-bin 2>/dev/null)" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python 2>&1)
py_rc=$?
echo "$py_out" | tail -25
count_pytest "$py_out" $py_rc

echo "== the client wheel in a venv (a non-Debian Python, PyTorch 2.x from PyPI), the tarball's daemons"
venv_out=$(bash tools/venv_check.sh 2>&1)
venv_rc=$?
echo "$venv_out" | grep -v "^[.sFE]*\( *\[ *[0-9]*%\]\)\?$" | tail -15
count_pytest "$venv_out" $venv_rc

if [[ $bazel_rc -ne 0 && $failed -eq 0 ]]; then
  echo "   bazel test failed (exit $bazel_rc) without a failing test case; see above"
  failed=1
fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
