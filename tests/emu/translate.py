#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Make a .cu file compilable as host C++ for the CPU emulator (tests/emu).

The one change: every kernel launch `kernel<<<grid, block[, smem[, stream]]>>>(args)`
becomes `pkvemu::launch(grid, block[, smem[, stream]]).run(kernel, args)`. Everything
else is left as it is; a #line directive keeps compiler messages and the emulator's
file:line reports pointing at the original file.

usage: translate.py INPUT.cu OUTPUT.cc
"""
import re
import sys

LAUNCH = re.compile(r"([A-Za-z_]\w*(?:\s*<[^;<>]*>)?)<<<(.*?)>>>\((\s*)(\)?)", re.S)


def rewrite(text):
    def sub(m):
        kernel, cfg, space, empty = m.group(1), m.group(2), m.group(3), m.group(4)
        head = f"pkvemu::launch({cfg}).run({kernel}"
        # Whitespace (newlines) is kept so that line numbers do not move.
        return head + space + ")" if empty else head + "," + space
    return LAUNCH.sub(sub, text)


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = argv[1], argv[2]
    with open(src, encoding="utf-8") as f:
        text = f.read()
    out = rewrite(text)
    if "<<<" in out:
        print(f"translate.py: {src}: a launch it cannot rewrite is left", file=sys.stderr)
        return 1
    with open(dst, "w", encoding="utf-8") as f:
        f.write(f'#include "pkvemu.h"\n#line 1 "{src}"\n' + out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
