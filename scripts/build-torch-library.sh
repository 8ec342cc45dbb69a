#!/usr/bin/env bash
# Builds target/release/libtrainbook_torch.so, the shared library the Jupyter kernel loads
# into the process that runs notebook cells (trainbook's engine), and puts beside it, as
# target/release/cells/libtrainbook_api.rlib, the exact build of trainbook-api inside that
# library: cells compile against it (`use trainbook::prelude::*`), and values cross between
# the cells' copy and the library's, so both must be one build (cargo keeps several builds of
# a crate side by side in deps/, one per feature resolution, and uplifts none of them for a
# `--bins` build).
#
# Cells link the Rust standard library dynamically (one copy for all cells), so the prelude
# must too: `-C prefer-dynamic`, which only `cargo rustc` can pass to one crate. The second
# version script exports tch's C wrapper, which cells that use tch call (see export-torch.map). The prelude is
# kept out of the workspace's default members so a plain `cargo build` never overwrites it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# The features `make build` gives the workspace: cuda, and hpu, whose worker side (the Gaudi
# bridge) is in this library too, so tasks defined in cells train on Gaudi.
source scripts/cargo-features.sh
# The dylib reuses the workspace build only if both resolve the same dependency features
# (prelude/dylib/Cargo.toml pins them). Drift would silently compile a second copy of much of
# the dependency graph, so name it instead.
tree() { ${CARGO:-cargo} tree -q -e normal,build -f '{p} {f}' --prefix none "${features[@]}" "$@" | sed 's/ (\*)$//' | sort -u; }
drift=$(comm -23 <(tree -p trainbook-torch | grep -v '^trainbook-torch ') <(tree))
if [ -n "$drift" ]; then
    echo "build-torch-library: the trainbook_torch library resolves other features than the workspace build for:" >&2
    echo "$drift" | sed 's/^/  /' >&2
    echo "add the workspace's features of these crates to prelude/dylib/Cargo.toml (see \`cargo tree -e features -i CRATE\`)" >&2
    exit 1
fi
messages=$(${CARGO:-cargo} rustc --release -p trainbook-torch --lib "${features[@]}" \
    --message-format=json-render-diagnostics -- -C prefer-dynamic \
    -C "link-arg=-Wl,--version-script=$root/prelude/dylib/export-torch.map")
api=$(printf '%s\n' "$messages" | grep '"reason":"compiler-artifact"' | grep '"name":"trainbook_api"' \
    | grep -o '"[^"]*/libtrainbook_api-[0-9a-f]*\.rlib"' | tr -d '"' | head -n 1)
if [ -z "$api" ] || [ ! -f "$api" ]; then
    echo "build-torch-library: cargo reported no trainbook-api rlib for the trainbook_torch library" >&2
    exit 1
fi
mkdir -p target/release/cells
cp -f "$api" target/release/cells/libtrainbook_api.rlib

# Cells that name `trainbook_torch` (tch and custom tasks) link the trainbook_torch library itself, and
# with it the native libraries it needs (libtorch's, HDF5's): their directories, as the build
# scripts (torch-sys', hdf5-sys') found them.
printf '%s\n' "$messages" | grep '"reason":"build-script-executed"' \
    | grep -o '"native=[^"]*"' | sed 's/^"native=//; s/"$//' | sort -u > target/release/cells/native-dirs
if ! grep -q . target/release/cells/native-dirs || ! printf '%s\n' "$messages" | grep '"package_id":"[^"]*torch-sys' | grep -q '"native='; then
    echo "build-torch-library: cargo reported no libtorch library directory (torch-sys's linked paths)" >&2
    exit 1
fi

# trainbook-cell-worker: the worker program of tasks defined in notebook cells. It links the
# trainbook_torch library dynamically, as the cells do, so the cell library it loads finds the same
# (single) copy of trainbook and its statics.
sysroot_lib="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/lib"
worker=target/release/trainbook-cell-worker
if [ ! -x "$worker" ] || [ "$worker" -ot target/release/libtrainbook_torch.so ] \
    || [ "$worker" -ot prelude/dylib/cell_worker.rs ]; then
    native=()
    while read -r d; do native+=(-L "native=$d"); done < target/release/cells/native-dirs
    rustc --edition 2021 -C opt-level=2 -C prefer-dynamic \
        --extern trainbook_torch=target/release/libtrainbook_torch.so \
        -L dependency=target/release/deps "${native[@]}" \
        -C "link-arg=-Wl,-rpath,$root/target/release:$sysroot_lib" \
        -o "$worker.tmp" prelude/dylib/cell_worker.rs
    mv -f "$worker.tmp" "$worker"
fi
