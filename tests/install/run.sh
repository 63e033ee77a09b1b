#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install test (issue 10): build and install pagedkv into a fresh prefix, then build
# out-of-tree C and C++ programs against the installed package, shared and static,
# through pkg-config and through CMake's find_package, and run them; run an
# installed tool (its rpath); run the README's build lines and POLICIES.md's plugin
# lines as written. Usage: tests/install/run.sh WORKDIR [meson options]
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
here=$src/tests/install
work=$(mkdir -p "$1" && cd "$1" && pwd)
shift
prefix=$work/prefix
rm -rf "$work/build" "$prefix" "$work/out" "$work/cmake-build"
mkdir -p "$work/out"

echo "== meson setup + install into $prefix"
meson setup "$work/build" "$src" --prefix="$prefix" -Dtests=false -Dbench=false "$@" >"$work/setup.log"
meson install -C "$work/build" >"$work/install.log"
libdir=$(meson introspect "$work/build" --buildoptions |
         python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="libdir"][0])')
# The documented search path: $prefix/<libdir>/pkgconfig (libdir is lib by default).
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
test -f "$PKG_CONFIG_PATH/pagedkv.pc" || { echo "FAIL: no pagedkv.pc under $PKG_CONFIG_PATH"; exit 1; }

fail=0
run() { # name command...: build or run, report
    if "${@:2}" >"$work/out/$1.log" 2>&1; then echo "ok   $1"; else echo "FAIL $1"; cat "$work/out/$1.log"; fail=1; fi
}

cflags=$(echo $(pkg-config --cflags pagedkv))
[ "$cflags" = "-I$prefix/include" ] || { echo "FAIL: pkg-config --cflags pagedkv gives '$cflags'"; fail=1; }
echo "pkg-config --static --libs pagedkv: $(pkg-config --static --libs pagedkv)"

rp="-Wl,-rpath,$prefix/$libdir"
# pkg-config, shared: C against the core, C and C++ against the full library.
run pc_c_core_shared cc -std=c11 -Wall -Werror "$here/consumer.c" -o "$work/out/c_core" \
    $(pkg-config --cflags --libs pagedkv-core) $rp
run pc_c_full_shared cc -std=c11 -Wall -Werror "$here/consumer.c" -o "$work/out/c_full" \
    $(pkg-config --cflags --libs pagedkv) $rp
run pc_cpp_full_shared c++ -std=c++17 -Wall -Werror "$here/consumer.cpp" -o "$work/out/cpp_full" \
    $(pkg-config --cflags --libs pagedkv) $rp
# pkg-config, static: the archive by name, then everything --static lists.
static_libs() { pkg-config --static --libs "$1" | sed "s/-l$1\b/-l:lib$1.a/"; }
run pc_c_core_static cc -std=c11 -Wall -Werror "$here/consumer.c" -o "$work/out/c_core_static" \
    $(pkg-config --cflags pagedkv-core) $(static_libs pagedkv-core)
run pc_c_full_static cc -std=c11 -Wall -Werror "$here/consumer.c" -o "$work/out/c_full_static" \
    $(pkg-config --cflags pagedkv) $(static_libs pagedkv)
run pc_cpp_full_static c++ -std=c++17 -Wall -Werror "$here/consumer.cpp" \
    -o "$work/out/cpp_full_static" $(pkg-config --cflags pagedkv) $(static_libs pagedkv)
for exe in c_core c_full cpp_full c_core_static c_full_static cpp_full_static; do
    [ -x "$work/out/$exe" ] && run "run_$exe" "$work/out/$exe"
done
for exe in c_core_static c_full_static cpp_full_static; do
    if [ -x "$work/out/$exe" ] && ldd "$work/out/$exe" | grep -q libpagedkv; then
        echo "FAIL $exe links libpagedkv dynamically"; fail=1
    fi
done
if [ -x "$work/out/c_core" ] && ldd "$work/out/c_core" | grep -q 'libcudart\|libopenblas\|libgomp\|libstdc'; then
    echo "FAIL c_core pulls more than libpagedkv-core"; fail=1
fi

