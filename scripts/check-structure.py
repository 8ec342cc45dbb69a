#!/usr/bin/env python3
"""The shape of trainbook's Rust, checked: no module imports another that imports it back
(within a crate, between the modules under one parent), no function outside tests longer than
100 lines, no struct of more than 15 fields unless it is a plain data record (RECORDS below:
serialized configs and results, the job's state record). Reads the
sources as text (comments, strings and #[cfg(test)] items left out); exits 1 naming each
offence. `scripts/check-structure.py --report` prints the findings and exits 0."""
import os, re, subprocess, sys
from collections import defaultdict

ROOT = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()

def strip(text):
    # blank out comments, strings and char literals, keeping line breaks
    out = []; i = 0; n = len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i); j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif text.startswith("/*", i):
            depth = 1; j = i + 2
            while j < n and depth:
                if text.startswith("/*", j): depth += 1; j += 2
                elif text.startswith("*/", j): depth -= 1; j += 2
                else: j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c == 'r' and re.match(r'r#*"', text[i:i+10]) and not (i and (text[i-1].isalnum() or text[i-1]=='_')):
            m = re.match(r'r(#*)"', text[i:]); hashes = m.group(1)
            end = text.find('"' + hashes, i + len(m.group(0)))
            j = end + 1 + len(hashes)
            out.append('""' + re.sub(r"[^\n]", " ", text[i+2:j])); i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('"' + re.sub(r"[^\n]", " ", text[i+1:j]) + '"'); i = j + 1
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:])
            if m:
                out.append(" " * len(m.group(0))); i += len(m.group(0))
            else:
                out.append(c); i += 1
        else:
            out.append(c); i += 1
    return "".join(out)

def drop_tests(code):
    # cut #[cfg(test)] items (modules and functions)
    lines = code.split("\n")
    res = list(lines)
    i = 0
    while i < len(lines):
        if re.match(r"\s*#\[cfg\(test\)\]", lines[i]):
            depth = 0; started = False; j = i
            while j < len(lines):
                depth += lines[j].count("{") - lines[j].count("}")
                if "{" in lines[j]: started = True
                if started and depth <= 0: break
                if not started and lines[j].rstrip().endswith(";") and j > i: break
                j += 1
            for k in range(i, min(j + 1, len(lines))): res[k] = ""
            i = j + 1
        else:
            i += 1
    return "\n".join(res)

def crates():
    files = subprocess.check_output(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.rs"], cwd=ROOT, text=True).split()
    # test modules kept in files of their own (`#[cfg(test)] mod tests;`) are tests
    files = sorted({f for f in files if os.path.exists(os.path.join(ROOT, f))
                    and not re.search(r"(^|/|_)tests\.rs$", f)})
    roots = {}
    for f in files:
        parts = f.split("/")
        if "src" in parts:
            k = parts.index("src")
            roots.setdefault("/".join(parts[:k+1]), []).append(f)
    return roots

def module_of(src, f):
    rel = os.path.relpath(f, src)[:-3].split("/")
    if rel[-1] in ("lib", "main", "mod"): rel = rel[:-1]
    if rel and rel[0] == "bin": return None
    return tuple(rel)

def circles(src, files):
    mods = {}
    for f in files:
        m = module_of(src, f)
        if m is not None: mods[m] = f
    edges = defaultdict(set)
    for m, f in mods.items():
        code = drop_tests(strip(open(os.path.join(ROOT, f)).read()))
        is_dir = f.endswith(("mod.rs", "lib.rs", "main.rs"))
        for path in re.findall(r"\b((?:crate|super|self)(?:::(?:super|[A-Za-z_]\w*|\{))+)", code):
            parts = path.split("::")
            if parts[0] == "crate": base = (); parts = parts[1:]
            else:
                base = m
                while parts and parts[0] in ("super", "self"):
                    if parts[0] == "super": base = base[:-1]
                    parts = parts[1:]
            target = base
            for p in parts:
                if p == "{" or not re.match(r"\w+$", p): break
                if target + (p,) in mods: target = target + (p,)
                else: break
            # sibling edge under the common ancestor
            k = 0
            while k < min(len(m), len(target)) and m[k] == target[k]: k += 1
            if k < len(m) and k < len(target):
                edges[m[:k+1]].add(target[:k+1])
    # SCCs
    index = {}; low = {}; stack = []; on = set(); out = []; counter = [0]
    sys.setrecursionlimit(10000)
    def visit(v):
        index[v] = low[v] = counter[0]; counter[0] += 1; stack.append(v); on.add(v)
        for w in edges[v]:
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted("::".join(c) for c in comp))
    for v in list(edges):
        if v not in index: visit(v)
    return out

