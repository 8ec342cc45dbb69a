#!/usr/bin/env bash
# Installs the "trainbook" Jupyter kernelspec into the project venv (where `make demo`'s and the
# tests' Jupyter look), after checking that the prelude loads into a cell. Users install it for
# their own Jupyter with `trainbook kernel install [--user|--sys-prefix|--prefix P]`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/target/release/trainbook-kernel" install --prefix "$root/.venv"
