#!/usr/bin/env bash
# Builds the HPU stand-in (a fake Intel Gaudi PyTorch bridge for tests; see README.md) into
# tests/hpu/python/habana_frameworks/torch/lib/:
#   libhabana_pytorch2_plugin.so            (+ link libhabana_pytorch2_plugin.upstream.so)
#   _hccl_eager_C<ext suffix>               (pybind11 module)
# and tests/hpu/build/handover_foreign.so: trainbook's own hand-over helper
# (prelude/hpu/csrc/backend_from_python.cpp) compiled to a pybind11 internals tag torch does not
# use, as a build with another compiler family would be (test_trainbook_on_hpu.py loads it).
# and, when the torch wheel cannot be imported for lack of CUDA libraries (trainbook's .venv has
# the CUDA wheel without its nvidia-* dependencies), stub CUDA libraries into tests/hpu/build/cuda-stubs.
#
#   tests/hpu/build.sh              build if sources, flags, compiler or torch changed (hash stamp)
#   tests/hpu/build.sh --force      rebuild
#   tests/hpu/build.sh --print-env  build if needed, then print the environment a process needs to
#                                   import the stand-in: PYTHONPATH=... and LD_LIBRARY_PATH=...
#                                   (one VAR=value a line; LD_LIBRARY_PATH only when stubs exist)
# Env: PYTHON (default <repo>/.venv/bin/python), CXX (default g++).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
cxx=${CXX:-g++}
pkg_root=$here/python
lib=$pkg_root/habana_frameworks/torch/lib
build=$here/build
stubs=$build/cuda-stubs
stamp=$build/stamp

force=0
print_env=0
for arg in "$@"; do
    case $arg in
        --force) force=1 ;;
        --print-env) print_env=1 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "build.sh: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

# One build at a time: parallel test processes (pytest -n) each ask for the stand-in at start.
mkdir -p "$build"
exec 9>"$build/lock"
flock 9

# Where torch is, its version, the Python headers: all without importing torch.
read -r torch_dir torch_version torch_git py_inc ext_suffix < <("$py" - <<'EOF'
import importlib.util, os, sysconfig
spec = importlib.util.find_spec("torch")
if spec is None or spec.origin is None:
    raise SystemExit("build.sh: this python has no torch")
d = os.path.dirname(spec.origin)
v = {}
exec(open(os.path.join(d, "version.py")).read(), v)
print(d, v["__version__"], v.get("git_version", "?"), sysconfig.get_paths()["include"],
      sysconfig.get_config_var("EXT_SUFFIX"))
EOF
)
tlib=$torch_dir/lib

flags=(-std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1 -DUSE_C10D_GLOO -DUSE_DISTRIBUTED -DGLOG_USE_GLOG_EXPORT
       -fPIC -O1 -shared -w
       -I"$torch_dir/include" -I"$torch_dir/include/torch/csrc/api/include")
plugin=libhabana_pytorch2_plugin.so
hccl=_hccl_eager_C$ext_suffix
handover_src=$repo/prelude/hpu/csrc/backend_from_python.cpp
foreign=handover_foreign.so

key=$( {
    cat "$here/csrc/hpu_plugin.cpp" "$here/csrc/hccl_eager.cpp" "$here/csrc/host_view.h" "$here/cuda_stubs.py" "$0" \
        "$handover_src" "$here/missing_ops_1.19.txt"
    echo "$torch_dir $torch_version $torch_git $py_inc $ext_suffix ${flags[*]}"
    "$cxx" --version | head -1
} | sha256sum | cut -d' ' -f1)

emit_env() {
    if [[ $print_env == 1 ]]; then
        echo "PYTHONPATH=$pkg_root${PYTHONPATH:+:$PYTHONPATH}"
        if [[ -n $(ls -A "$stubs" 2>/dev/null | grep '\.so') ]]; then
            echo "LD_LIBRARY_PATH=$stubs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        fi
    fi
}

# The torch release the "bridge" was built for, where the real one keeps it
# (habana_frameworks/torch/required_version.txt); its __init__ checks it as the bridge does.
echo "${torch_version%%+*}" > "$pkg_root/habana_frameworks/torch/required_version.txt"

if [[ $force == 0 && -f $stamp && $(cat "$stamp") == "$key" && -f $lib/$plugin && -f $lib/$hccl && -f $build/$foreign && -f $lib/missing_ops.txt ]]; then
    emit_env
    exit 0
fi

start=$SECONDS
mkdir -p "$lib" "$build"
rm -f "$stamp"

# CUDA stubs (only for sonames missing from torch/lib, the nvidia wheels and the system).
rm -rf "$stubs"
"$py" "$here/cuda_stubs.py" "$tlib" "$stubs" >/dev/null

tmp=$(mktemp -d "$build/tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# The translation units at once (~15 s, ~25 s and ~20 s alone on one core).
"$cxx" "${flags[@]}" "$here/csrc/hpu_plugin.cpp" -o "$tmp/$plugin" -Wl,-soname,$plugin \
    -L"$tlib" -ltorch_cpu -lc10 -Wl,-rpath,"$tlib" &
p1=$!
"$cxx" "${flags[@]}" -fvisibility=hidden -I"$py_inc" "$here/csrc/hccl_eager.cpp" -o "$tmp/$hccl" \
    -L"$tlib" -ltorch_python -ltorch_cpu -lc10 -Wl,-rpath,"$tlib" &
p2=$!
"$cxx" "${flags[@]}" '-DPYBIND11_COMPILER_TYPE="_foreign"' -I"$py_inc" -I"$repo/prelude/engine/csrc" \
    "$handover_src" -o "$tmp/$foreign" -L"$tlib" -ltorch_cpu -lc10 -Wl,-rpath,"$tlib" &
p3=$!
rc=0
wait $p1 || rc=1
wait $p2 || rc=1
wait $p3 || rc=1
if [[ $rc != 0 ]]; then
    echo "build.sh: compiling the HPU stand-in failed" >&2
    exit 1
fi
mv -f "$tmp/$plugin" "$lib/$plugin"
mv -f "$tmp/$hccl" "$lib/$hccl"
mv -f "$tmp/$foreign" "$build/$foreign"
cp -f "$here/missing_ops_1.19.txt" "$lib/missing_ops.txt"
ln -sfn "$plugin" "$lib/libhabana_pytorch2_plugin.upstream.so"
echo "$key" >"$stamp"
echo "build.sh: HPU stand-in built for torch $torch_version in $((SECONDS - start))s" >&2
emit_env