def functions(f):
    code = drop_tests(strip(open(os.path.join(ROOT, f)).read()))
    lines = code.split("\n"); res = []
    for i, line in enumerate(lines):
        m = re.search(r"\bfn\s+(\w+)", line)
        if not m: continue
        depth = 0; started = False; j = i
        while j < len(lines):
            seg = lines[j] if j > i else line[m.start():]
            for ch in seg:
                if ch == "{": depth += 1; started = True
                elif ch == "}": depth -= 1
                elif ch == ";" and not started: break
            if not started and ";" in seg: j = -1; break
            if started and depth <= 0: break
            j += 1
        if j >= i: res.append((j - i + 1, f"{f}:{i+1}", m.group(1)))
    return res

def structs(f):
    code = drop_tests(strip(open(os.path.join(ROOT, f)).read()))
    res = []
    for m in re.finditer(r"\bstruct\s+(\w+)[^;{(]*\{", code):
        depth = 1; j = m.end(); fields = 0; body_start = j
        while depth and j < len(code):
            if code[j] in "{(<[": depth += 1
            elif code[j] in "})>]": depth -= 1
            elif code[j] == "," and depth == 1: fields += 1
            j += 1
        body = code[body_start:j-1].strip()
        if body and not body.rstrip().endswith(","): fields += 1
        res.append((fields, f"{f}:{code[:m.start()].count(chr(10))+1}", m.group(1)))
    return res

# Plain data records: every field is a value users or files set, read as a whole.
RECORDS = {
    "JobSpec",       # the job as asked (config.json, the builders' target)
    "TrainResult",   # what a job returns
    "LlamaConfig",   # transformers' config.json fields
    "EncoderConfig", # transformers' config.json fields
    "State",         # driver/handle.rs: the job's state as handles read it
}
FN_LIMIT = 100
FIELD_LIMIT = 15

if __name__ == "__main__":
    allc = []; allf = []; alls = []
    for src, files in sorted(crates().items()):
        for c in circles(src, files): allc.append((src, c))
        for f in files:
            allf += functions(f); alls += structs(f)
    problems = []
    problems += [f"modules of {s} that import each other in a circle: {', '.join(c)}" for s, c in allc]
    problems += [f"{w}: fn {name} is {n} lines (at most {FN_LIMIT}): split it" for n, w, name in sorted(allf, reverse=True) if n > FN_LIMIT]
    problems += [f"{w}: struct {name} has {n} fields (at most {FIELD_LIMIT}): group them, or list it in RECORDS if it is plain data" for n, w, name in sorted(alls, reverse=True) if n > FIELD_LIMIT and name not in RECORDS]
    for p in problems: print(p)
    if "--report" in sys.argv:
        for n, w, name in sorted(alls, reverse=True):
            if n > FIELD_LIMIT and name in RECORDS: print(f"{w}: record {name}, {n} fields")
        sys.exit(0)
    if problems: sys.exit(1)
    print(f"structure: no module circle, no function over {FN_LIMIT} lines, no struct over {FIELD_LIMIT} fields outside {len(RECORDS)} records")
