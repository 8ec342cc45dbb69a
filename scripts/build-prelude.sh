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
${CARGO:-cargo} rustc --release -p trainbook-prelude --lib "${features[@]}" -- -C prefer-dynamic
