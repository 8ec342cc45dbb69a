#!/usr/bin/env bash
# Real-browser test of the live dashboard and the sweep view: JupyterLab from .venv, the trainbook kernel, headless
# Debian Chromium driven by playwright-core (tests/browser/README.md). Checks what it needs and
# says how to get it, installs the pinned node packages only when missing or stale, then runs
# tests/browser/dashboard.test.mjs. Artifacts: $TRAINBOOK_ARTIFACTS (default
# target/test-artifacts/browser).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=tests/browser

fail() {
    echo "error: $*" >&2
    exit 1
}

# Debian's Chromium (never a browser download) and node/npm: installed here when missing, since
# only this test needs them.
chromium=${CHROMIUM:-/usr/bin/chromium}
need=()
[ -n "${CHROMIUM:-}" ] || [ -x /usr/bin/chromium ] || need+=(chromium)
command -v npm >/dev/null || need+=(nodejs npm)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]} (apt) for the browser test"
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
        fail "could not install ${need[*]} with apt-get; install them, or point CHROMIUM at a Chromium binary"
fi
[ -x "$chromium" ] || fail "chromium not found at $chromium (CHROMIUM=...)"
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 18 ] || fail "node $(node --version) is too old (need >= 18, Debian 12's nodejs is 18)"
[ -x .venv/bin/jupyter ] && .venv/bin/python -c 'import jupyterlab' 2>/dev/null ||
    fail "JupyterLab is not in .venv: run scripts/setup.sh (pip install -r scripts/requirements.txt)"
spec=.venv/share/jupyter/kernels/trainbook/kernel.json
[ -f "$spec" ] || fail "no trainbook kernelspec in .venv: run make build"
kernel=$(.venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["argv"][0])' "$spec")
[ -x "$kernel" ] || fail "the kernelspec's $kernel is missing: run make build"
[ -f notebooks/bert.ipynb ] || fail "notebooks/bert.ipynb not found"
[ -f notebooks/sweep.ipynb ] || fail "notebooks/sweep.ipynb not found"
[ -n "${TRAINBOOK_DATA:-}" ] || [ -f .data/datasets/rotten_tomatoes/reviews.csv ] ||
    fail "the notebook's data is missing (.data/datasets/rotten_tomatoes): run scripts/setup.sh"

# `npm ci` only when node_modules does not match the committed lock file. The stamp lives in
# node_modules, so `npm ci` (which empties it) never leaves a stale one behind.
stamp=$dir/node_modules/.package-lock.sha256
want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
if [ ! -d "$dir/node_modules/playwright-core" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "installing tests/browser/node_modules (npm ci)"
    # playwright-core downloads no browser; the variable makes sure of it.
    (cd "$dir" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund)
    echo "$want" >"$stamp"
fi

exec node "$dir/dashboard.test.mjs"
