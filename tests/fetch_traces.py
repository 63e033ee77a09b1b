#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# scripts/fetch_traces.sh's contract, offline (CI has no network): the trace table's
# format (pinned URLs, well-formed sums), --help, unknown names, a corrupted copy
# refused with nothing left under its final name, the download path through a stand-in
# curl, and unpinned traces refused without --allow-unpinned.
#
# Usage: fetch_traces.py SCRIPT [MIRROR]
#   MIRROR: a directory holding upstream copies of some traces under their install
#   names. With one, those copies must install and verify (--from and the download
#   path); without one that holds any, the test exits 77 (skipped) after the checks
#   that need no real bytes. MIRROR defaults to $PKV_TRACE_MIRROR (.ci/run sets it
#   where the CI machine keeps a copy of the public traces).
import hashlib
import os
import re
import subprocess
import sys
import tempfile

script = os.path.abspath(sys.argv[1])
repo = os.path.dirname(os.path.dirname(script))
mirror = (sys.argv[2] if len(sys.argv) > 2 else
          os.environ.get("PKV_TRACE_MIRROR", ""))


def run(*args, env=None):
    return subprocess.run([script, *args], capture_output=True, text=True, env=env, timeout=120)


def table():
    """The rows of the script's table, parsed from its text (as a reviewer reads it)."""
    text = open(script).read()
    body = text.split("cat <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    return [line.split("|") for line in body.splitlines()]


def leftovers(d):
    return [f for f in os.listdir(d) if ".part." in f]


rows = table()
names = [r[0] for r in rows]

# ---- the table: one well-formed row per trace, each URL pinned ----
assert len(rows) == 8 and len(set(names)) == 8, names
for want in ("azure_conv_2023", "azure_code_2023", "mooncake_fast25_conversation",
             "azure_code_2024_week", "azure_conv_2024_week", "burstgpt_1",
             "mooncake_fast25_toolagent", "mooncake_fast25_synthetic"):
    assert want in names, want
for row in rows:
    assert len(row) == 6, row
    name, file, url, sha, size, blob = row
    assert re.fullmatch(r"[a-z0-9_]+", name), row
    assert file in (name + ".csv", name + ".jsonl"), row
    assert re.fullmatch(r"https://[^\s|]+", url), row
    gh = re.fullmatch(r"https://raw\.githubusercontent\.com/([^/]+)/([^/]+)/([^/]+)/.+", url)
    if gh:  # a GitHub URL names a commit, not a branch: its bytes cannot move
        assert re.fullmatch(r"[0-9a-f]{40}", gh.group(3)), ("not pinned to a commit", row)
        assert blob != "-", ("a GitHub file has a git blob id to pin", row)
    assert sha == "-" or re.fullmatch(r"[0-9a-f]{64}", sha), row
    assert size == "-" or re.fullmatch(r"[1-9][0-9]*", size), row
    assert blob == "-" or re.fullmatch(r"[0-9a-f]{40}", blob), row
    assert (sha == "-") == (size == "-"), ("sha256 and size come from the same bytes", row)
# --list prints the same table.
r = run("--list")
assert r.returncode == 0, r.stderr
listed = [line.split("\t") for line in r.stdout.splitlines()[1:]]
assert [(l[0], l[1], l[3]) for l in listed] == [(x[0], x[1], x[2]) for x in rows], listed

# ---- --help, usage errors ----
r = run("--help")
assert r.returncode == 0 and "usage:" in r.stdout and "Exit codes" in r.stdout, r
for n in names:
    assert n in r.stdout, n
with tempfile.TemporaryDirectory() as d:
    r = run("--dest", d, "azure_conv_2023", "no_such_trace")
    assert r.returncode == 2 and "unknown trace 'no_such_trace'" in r.stderr, r
    assert os.listdir(d) == [], os.listdir(d)  # nothing started
    r = run("--dest", d, "--bogus")
    assert r.returncode == 2 and "--bogus" in r.stderr, r
    r = run("--dest", d, "--from", os.path.join(d, "absent"), "azure_conv_2023")
    assert r.returncode == 2 and "not a directory" in r.stderr, r
    r = run("--dest")
    assert r.returncode == 2 and "needs a directory" in r.stderr, r

# ---- refused copies: wrong bytes never get the final name ----
with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dest:
    for row in rows:
        with open(os.path.join(src, row[1]), "w") as f:
            f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1,2\n")
    # Pinned by sha256 and size: a wrong size is named as such.
    r = run("--dest", dest, "--from", src, "azure_conv_2023")
    assert r.returncode == 3 and "size mismatch" in r.stderr, r
    # Pinned by git blob only (BurstGPT): the blob id is checked.
    r = run("--dest", dest, "--from", src, "burstgpt_1")
    assert r.returncode == 3 and "git blob mismatch" in r.stderr, r
    # No pin (Azure 2024): refused unless asked for, then installed with its sum shown.
    r = run("--dest", dest, "--from", src, "azure_code_2024_week")
    assert r.returncode == 4 and "unverified: no pinned sum" in r.stderr, r
    assert os.listdir(dest) == [], os.listdir(dest)
    # A mismatch outranks the unpinned refusal in the exit code.
    r = run("--dest", dest, "--from", src, "azure_code_2024_week", "azure_conv_2023")
    assert r.returncode == 3, r
    assert os.listdir(dest) == [], os.listdir(dest)
    r = run("--dest", dest, "--from", src, "--allow-unpinned", "azure_code_2024_week")
    assert r.returncode == 0, r
    got = os.path.join(dest, "azure_code_2024_week.csv")
    assert r.stdout.strip() == got, r.stdout
    sha = hashlib.sha256(open(got, "rb").read()).hexdigest()
    assert sha in r.stderr, r.stderr
    # --allow-unpinned does not let a pinned trace through.
    r = run("--dest", dest, "--from", src, "--allow-unpinned", "azure_conv_2023")
    assert r.returncode == 3 and not os.path.exists(os.path.join(dest, "azure_conv_2023.csv")), r
    assert leftovers(dest) == [], leftovers(dest)

# ---- the download path, offline: a stand-in curl on PATH ----
# It serves URL -> $FAKE_SRC/<basename of the URL> and logs the URL, or fails as an
# unreachable host does (curl's exit 6) when $FAKE_SRC is empty.
fake_bin = tempfile.mkdtemp()
with open(os.path.join(fake_bin, "curl"), "w") as f:
    f.write('#!/usr/bin/env bash\n'
            'out=; url=\n'
            'while (( $# )); do case "$1" in -o) out="$2"; shift ;; '
            '--retry|--connect-timeout) shift ;; -*) ;; *) url="$1" ;; esac; shift; done\n'
            'echo "$url" >> "$FAKE_LOG"\n'
            '[[ -n "$FAKE_SRC" ]] || { echo "curl: (6) Could not resolve host" >&2; exit 6; }\n'
            'cp "$FAKE_SRC/${url##*/}" "$out"\n')
os.chmod(os.path.join(fake_bin, "curl"), 0o755)


def fake_env(src):
    env = dict(os.environ, PATH=fake_bin + os.pathsep + os.environ["PATH"],
               FAKE_LOG=os.path.join(fake_bin, "log"), FAKE_SRC=src)
    open(env["FAKE_LOG"], "w").close()
    return env


with tempfile.TemporaryDirectory() as dest:
    env = fake_env("")
    r = run("--dest", dest, "azure_conv_2023", env=env)
    assert r.returncode == 1 and "offline?" in r.stderr and "--from" in r.stderr, r
    assert os.listdir(dest) == [], os.listdir(dest)
    assert open(env["FAKE_LOG"]).read().split() == [rows[names.index("azure_conv_2023")][2]]

# ---- real bytes: the copies in MIRROR install and verify ----
have = [row for row in rows if mirror and os.path.isfile(os.path.join(mirror, row[1]))]
if not have:
    print(f"fetch_traces: ok (no trace copies in {mirror}: the install of real bytes skipped)")
    sys.exit(77)
with tempfile.TemporaryDirectory() as dest:
    picked = [row[0] for row in have]
    r = run("--dest", dest, "--from", mirror, *picked)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [os.path.join(dest, row[1]) for row in have], r.stdout
    for row in have:
        a = open(os.path.join(mirror, row[1]), "rb").read()
        assert open(os.path.join(dest, row[1]), "rb").read() == a, row[0]
    # Again: already there, verified, nothing copied.
    r = run("--dest", dest, "--from", mirror, *picked)
    assert r.returncode == 0 and r.stderr.count("already at") == len(have), r.stderr
    # A copy with one byte changed (same size) fails the sha256 and replaces nothing.
    row = have[0]
    with tempfile.TemporaryDirectory() as bad:
        data = bytearray(open(os.path.join(mirror, row[1]), "rb").read())
        data[len(data) // 2] ^= 0x01
        open(os.path.join(bad, row[1]), "wb").write(data)
        open(os.path.join(bad, row[2].rsplit("/", 1)[1]), "wb").write(data)
        fresh = os.path.join(dest, "fresh")
        os.mkdir(fresh)
        r = run("--dest", fresh, "--from", bad, row[0])
        assert r.returncode == 3 and "sha256 mismatch" in r.stderr, r
        assert os.listdir(fresh) == [], os.listdir(fresh)
        # The download path: the same verification on what the server sent.
        r = run("--dest", fresh, row[0], env=fake_env(bad))
        assert r.returncode == 3 and os.listdir(fresh) == [], r
    with tempfile.TemporaryDirectory() as srv, tempfile.TemporaryDirectory() as fresh:
        for row in have:  # served under the upstream file names
            os.symlink(os.path.abspath(os.path.join(mirror, row[1])),
                       os.path.join(srv, row[2].rsplit("/", 1)[1]))
        env = fake_env(srv)
        r = run("--dest", fresh, *picked, env=env)
        assert r.returncode == 0, r.stderr
        assert open(env["FAKE_LOG"]).read().split() == [row[2] for row in have]
        for row in have:
            assert (open(os.path.join(fresh, row[1]), "rb").read() ==
                    open(os.path.join(mirror, row[1]), "rb").read()), row[0]
print(f"fetch_traces: ok ({len(have)} real copies verified: {', '.join(r[0] for r in have)})")
