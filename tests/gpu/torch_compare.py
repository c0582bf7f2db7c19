#!/usr/bin/env python3
"""Cross-check against PyTorch: the same seeded allocation sequence through torch.cuda's native caching
allocator and through cachalot (CUDA backend, loaded with ctypes) must give the same memory_stats, field
by field, after every operation. Each config runs in its own process (PyTorch reads its config once).

usage: torch_compare.py LIBCACHALOT.so [OPS]   (each allocator runs in its own process)
"""
import ctypes as C
import os
import random
import subprocess
import sys

CONFIGS = [
    "",
    "roundup_power2_divisions:4",
    "max_split_size_mb:40",
    "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1],max_split_size_mb:100",
    "max_split_size_mb:20,max_non_split_rounding_mb:40",
]
ARRAYS = ["allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
          "active_bytes", "inactive_split_bytes", "requested_bytes"]
KINDS = ["all", "small_pool", "large_pool"]
FIELDS = ["current", "peak", "allocated", "freed"]
COUNTERS = ["num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free"]


class Stat(C.Structure):
    _fields_ = [(f, C.c_int64) for f in FIELDS]


class DeviceStats(C.Structure):
    _fields_ = [(a, Stat * 3) for a in ARRAYS] + [("oversize_allocations", Stat), ("oversize_segments", Stat)] + \
               [(c, C.c_int64) for c in COUNTERS] + [("max_split_size", C.c_int64)]


def flat(st):
    d = {}
    for a in ARRAYS:
        for k, kind in enumerate(KINDS):
            for f in FIELDS:
                d[f"{a}.{kind}.{f}"] = getattr(getattr(st, a)[k], f)
    for a in ("oversize_allocations", "oversize_segments"):
        for f in FIELDS:
            d[f"{a}.{f}"] = getattr(getattr(st, a), f)
    for c in COUNTERS + ["max_split_size"]:
        d[c] = getattr(st, c)
    return d


def sequence(seed, ops):
    rng = random.Random(seed)
    special = [1, 511, 512, 513, 1 << 20, (1 << 20) + 1, (10 << 20) - 512, (10 << 20) + 512, 84 << 20, 400 << 20,
               (20 << 20) - 512, 39 << 20, 41 << 20, 100 << 20]
    live = 0
    for i in range(ops):
        r = rng.random()
        if r < 0.01:
            yield ("empty_cache",)
        elif r < 0.58 or live == 0:
            size = rng.choice(special) if rng.random() < 0.1 else int(2 ** rng.uniform(0, 27))
            live += 1
            yield ("malloc", size)
        else:
            yield ("free", rng.randrange(live))
            live -= 1


def run_one(lib_path, conf, ops, which, out_path):
    """Runs the sequence through one allocator ('torch' or 'cachalot') and writes its stats after every
    step, one JSON list per line. One allocator per process, so that both see the same sequence of device
    addresses from cudaMalloc: best fit breaks ties between equal sizes by address, and the two
    allocators' segments interleaved in one process would order differently."""
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    import json
    import torch
    torch.cuda.init()
    st = DeviceStats()
    keys = list(flat(st).keys())
    if which == "cachalot":
        lib = C.CDLL(lib_path)
        lib.cachalot_last_error.restype = C.c_char_p
        lib.cachalot_malloc.argtypes = [C.c_void_p, C.c_int, C.c_size_t, C.c_void_p, C.POINTER(C.c_void_p)]
        lib.cachalot_free.argtypes = [C.c_void_p, C.c_void_p]
        backend, alloc = C.c_void_p(), C.c_void_p()
        assert lib.cachalot_backend_cuda(C.byref(backend)) == 0, lib.cachalot_last_error()
        assert lib.cachalot_create(backend, conf.encode(), C.byref(alloc)) == 0, lib.cachalot_last_error()

        def do_malloc(size):
            p = C.c_void_p()
            assert lib.cachalot_malloc(alloc, 0, size, None, C.byref(p)) == 0, lib.cachalot_last_error()
            return p

        def addr(p):
            return p.value

        def do_free(p):
            assert lib.cachalot_free(alloc, p) == 0, lib.cachalot_last_error()

        def do_empty():
            assert lib.cachalot_empty_cache(alloc) == 0

        def stats():
            assert lib.cachalot_memory_stats(alloc, 0, C.byref(st)) == 0
            d = flat(st)
            return [d[k] for k in keys]
    else:
        stream = torch.cuda.current_stream().cuda_stream  # the legacy default stream, 0
        do_malloc = lambda size: torch.cuda.caching_allocator_alloc(size, 0, stream)
        addr = int
        do_free = torch.cuda.caching_allocator_delete
        do_empty = torch.cuda.empty_cache

        def stats():
            t = torch.cuda.memory_stats()
            return [t.get(k, None) for k in keys]
    live = []
    with open(out_path, "w") as f:
        f.write(json.dumps(keys) + "\n")
        for op in sequence(1234, ops):
            ptr = None
            if op[0] == "malloc":
                live.append(do_malloc(op[1]))
                ptr = addr(live[-1])
            elif op[0] == "free":
                do_free(live.pop(op[1]))
            else:
                do_empty()
            f.write(json.dumps([list(op), stats(), ptr]) + "\n")
    if which == "cachalot":
        assert lib.cachalot_check(alloc) == 0, lib.cachalot_last_error()


