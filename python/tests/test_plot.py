# SPDX-License-Identifier: MIT
"""pagedkv.plot, the plotting behind pkv-plot, from Python (issue 25, item 2): it
imports without matplotlib (loaded on first use), draws with the caller's matplotlib,
and without one says which interpreter lacks it and the pip command for it."""
import subprocess
import sys

import pytest

from pagedkv import plot

HEADER = ("policy,step,time_s,running,waiting,token_states_bytes,reserved_bytes,"
          "internal_frag_bytes,external_frag_bytes,free_bytes,capacity_bytes,step_ms,alloc_ms,"
          "point,block_size,load_scale\n")


def timeline(tmp_path):
    p = tmp_path / "tl.csv"
    rows = [HEADER]
    for point, policy in enumerate(("paged", "contiguous-max")):
        for step in range(50):
            used = 1000 * step
            rows.append("%s,%d,%f,1,0,%d,100,50,25,%d,1000000,1.5,0,%d,16,1\n" %
                        (policy, step, 0.01 * step, used, 1000000 - used - 175, point))
    p.write_text("".join(rows))
    return p


def test_import_does_not_need_matplotlib():
    r = subprocess.run([sys.executable, "-c",
                        "import sys, pagedkv.plot; assert 'matplotlib' not in sys.modules"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_capacity_draws_or_says_how_to_install(tmp_path):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(plot.MatplotlibMissing) as e:
            plot.capacity(str(timeline(tmp_path)), str(tmp_path / "c.png"))
        assert sys.executable in str(e.value)
        assert "%s -m pip install matplotlib" % sys.executable in str(e.value)
        assert isinstance(e.value, ImportError)
        return
    fig = plot.capacity(str(timeline(tmp_path)), str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert len([a for a in fig.axes if a.get_ylabel() == "GiB"]) == 2


def test_bad_input_names_the_column(tmp_path):
    pytest.importorskip("matplotlib")
    bad = tmp_path / "bad.csv"
    bad.write_text("policy,step\npaged,0\n")
    with pytest.raises(plot.PlotInputError, match="token_states_bytes"):
        plot.capacity(str(bad))
