#!/usr/bin/env bash
# Which tch release goes with a Python interpreter's torch, and whether trainbook builds with it.
#   scripts/torch-pair.sh [--python PY] [--torch VERSION] [--quiet]
#   scripts/torch-pair.sh --list          the pairs table (also in docs/devices.md)
#   scripts/torch-pair.sh --buildable     "torch tch" for each pair trainbook builds with
# Exit 0: the torch is the one trainbook pins (tch in Cargo.toml, torch in scripts/setup.sh).
# Exit 3: another pair trainbook builds with after `scripts/use-tch.sh TCH` (printed as
#         "... <-> tch TCH: built with trainbook ..."); the container build does that itself.
# Exit 2: another torch; the message names the tch release made for it and the way forward.
# Exit 1: no torch found, or a usage error.
# torch is never imported (an import needs the GPU/HPU runtime libraries; a build does not):
# the version comes from torch/version.py, found with importlib without running the package.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# torch release -> the tch release whose torch-sys expects exactly it (TORCH_VERSION in
# torch-sys/build.rs of the crate published on crates.io). "-": no tch release for that minor.
# Rows other than trainbook's own pin and BUILT below are known releases, not verified with it.
PAIRS="
2.13.0 0.26.0
2.12 -
2.11.0 0.24.0
2.10.0 0.23.0
2.9.0 0.22.0
2.8 -
2.7.0 0.20.0
2.6.0 0.19.0
2.5.1 0.18.1
2.5.0 0.18.0
2.4.0 0.17.0
2.3.0 0.16.1
2.2.0 0.15.0
2.1.0 0.14.0
2.0.0 0.13.0
"
# Pairs other than the pin that trainbook has been built with and whose tests passed (date):
# the container build switches to them with scripts/use-tch.sh. CI builds the pin and checks that
# each of these still builds against its torch's headers (scripts/check-torch-pairs.sh).
BUILT="
2.11.0 0.24.0 2026-11-23
"
# Why the "-" rows have no tch: crates.io has no tch 0.21 (tch-rs's changelog names it for torch
# 2.8, but it was never published) and no tch 0.25 (nothing between 2.11 and 2.13).
declare -A NONE_WHY=(
  [2.12]="no tch release was published for torch 2.12"
  [2.8]="no tch release was published for torch 2.8 (tch-rs's changelog names 0.21.0, which is not on crates.io)"
)
# The Intel Gaudi PyTorch containers (vault.habana.ai/gaudi-docker/<gaudi>/.../pytorch-installer-<torch>)
# and their torch: Habana's support matrices and image tags. Their builds report e.g. 2.10.0a0+git<sha>.
GAUDI="
2.11.0 1.24.1
2.10.0 1.24.0
2.9.0 1.23.0
2.7.1 1.22.x
2.6.0 1.20.x,1.21.x
2.5.1 1.19.x
2.4.0 1.18.x
2.3.1 1.17.x
2.2.2 1.16.x
2.2.0 1.15.x
2.1.1 1.14.x
"

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
py=python3 torch_arg="" list=0 quiet=0 buildable=0
while [ $# -gt 0 ]; do
  case $1 in
    --python) py=${2:?--python needs a path}; shift 2 ;;
    --torch) torch_arg=${2:?--torch needs a version}; shift 2 ;;
    --list) list=1; shift ;;
    --buildable) buildable=1; shift ;;
    -q|--quiet) quiet=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "torch-pair: unknown argument $1" >&2; usage >&2; exit 1 ;;
  esac
done

# trainbook's own pins, read where they are set so this script cannot disagree with the build.
cargo_tch=$(sed -n 's/^tch *= *"=\([0-9][0-9.]*\)".*/\1/p' "$root/Cargo.toml" | head -n1)
torch_pin=$(sed -n 's/^TORCH_VERSION=\([0-9][0-9.]*\).*/\1/p' "$root/scripts/setup.sh" | head -n1)
[ -n "$cargo_tch" ] && [ -n "$torch_pin" ] || {
  echo "torch-pair: cannot read the pins (tch = \"=X\" in Cargo.toml, TORCH_VERSION= in scripts/setup.sh)" >&2; exit 1; }

# tch for an exact torch release, or "" when the table has none.
tch_for() { awk -v t="$1" '$1 == t { print $2; exit }' <<<"$PAIRS"; }
# The row for the same minor: "torch tch", or "".
row_for_minor() { awk -v m="$1" '{ split($1, v, "."); if (v[1] "." v[2] == m) { print; exit } }' <<<"$PAIRS"; }
gaudi_for() { awk -v t="$1" '$1 == t { print $2; exit }' <<<"$GAUDI"; }
# "tch date" when trainbook was built with this torch's own tch, or "".
built_for() { awk -v t="$1" '$1 == t { print $2, $3; exit }' <<<"$BUILT"; }

# A table that does not list the pinned pair is out of date: say so instead of guessing.
# Cargo.toml may have been switched to another built pair by scripts/use-tch.sh (the container
# build does that); the pin that counts is the one made for scripts/setup.sh's torch.
tch_pin=$(tch_for "$torch_pin")
if [ -z "$tch_pin" ] || [ "$tch_pin" = - ] ||
   { [ "$cargo_tch" != "$tch_pin" ] && ! awk -v c="$cargo_tch" '$2 == c { f = 1 } END { exit !f }' <<<"$BUILT"; }; then
  echo "torch-pair: the pairs table in scripts/torch-pair.sh does not list tch $cargo_tch for torch $torch_pin (the pins in Cargo.toml and scripts/setup.sh): update it" >&2
  exit 1
