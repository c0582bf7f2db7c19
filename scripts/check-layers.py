#!/usr/bin/env python3
"""Checks the layer rule of docs/architecture.md: a file uses files of its own room or of rooms below it,
never above it or beside it.

Two kinds of edges are read:
  - #include "..." lines of every C, C++ and header file under src/ and tools/ (resolved to a file);
  - symbols: for each object of the static library (and of the preload library when it is built), the
    cl_* / cachalot_* symbols it uses but does not define, bound to the object that defines them. These
    catch calls through inline functions of a header, which no #include line shows.

Every file of the library's rooms (common/ up to process/) is also read for calls of an entry point (a
function include/cachalot/ declares): nothing inside the library calls one; the plug-ins, the PyTorch
layer and the tools, programs that use the library, may.

With BUILD_DIR it also checks that no strongly connected set of more than two source files exists in the
symbol edges (a circle of calls through three files or more; two files that call each other, like
expandable.c and expandable_unmap.c, are one concept split for size).

With --limits it also checks the rooms' limits: no file of src/ or tools/ over 700 lines, no function of
src/ over 80 (from its signature to its closing brace; top-level definitions, so C++ member functions
defined inside a class are not seen).

Usage: check-layers.py [--limits] SOURCE_DIR [BUILD_DIR]   (without BUILD_DIR only #include lines are read)
Exits 1 and lists the edges that break the rule (and what is over the limits)."""
import os
import re
import subprocess
import sys

# Level of each room: a room may use rooms of a lower level, and itself. Rooms of the same level are
# beside each other and may not use each other. Inside src/allocator/ the core's rooms stand on the
# backend in this order, and the policy files (src/allocator/*.c) above them all.
ROOMS = [
    ("include/cachalot/", "include", 0),
    ("src/common/", "common", 1),
    ("src/allocator/backend/", "backend", 2),
    ("src/allocator/core/", "core", 3),
    ("src/allocator/expandable/", "expandable", 4),
    ("src/allocator/host/", "host", 4),
    ("src/allocator/pools/", "pools", 5),
    ("src/allocator/", "allocator", 6),
    ("src/stats/", "stats", 7),
    ("src/graph/", "graph", 7),
    ("src/process/", "process", 8),
    ("src/plugin/", "plugin", 9),
    ("src/torch/", "torch", 9),
    ("tools/common/", "tools/common", 10),
    ("tools/alloc_snapshot/", "alloc_snapshot", 11),
    ("tools/alloc_bench/", "alloc_bench", 11),
    ("tools/", "tools", 11),
]
# The tools may compile these files of src/common/ into themselves (the library hides them).
TOOLS_LEVEL, TOOLS_MAY_USE = 10, ("common",)
# The library's own rooms (up to process/): nothing in them calls an entry point (a cachalot_* function of
# include/cachalot/); entry points are shells over the rooms' functions. The plug-ins and the PyTorch
# layer above are programs that use the library, as the tools are.
LIBRARY_LEVEL = 8

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
SOURCE_EXT = (".c", ".h", ".cpp", ".cu")


def room_of(path):
    for prefix, name, level in ROOMS:
        if path.startswith(prefix):
            return name, level
    return None, None


def allowed(src, dst):
    (sn, sl), (dn, dl) = room_of(src), room_of(dst)
    if sn is None or dn is None or sn == dn:
        return True
    if sl >= TOOLS_LEVEL and dn in TOOLS_MAY_USE:
        return True
    return dl < sl


