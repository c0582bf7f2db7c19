#!/usr/bin/env python3
"""The layer check must be able to fail: each rule of scripts/check-layers.py broken once in a small tree
of its own, and the edges it must let through let through. Usage: test_check_layers.py CHECK_LAYERS_PY"""
import importlib.util
import os
import sys
import tempfile


def load(path):
    spec = importlib.util.spec_from_file_location("check_layers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def main():
    cl = load(sys.argv[1])
    failures = []

    def expect(what, got, want):
        if got != want:
            failures.append(f"{what}: got {sorted(got)}, want {sorted(want)}")

    with tempfile.TemporaryDirectory() as root:
        write(root, "include/cachalot/allocator.h",
              "typedef int cachalot_status;\ntypedef void (*cachalot_hook)(void);\n"
              "cachalot_status cachalot_malloc(void **p, unsigned long n);\n")
        write(root, "src/allocator/core/core.h", "/* the core */\n")
        write(root, "src/allocator/pools/pools.h", '#include "../core/core.h"\n')
        write(root, "src/allocator/host/host_cache.h", "\n")
        # up: the core includes a room above it
        write(root, "src/allocator/core/lane.c", '#include "core.h"\n#include "../pools/pools.h"\n')
        # beside: expandable/ and host/ stand side by side
        write(root, "src/allocator/expandable/expandable.c", '#include "../host/host_cache.h"\n')
        # down: a policy file includes every room; allowed
        write(root, "src/allocator/malloc.c", '#include "pools/pools.h"\n#include "core/core.h"\n')
        # an entry point called inside the library, once in a comment and a string (not calls), and a
        # definition (not a call either)
        write(root, "src/graph/graph.c",
              "/* cachalot_malloc(p, 1) */\nstatic const char *m = \"cachalot_malloc(\";\n"
              "cachalot_status cachalot_malloc(void **p, unsigned long n) {\n  return 0;\n}\n"
              "static int f(void **p) {\n  return cachalot_malloc(p, 8);\n}\n"
              "cachalot_status (*hook)(void);\n")
        # a program using the library may call it
        write(root, "src/plugin/plugin.c", "static int g(void **p) { return cachalot_malloc(p, 8); }\n")

        edges = {(s, d) for s, d in cl.include_edges(root) if not cl.allowed(s, d)}
        expect("includes that break the rule", edges, {
            ("src/allocator/core/lane.c", "src/allocator/pools/pools.h"),
            ("src/allocator/expandable/expandable.c", "src/allocator/host/host_cache.h"),
        })
        calls = set(cl.entry_point_calls(root))
        expect("entry points called inside the library", calls, {("src/graph/graph.c:7", "cachalot_malloc")})
        expect("the entry points", cl.api_functions(root), {"cachalot_malloc"})

    three = {"a.c": {"b.c"}, "b.c": {"c.c"}, "c.c": {"a.c"}, "d.c": {"e.c"}, "e.c": {"d.c"}}
    expect("circles of more than two files", {tuple(c) for c in cl.circles(three)}, {("a.c", "b.c", "c.c")})
    expect("rooms: the policy files above pools/", {cl.allowed("src/allocator/release.c",
                                                              "src/allocator/pools/pool.c")}, {True})
    expect("rooms: pools/ below the policy files", {cl.allowed("src/allocator/pools/pool.c",
                                                              "src/allocator/release.c")}, {False})

    for f in failures:
        print("FAIL:", f)
    print(f"check-layers self-test: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
