# SPDX-License-Identifier: MIT
"""What `import pagedkv` costs an engine: the allocator module (pagedkv._core) links
libpagedkv-core and needs libc and numpy only; the testbed (BLAS, OpenMP) is a module
of its own that is loaded on first use."""
import os
import re
import shutil
import subprocess
import sys

import pytest

import pagedkv
from pagedkv import _core

# The C runtime and the dynamic loader, under any of glibc's names.
LIBC = re.compile(r"^(linux-vdso|linux-gate|ld-linux[-\w.]*|libc|libm|libdl|libpthread|librt)"
                  r"\.so[.\d]*$")


def needed(path):
    """The shared libraries `path` loads, by name (ldd: direct and indirect)."""
    out = subprocess.run(["ldd", path], check=True, capture_output=True, text=True).stdout
    names = []
    for line in out.splitlines():
        name = line.strip().split()[0] if line.strip() else ""
        names.append(os.path.basename(name))
    return [n for n in names if n]


@pytest.mark.skipif(shutil.which("ldd") is None, reason="no ldd on this system")
def test_allocator_module_needs_libc_only():
    libs = needed(_core.__file__)
    allowed = LIBC
    if pagedkv.HAVE_CUDA:  # a CUDA build compiles the CUDA backend in: cudart joins
        allowed = re.compile(LIBC.pattern + r"|^libcudart\.so[.\d]*$|^lib(gcc_s|stdc\+\+)\.so[.\d]*$")
    extra = [n for n in libs if not allowed.match(n)]
    assert not extra, f"{_core.__file__} loads {extra}: the allocator must need libc only"
    assert not any("blas" in n or "gomp" in n for n in libs)


def run_python(code):
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_import_does_not_load_the_testbed():
    out = run_python(
        "import sys, pagedkv\n"
        "pool = pagedkv.BlockPool(8)\n"
        "seqs = pagedkv.SeqSet(pool, 4)\n"
        "seqs.append(seqs.create(), 9)\n"
        "print('pagedkv._testbed' in sys.modules)\n"
        "pagedkv.POLICIES\n"
        "print('pagedkv._testbed' in sys.modules)\n")
    assert out.split() == ["False", "True"]


def test_testbed_names_resolve_lazily():
    assert "paged" in pagedkv.POLICIES
    assert pagedkv.load_trace is pagedkv._testbed.load_trace
    assert "load_trace" in dir(pagedkv)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        pagedkv.no_such_name  # noqa: B018


def test_testbed_raises_the_allocator_exception_classes(tmp_path):
    # One class per status across both modules: `except pagedkv.FileError` catches a
    # missing trace file although the testbed module raised it.
    with pytest.raises(pagedkv.FileError):
        pagedkv.load_trace(str(tmp_path / "missing.csv"))
