#!/usr/bin/env python3
"""Checks trainbook's documentation against the files and the command line it describes.

Checked: README.md, every docs/**/*.md, and the other README.md files of the repository
(target/, .venv/, node_modules/, .data/ and hidden directories left out).

a) Every relative Markdown link, `[text](path)` or `[text](path#anchor)` (images and reference
   definitions too; not http(s)/mailto or other schemes), resolves to a file or directory
   relative to the file that contains it; an `#anchor` into a .md file (or within the same
   file) matches one of its headings by GitHub's slug rules.
b) Every command line shown in a fenced code block or in inline code that runs
   `trainbook <subcommand> ...` (also `target/release/trainbook`, behind srun/mpirun/torchrun,
   or `cargo run ... --bin trainbook -- ...`) names a subcommand that exists and only `--flags`
   that subcommand's parser accepts, as `trainbook <subcommand> --help` lists them.

Each problem is one line, `FILE:LINE: <what is wrong> — <how to fix>`; exit 1 when there is any,
0 with a one-line summary otherwise, 2 when the trainbook binary is missing.

    python3 scripts/check-docs.py [--root DIR] [--trainbook PATH]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import os
import re
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SKIP_DIRS = {"target", ".venv", "node_modules", ".data", "trainbook_runs"}
# Fenced blocks in these languages hold code, not command lines.
CODE_LANGS = {
    "rust", "rs", "python", "py", "json", "jsonl", "toml", "yaml", "yml", "c", "cpp", "c++",
    "js", "javascript", "ts", "typescript", "html", "css", "jinja", "dockerfile", "diff",
    "ini", "sql", "xml",
}
# Programs that run the command given after their own options.
LAUNCHERS = {"srun", "mpirun", "mpiexec", "torchrun", "env", "sudo", "time", "nohup", "exec",
             "timeout", "xargs"}
OPERATORS = {";", "&&", "||", "|", "&"}
PLACEHOLDER = re.compile(r"[<>\[\]{}|…]|\.\.\.")


@dataclass
class Problem:
    file: str
    line: int
    text: str


@dataclass
class Doc:
    path: Path
    rel: str
    lines: list[str]
    anchors: set[str] = field(default_factory=set)
    fenced: list[tuple[int, str, list[str]]] = field(default_factory=list)  # (first line, lang, lines)
    spans: list[tuple[int, str]] = field(default_factory=list)  # inline code: (line, content)
    links: list[tuple[int, str]] = field(default_factory=list)  # (line, target)


# ---------------------------------------------------------------------------------------------
# Markdown


def github_slug(text: str) -> str:
    """The anchor GitHub gives a heading whose rendered text is `text` (before de-duplication)."""
    s = text.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def heading_text(raw: str) -> str:
    """The rendered text of a heading's Markdown source: code spans, links, emphasis, tags."""
    out = []
    for i, part in enumerate(re.split(r"(`+)(.+?)\1", raw)):
        # re.split with two groups yields: text, ticks, code, text, ticks, code, ...
        kind = i % 3
        if kind == 1:
            continue
        if kind == 2:
            out.append(part.strip())
            continue
        part = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", part)  # links and images: their text
        part = re.sub(r"<[^>]+>", "", part)  # HTML tags
        part = re.sub(r"(?<!\w)_(\S(?:.*?\S)?)_(?!\w)", r"\1", part)  # _emphasis_
        part = part.replace("*", "")
        part = part.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
        part = part.replace("\\", "")
        out.append(part)
    return "".join(out)


FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:[^>]*?\s)?(?:name|id)=[\"']([^\"']+)[\"']", re.I)
INLINE_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)")


