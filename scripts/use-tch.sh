#!/usr/bin/env bash
# Switches the tch release trainbook builds with, for a torch other than the pinned one:
#   scripts/use-tch.sh VERSION [--check]
# rewrites the `tch` and `torch-sys` pins in the workspace Cargo.toml and re-locks them
# (`cargo update`, which needs crates.io). Only the releases scripts/torch-pair.sh lists as built
# with trainbook are accepted. Idempotent; --check only says what it would change. The container
# build runs it when the image's torch is one of those pairs; on your own machine it leaves a
# change to Cargo.toml/Cargo.lock that `git checkout Cargo.toml Cargo.lock` undoes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { printf '\033[1;34m[tch]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[tch]\033[0m %s\n' "$*" >&2; exit 1; }

want="" check=0
for a in "$@"; do
  case $a in
    --check) check=1 ;;
    [0-9]*) want=$a ;;
    *) die "usage: $0 VERSION [--check]" ;;
  esac
done
[ -n "$want" ] || die "usage: $0 VERSION [--check]"
scripts/torch-pair.sh --buildable | awk '{print $2}' | grep -qx "$want" ||
  die "tch $want is not one trainbook builds with (scripts/torch-pair.sh --list: 'supported' or 'built with trainbook')"

# The tch version Cargo.lock holds.
locked_tch() { awk '/^name = "tch"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock; }
have=$(sed -n 's/^tch *= *"=\([0-9][0-9.]*\)".*/\1/p' Cargo.toml | head -n1)
if [ "$have" = "$want" ] && [ "$(locked_tch)" = "$want" ]; then
  say "tch $want is already the pin"
  exit 0
fi
if [ "$check" = 1 ]; then
  say "would pin tch and torch-sys to =$want in Cargo.toml (now $have) and run: cargo update -p tch -p torch-sys"
  exit 0
fi
tmp=$(mktemp "$root/Cargo.toml.XXXXXX")
sed -e "s/^tch *= *\"=[0-9.]*\"/tch = \"=$want\"/" -e "s/^torch-sys *= *\"=[0-9.]*\"/torch-sys = \"=$want\"/" Cargo.toml >"$tmp"
mv "$tmp" Cargo.toml
cargo update -p tch -p torch-sys
[ "$(locked_tch)" = "$want" ] || die "Cargo.lock has tch $(locked_tch) after the update, not $want"
say "tch and torch-sys pinned to $want (was $have)"
