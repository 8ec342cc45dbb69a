#!/usr/bin/env bash
# Puts the freshly built `trainbook`, `trainbook-worker` and `trainbook-kernel` on the user's PATH by linking them
# into ~/.cargo/bin (or $TRAINBOOK_BIN_DIR). Links, not copies: a rebuild updates them, and the
# binaries find libtorch through their rpath.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin_dir=${TRAINBOOK_BIN_DIR:-${CARGO_HOME:-$HOME/.cargo}/bin}
mkdir -p "$bin_dir"
for b in trainbook trainbook-worker trainbook-kernel; do
  ln -sfn "$root/target/release/$b" "$bin_dir/$b"
done
case ":$PATH:" in
  *":$bin_dir:"*) ;;
  *) echo "note: add $bin_dir to your PATH to run \`trainbook\` directly" >&2 ;;
esac