def parse(path: Path, root: Path) -> Doc:
    text = path.read_text(encoding="utf-8", errors="replace")
    doc = Doc(path, path.relative_to(root).as_posix(), text.splitlines())
    counts: dict[str, int] = {}

    def add_heading(raw: str) -> None:
        base = github_slug(heading_text(raw))
        n = counts.get(base, 0)
        slug = base if n == 0 else f"{base}-{n}"
        while slug in doc.anchors:  # a heading whose own text ends in -N
            n += 1
            slug = f"{base}-{n}"
        counts[base] = n + 1
        doc.anchors.add(slug)

    # Pass 1: fenced blocks out, headings in; the rest goes on as blocks of prose lines.
    prose: list[list[tuple[int, str]]] = [[]]
    fence: tuple[str, int, str, list[str]] | None = None  # (marker, first line, lang, lines)
    prev_para = False
    for no, line in enumerate(doc.lines, 1):
        if fence:
            m = FENCE.match(line)
            if m and m.group(1)[0] == fence[0][0] and len(m.group(1)) >= len(fence[0]) and not m.group(2):
                doc.fenced.append((fence[1], fence[2], fence[3]))
                fence = None
            else:
                fence[3].append(line)
            continue
        m = FENCE.match(line)
        if m:
            fence = (m.group(1), no + 1, m.group(2).lower(), [])
            prose.append([])
            prev_para = False
            continue
        for a in HTML_ANCHOR.findall(line):
            doc.anchors.add(a)
        if not line.strip():
            prose.append([])
            prev_para = False
            continue
        m = ATX.match(line)
        if m:
            add_heading(m.group(2) or "")
            prose.append([])
            prev_para = False
            continue
        m = SETEXT.match(line)
        if m and prev_para and prose[-1]:
            # The paragraph's lines so far are the heading.
            raw = " ".join(l.strip() for _, l in prose[-1])
            add_heading(raw)
            prose[-1].append((no, ""))
            prose.append([])
            prev_para = False
            continue
        stripped = line.lstrip()
        prev_para = not (stripped.startswith("|") or re.match(r"([-*+]|\d+[.)])\s", stripped)
                         or stripped.startswith(">"))
        prose[-1].append((no, line))
    if fence:  # an unclosed fence runs to the end of the file
        doc.fenced.append((fence[1], fence[2], fence[3]))

    # Pass 2: code spans and links, block by block (a code span does not cross a blank line).
    for block in prose:
        if not block:
            continue
        joined = "\n".join(l for _, l in block)
        starts = [no for no, _ in block]
        offsets = []
        pos = 0
        for _, l in block:
            offsets.append(pos)
            pos += len(l) + 1

        def line_of(offset: int) -> int:
            i = 0
            while i + 1 < len(offsets) and offsets[i + 1] <= offset:
                i += 1
            return starts[i]

        masked = list(joined)
        i = 0
        while i < len(joined):
            c = joined[i]
            if c == "\\" and i + 1 < len(joined):
                i += 2
                continue
            if c == "`":
                j = i
                while j < len(joined) and joined[j] == "`":
                    j += 1
                ticks = joined[i:j]
                k = j
                close = -1
                while True:
                    k = joined.find(ticks, k)
                    if k < 0:
                        break
                    end = k + len(ticks)
                    if (k == 0 or joined[k - 1] != "`") and (end >= len(joined) or joined[end] != "`"):
                        close = k
                        break
                    while k < len(joined) and joined[k] == "`":
                        k += 1
                if close < 0:
                    i = j
                    continue
                content = joined[j:close]
                doc.spans.append((line_of(i), content))
                for p in range(i, close + len(ticks)):
                    if masked[p] != "\n":
                        masked[p] = " "
                i = close + len(ticks)
                continue
            i += 1
        masked_text = "".join(masked)
        for m in INLINE_LINK.finditer(masked_text):
            target = m.group(2)
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            doc.links.append((line_of(m.start()), target))
        for off_line, l in zip(offsets, masked_text.split("\n")):
            m = REF_DEF.match(l)
            if m:
                target = m.group(2)
                if target.startswith("<") and target.endswith(">"):
                    target = target[1:-1]
                doc.links.append((line_of(off_line), target))
    return doc


def find_docs(root: Path) -> list[Path]:
    found = []
    if (root / "README.md").is_file():
        found.append(root / "README.md")
    docs = root / "docs"
    if docs.is_dir():
        found += sorted(p for p in docs.rglob("*.md") if p.is_file())
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        d = Path(dirpath)
        if d == root or d == docs or docs in d.parents:
            continue
        if "README.md" in filenames:
            found.append(d / "README.md")
    return found


# ---------------------------------------------------------------------------------------------
# Links


