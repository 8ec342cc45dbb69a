#!/usr/bin/env bash
# Builds target/release/libtrainbook_prelude.so, the shared library the Jupyter kernel links
# every notebook cell against (`use trainbook::prelude::*`), then installs the kernelspec.
#
# Cells link the Rust standard library dynamically (one copy for all cells), so the prelude
# must too: `-C prefer-dynamic`, which only `cargo rustc` can pass to one crate. The prelude is
# kept out of the workspace's default members so a plain `cargo build` never overwrites it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
features=()
if [ "$(cat .libtorch/cuda 2>/dev/null)" = 1 ]; then features=(--features trainbook/cuda); fi
# The dylib reuses the workspace build only if both resolve the same dependency features
# (prelude/dylib/Cargo.toml pins them). Drift would silently compile a second copy of much of
# the dependency graph, so name it instead.
tree() { ${CARGO:-cargo} tree -q -e normal,build -f '{p} {f}' --prefix none "${features[@]}" "$@" | sed 's/ (\*)$//' | sort -u; }
drift=$(comm -23 <(tree -p trainbook-prelude | grep -v '^trainbook-prelude ') <(tree))
if [ -n "$drift" ]; then
    echo "build-prelude: the prelude dylib resolves other features than the workspace build for:" >&2
    echo "$drift" | sed 's/^/  /' >&2
    echo "add the workspace's features of these crates to prelude/dylib/Cargo.toml (see \`cargo tree -e features -i CRATE\`)" >&2
    exit 1
fi
${CARGO:-cargo} rustc --release -p trainbook-prelude --lib "${features[@]}" -- -C prefer-dynamic