def compare(conf, path_c, path_t):
    import json
    with open(path_c) as fc, open(path_t) as ft:
        keys = json.loads(fc.readline())
        ft.readline()
        n = mismatches = 0
        last = None
        # Best fit breaks ties between equal sizes by address. Absolute addresses differ between processes;
        # what matters is the order of the segments' addresses. A new segment's first block is returned at
        # its base; its rank among the segments made so far is compared between the two runs.
        bases = {"c": [], "t": []}
        first_order_diff = None
        late = 0
        idx = keys.index("num_device_alloc")
        prev_alloc = {"c": 0, "t": 0}
        for lc, lt in zip(fc, ft):
            n += 1
            (op, a, pa), (_, b, pb) = json.loads(lc), json.loads(lt)
            for who, st, ptr in (("c", a, pa), ("t", b, pb)):
                if st[idx] > prev_alloc[who] and ptr is not None:
                    bases[who].append(ptr)
                prev_alloc[who] = st[idx]
            rank = lambda lst: sorted(lst).index(lst[-1]) if lst else None
            if first_order_diff is None and len(bases["c"]) == len(bases["t"]) and rank(bases["c"]) != rank(bases["t"]):
                first_order_diff = n
            diff = {k: (x, y) for k, x, y in zip(keys, a, b) if x != y}
            if diff and first_order_diff is None:
                mismatches += 1
                if mismatches <= 3:
                    print(f"  [{conf!r}] op {n} {op}: cachalot vs torch differ: {dict(list(diff.items())[:6])}")
            elif diff:
                late += 1
            last = dict(zip(keys, a))
    compared = n if first_order_diff is None else first_order_diff - 1
    print(f"config {conf!r}: {compared} of {n} ops comparable, {mismatches} of them with a difference in any of "
          f"{len(keys)} stats; reserved peak {last['reserved_bytes.all.peak']} B, device allocs "
          f"{last['num_device_alloc']}, device frees {last['num_device_free']}" +
          ("" if first_order_diff is None else
           f"; the device returned segments in another address order from op {first_order_diff} on, so ties in "
           f"best fit resolve differently ({late} later steps differ; not counted)"))
    return mismatches


def main():
    if len(sys.argv) >= 7 and sys.argv[1] == "--one":
        run_one(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6])
        return
    import tempfile
    lib = os.path.abspath(sys.argv[1])
    ops = sys.argv[2] if len(sys.argv) > 2 else "3000"
    failed = 0
    tmp = tempfile.mkdtemp()
    for i, conf in enumerate(CONFIGS):
        paths = {}
        for which in ("cachalot", "torch"):
            paths[which] = os.path.join(tmp, f"{i}-{which}.jsonl")
            r = subprocess.run([sys.executable, __file__, "--one", lib, conf, ops, which, paths[which]])
            if r.returncode != 0:
                print(f"config {conf!r}: the {which} run failed")
        try:
            failed += compare(conf, paths["cachalot"], paths["torch"]) != 0
        except (OSError, ValueError, TypeError) as e:
            print(f"config {conf!r}: cannot compare: {e}")
            failed += 1
    print(f"{len(CONFIGS) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
