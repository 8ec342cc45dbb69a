#!/usr/bin/env bash
# The Dockerfile's build steps (every RUN of it is one of these), so CI can run them too:
#   scripts/container-build.sh [--check] [--python PY] preflight|jupyter|build
#     preflight  decide which torch trainbook builds against, before anything long runs
#     jupyter    install Jupyter Notebook into the image's Python
#     build      set up, build trainbook and its prelude, install the kernelspec for that Jupyter
#     --check    do every step that changes nothing (CI runs this against the project venv):
#                the toolchain, the torch pair, the LIBTORCH layout (built in a temporary
#                directory), the C++ ABI, then print what would run
#   TRAINBOOK_TORCH=auto       (default) the image's own torch when trainbook builds with it
#                              (scripts/torch-pair.sh exit 0 or 3), else trainbook's own CPU
#                              wheel, with a warning that says why
#   TRAINBOOK_TORCH=container  the image's own torch, or fail at preflight (scripts/torch-pair.sh
#                              --list shows the pairs)
#   TRAINBOOK_TORCH=wheel      trainbook's own CPU torch wheel in .venv (what make build does)
#   --python PY / TRAINBOOK_PYTHON  the image's interpreter: its torch and its Jupyter (python3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { printf '\033[1;34m[container]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[container]\033[0m %s\n' "$*" >&2; exit 1; }

NOTEBOOK=notebook==7.6.5
# papermill at the version `make setup` installs (headless runs in the container, as outside it);
# trainbook's translator for it is installed by `build`, once the sources are in the image.
PAPERMILL=$(grep -m1 '^papermill==' scripts/requirements.txt) || PAPERMILL=papermill
check=0 step="" py=${TRAINBOOK_PYTHON:-python3}
while [ $# -gt 0 ]; do
  case $1 in
    --check) check=1; shift ;;
    --python) py=${2:?--python needs a path}; shift 2 ;;
    preflight|jupyter|build) step=$1; shift ;;
    *) die "unknown argument $1 (usage: $0 [--check] [--python PY] preflight|jupyter|build)" ;;
  esac
done
[ -n "$step" ] || die "usage: $0 [--check] [--python PY] preflight|jupyter|build"
mode=${TRAINBOOK_TORCH:-auto}
case $mode in auto|container|wheel) ;; *) die "TRAINBOOK_TORCH must be auto, container or wheel, not '$mode'" ;; esac
py=$(command -v "$py") || die "Python interpreter '$py' not found"
case $py in /*) ;; *) py=$PWD/$py ;; esac
# auto decides the same way in every step (the image's torch does not change between them).
if [ "$mode" = auto ]; then
  pair=0
  scripts/torch-pair.sh --quiet --python "$py" >/dev/null 2>&1 || pair=$?
  if [ "$pair" = 0 ] || [ "$pair" = 3 ]; then
    mode=container
  else
    mode=wheel
    auto_why="trainbook does not build with the image's torch (scripts/torch-pair.sh --python $py says why)"
  fi
fi
torch_pin=$(sed -n 's/^TORCH_VERSION=\([0-9.]*\).*/\1/p' scripts/setup.sh)
tch_pin=$(scripts/torch-pair.sh --buildable | awk -v t="$torch_pin" '$1 == t { print $2; exit }')
tch_use=$tch_pin torch_use=$torch_pin
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# Which torch trainbook builds against. container: the image's torch must be one trainbook
# builds with (fails here, in seconds, instead of deep inside torch-sys' build script); its layout is built
# in a scratch directory to prove it has what the build needs. wheel: only report the image's.
preflight() {
  if [ -n "${auto_why:-}" ]; then
    say "WARNING: TRAINBOOK_TORCH=auto falls back to trainbook's own CPU torch: $auto_why." \
        "trainbook in this image trains on the CPU; pass --build-arg TRAINBOOK_TORCH=container to make this an error"
  fi
  if [ "$mode" = wheel ]; then
    local seen
    seen=$(scripts/torch-pair.sh --python "$py" 2>&1 | sed -n 's/^ *found: *//p;s/ <-> .*//p' | head -n1 || true)
    say "TRAINBOOK_TORCH=wheel: trainbook builds against its own torch $torch_pin in .venv (CPU);" \
        "the image's ${seen:-Python has no torch} stays as it is"
    return 0
  fi
  say "TRAINBOOK_TORCH=container: checking the image's torch ($py)"
  local rc=0 said
  said=$(scripts/torch-pair.sh --python "$py") || rc=$?
  [ -z "$said" ] || say "$said"
  [ "$rc" = 0 ] || [ "$rc" = 3 ] || exit "$rc"
  # The tch to build with (the pin, or the pair made for the image's torch) and its torch.
  tch_use=$(sed -n 's/.* <-> tch \([0-9.]*\):.*/\1/p' <<<"$said")
  torch_use=$(scripts/torch-pair.sh --buildable | awk -v c="$tch_use" '$2 == c { print $1; exit }')
  [ -n "$torch_use" ] || die "cannot tell which torch tch '$tch_use' is for (scripts/torch-pair.sh --buildable)"
  local l=$scratch/libtorch
  rm -rf "$l"
  TRAINBOOK_TORCH_PYTHON=$py LIBTORCH=$l scripts/libtorch-layout.sh
  [ -f "$l/include/torch/csrc/distributed/c10d/ProcessGroupGloo.hpp" ] ||
    die "the image's torch has no c10d headers (torch/include/torch/csrc/distributed): trainbook's collectives need them"
  [ "$(cat "$l/build-version")" = "$torch_use" ] || die "LIBTORCH layout reports torch $(cat "$l/build-version"), not $torch_use"
  # trainbook's C++ shim and torch-sys compile with the new libstdc++ ABI; a torch built with the
  # old one would fail to link. Its symbols say which: new-ABI std::string lives in __cxx11.
  local abi
  abi=$("$py" -c 'import sys; print(1 if b"__cxx11" in open(sys.argv[1], "rb").read() else 0)' "$(readlink -f "$l/lib/libc10.so")")
  [ "$abi" = 1 ] || die "the image's torch is built with the old C++ ABI (_GLIBCXX_USE_CXX11_ABI=0); trainbook needs the new one: use TRAINBOOK_TORCH=wheel"
  say "the image's torch has c10d headers, libtorch_cpu.so and the C++11 ABI: LIBTORCH will point at it"
  [ "$tch_use" = "$tch_pin" ] || say "trainbook will build with tch $tch_use, the release made for torch $torch_use (scripts/use-tch.sh)"
}

