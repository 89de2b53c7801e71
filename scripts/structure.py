#!/usr/bin/env python3
"""The house rules of sluice's Rust code, checked (CI runs this).

    python3 scripts/structure.py [ROOT]

Production code is every tracked `.rs` file outside `tests/`, up to its
first `#[cfg(test)]`. The rules:

- guides: a file that declares modules (`mod x;`) names each of them in
  its `//!` docs, so a reader finds a concept's file from its crate's
  guide in one step;
- circles: no two files of a crate import each other, directly or round
  a loop (`crate::` and `super::` paths);
- floors: in a crate with a `floors.txt`, a module imports only modules
  on its own floor or below (the file lists the floors, top first);
- sizes: a file holds at most 500 production lines and a function at
  most 100;
- homes: a type's own methods (`impl Type`, not a trait's) are in at
  most 3 files of its crate, so a reader finds them in one of a few
  places.

The breaches that were there when a rule came in are listed in
`scripts/structure-allow.txt`: a file or function with its size then,
which may shrink, never grow, and leaves the list once it fits; a circle
(`circle` and its modules) with the reason it stays. Nothing else may be
added there.

Exit status 1 and one line per breach when a rule is broken.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict

MAX_FILE = 500
MAX_FN = 100
MAX_HOMES = 3
IMPL_DECL = re.compile(r"^impl(?:<[^>]*>)?\s+([A-Z]\w*)\b(?:<[^{]*>)?\s*\{", re.M)
ALLOW = "scripts/structure-allow.txt"

MOD_DECL = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", re.M)
FN_DECL = re.compile(
    r'^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?'
    r'(?:extern\s+"C"\s+)?fn\s+(\w+)'
)
PATH_REF = re.compile(r"\b(crate|(?:super::)+)(?:::)?([A-Za-z_][\w:]*)(?:::\{([^}]*)\})?")


def tracked(root: str) -> list[str]:
    out = subprocess.check_output(["git", "-C", root, "ls-files", "*.rs"], text=True)
    return [
        f
        for f in out.split()
        if not f.startswith("tests/")
        and "/tests/" not in f
        and os.path.exists(os.path.join(root, f))
    ]


def production(text: str) -> str:
    """The file up to its tests module."""
    i = text.find("#[cfg(test)]")
    return text if i < 0 else text[:i]


def blank(text: str) -> str:
    """`text` with the insides of its comments, strings (raw ones too, and
    those that run over lines) and char literals blanked, line breaks
    kept: what is left is code, its braces the code's own."""
    out = []
    i, n = 0, len(text)
    keep = lambda c: c if c == "\n" else " "
    while i < n:
        c = text[i]
        two = text[i : i + 2]
        if two == "//":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif two == "/*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(map(keep, text[i:j])))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i : i + 258]) and not (
            i and (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            start = i + 2 + len(hashes)
            j = text.find('"' + hashes, start)
            j = n if j < 0 else j + 1 + len(hashes)
            out.append('""' + "".join(map(keep, text[start : j - 1 - len(hashes)])))
            out.append(" " * (2 * len(hashes)))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append('"' + "".join(map(keep, text[i + 1 : j - 1])) + '"')
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}'), or a lifetime ('a).
            m = re.match(r"'(\\[^']*|[^'\\])'", text[i : i + 12])
            if m:
                out.append("''" + " " * (len(m.group(0)) - 2))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_comments_and_strings(line: str) -> str:
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return re.sub(r"//.*", "", line)


def crate_of(path: str) -> tuple[str, str] | None:
    """(crate dir, its src dir) of a production file."""
    if path.startswith("src/"):
        return "", "src"
    if "/src/" in path:
        d = path.split("/src/", 1)[0]
        return d, d + "/src"
    return None


def module_of(src: str, path: str) -> tuple[str, ...]:
    parts = path[len(src) + 1 : -3].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def is_dir_module(path: str) -> bool:
    return os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs")


# ---- guides ---------------------------------------------------------------


