#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The README's C snippets are excerpts of programs the test suite builds and runs:
every statement of each ```c block (comments dropped, whitespace collapsed, the
examples' CHECK(...) wrapper removed) is a statement of one file of examples/. A
renamed call, a changed argument list or an undefined name in the README fails here.
(The Python snippets run as written in python/tests/test_readme.py.)

usage: readme_snippets.py SOURCE_ROOT
"""
import pathlib
import re
import sys


def blocks(text, lang):
    return re.findall(r"^```%s\n(.*?)^```" % lang, text, re.S | re.M)


def statements(code):
    """The statements of C code: preprocessor lines, and the rest split at ; { }."""
    code = re.sub(r"//[^\n]*", "", code)
    out = [" ".join(l.split()) for l in code.split("\n") if l.lstrip().startswith("#")]
    code = "\n".join(l for l in code.split("\n") if not l.lstrip().startswith("#"))
    for raw in re.split(r"[;{}]", code):
        s = " ".join(raw.split())
        s = s.replace("CHECK(", "", 1)[:-1] if "CHECK(" in s else s
        if s:
            out.append(s)
    return out


def main():
    root = pathlib.Path(sys.argv[1])
    readme = (root / "README.md").read_text()
    examples = {p: set(statements(p.read_text())) for p in sorted((root / "examples").glob("*.c"))}
    cblocks = blocks(readme, "c")
    fails = 0
    if not cblocks:
        print("FAIL  README.md has no ```c block")
        return 1
    for i, block in enumerate(cblocks, 1):
        want = statements(block)
        best, missing = None, want
        for path, have in examples.items():
            m = [s for s in want if s not in have]
            if len(m) < len(missing):
                best, missing = path, m
        if missing:
            fails += 1
            print("FAIL  README C block %d: %d of %d statements in no example%s:" %
                  (i, len(missing), len(want), "" if best is None else
                   " (closest: %s)" % best.relative_to(root)))
            for s in missing:
                print("        " + s)
        else:
            print("ok    README C block %d: its %d statements are all in %s" %
                  (i, len(want), best.relative_to(root)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