def include_edges(root):
    for top in ("src", "tools"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        kind, name = m.groups()
                        if kind == "<":
                            if name.startswith("cachalot/"):
                                yield rel, "include/" + name
                            continue
                        for base in (dirpath, os.path.join(root, "src"), os.path.join(root, "include")):
                            target = os.path.normpath(os.path.join(base, name))
                            if os.path.exists(target):
                                yield rel, os.path.relpath(target, root)
                                break


def objects_of(paths, sources):
    """{source path: (defined symbols, undefined symbols)} for the objects in an archive or a list of
    object files (meson names an object after its source: src/a/b.c -> src_a_b.c.o)."""
    by_member = {s.replace("/", "_") + ".o": s for s in sources}
    out = subprocess.run(["nm", "-A"] + paths, capture_output=True, text=True, check=True).stdout
    result = {}
    for line in out.splitlines():
        fields = line.split(":")
        if len(fields) < 2:
            continue
        cur = by_member.get(os.path.basename(fields[-2]))
        if cur is None:
            continue
        result.setdefault(cur, (set(), set()))
        parts = fields[-1].split()
        if len(parts) < 2:
            continue
        kind, name = parts[-2], parts[-1]
        if not (name.startswith("cl_") or name.startswith("cachalot_")):
            continue
        if kind == "U":
            result[cur][1].add(name)
        elif kind in "TDBRVWtdbr":
            result[cur][0].add(name)
    return result


def symbol_edges(root, build):
    sources = []
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        sources += [os.path.relpath(os.path.join(dirpath, f), root) for f in files if f.endswith(".c")]
    archive = os.path.join(build, "libcachalot.a")
    if not os.path.exists(archive):
        sys.exit(f"check-layers: {archive} not found (build the static library first)")
    libraries = [[archive]]
    # The interposer is the library built again with its own files: its objects bind among themselves.
    preload = os.path.join(build, "libcachalot_preload.so.p")
    if os.path.isdir(preload):
        libraries.append([os.path.join(preload, f) for f in sorted(os.listdir(preload)) if f.endswith(".o")])
    for paths in libraries:
        objs = objects_of(paths, sources)
        definer = {}
        for src, (defined, _) in objs.items():
            for s in defined:
                definer[s] = src
        for src, (_, used) in objs.items():
            for s in sorted(used):
                if s in definer and definer[s] != src:
                    yield src, definer[s], s


def in_library(path):
    _, level = room_of(path)
    return level is not None and 1 <= level <= LIBRARY_LEVEL


def api_functions(root):
    """The names of the functions include/cachalot/ declares (its typedef'd names left out)."""
    names, types = set(), set()
    folder = os.path.join(root, "include", "cachalot")
    for f in sorted(os.listdir(folder)):
        with open(os.path.join(folder, f), encoding="utf-8") as fh:
            text = strip_c(fh.read())
        names |= set(re.findall(r"\b(cachalot_\w+)\s*\(", text))
        types |= set(re.findall(r"\btypedef\b[^;{]*?\b(cachalot_\w+)\s*;", text))
        types |= set(re.findall(r"}\s*(cachalot_\w+)\s*;", text))
        types |= set(re.findall(r"\(\s*\*\s*(cachalot_\w+)\s*\)", text))
    return names - types


def strip_c(text):
    """text without its comments and with its strings and characters emptied, lines kept in place."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"\"(\\.|[^\"\\\n])*\"|'(\\.|[^'\\\n])*'", '""', text)


def entry_point_calls(root):
    """file:line: name for each call of an entry point written in a file of the library's rooms. Found in
    the source, so calls within one file and calls an inline function hides are seen too; a function's
    own definition is not a call."""
    api = api_functions(root)
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            if not f.endswith((".c", ".h")) or not in_library(rel):
                continue
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines = strip_c(fh.read()).split("\n")
            for i, line in enumerate(lines):
                calls = [m.group(1) for m in re.finditer(r"\b(cachalot_\w+)\s*\(", line) if m.group(1) in api]
                if calls and DEFINITION.match(line) and not line.rstrip().endswith(";"):
                    calls = calls[1:]  # the definition's own name
                for name in calls:
                    yield f"{rel}:{i + 1}", name


MAX_CIRCLE = 2


def circles(edges):
    """The strongly connected sets of more than MAX_CIRCLE files of the graph {file: set of files} (Tarjan's
    algorithm, iterative), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = 0
    nodes = sorted(set(edges) | {w for v in edges for w in edges[v]})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > MAX_CIRCLE:
                    found.append(sorted(comp))
    return found


MAX_FILE_LINES, MAX_FUNCTION_LINES = 700, 80
DEFINITION = re.compile(r"^[A-Za-z_][^;]*\(")


def over_limits(root):
    for top in ("src", "tools"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    lines = fh.read().split("\n")
                if len(lines) - 1 > MAX_FILE_LINES:
                    yield f"{rel} has {len(lines) - 1} lines (at most {MAX_FILE_LINES})"
                if top != "src":
                    continue
                start = None
                for i, line in enumerate(lines):
                    if start is None and DEFINITION.match(line) and not line.startswith(("typedef", "#")) \
                            and not line.rstrip().endswith(";"):
                        start = i
                    elif start is not None and line.startswith("}"):
                        if i - start + 1 > MAX_FUNCTION_LINES:
                            name = re.search(r"([A-Za-z_][\w:~]*)\s*\(", lines[start])
                            yield f"{rel}:{start + 1}: {name.group(1) if name else '?'} has {i - start + 1} lines " \
                                  f"(at most {MAX_FUNCTION_LINES})"
                        start = None


def main():
    args = sys.argv[1:]
    limits = "--limits" in args
    args = [a for a in args if a != "--limits"]
    if len(args) not in (1, 2):
        sys.exit(__doc__)
    root = args[0]
    bad = set()
    for src, dst in include_edges(root):
        if not allowed(src, dst):
            bad.add(f"{src} includes {dst}")
    for where, name in entry_point_calls(root):
        bad.add(f"{where} calls the entry point {name}")
    if len(args) == 2:
        calls = {}
        for src, dst, sym in symbol_edges(root, args[1]):
            if not allowed(src, dst):
                bad.add(f"{src} uses {sym} of {dst}")
            if sym.startswith("cachalot_") and in_library(src):
                bad.add(f"{src} calls the entry point {sym} of {dst}")
            calls.setdefault(src, set()).add(dst)
        for comp in circles(calls):
            bad.add(f"a circle of calls through {len(comp)} files: {', '.join(comp)}")
    for line in sorted(bad):
        print("layer rule broken:", line)
    over = list(over_limits(root)) if limits else []
    for line in over:
        print("over the limits:", line)
    if bad or over:
        print(f"check-layers: {len(bad)} edges break the rule of docs/architecture.md, {len(over)} limits passed")
        return 1
    print("check-layers: every edge points down" + (", every file and function within the limits" if limits else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
