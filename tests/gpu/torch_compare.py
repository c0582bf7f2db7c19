#!/usr/bin/env python3
"""Cross-check against PyTorch: the same seeded allocation sequence through torch.cuda's native caching
allocator and through cachalot (CUDA backend, loaded with ctypes) must give the same memory_stats, field
by field, after every operation. Each config runs in its own process (PyTorch reads its config once).

usage: torch_compare.py LIBCACHALOT.so [OPS]
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


def run_one(lib_path, conf, ops):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    import torch
    torch.cuda.init()
    lib = C.CDLL(lib_path)
    lib.cachalot_last_error.restype = C.c_char_p
    backend, alloc = C.c_void_p(), C.c_void_p()
    assert lib.cachalot_backend_cuda(C.byref(backend)) == 0, lib.cachalot_last_error()
    assert lib.cachalot_create(backend, conf.encode(), C.byref(alloc)) == 0, lib.cachalot_last_error()
    lib.cachalot_malloc.argtypes = [C.c_void_p, C.c_int, C.c_size_t, C.c_void_p, C.POINTER(C.c_void_p)]
    lib.cachalot_free.argtypes = [C.c_void_p, C.c_void_p]
    st = DeviceStats()

    def ours():
        assert lib.cachalot_memory_stats(alloc, 0, C.byref(st)) == 0
        return flat(st)

    def theirs():
        t = torch.cuda.memory_stats()
        return {k: t.get(k, "missing") for k in ours_keys}

    ours_keys = list(ours().keys())
    t_live, c_live = [], []
    stream = torch.cuda.current_stream().cuda_stream  # the legacy default stream, 0
    mismatches = 0
    n = 0
    for op in sequence(1234, ops):
        n += 1
        if op[0] == "malloc":
            t_live.append(torch.cuda.caching_allocator_alloc(op[1], 0, stream))
            p = C.c_void_p()
            rc = lib.cachalot_malloc(alloc, 0, op[1], None, C.byref(p))
            assert rc == 0, lib.cachalot_last_error()
            c_live.append(p)
        elif op[0] == "free":
            torch.cuda.caching_allocator_delete(t_live.pop(op[1]))
            assert lib.cachalot_free(alloc, c_live.pop(op[1])) == 0, lib.cachalot_last_error()
        else:
            torch.cuda.empty_cache()
            assert lib.cachalot_empty_cache(alloc) == 0
        a, b = ours(), theirs()
        diff = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
        if diff:
            mismatches += 1
            if mismatches <= 3:
                print(f"  [{conf!r}] op {n} {op}: cachalot vs torch differ: {dict(list(diff.items())[:6])}")
        if mismatches > 20:
            break
    assert lib.cachalot_check(alloc) == 0, lib.cachalot_last_error()
    final = ours()
    print(f"config {conf!r}: {n} ops, {mismatches} steps with a difference; final reserved peak "
          f"{final['reserved_bytes.all.peak']} B, segments allocated {final['segment.all.allocated']}, "
          f"device allocs {final['num_device_alloc']}")
    return mismatches


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "--one":
        sys.exit(1 if run_one(sys.argv[2], sys.argv[3], int(sys.argv[4])) else 0)
    lib = os.path.abspath(sys.argv[1])
    ops = sys.argv[2] if len(sys.argv) > 2 else "3000"
    failed = 0
    for conf in CONFIGS:
        r = subprocess.run([sys.executable, __file__, "--one", lib, conf, ops])
        failed += r.returncode != 0
    print(f"{len(CONFIGS) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
