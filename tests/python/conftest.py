"""Shared fixtures: where the Bazel-built binaries are."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def bin_dir():
    path = pathlib.Path(os.environ.get("PTC_BIN_DIR", ROOT / "bazel-bin"))
    if not (path / "tools" / "ptcctl").exists():
        pytest.fail(f"{path}/tools/ptcctl is missing; build with `bazel build //...` "
                    "or set PTC_BIN_DIR")
    return path


@pytest.fixture(scope="session")
def ptcctl(bin_dir):
    def run(*args):
        return subprocess.run([str(bin_dir / "tools" / "ptcctl"), *args],
                              capture_output=True, text=True, timeout=300)
    return run


@pytest.fixture(scope="session")
def ptc_module(bin_dir):
    """The `ptc` Python package Bazel built (client/python)."""
    import sys
    pkg = bin_dir / "client" / "python" / "pkg"
    if not (pkg / "ptc" / "_ptc.so").exists():
        pytest.fail(f"{pkg}/ptc/_ptc.so is missing; build with `bazel build //...`")
    sys.path.insert(0, str(pkg))
    import ptc
    return ptc


@pytest.fixture(scope="session", autouse=True)
def tls_certificates():
    """Every test's processes speak mutual TLS; the certificates (and the
    PTC_TLS_* environment of this process) exist before any client
    connects, since ptc's client library reads them once per process."""
    from cluster import certificates
    return certificates()
