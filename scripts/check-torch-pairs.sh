#!/usr/bin/env bash
# Proves that trainbook still builds with every torch/tch pair it claims besides the pin
# (scripts/torch-pair.sh --buildable; the pin itself is what `make build` builds):
#   scripts/check-torch-pairs.sh [TORCH_VERSION...]      (default: every claimed pair)
# For each pair, against that torch's own C++ headers (fetched from its PyPI wheel by
# scripts/torch-headers.py into .data/torch-headers/, about 20 MB, no libraries):
#   - a copy of the workspace is switched to the pair's tch (scripts/use-tch.sh), and
#   - `cargo check` runs over every crate that uses tch, with the hpu feature: its build
#     scripts compile every csrc/*.cpp of the engine and hpu crates (and tch's own C++ wrapper)
#     against those headers, and rustc type-checks the Rust code, tests included, against that
#     tch's API.
# A failure names the pair and the first errors (file:line). Nothing is linked, so no libtorch
# binaries are needed. The work is cached under target/torch-pairs/ (warm: seconds).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { printf '\033[1;34m[torch-pairs]\033[0m %s\n' "$*" >&2; }

pin_torch=$(scripts/torch-pair.sh --buildable | awk 'NR == 1 { print $1 }')
mapfile -t pairs < <(scripts/torch-pair.sh --buildable | tail -n +2)
if [ $# -gt 0 ]; then
  want=" $* "
  sel=()
  for p in "${pairs[@]}"; do [[ $want == *" ${p%% *} "* ]] && sel+=("$p"); done
  pairs=("${sel[@]}")
  [ ${#pairs[@]} -gt 0 ] || { echo "torch-pairs: none of '$*' is a pair trainbook claims besides the pin $pin_torch (scripts/torch-pair.sh --list)" >&2; exit 1; }
fi

work=$root/target/torch-pairs
mkdir -p "$work"
py=$(cat .libtorch/hpu-python 2>/dev/null || true)
features=()
[ -n "$py" ] && features=(--features trainbook/hpu)
failed=()
for pair in "${pairs[@]}"; do
  read -r torch tch <<<"$pair"
  headers=$root/.data/torch-headers/$torch
  scripts/torch-headers.py "$torch" "$headers"
  src=$work/src-$torch
  say "torch $torch with tch $tch: the workspace's crates checked against its headers"
  # The working tree as it is (tracked and new files, not ignored ones), into a copy whose
  # Cargo.toml/Cargo.lock use-tch.sh rewrites; files keep their times and unchanged ones are not
  # copied again, so a warm check only redoes what changed. Files gone from the tree go here too.
  mkdir -p "$src"
  git ls-files -z -co --exclude-standard | xargs -0 -r cp -a -u --parents -t "$src"
  comm -z -13 <(git ls-files -z -co --exclude-standard | sort -z) \
    <(cd "$src" && find . -type f -printf '%P\0' | sort -z) | (cd "$src" && xargs -0 -r rm -f)
  (cd "$src" && scripts/use-tch.sh "$tch" >/dev/null 2>"$work/use-tch-$torch.log") || {
    cat "$work/use-tch-$torch.log" >&2; failed+=("torch $torch / tch $tch: scripts/use-tch.sh $tch failed"); continue; }
  log=$work/check-$torch.log
  # Debug info off: the build scripts' C++ compiles are the slow part and need none.
  if (cd "$src" && LIBTORCH=$headers PYO3_PYTHON=${py:-python3} CARGO_TARGET_DIR=$work/target \
      CARGO_PROFILE_DEV_DEBUG=false cargo check --quiet --message-format=short \
      -p trainbook -p trainbook-engine -p trainbook-recipes -p trainbook-api ${py:+-p trainbook-hpu} \
      --all-targets "${features[@]}") >"$log" 2>&1; then
    say "torch $torch with tch $tch: builds"
  else
    # The first errors, with paths relative to the workspace (C++ from the build scripts, run
    # in their package's directory; Rust from rustc).
    errs=$(sed "s|$src/||g; s|^ *cargo:warning=||" "$log" | awk '
      /custom build command for `/ { match($0, /\([^)]*\)`/); pkg = substr($0, RSTART + 1, RLENGTH - 3) "/"; print; next }
      /^ToolExecError/ { next }
      /(error|Error)(\[E[0-9]+\])?:/ && !/^error: could not compile/ {
        if ($0 ~ /^csrc\//) $0 = pkg $0
        if (!seen[$0]++) print
      }' | head -n 8)
    failed+=("torch $torch / tch $tch (scripts/torch-pair.sh calls it built):
$(printf '%s\n' "${errs:-$(tail -n 20 "$log")}" | sed 's/^/    /')
    full log: $log")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  {
    echo "error: trainbook no longer builds with a torch it claims:"
    printf '  %s\n' "${failed[@]}"
    echo "  Gate code that differs between torch releases in prelude/engine/csrc/torch_compat.h (C++);"
    echo "  or, if the pair is given up, remove it from BUILT in scripts/torch-pair.sh and docs/devices.md."
  } >&2
  exit 1
fi
