#!/usr/bin/env bash
# Builds ptc's two artifacts for machines other than this Debian 12 build
# host, from the checkout:
#
#   bash tools/package.sh [OUT_DIR]        (default: dist/)
#
# -> OUT_DIR/ptc-VERSION-py3-none-manylinux_2_GLIBC_x86_64.whl: the Python
#    client (`pip install` it into any CPython >= 3.9; tools/wheel.py)
# -> OUT_DIR/ptc-VERSION-linux-x86_64.tar.gz, one folder ptc-VERSION/:
#   bin/      ptcd, ptc-coordinator, ptcctl, ptc-certs
#   libexec/  synthetic_job (a job without a framework), and the GPU checks
#             device_copies_test, gpu_copy_benchmark and gpu_store_benchmark
#             (tools/device_check.sh)
#   lib/      every shared library they load except glibc's own (gRPC,
#             protobuf, abseil, UCX and its transport modules in lib/ucx,
#             spdlog, fmt, OpenSSL, libstdc++, the CUDA runtime, ...)
#   GLIBC     the oldest glibc it runs with (the build machine's)
#
# The programs find lib/ through their run path ($ORIGIN/../lib, set with
# patchelf as DT_RPATH so that it also covers the libraries' own
# dependencies), so the folder runs from wherever it is unpacked, on any
# x86-64 Linux whose glibc is at least GLIBC's, with no Debian package
# installed. UCX finds its transport modules in lib/ucx (beside libucs).
# The InfiniBand and RDMA-CM modules are shipped without rdma-core: on a
# host with RDMA they load the host's libibverbs and librdmacm, elsewhere
# UCX skips them.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
bash tools/setup.sh

targets=(//client:python_package //ptcd:ptcd //coordinator:ptc-coordinator //tools:ptcctl //tools:synthetic_job
         //client:device_copies_test //tools:gpu_copy_benchmark //tools:gpu_store_benchmark)
echo "package: building ${targets[*]}"
if ! build_log=$(bazel build "${targets[@]}" 2>&1); then
  # A failed build may leave older outputs behind: never package those.
  echo "$build_log" | grep -E "^ERROR|error:" >&2
  echo "package: the build failed" >&2
  exit 1
fi
bin=$(bazel info bazel-bin 2>/dev/null)
for t in ptcd/ptcd coordinator/ptc-coordinator tools/ptcctl tools/synthetic_job \
         client/device_copies_test tools/gpu_copy_benchmark tools/gpu_store_benchmark; do
  [[ -x "$bin/$t" ]] || { echo "package: $bin/$t was not built" >&2; exit 1; }
done

version=$(git describe --tags --always --dirty 2>/dev/null || echo unknown)
# (getconf, not `ldd --version | head`: with pipefail, head closing the
# pipe early fails the script with SIGPIPE on a busy machine.)
glibc=$(getconf GNU_LIBC_VERSION | grep -oE "[0-9]+\.[0-9]+$")
name="ptc-$version"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/$name"
mkdir -p "$root/bin" "$root/libexec" "$root/lib/ucx"

install -m 755 "$bin/ptcd/ptcd" "$bin/coordinator/ptc-coordinator" "$bin/tools/ptcctl" \
  "$root/bin/"
install -m 755 tools/ptc-certs "$root/bin/"
install -m 755 "$bin/tools/synthetic_job" "$bin/client/device_copies_test" \
  "$bin/tools/gpu_copy_benchmark" "$bin/tools/gpu_store_benchmark" "$root/libexec/"

# glibc's own libraries stay the host's: they must match its loader.
is_glibc() {
  [[ "$1" =~ /(libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|ld-linux-x86-64)\.so ]]
}
# Every library a program or library loads, transitively (ldd resolves
# the whole tree), copied once under its soname.
bundle() {
  local lib soname
  while read -r soname lib; do
    [[ -n "$lib" && -f "$lib" ]] || continue
    is_glibc "$lib" && continue
    [[ -e "$root/lib/$soname" ]] && continue
    cp -L "$lib" "$root/lib/$soname"
    chmod 644 "$root/lib/$soname"
  done < <(ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
}
for f in "$root"/bin/* "$root"/libexec/*; do
  file -b "$f" | grep -q ELF && bundle "$f"
done
ucx_modules=/usr/lib/x86_64-linux-gnu/ucx
for m in "$ucx_modules"/libuct_*.so.0; do
  cp -L "$m" "$root/lib/ucx/$(basename "$m")"
  # cma's needs are all in lib/ already; ib and rdmacm need rdma-core,
  # which is the host's business (see above).
  [[ "$(basename "$m")" == libuct_cma.so.0 ]] && bundle "$m"
done

for f in "$root"/bin/* "$root"/libexec/*; do
  file -b "$f" | grep -q ELF || continue
  patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$f"
done
for f in "$root"/lib/*.so*; do
  patchelf --force-rpath --set-rpath '$ORIGIN' "$f"
done
for f in "$root"/lib/ucx/*.so*; do
  patchelf --force-rpath --set-rpath '$ORIGIN/..' "$f"
done
echo "$glibc" > "$root/GLIBC"
cat > "$root/README" <<EOF
ptc $version: ptcd, ptc-coordinator and ptcctl for x86-64 Linux with glibc
$glibc or newer (built on Debian 12). Nothing else needs to be installed:
every library they load except glibc's is in lib/, found through the
programs' run path, so this folder runs from wherever it is unpacked.

  bin/ptcd --help
  bin/ptc-coordinator --help
  bin/ptcctl --help
  bin/ptc-certs        (makes the cluster's certificates; needs openssl)

libexec/ holds synthetic_job (a job without a framework, for checks) and
the GPU checks run by tools/device_check.sh in ptc's source tree.
EOF

mkdir -p "$out"
rm -f "$out"/ptc-*-linux-x86_64.tar.gz
tarball="$out/$name-linux-x86_64.tar.gz"
tar -C "$stage" -czf "$tarball" "$name"
echo "package: $tarball ($(du -h "$tarball" | cut -f1), glibc >= $glibc," \
  "$(ls "$root/lib" | grep -c "\.so") libraries)"
rm -f "$out"/ptc-*.whl
wheel=$(/usr/bin/python3 tools/wheel.py "$bin/client/python/pkg" "$out")
echo "package: $wheel ($(du -h "$wheel" | cut -f1))"
