#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Policy ABI 3 (issue 23): a plugin built for ABI 2 is refused (exit 2) with a
# reason that names its version and the engine's.
# Usage: policy_abi_cli.py PKV_REPLAY ABI2_PLUGIN SOURCE_ROOT
import os
import subprocess
import sys

exe, plugin, root = sys.argv[1:4]
trace = os.path.join(root, "traces", "conv_small.csv")
p = subprocess.run([exe, "-q", "--policy-plugin", plugin, "--policy", "paged", trace],
                   capture_output=True, text=True)
assert p.returncode == 2, (p.returncode, p.stderr)
assert "built for policy ABI 2" in p.stderr, p.stderr
assert "policy ABI 3" in p.stderr, p.stderr
print("ok:", p.stderr.strip().splitlines()[-1])
