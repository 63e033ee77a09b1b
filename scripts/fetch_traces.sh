#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install the public LLM request traces that the benchmarks and docs replay, from
# their upstream sources, each checked against a checksum written below before it
# gets its final name. Nothing here is part of the project: the files are the
# upstream bytes, under their own licenses (docs/RESEARCH.md, "Getting the traces").
#
# Invariant: a file under DEST with a trace's name is either absent or the bytes
# that its row below pins. Downloads and copies land in a temporary file in DEST
# and are renamed only after they verify, so a failed or interrupted run leaves
# nothing under a final name.
set -euo pipefail

prog=fetch_traces
root="$(cd "$(dirname "$0")/.." && pwd)"

# ---- the traces ----
# One row per trace, '|'-separated:
#   name | file | url | sha256 | bytes | git blob
# A GitHub URL is pinned to the commit that was read, so its bytes cannot move.
# sha256 and bytes: computed once from those bytes. "git blob": the id the
# upstream commit records for the file (`git hash-object`), the pin when the
# bytes themselves could not be read here (too large for the mirror that was
# used); the script checks it by hashing "blob <size>\0" + content with SHA-1.
# A "-" is a value nobody could pin: such a trace is refused unless
# --allow-unpinned (Azure's 2024 week-long traces live in blob storage outside
# any versioned repository, so no upstream id exists for them).
traces_table() {
    cat <<'EOF'
azure_code_2023|azure_code_2023.csv|https://raw.githubusercontent.com/Azure/AzurePublicDataset/b469a113cedca53ddc3bdea71a143dc4b7d8700c/data/AzureLLMInferenceTrace_code.csv|54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6|320117|62bd8109d0f2b1bc48206d397ecca48d8de03aab
azure_conv_2023|azure_conv_2023.csv|https://raw.githubusercontent.com/Azure/AzurePublicDataset/b469a113cedca53ddc3bdea71a143dc4b7d8700c/data/AzureLLMInferenceTrace_conv.csv|2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8|719188|5b9219f2caf93bbbf95ec29894e206115658e235
azure_code_2024_week|azure_code_2024_week.csv|https://azurepublicdatasettraces.blob.core.windows.net/azurellminfererencetrace/AzureLLMInferenceTrace_code_1week.csv|-|-|-
azure_conv_2024_week|azure_conv_2024_week.csv|https://azurepublicdatasettraces.blob.core.windows.net/azurellminfererencetrace/AzureLLMInferenceTrace_conv_1week.csv|-|-|-
burstgpt_1|burstgpt_1.csv|https://raw.githubusercontent.com/HPMLL/BurstGPT/e92f533b6c85ea7f4164fb3d97d1aa2c3edacbc8/data/BurstGPT_1.csv|-|-|f95dd2c84454b067fdd0973858c55ecfe31bdad7
mooncake_fast25_conversation|mooncake_fast25_conversation.jsonl|https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/conversation_trace.jsonl|b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df|3029533|5a371794b81d7fc7487ec8a02a2c631bcc7fbdf8
mooncake_fast25_toolagent|mooncake_fast25_toolagent.jsonl|https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/toolagent_trace.jsonl|-|-|b765599d1e0828b37f68d481563c385d3c11de54
mooncake_fast25_synthetic|mooncake_fast25_synthetic.jsonl|https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/synthetic_trace.jsonl|bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131|1136313|e4838049c0dcfc358a5f24ab08251279475cba94
EOF
}

# Exit codes (also in --help). With several failures the most serious wins:
# a checksum mismatch, then a failed download or copy, then an unpinned refusal.
EX_OK=0 EX_FETCH=1 EX_USAGE=2 EX_MISMATCH=3 EX_UNPINNED=4

