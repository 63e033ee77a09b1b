#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Print the commands of the first ```sh block of a document that contains TEXT, one
a line (continuation lines joined; comments and blank lines kept out), so that
tests/install/run.sh runs the documented lines as written.

usage: doc_commands.py FILE TEXT
"""
import re
import sys


def main():
    path, text = sys.argv[1], sys.argv[2]
    with open(path) as f:
        doc = f.read()
    for block in re.findall(r"^```sh\n(.*?)^```", doc, re.S | re.M):
        if text not in block:
            continue
        for cmd in block.replace("\\\n", " ").split("\n"):
            cmd = re.sub(r"\s+#[^'\"]*$", "", cmd).strip()  # a trailing comment
            if cmd and not cmd.startswith("#"):
                print(cmd)
        return 0
    sys.stderr.write("doc_commands.py: no ```sh block of %s contains %r\n" % (path, text))
    return 1


if __name__ == "__main__":
    sys.exit(main())
