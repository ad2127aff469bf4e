#!/usr/bin/env bash
# Installs what ptc needs on Debian 12 (as root): Bazel and the system
# libraries it builds against. CUDA and NCCL are expected under
# /usr/local/cuda. Safe to run again; with CI=true it always refreshes apt.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap g++ libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
  protobuf-compiler libabsl-dev libspdlog-dev libfmt-dev catch2 libucx-dev
  ucx-utils libxxhash-dev python3-venv python3-numpy python3-pytest
  python3-torch openssl iproute2 clang libclang-rt-14-dev
  etcd-server etcd-client golang-etcd-server-dev patchelf file
  chromium chromium-driver
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [[ ${#missing[@]} -gt 0 || "${CI:-}" == "true" ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing packages (${missing[*]}); run as root to install them" >&2
    exit 1
  fi
  echo "setup: installing ${#PACKAGES[@]} Debian packages (${#missing[@]} missing)"
  export DEBIAN_FRONTEND=noninteractive
  # Two setups at once (two test suites on one machine) take turns, and
  # apt waits for a lock another apt holds instead of failing.
  exec 9>/run/lock/ptc-setup.lock
  flock -w 1800 9 || { echo "setup: another setup held its lock for 30 minutes" >&2; exit 1; }
  apt_opts=(-q -o DPkg::Lock::Timeout=600)
  for attempt in 1 2 3 4 5 6; do
    apt-get "${apt_opts[@]}" update >/dev/null 2>/tmp/ptc-apt-update.$$ && break
    if ! grep -q "Could not get lock" /tmp/ptc-apt-update.$$ || [[ $attempt == 6 ]]; then
      cat /tmp/ptc-apt-update.$$ >&2; rm -f /tmp/ptc-apt-update.$$; exit 1
    fi
    echo "setup: apt's lists are locked by another apt; waiting" >&2
    sleep 20
  done
  rm -f /tmp/ptc-apt-update.$$
  apt-get "${apt_opts[@]}" install -y --no-install-recommends "${PACKAGES[@]}" >/dev/null
  exec 9>&-
fi

# Host tuning for ptcd: let shared memory use transparent huge pages where
# a program asks for them (madvise). ptcd's and its clients' mappings ask;
# nothing else changes. Without it, saves through shared memory fault in
# every 4 KiB page. See deploy/README.md.
thp=/sys/kernel/mm/transparent_hugepage/shmem_enabled
if [[ -w $thp ]] && grep -q "\[never\]" "$thp"; then
  echo advise > "$thp" 2>/dev/null && echo "setup: shared-memory huge pages set to 'advise'"
fi