usage() {
    cat <<EOF
usage: scripts/fetch_traces.sh [--dest DIR] [--from DIR] [--allow-unpinned] [NAME...]
       scripts/fetch_traces.sh --list | --help

Download public LLM request traces from their upstream sources (or copy them from
a local copy with --from), check each against the checksum pinned in this script,
and install it as DEST/FILE. No NAME: every trace. Progress goes to stderr; the
path of each installed trace goes to stdout, one per line.

  --dest DIR        where to install (default: traces/real in the repository)
  --from DIR        offline: take DIR/FILE (or the upstream file name, e.g.
                    DIR/AzureLLMInferenceTrace_conv.csv) instead of downloading;
                    checked exactly as a download is
  --allow-unpinned  also install traces that have no pinned checksum (Azure 2024:
                    its host publishes none); their sha256 is printed so that you
                    can record it. A file that fails a pinned checksum is never
                    installed, with or without this option.
  --list            print name, file, check and source URL of every trace (TSV)
  --help            this text

Traces (docs/RESEARCH.md, "Getting the traces", has licenses and citations):
$(traces_table | awk -F'|' '{ printf "  %-30s %s\n", $1, $2 }')

Exit codes: 0 every requested trace installed and verified; 1 a download or copy
failed (offline? use --from); 2 bad usage or unknown NAME; 3 a file did not match
its pinned checksum (not installed); 4 a trace has no pinned checksum and
--allow-unpinned was not given (not installed).
EOF
}

say() { printf '%s: %s\n' "$prog" "$*" >&2; }

# The digest tools differ between Linux (coreutils) and macOS (shasum).
sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then sha256sum <"$1" | cut -d' ' -f1
    else shasum -a 256 <"$1" | cut -d' ' -f1; fi
}
sha1_stream() {
    if command -v sha1sum >/dev/null 2>&1; then sha1sum | cut -d' ' -f1
    else shasum -a 1 | cut -d' ' -f1; fi
}
size_of() { wc -c <"$1" | tr -d ' '; }
# Git's object id of a file's bytes: SHA-1 over "blob <size>\0" then the bytes.
git_blob_of() {
    { printf 'blob %s\0' "$(size_of "$1")"; cat "$1"; } | sha1_stream
}

# verify FILE NAME SHA256 BYTES BLOB -> 0 verified, EX_MISMATCH, EX_UNPINNED.
# Every pinned value is checked (size first: the clearest message for a cut-off
# download). Prints the reason on stderr.
verify() {
    local f="$1" name="$2" sum="$3" bytes="$4" blob="$5" got
    if [[ "$bytes" != - ]]; then
        got="$(size_of "$f")"
        if [[ "$got" != "$bytes" ]]; then
            say "$name: size mismatch: got $got bytes, expected $bytes (truncated or a different file)"
            return $EX_MISMATCH
        fi
    fi
    if [[ "$sum" != - ]]; then
        got="$(sha256_of "$f")"
        if [[ "$got" != "$sum" ]]; then
            say "$name: sha256 mismatch: got $got, expected $sum"
            return $EX_MISMATCH
        fi
    fi
    if [[ "$blob" != - ]]; then
        got="$(git_blob_of "$f")"
        if [[ "$got" != "$blob" ]]; then
            say "$name: git blob mismatch: got $got, expected $blob"
            return $EX_MISMATCH
        fi
    fi
    if [[ "$sum" != - ]]; then
        say "$name: sha256 verified"
    elif [[ "$blob" != - ]]; then
        say "$name: verified against the upstream git blob $blob (sha256 $(sha256_of "$f"))"
    elif (( allow_unpinned )); then
        say "$name: unverified: no pinned sum (accepted: --allow-unpinned); sha256 $(sha256_of "$f")"
    else
        say "$name: unverified: no pinned sum; not installed (give --allow-unpinned to accept the bytes the server sends)"
        return $EX_UNPINNED
    fi
}

# download URL OUT: curl or wget, whichever exists.
download() {
    local url="$1" out="$2" rc=0
    if command -v curl >/dev/null 2>&1; then
        local bar=-sS
        [[ -t 2 ]] && bar=-#
        curl -fL --retry 2 --connect-timeout 20 "$bar" -o "$out" "$url" || rc=$?
        (( rc == 0 )) || say "curl failed (exit $rc) on $url"
    elif command -v wget >/dev/null 2>&1; then
        local q=-nv
        [[ -t 2 ]] && q=--show-progress
        wget -q "$q" -O "$out" "$url" || rc=$?
        (( rc == 0 )) || say "wget failed (exit $rc) on $url"
    else
        say "neither curl nor wget is installed; install one, or use --from DIR"
        return 1
    fi
    (( rc == 0 )) || say "no download (offline?): copy the files by other means and use --from DIR"
    return $rc
}

