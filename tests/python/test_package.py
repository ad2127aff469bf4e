"""What tools/package.sh makes for machines other than this one. The
relocatable tarball: built from this checkout, unpacked elsewhere, and run
with every library but glibc's hidden (a mount namespace,
tools/tarball_check.sh --only-glibc): a coordinator and two ptcds, a change
between them over UCX, every element verified. The client: one build that
imports in every CPython here (the wheel itself is installed and tested in
a venv with PyTorch 2.x by tools/venv_check.sh, which tools/test.sh runs)."""
import os
import pathlib
import shutil
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


def interpreters():
    """Every CPython >= 3.9 this machine has: Debian's, and those of pyenv or
    on PATH (python3.9 ... python3.13)."""
    found = {}
    candidates = ["/usr/bin/python3", *(shutil.which(f"python3.{m}") or "" for m in range(9, 15))]
    candidates += [str(p) for p in pathlib.Path.home().glob(".pyenv/versions/3.*/bin/python3")]
    for c in filter(None, candidates):
        r = subprocess.run([c, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True)
        if r.returncode == 0 and tuple(map(int, r.stdout.split("."))) >= (3, 9):
            found.setdefault(r.stdout.strip(), c)
    return found


def test_one_build_of_the_client_imports_in_every_cpython(bin_dir):
    """The package binds libptc.so with ctypes: nothing in it is built for
    one Python version."""
    pythons = interpreters()
    assert pythons, "no CPython >= 3.9 here"
    program = ("import ptc\n"
               "c = ptc.ParallelConfig.parse('tp=2,pp=2')\n"
               "assert (c.world_size, c.coord_of(3), c.rank_of(1, 0, 1)) == (4, (1, 0, 1), 3)\n"
               "cur = ptc.DataCursor(seed=1, dataset_size=100, global_batch=8)\n"
               "cur.advance()\n"
               "assert ptc.DataCursor.decode(cur.encode()).consumed == 8\n"
               "try:\n"
               "    ptc.ParallelConfig.parse('tp=0')\n"
               "except ptc.Error as e:\n"
               "    assert e.code == 'INVALID_ARGUMENT'\n"
               "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=str(bin_dir / "client/python/pkg"))
    for version, python in sorted(pythons.items()):
        r = subprocess.run([python, "-c", program], capture_output=True, text=True, env=env,
                           cwd="/")
        assert r.returncode == 0 and r.stdout.strip() == "ok", f"{version} ({python}): {r.stderr}"
    print(f"imported in CPython {', '.join(sorted(pythons))}")
