# SPDX-License-Identifier: MIT
"""examples/python/block_manager.py runs, preempts, hits the prefix cache, copies on
write, and every output equals the reference."""
import pathlib
import re
import subprocess
import sys

import pytest

import pagedkv as pkv

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "block_manager.py"


def run(*args):
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True)


@pytest.mark.skipif(not pkv.HAVE_BATCH, reason="the core lacks pkv_seqset_append_batch")
@pytest.mark.parametrize("args", [
    ("--requests", "40", "--blocks", "96"),
    ("--requests", "60", "--blocks", "40", "--block-size", "8", "--seed", "2"),  # tight
    ("--requests", "20", "--blocks", "64", "--no-prefix-caching"),
])
def test_block_manager_example(args):
    out = run(*args)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every output equals the reference" in out.stdout
    stats = {k.strip(): int(v)
             for k, v in re.findall(r"([a-z -]+?) (\d+)", out.stdout.splitlines()[0])}
    assert stats["cow copies"] > 0
    if "--no-prefix-caching" not in args:
        assert stats["prefix-hit tokens"] > 0
    if args[3] == "40":  # the tight pool
        assert stats["preemptions"] > 0


def test_block_manager_bad_usage():
    assert run("--blocks", "0").returncode == 2
    assert run("--help").returncode == 0