# CMake: find_package(pagedkv) from the prefix, all four targets.
if command -v cmake >/dev/null; then
    run cmake_configure cmake -S "$here" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_BUILD_RPATH="$prefix/$libdir"
    run cmake_build cmake --build "$work/cmake-build"
    for exe in c_core c_core_static cpp_full cpp_full_static; do
        [ -x "$work/cmake-build/$exe" ] && run "cmake_run_$exe" "$work/cmake-build/$exe"
    done
else
    echo "skip cmake: not installed"
fi

# Installed tools run from the prefix without LD_LIBRARY_PATH, and carry a runpath
# to the prefix's libdir (and CUDA's, when built with it).
run tool_pkv_size env -u LD_LIBRARY_PATH "$prefix/bin/pkv-size" --help
for tool in "$prefix"/bin/pkv-*; do
    [ "$(head -c 4 "$tool" | tail -c 3)" = "ELF" ] || continue # scripts (pkv-plot) have none
    if ! readelf -d "$tool" | grep -q "R.*PATH.*$prefix/$libdir"; then
        echo "FAIL $(basename "$tool") has no runpath to $prefix/$libdir"; fail=1
    fi
done

# The installed pkv-plot finds its plotting module (share/pagedkv/plot.py): on a
# missing input it says that, or that matplotlib is missing, never that the module is.
"$prefix/bin/pkv-plot" waste "$work/none.csv" -o "$work/out/none.png" >"$work/out/plot.log" 2>&1 || true
if grep -q "cannot find" "$work/out/plot.log"; then
    echo "FAIL installed pkv-plot: $(cat "$work/out/plot.log")"; fail=1
else
    echo "ok   installed pkv-plot loads its module"
fi

# The documented lines as written (issue 25): the README's out-of-tree builds, each
# program then run without LD_LIBRARY_PATH (the rpath finds the library), and
# POLICIES.md's plugin lines: the plugins the build made, one built from the clone,
# one built against the installed package.
doc_commands() { python3 "$here/doc_commands.py" "$src/$1" "$2"; }
if cmds=$(doc_commands README.md "pkg-config --variable=libdir"); then
    i=0
    while IFS= read -r cmd; do
        case $cmd in
        export\ PKG_CONFIG_PATH=*) # the documented path is lib/; this prefix's may differ
            [ "$libdir" = lib ] && run readme_pkg_config_path bash -c \
                "PREFIX='$prefix'; $cmd; test \"\$PKG_CONFIG_PATH\" = '$PKG_CONFIG_PATH'" ;;
        cc\ *)
            i=$((i + 1)); d=$work/out/readme_$i
            mkdir -p "$d" && cp "$here/consumer.c" "$d/app.c"
            run "readme_build_$i" bash -c "cd '$d' && PREFIX='$prefix' && $cmd"
            [ -x "$d/a.out" ] && run "readme_run_$i" env -u LD_LIBRARY_PATH "$d/a.out" ;;
        esac
    done <<<"$cmds"
    [ $i -ge 3 ] || { echo "FAIL README: $i build lines found, 3 expected"; fail=1; }
else
    fail=1
fi
clone=$work/out/policies_clone installed=$work/out/policies_installed
mkdir -p "$clone" "$installed"
ln -sfn "$src/include" "$clone/include"
ln -sfn "$src/examples" "$clone/examples"
ln -sfn "$src/traces" "$clone/traces"
ln -sfn "$work/build" "$clone/build"
ln -sfn "$src/traces" "$installed/traces"
cp "$src/examples/policies/buddy.c" "$installed/my_policy.c"
k=0
for what in clone:build/examples/policies/buddy.so clone:"-Iinclude my_policy.c" \
             installed:'$(pkg-config --cflags pagedkv) my_policy.c'; do
    dir=${what%%:*}; dir=${!dir}
    cmds=$(doc_commands docs/POLICIES.md "${what#*:}") || { fail=1; continue; }
    while IFS= read -r cmd; do
        k=$((k + 1))
        run "policies_$k" env -u LD_LIBRARY_PATH PATH="$prefix/bin:$PATH" \
            bash -c "cd '$dir' && $cmd"
    done <<<"$cmds"
done
[ $k -ge 6 ] || { echo "FAIL POLICIES.md: $k plugin commands found, 6 expected"; fail=1; }

[ $fail -eq 0 ] && echo "install test: all passed" || echo "install test: FAILED"
exit $fail
