#!/usr/bin/env bash
# Installs stock evcxr_jupyter 0.22.0 (the kernel trainbook's is compared with) into
# .bench-evcxr/, with a kernelspec "evcxr-stock" next to it. Idempotent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/.bench-evcxr
bin=$dest/bin/evcxr_jupyter
if ! [ -x "$bin" ] || ! "$bin" --help 2>&1 | grep -q .; then
  # --locked: the crate's own lock file (newer salsa releases break its rust-analyzer crates).
  # Building in the workspace's target dir reuses the evcxr dependencies trainbook already built.
  nice -n 10 cargo install evcxr_jupyter --version 0.22.0 --locked --root "$dest" \
    --target-dir "$root/target/bench-evcxr"
fi
spec=$dest/share/jupyter/kernels/evcxr-stock
mkdir -p "$spec"
cat > "$spec/kernel.json" <<JSON
{
  "argv": ["$bin", "--control_file", "{connection_file}"],
  "display_name": "Rust (stock evcxr 0.22)",
  "language": "rust",
  "interrupt_mode": "message"
}
JSON
echo "stock evcxr kernelspec: $spec" >&2