def check_guides(root: str, files: list[str]) -> list[str]:
    out = []
    for f in files:
        text = open(os.path.join(root, f), encoding="utf-8").read()
        mods = MOD_DECL.findall(production(text))
        if not mods:
            continue
        doc = "\n".join(l for l in text.split("\n") if l.lstrip().startswith("//!"))
        for m in mods:
            if not re.search(r"`" + m + r"(`|/|::)", doc):
                out.append(f"guides: {f} declares `mod {m}` but its //! docs do not name it")
    return out


# ---- the import graph -----------------------------------------------------


def import_graph(root: str, files: list[str]) -> dict[str, dict[tuple, set[tuple]]]:
    """Per crate: module → the modules of the same crate it names."""
    crates: dict[str, dict[tuple, str]] = defaultdict(dict)
    for f in files:
        c = crate_of(f)
        if c and "/bin/" not in f:
            crates[c[1]][module_of(c[1], f)] = f
    graphs = {}
    for src, mods in crates.items():
        graph: dict[tuple, set[tuple]] = defaultdict(set)
        for m, f in mods.items():
            text = production(open(os.path.join(root, f), encoding="utf-8").read())
            text = "\n".join(strip_comments_and_strings(l) for l in text.split("\n"))
            for hit in PATH_REF.finditer(text):
                if hit.group(1) == "crate":
                    base = []
                else:
                    ups = hit.group(1).count("super::")
                    here = list(m) if is_dir_module(f) else list(m[:-1])
                    base = here[: len(here) - (ups - 1)] if ups > 1 else here
                base = base + hit.group(2).split("::")
                refs = [base]
                for item in (hit.group(3) or "").split(","):
                    item = item.strip().split(" as ")[0]
                    if item and item != "self":
                        refs.append(base + item.split("::"))
                for r in refs:
                    for k in range(len(r), 0, -1):
                        t = tuple(r[:k])
                        if t in mods:
                            # A module naming its own submodule is not a back edge.
                            if t != m and t[: len(m)] != m:
                                graph[m].add(t)
                            break
        graphs[src] = graph
    return graphs


def circles(graph: dict[tuple, set[tuple]]) -> list[list[tuple]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[tuple, int] = {}
    low: dict[tuple, int] = {}
    stack: list[tuple] = []
    on: set[tuple] = set()
    found = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: tuple) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def check_circles(root: str, graphs) -> list[str]:
    out = []
    allowed = set(read_allow(root, "circle"))
    seen = set()
    for src, graph in sorted(graphs.items()):
        for comp in circles(graph):
            names = ", ".join("/".join(m) or "(root)" for m in comp)
            key = f"{src}: {names}"
            seen.add(key)
            if key not in allowed:
                out.append(f"circles: {key} import each other")
    for key in sorted(allowed - seen):
        out.append(f"circles: {key} no longer import each other: take it out of {ALLOW}")
    return out


def check_floors(root: str, graphs) -> list[str]:
    out = []
    for src, graph in sorted(graphs.items()):
        crate_dir = src[: -len("src")].rstrip("/")
        spec = os.path.join(root, crate_dir, "floors.txt")
        if not os.path.exists(spec):
            continue
        floor_of: dict[str, int] = {}
        floors = []
        for line in open(spec, encoding="utf-8"):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, members = line.partition(":")
            floors.append(name.strip())
            for mod in members.split():
                floor_of[mod] = len(floors) - 1
        height = len(floors)
        for m, targets in graph.items():
            if not m or m[0] not in floor_of:
                if m:
                    out.append(f"floors: {src}/{m[0]} is on no floor of {spec}")
                continue
            mine = floor_of[m[0]]
            for t in targets:
                if not t or t[0] == m[0] or t[0] not in floor_of:
                    continue
                theirs = floor_of[t[0]]
                # Floors are listed top first: a smaller index is higher.
                if theirs < mine:
                    out.append(
                        f"floors: {'/'.join(m)} ({floors[mine]}, floor {height - mine}) imports "
                        f"{'/'.join(t)} ({floors[theirs]}, floor {height - theirs}), above it"
                    )
    return sorted(set(out))


# ---- sizes ----------------------------------------------------------------


