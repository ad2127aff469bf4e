"""The relocatable tarball (tools/package.sh): built from this checkout,
unpacked elsewhere, and run with every library but glibc's hidden (a mount
namespace, tools/tarball_check.sh --only-glibc): a coordinator and two
ptcds, a change between them over UCX, every element verified."""
import os
import pathlib
import subprocess
import tarfile

import pytest

from conftest import ROOT


def test_the_tarball_runs_with_glibc_alone(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root for a mount namespace")
    r = subprocess.run(["bash", str(ROOT / "tools/package.sh"), str(tmp_path / "dist")],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout + r.stderr
    [tarball] = list((tmp_path / "dist").glob("ptc-*-linux-x86_64.tar.gz"))
    with tarfile.open(tarball) as t:
        names = t.getnames()
        t.extractall(tmp_path / "unpacked")
    [top] = {n.split("/")[0] for n in names}
    root = tmp_path / "unpacked" / top
    for program in ["bin/ptcd", "bin/ptc-coordinator", "bin/ptcctl", "libexec/synthetic_job"]:
        assert os.access(root / program, os.X_OK), program
    # Nothing but glibc's own libraries comes from the host.
    libs = {p.name for p in (root / "lib").iterdir()}
    assert not any(n.startswith(("libc.so", "libm.so", "ld-linux")) for n in libs), libs
    assert "libstdc++.so.6" in libs and "libucp.so.0" in libs
    assert (root / "lib/ucx/libuct_cma.so.0").exists()
    assert (root / "GLIBC").read_text().strip()

    # Moved after unpacking: the run path is relative.
    moved = tmp_path / "elsewhere"
    root.rename(moved)
    r = subprocess.run(["bash", str(ROOT / "tools/tarball_check.sh"), str(moved), "--only-glibc"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("tarball check: ok"), r.stdout