# install NAME FILE URL SHA256 BYTES BLOB -> 0 or an exit code above.
install_one() {
    local name="$1" file="$2" url="$3" sum="$4" bytes="$5" blob="$6"
    local dst="$dest/$file" tmp rc=0
    if [[ -f "$dst" ]] && [[ "$sum" != - || "$blob" != - ]] &&
        verify "$dst" "$name" "$sum" "$bytes" "$blob" 2>/dev/null; then
        say "$name: already at $dst (verified)"
        printf '%s\n' "$dst"
        return 0
    fi
    tmp="$(mktemp "$dest/.$file.part.XXXXXX")"
    current_tmp="$tmp"
    if [[ -n "$from" ]]; then
        local src="$from/$file"
        [[ -f "$src" ]] || src="$from/$(basename "$url")"
        if [[ ! -f "$src" ]]; then
            say "$name: neither $from/$file nor $from/$(basename "$url") exists"
            rm -f "$tmp"
            return $EX_FETCH
        fi
        say "$name: copying $src"
        cp "$src" "$tmp" || rc=$EX_FETCH
    else
        say "$name: downloading $url"
        download "$url" "$tmp" || rc=$EX_FETCH
    fi
    (( rc == 0 )) && { verify "$tmp" "$name" "$sum" "$bytes" "$blob" || rc=$?; }
    if (( rc != 0 )); then
        rm -f "$tmp"
        current_tmp=""
        return $rc
    fi
    chmod 0644 "$tmp"
    mv -f "$tmp" "$dst"
    current_tmp=""
    say "$name: installed at $dst"
    printf '%s\n' "$dst"
}

# ---- options ----
dest="$root/traces/real" from="" allow_unpinned=0 list=0
names=()
while (( $# )); do
    case "$1" in
        -h|--help) usage; exit $EX_OK ;;
        --list) list=1 ;;
        --allow-unpinned) allow_unpinned=1 ;;
        --dest|--from)
            [[ $# -ge 2 && -n "$2" ]] || { say "$1 needs a directory (see --help)"; exit $EX_USAGE; }
            if [[ "$1" == --dest ]]; then dest="$2"; else from="$2"; fi
            shift ;;
        -*) say "unknown option '$1' (see --help)"; exit $EX_USAGE ;;
        *) names+=("$1") ;;
    esac
    shift
done

if (( list )); then
    printf 'name\tfile\tcheck\turl\n'
    traces_table | awk -F'|' '{ c = $4 != "-" ? "sha256" : $6 != "-" ? "git-blob" : "none";
                                printf "%s\t%s\t%s\t%s\n", $1, $2, c, $3 }'
    exit $EX_OK
fi

known="$(traces_table | cut -d'|' -f1)"
if (( ${#names[@]} == 0 )); then
    mapfile -t names <<<"$known"
fi
for n in "${names[@]}"; do
    if ! grep -qxF -- "$n" <<<"$known"; then
        say "unknown trace '$n'; known: $(tr '\n' ' ' <<<"$known")"
        exit $EX_USAGE
    fi
done
if [[ -n "$from" && ! -d "$from" ]]; then
    say "--from $from is not a directory"
    exit $EX_USAGE
fi
mkdir -p "$dest" || { say "cannot create --dest $dest"; exit $EX_FETCH; }
# An interrupted run leaves no partial file behind (only its own: another run
# may be filling the same DEST).
current_tmp=""
trap '[[ -z "$current_tmp" ]] || rm -f "$current_tmp"' EXIT

worst=$EX_OK
rank() { case "$1" in 3) echo 3 ;; 1) echo 2 ;; 4) echo 1 ;; *) echo 0 ;; esac; }
for n in "${names[@]}"; do
    IFS='|' read -r name file url sum bytes blob < <(traces_table | grep "^$n|")
    rc=0
    install_one "$name" "$file" "$url" "$sum" "$bytes" "$blob" || rc=$?
    if (( $(rank $rc) > $(rank $worst) )); then worst=$rc; fi
done
exit $worst