def check_links(doc: Doc, docs_by_path: dict[Path, Doc], root: Path, problems: list[Problem]) -> int:
    checked = 0
    for line, target in doc.links:
        if not target or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("//"):
            continue
        checked += 1
        path_part, _, anchor = target.partition("#")
        path_part = urllib.parse.unquote(path_part.split("?", 1)[0])
        anchor = urllib.parse.unquote(anchor)
        if path_part:
            base = root if path_part.startswith("/") else doc.path.parent
            dest = (base / path_part.lstrip("/")).resolve()
            if not dest.exists():
                hint = ""
                if dest.parent.is_dir():
                    close = difflib.get_close_matches(dest.name, [p.name for p in dest.parent.iterdir()], n=1)
                    if close:
                        hint = f" (did you mean {(Path(path_part).parent / close[0]).as_posix()}?)"
                problems.append(Problem(doc.rel, line,
                    f"link `{target}` — no file or directory {path_part}{hint}; paths are relative to {Path(doc.rel).parent.as_posix() or '.'}/"))
                continue
        else:
            dest = doc.path.resolve()
        if not anchor:
            continue
        if dest.is_dir() or dest.suffix.lower() != ".md":
            continue  # anchors into source files (#L10) and directories are not checked
        target_doc = docs_by_path.get(dest)
        if target_doc is None:
            target_doc = parse(dest, root) if root in dest.parents else parse_outside(dest)
            docs_by_path[dest] = target_doc
        if anchor not in target_doc.anchors:
            close = difflib.get_close_matches(anchor, sorted(target_doc.anchors), n=1, cutoff=0.5)
            hint = f"did you mean #{close[0]}?" if close else "use one of its headings' anchors (lowercase, punctuation dropped, spaces as -)"
            where = "this file" if not path_part else path_part
            problems.append(Problem(doc.rel, line,
                f"link `{target}` — {where} has no heading with anchor #{anchor}; {hint}"))
    return checked


def parse_outside(path: Path) -> Doc:
    return parse(path, path.parent)


# ---------------------------------------------------------------------------------------------
# Command lines


Word = tuple[str, int]  # a shell word and the line of the file it starts on


def shell_words(line: str, line_at=lambda offset: 0) -> list[Word]:
    """Splits one shell line into words and operators (; && || | &), each with `line_at(offset)`
    of its first character; `#` starts a comment at the start of a word. Quotes group; an
    unclosed quote runs to the end of the line."""
    words: list[Word] = []
    cur: list[str] = []
    start = -1
    i = 0
    n = len(line)

    def flush() -> None:
        nonlocal cur, start
        if start >= 0:
            words.append(("".join(cur), line_at(start)))
        cur, start = [], -1

    while i < n:
        c = line[i]
        if c in " \t\n":
            flush()
            i += 1
            continue
        if c == "#" and start < 0:
            break
        if c in ";&|":
            flush()
            op = line[i:i + 2] if line[i:i + 2] in ("&&", "||") else c
            words.append((op, line_at(i)))
            i += len(op)
            continue
        if start < 0:
            start = i
        if c == "\\" and i + 1 < n:
            cur.append(line[i + 1])
            i += 2
        elif c in "'\"":
            j = line.find(c, i + 1)
            if j < 0:
                j = n
            cur.append(line[i + 1:j])
            i = j + 1
        else:
            cur.append(c)
            i += 1
    flush()
    return words


def is_trainbook(word: str) -> bool:
    return word == "trainbook" or (word.endswith("/trainbook") and not word.startswith("http"))