def functions(text: str):
    """(name, first line, length) of every function in production code."""
    lines = production(text).split("\n")
    code = blank(production(text)).split("\n")
    i = 0
    while i < len(lines):
        hit = FN_DECL.match(lines[i])
        if not hit:
            i += 1
            continue
        depth, started, j = 0, False, i
        while j < len(lines):
            s = code[j]
            for ch in s:
                if ch == "{":
                    depth += 1
                    started = True
                elif ch == "}":
                    depth -= 1
            if started and depth == 0:
                break
            if not started and s.rstrip().endswith(";"):
                break
            j += 1
        if started:
            yield hit.group(1), i + 1, j - i + 1
        i += 1


def sizes(root: str, files: list[str]) -> dict[str, int]:
    """Every file and function over its limit: `path` or `path::fn` → lines."""
    over = {}
    for f in files:
        text = open(os.path.join(root, f), encoding="utf-8").read()
        n = production(text).rstrip("\n").count("\n") + 1
        if n > MAX_FILE:
            over[f] = n
        for name, _, length in functions(text):
            if length > MAX_FN:
                key = f"{f}::{name}"
                over[key] = max(length, over.get(key, 0))
    return over


def read_allow(root: str, kind: str = "size") -> dict[str, int]:
    """The allow list's entries of one kind: `size` (what → lines),
    `circle` (the circle → 0) or `homes` (`crate Type` → files)."""
    allow = {}
    path = os.path.join(root, ALLOW)
    if os.path.exists(path):
        for line in open(path, encoding="utf-8"):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            first, what = line.split(None, 1)
            if first == "circle":
                if kind == "circle":
                    allow[what] = 0
            elif first == "homes":
                if kind == "homes":
                    n, key = what.split(None, 1)
                    allow[key] = int(n)
            elif kind == "size":
                allow[what] = int(first)
    return allow


def check_sizes(root: str, files: list[str]) -> list[str]:
    out = []
    allow = read_allow(root)
    for what, n in sorted(sizes(root, files).items()):
        limit = MAX_FN if "::" in what else MAX_FILE
        kind = "function" if "::" in what else "file"
        if what not in allow:
            out.append(f"sizes: {kind} {what} is {n} lines (at most {limit})")
        elif n > allow[what]:
            out.append(f"sizes: {kind} {what} grew to {n} lines ({allow[what]} in {ALLOW})")
    now = sizes(root, files)
    for what in sorted(allow):
        if what not in now:
            out.append(f"sizes: {what} fits now: take it out of {ALLOW}")
    return out


def check_homes(root: str, files: list[str]) -> list[str]:
    """Types whose inherent impls are spread over more than MAX_HOMES files
    (or, where listed, over more files than the allow list's)."""
    homes: dict[str, set[str]] = defaultdict(set)
    for path in files:
        found = crate_of(path)
        if found is None:
            continue
        with open(os.path.join(root, path), encoding="utf-8") as f:
            text = production(f.read())
        for ty in IMPL_DECL.findall(text):
            homes[f"{found[0]} {ty}"].add(path)
    allow = read_allow(root, "homes")
    out = []
    for key, paths in sorted(homes.items()):
        limit = allow.get(key, MAX_HOMES)
        if len(paths) > limit:
            crate, ty = key.split()
            out.append(f"homes: impl {ty} is in {len(paths)} files of {crate} "
                       f"(at most {limit}): " + ", ".join(sorted(paths)))
    for key, n in sorted(allow.items()):
        if len(homes.get(key, ())) <= MAX_HOMES:
            out.append(f"homes: {key} fits now: take it out of {ALLOW}")
        elif len(homes[key]) < n:
            out.append(f"homes: {key} is in {len(homes[key])} files now: "
                       f"lower its entry in {ALLOW}")
    return out


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    files = tracked(root)
    graphs = import_graph(root, files)
    breaches = (
        check_guides(root, files)
        + check_circles(root, graphs)
        + check_floors(root, graphs)
        + check_sizes(root, files)
        + check_homes(root, files)
    )
    for b in breaches:
        print(b)
    allow = read_allow(root)
    print(
        f"structure: {len(files)} files, {len(breaches)} breaches; "
        f"{len(allow)} files and functions still over their size (see {ALLOW})"
    )
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