fi

if [ "$buildable" = 1 ]; then
  echo "$torch_pin $tch_pin"
  awk 'NF { print $1, $2 }' <<<"$BUILT"
  exit 0
fi

if [ "$list" = 1 ]; then
  printf '%-8s %-7s %-34s %s\n' torch tch "with trainbook" "Gaudi images with this torch"
  while read -r t c; do
    [ -n "$t" ] || continue
    if [ "$c" = - ]; then c="none"; s="no tch release"; t="$t.x"
    elif [ "$t" = "$torch_pin" ]; then s="supported (built and tested)"
    elif b=$(built_for "$t") && [ -n "$b" ]; then s="built with trainbook ${b#* }"
    else s="known, not verified"; fi
    printf '%-8s %-7s %-34s %s\n' "$t" "$c" "$s" "$(gaudi_for "$t")"
  done <<<"$PAIRS"
  # Gaudi torch versions that no tch release is built for exactly.
  while read -r t g; do
    [ -n "$t" ] && [ -z "$(tch_for "$t")" ] || continue
    r=$(row_for_minor "${t%.*}")
    printf '%-8s %-7s %-34s %s\n' "$t" "none" "nearest: tch ${r#* } (torch ${r%% *})" "$g"
  done <<<"$GAUDI"
  exit 0
fi

# The torch to judge: --torch, or the interpreter's.
if [ -n "$torch_arg" ]; then
  found=$torch_arg where="(given with --torch)"
else
  pyexe=$(command -v "$py" 2>/dev/null) || { echo "torch-pair: python interpreter '$py' not found" >&2; exit 1; }
  # Absolute, for the cd below; not resolved through links (a venv's python is a link).
  case $pyexe in /*) ;; *) pyexe=$(cd "$(dirname "$pyexe")" && pwd)/$(basename "$pyexe") ;; esac
  # From / so that a torch-named file in the current directory cannot shadow the real package.
  found=$(cd / && "$pyexe" - <<'PY'
import importlib.util, os, re, sys
spec = importlib.util.find_spec("torch")
if spec is None or not spec.submodule_search_locations:
    sys.exit(3)
d = spec.submodule_search_locations[0]
try:
    m = re.search(r"""__version__\s*=\s*['"]([^'"]+)['"]""", open(os.path.join(d, "version.py")).read())
    print(m.group(1))
except (OSError, AttributeError):
    from importlib.metadata import version
    print(version("torch"))
PY
  ) || { echo "torch-pair: $pyexe has no torch (looked for the torch package without importing it)" >&2; exit 1; }
  where="in $pyexe"
fi

# Release part: 2.7.1a0+git1234 -> 2.7.1 (Gaudi builds), 2.13.0+cu130 -> 2.13.0 (PyPI wheels).
if [[ $found =~ ^([0-9]+)\.([0-9]+)(\.([0-9]+))? ]]; then
  minor=${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
  release=$minor.${BASH_REMATCH[4]:-0}
else
  echo "torch-pair: cannot read a version from '$found'" >&2; exit 1
fi
shown="torch $release"; [ "$found" = "$release" ] || shown="torch $release ($found)"

tch=$(tch_for "$release")
if [ "$release" = "$torch_pin" ]; then
  [ "$quiet" = 1 ] || echo "$shown $where <-> tch $tch_pin: supported (trainbook pins tch =$tch_pin, built and tested with torch $torch_pin)"
  exit 0
fi

b=$(built_for "$release")
if [ -n "$b" ]; then
  [ "$quiet" = 1 ] || echo "$shown $where <-> tch ${b%% *}: built with trainbook (tests passed ${b#* }; CI checks that it builds); switch with scripts/use-tch.sh ${b%% *}"
  exit 3
fi

buildable_torches() { { echo "$torch_pin"; awk 'NF { print $1 }' <<<"$BUILT"; } | paste -sd' '; }

# Mismatch: what tch release exists for this torch, and what to do instead.
if [ -n "$tch" ]; then
  made="tch $tch is the release built for torch $release (known, not verified with trainbook)"
else
  row=$(row_for_minor "$minor")
  if [ -n "$row" ] && [ "${row#* }" != - ]; then
    made="none for $release exactly: tch ${row#* } is built for torch ${row%% *} (torch-sys checks the exact version; not verified with trainbook)"
  elif [ -n "$row" ]; then
    made="none known: ${NONE_WHY[$minor]:-no tch release for torch $minor}"
  else
    made="none known: the table starts at torch 2.0"
  fi
fi
cat >&2 <<EOF
error: trainbook cannot be built against this torch.
  found:     $shown $where
  tch for it: $made
  trainbook: tch $tch_pin with torch $torch_pin (built and tested in CI), and the other pairs it
             was built with for torch $(buildable_torches | cut -d' ' -f2- | sed 's/ /, /g')
             (scripts/torch-pair.sh --list shows every known pair)
  way forward:
    - build against trainbook's own torch $torch_pin CPU wheel in a venv instead:
      TRAINBOOK_TORCH=wheel (docker build --build-arg TRAINBOOK_TORCH=wheel ...). trainbook then
      runs on the CPU; the image's own torch stays as it is for Python code.
    - or use a Gaudi image whose torch is one of $(buildable_torches) (the container
      build switches tch itself: scripts/use-tch.sh).
    LIBTORCH_BYPASS_VERSION_CHECK does not help: trainbook's bindings and C++ shim are compiled
    against torch $torch_pin's API.
EOF
exit 2