def trainbook_args(cmd: list[Word]) -> list[Word] | None:
    """The arguments one simple command gives trainbook, or None when it runs no trainbook."""
    words = [w for w, _ in cmd]
    i = 0
    while i < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]):
        i += 1  # VAR=value prefixes
    if i >= len(words):
        return None
    first = words[i]
    if is_trainbook(first):
        return cmd[i + 1:]
    if first in LAUNCHERS:
        for j in range(i + 1, len(words)):
            if is_trainbook(words[j]):
                return cmd[j + 1:]
        return None
    if first == "cargo" and "run" in words[i + 1:] and "--" in words[i + 1:]:
        sep = words.index("--", i + 1)
        own, args = words[i + 1:sep], cmd[sep + 1:]
        bins = [own[k + 1] for k, w in enumerate(own[:-1]) if w == "--bin"]
        bins += [w.split("=", 1)[1] for w in own if w.startswith("--bin=")]
        if bins:
            return args if bins == ["trainbook"] else None
        pkgs = [own[k + 1] for k, w in enumerate(own[:-1]) if w in ("-p", "--package")]
        pkgs += [w.split("=", 1)[1] for w in own if w.startswith("--package=")]
        if pkgs == ["trainbook"] and not any(w == "--example" or w.startswith("--example=") for w in own):
            return args
    return None


def commands_in(text: str, line_at) -> list[list[Word]]:
    cmds: list[list[Word]] = [[]]
    for w in shell_words(text, line_at):
        if w[0] in OPERATORS:
            cmds.append([])
        else:
            cmds[-1].append(w)
    return [a for a in (trainbook_args(c) for c in cmds if c) if a is not None]


def logical_lines(lines: list[str], first: int) -> list[tuple[str, list[tuple[int, int]]]]:
    """Joins `\\`-continued lines: (text, [(offset in text, line number), ...])."""
    out = []
    buf, pieces = "", []
    for k, raw in enumerate(lines):
        line = raw.rstrip()
        if not pieces:
            s = line.lstrip()
            if s.startswith("$ "):
                line = s[2:]
        pieces.append((len(buf), first + k))
        if line.endswith("\\") and not line.endswith("\\\\"):
            buf += line[:-1] + " "
            continue
        out.append((buf + line, pieces))
        buf, pieces = "", []
    if pieces:
        out.append((buf, pieces))
    return out


def gather_commands(doc: Doc) -> list[list[Word]]:
    found = []
    for first, lang, lines in doc.fenced:
        if lang in CODE_LANGS:
            continue
        for text, pieces in logical_lines(lines, first):
            def line_at(offset: int, pieces=pieces) -> int:
                return max((no for start, no in pieces if start <= offset), default=pieces[0][1])
            found += commands_in(text, line_at)
    for no, content in doc.spans:
        text = content.replace("\\|", " |")  # a table cell's escaped pipe, same length
        found += commands_in(text, lambda offset, no=no, text=text: no + text.count("\n", 0, offset))
    return found


