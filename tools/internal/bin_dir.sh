#!/usr/bin/env bash
# Lays out an unpacked ptc tarball's programs as Bazel lays out its build
# (ptcd/ptcd, coordinator/ptc-coordinator, tools/ptcctl,
# tools/synthetic_job), which the Python tests and benchmarks take as their
# bin folder (PTC_BIN_DIR, --bin):
#
#   bash tools/internal/bin_dir.sh TARBALL_DIR OUT_DIR
set -euo pipefail
tarball=$(realpath "$1")
out=$2
mkdir -p "$out/ptcd" "$out/coordinator" "$out/tools"
ln -sfn "$tarball/bin/ptcd" "$out/ptcd/ptcd"
ln -sfn "$tarball/bin/ptc-coordinator" "$out/coordinator/ptc-coordinator"
ln -sfn "$tarball/bin/ptcctl" "$out/tools/ptcctl"
ln -sfn "$tarball/libexec/synthetic_job" "$out/tools/synthetic_job"