jupyter() {
  if [ "$check" = 1 ]; then
    "$py" -m pip --version >/dev/null || die "$py has no pip to install $NOTEBOOK with"
    say "would run: $py -m pip install $NOTEBOOK $PAPERMILL"
    return 0
  fi
  say "installing $NOTEBOOK and $PAPERMILL into $py"
  # PEP 668 images (Ubuntu 24.04 variants) mark the system Python as externally managed; the
  # image is that Python's only user, so installing into it is intended.
  PIP_BREAK_SYSTEM_PACKAGES=1 "$py" -m pip install --no-cache-dir --disable-pip-version-check -q "$NOTEBOOK" "$PAPERMILL"
  "$py" -m jupyter notebook --version >/dev/null
  "$py" -m papermill --version >/dev/null
}

# Where the image's Jupyter looks for kernelspecs: <sys.prefix>/share/jupyter.
jupyter_prefix() { "$py" -c 'import sys; print(sys.prefix)'; }

build() {
  local prefix
  prefix=$(jupyter_prefix)
  if [ "$check" = 1 ]; then
    scripts/install-rust.sh --check
    preflight
    [ -x scripts/setup.sh ] && [ -f Makefile ] || die "scripts/setup.sh or the Makefile is missing"
    local env=""
    [ "$mode" = container ] && env="TRAINBOOK_TORCH_PYTHON=$py "
    scripts/use-tch.sh "$tch_use" --check
    say "would run: ${env}scripts/setup.sh && ${env}make build"
    say "would run: target/release/trainbook-kernel install --prefix $prefix"
    say "would run: $py -m pip install --no-deps ./python/trainbook-papermill"
    say "would run: target/release/trainbook check --workers 2"
    say "check passed ($mode)"
    return 0
  fi
  scripts/install-rust.sh --check
  preflight
  # setup.sh and the Makefile's own setup step build .libtorch; in container mode
  # libtorch-layout.sh then takes the image's torch.
  if [ "$mode" = container ]; then export TRAINBOOK_TORCH_PYTHON=$py; else unset TRAINBOOK_TORCH_PYTHON; fi
  # The image's pair in container mode, else the pin (also undoes an earlier switch).
  scripts/use-tch.sh "$tch_use"
  # setup.sh makes .venv with python3's venv module, which Ubuntu ships separately.
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    say "installing python3-venv (setup.sh creates .venv with it)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  scripts/setup.sh   # first: it installs build-essential, and with it make
  make build
  if [ "$mode" = container ] && [ "$(cat .libtorch/build-version)" != "$torch_use" ]; then
    die ".libtorch does not point at the image's torch $torch_use"
  fi
  say "installing the trainbook kernelspec for $py's Jupyter ($prefix/share/jupyter)"
  target/release/trainbook-kernel install --prefix "$prefix"
  if "$py" -c 'import jupyter_client' 2>/dev/null; then
    "$py" -m jupyter kernelspec list | grep -q '^ *trainbook ' || die "jupyter kernelspec list does not show trainbook"
  fi
  # papermill's translator for the trainbook kernel, so `papermill notebooks/bert.ipynb OUT -p ...`
  # writes Rust parameter cells in the image too.
  say "installing trainbook's papermill translator into $py"
  PIP_BREAK_SYSTEM_PACKAGES=1 "$py" -m pip install --no-cache-dir --disable-pip-version-check -q --no-deps ./python/trainbook-papermill
  "$py" -c 'import trainbook_papermill' || die "trainbook's papermill translator did not install into $py"
  # The built binaries against the libraries they will run with: two workers, one allreduce, on
  # the device `auto` picks (HPUs when the image runs on Gaudi; at build time, where no device
  # is attached, CPU with one warning that says why).
  TRAINBOOK_RUNS=$scratch/runs target/release/trainbook check --workers 2
  say "trainbook built ($mode torch $(cat .libtorch/build-version)); start Jupyter with: jupyter notebook"
}

case $step in
  preflight) preflight ;;
  jupyter) jupyter ;;
  build) build ;;
esac
