"""Builds the Python client's wheel from the package Bazel built.

    python3 tools/wheel.py PKG_DIR OUT_DIR     (tools/package.sh runs it)

PKG_DIR is bazel-bin/client/python/pkg (the `ptc` package: its Python
modules and libptc.so, the client library's C ABI). The wheel holds the
package, and in ptc/.libs every library libptc.so loads except glibc's and
the C++ runtime's (libstdc++, libgcc_s: the ones the Python process and
PyTorch already share), with run paths so that libptc.so finds them there
($ORIGIN/.libs) wherever pip puts the package. Nothing in it is built for
one Python version (ctypes binds the C ABI), so it is tagged py3-none for
any CPython >= 3.9 on x86-64 Linux with glibc >= the build machine's.

Prints the wheel's path.
"""
import base64
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

# What the host provides: glibc's libraries and the C++ runtime.
HOST_LIBRARIES = re.compile(
    r"^(libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|ld-linux-x86-64|"
    r"libstdc\+\+|libgcc_s)\.so")


def run(*cmd):
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True,
                          text=True).stdout


def version():
    """0.1.0 plus the commit (a PEP 440 local version)."""
    try:
        commit = run("git", "rev-parse", "--short=8", "HEAD").strip()
        dirty = run("git", "status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.CalledProcessError):
        return "0.1.0"
    return f"0.1.0+g{commit}" + (".dirty" if dirty else "")


def glibc():
    out = run("ldd", "--version").splitlines()[0]
    major, minor = re.search(r"(\d+)\.(\d+)$", out).groups()
    return int(major), int(minor)


def dependencies(library):
    """(soname, path) of every library `library` loads, transitively."""
    deps = []
    for line in run("ldd", library).splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line)
        if m and not HOST_LIBRARIES.match(m.group(1)):
            deps.append((m.group(1), m.group(2)))
    return deps


def record_line(root, path):
    data = path.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path.relative_to(root).as_posix()},sha256={digest},{len(data)}"


def main(pkg_dir, out_dir):
    pkg_dir, out_dir = pathlib.Path(pkg_dir), pathlib.Path(out_dir)
    if not (pkg_dir / "ptc" / "libptc.so").exists():
        sys.exit(f"wheel: {pkg_dir}/ptc/libptc.so is missing; bazel build //client:python_package")
    ver = version()
    major, minor = glibc()
    tag = f"py3-none-manylinux_{major}_{minor}_x86_64"
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        shutil.copytree(pkg_dir / "ptc", root / "ptc")
        for p in root.joinpath("ptc").rglob("*"):
            p.chmod(0o755 if p.suffix == ".so" else 0o644)
        libs = root / "ptc" / ".libs"
        libs.mkdir()
        for soname, path in dependencies(pkg_dir / "ptc" / "libptc.so"):
            shutil.copy(os.path.realpath(path), libs / soname)
            (libs / soname).chmod(0o644)
            run("patchelf", "--force-rpath", "--set-rpath", "$ORIGIN", libs / soname)
        run("patchelf", "--force-rpath", "--set-rpath", "$ORIGIN/.libs",
            root / "ptc" / "libptc.so")

        info = root / f"ptc-{ver}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\n"
            "Name: ptc\n"
            f"Version: {ver}\n"
            "Summary: ptc's client: a training rank's state in ptc's in-memory store, "
            "across changes of parallelism\n"
            "Requires-Python: >=3.9\n"
            "Requires-Dist: numpy\n"
            "Provides-Extra: torch\n"
            "Requires-Dist: torch>=1.13; extra == \"torch\"\n")
        (info / "WHEEL").write_text(
            "Wheel-Version: 1.0\n"
            "Generator: ptc tools/wheel.py\n"
            "Root-Is-Purelib: false\n"
            f"Tag: {tag}\n")
        (info / "top_level.txt").write_text("ptc\n")
        files = sorted(p for p in root.rglob("*") if p.is_file())
        record = info / "RECORD"
        lines = [record_line(root, p) for p in files]
        lines.append(f"{record.relative_to(root).as_posix()},,")
        record.write_text("\n".join(lines) + "\n")

        out_dir.mkdir(parents=True, exist_ok=True)
        wheel = out_dir / f"ptc-{ver}-{tag}.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
            for p in files + [record]:
                info_ = zipfile.ZipInfo(p.relative_to(root).as_posix(), (2026, 1, 1, 0, 0, 0))
                info_.external_attr = (p.stat().st_mode & 0o777 | 0o100000) << 16
                info_.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info_, p.read_bytes())
    print(wheel)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