class Parser:
    """The accepted subcommands and flags, read from the real binary's --help (once each)."""

    def __init__(self, binary: Path):
        self.binary = binary
        self.cache: dict[tuple[str, ...], tuple[set[str], list[str]] | str] = {}

    def run_help(self, path: tuple[str, ...]) -> tuple[set[str], list[str]] | str:
        env = dict(os.environ, NO_COLOR="1", TERM="dumb", COLUMNS="200")
        env.pop("CLICOLOR_FORCE", None)
        try:
            r = subprocess.run([str(self.binary), *path, "--help"], capture_output=True, text=True,
                               timeout=60, env=env, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"`{self.display(path)} --help` did not run: {e}"
        if r.returncode != 0:
            last = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or ["no output"]
            return f"`{self.display(path)} --help` failed (exit {r.returncode}): {last[0]}"
        return parse_help(r.stdout)

    @staticmethod
    def display(path: tuple[str, ...]) -> str:
        return " ".join(("trainbook", *path))

    def prefetch(self, paths: set[tuple[str, ...]]) -> None:
        todo = [p for p in paths if p not in self.cache]
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            for p, res in zip(todo, pool.map(self.run_help, todo)):
                self.cache[p] = res

    def help(self, path: tuple[str, ...]) -> tuple[set[str], list[str]] | str:
        if path not in self.cache:
            self.cache[path] = self.run_help(path)
        return self.cache[path]


def parse_help(text: str) -> tuple[set[str], list[str]]:
    """The `--long` flags and the subcommands clap's help lists."""
    flags: set[str] = set()
    commands: list[str] = []
    in_commands = False
    for line in text.splitlines():
        if re.match(r"^(Commands|Subcommands):\s*$", line):
            in_commands = True
            continue
        if in_commands:
            m = re.match(r"^ {2}([A-Za-z0-9][\w-]*)(?:,|\s|$)", line)
            if m:
                commands.append(m.group(1))
                continue
            if not line.strip() or not line.startswith(" "):
                in_commands = False
        # Option lines: "  -n, --workers <N>" or "      --device <DEVICE>"; wrapped
        # descriptions are indented further and may mention other flags.
        m = re.match(r"^ {2}(?:-[^\s,-], | {4})(--[A-Za-z0-9][\w-]*)", line)
        if m:
            flags.add(m.group(1))
        for alias in re.findall(r"\[(?:aliases|alias): ([^\]]*)\]", line):
            flags.update(re.findall(r"--[A-Za-z0-9][\w-]*", alias))
    return flags, commands


def check_command(args: list[Word], first_line: int, parser: Parser, file: str,
                  problems: list[Problem]) -> bool:
    """Checks one trainbook invocation; False when it could not be (a placeholder subcommand)."""
    top = parser.help(())
    if isinstance(top, str):
        problems.append(Problem(file, first_line, f"{top} — run `make build` first"))
        return True
    global_flags = top[0] | {"--help", "--version"}
    path: tuple[str, ...] = ()
    commands = top[1]
    allowed = global_flags
    for w, line in args:
        if w == "--":
            break
        if w.startswith("-"):
            name = w.split("=", 1)[0]
            if name.startswith("--") and len(name) > 2 and name not in allowed:
                close = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]}?)" if close else ""
                shown = parser.display(path)
                problems.append(Problem(file, line,
                    f"`{shown} {name}` — {' '.join(path) or 'trainbook'} has no {name}{hint}; see `{shown} --help`"))
            continue
        if not commands:
            continue  # a positional argument or a flag's value
        # The first word that is not a flag, while this level has subcommands, names one.
        if PLACEHOLDER.search(w):
            return False
        if w not in commands:
            close = difflib.get_close_matches(w, commands, n=1)
            hint = f"did you mean {close[0]}?" if close else f"it has {', '.join(c for c in commands if c != 'help')}"
            shown = parser.display(path)
            problems.append(Problem(file, line,
                f"`{shown} {w}` — {shown} has no subcommand {w} ({hint}); see `{shown} --help`"))
            return True
        path = (*path, w)
        h = parser.help(path)
        if isinstance(h, str):
            problems.append(Problem(file, line, f"{h} — run `make build` first"))
            return True
        allowed = h[0] | global_flags
        commands = h[1]
    return True


# ---------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=REPO, help="the repository to check (default: this one)")
    ap.add_argument("--trainbook", type=Path, default=REPO / "target/release/trainbook",
                    help="the trainbook binary whose --help lists the accepted flags (default: %(default)s)")
    opts = ap.parse_args()
    root = opts.root.resolve()
    binary = opts.trainbook if opts.trainbook.is_absolute() else (Path.cwd() / opts.trainbook)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        print(f"check-docs: {binary} does not exist; run `make build` first (or pass --trainbook PATH)",
              file=sys.stderr)
        return 2

    docs = [parse(p, root) for p in find_docs(root)]
    by_path = {d.path.resolve(): d for d in docs}
    problems: list[Problem] = []
    links = sum(check_links(d, by_path, root, problems) for d in docs)

    parser = Parser(binary)
    found = [(d, args) for d in docs for args in gather_commands(d)]
    firsts = {()} | {(a[0][0],) for _, a in found
                     if a and not a[0][0].startswith("-") and not PLACEHOLDER.search(a[0][0])}
    parser.prefetch(firsts)
    commands = 0
    for d, args in found:
        first_line = args[0][1] if args else 0
        commands += check_command(args, first_line, parser, d.rel, problems)

    if problems:
        problems.sort(key=lambda p: (p.file, p.line))
        for p in problems:
            print(f"{p.file}:{p.line}: {p.text}")
        print(f"check-docs: {len(problems)} problem(s) in {len({p.file for p in problems})} file(s) "
              f"({len(docs)} files, {links} links, {commands} command lines checked)")
        return 1
    print(f"check-docs: {len(docs)} files, {links} links, {commands} command lines checked: all good")
    return 0


if __name__ == "__main__":
    sys.exit(main())
