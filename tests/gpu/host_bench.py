"""Pinned host memory side by side on one GPU: PyTorch's caching host allocator, cachalot's host cache
(through PyTorch and through its C API) and bare cudaHostAlloc / cudaFreeHost, then an H2D copy pipeline.

    python3 tests/gpu/host_bench.py [OUT.json]

Needs the cachalot package installed with its PyTorch backend. Each allocator runs in a fresh process
(PyTorch's host allocator is chosen before the first pinning). Rows:
  pair      ns per alloc+free of one pinned block, per size from 4 KiB to 64 MiB, with a warm cache
            (median of 5 passes of 2000 pairs; bare cudaHostAlloc: 5 passes of 5 pairs)
  pipeline  GB/s of a loop that pins a 64 MiB batch, copies it to the device on a side stream
            (non_blocking) and frees it at once, 48 batches; and the same copies from one pinned buffer
            kept for the whole loop, the bandwidth ceiling
"""
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
PASSES = 5


def timed_pairs(alloc_free, n):
    alloc_free()  # warm: the block is cached from here on
    out = []
    for _ in range(PASSES):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            alloc_free()
        out.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(out)


def pipeline(torch, batch=64 << 20, batches=48):
    dev = torch.empty(batch, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    res = {}
    for kind in ("pin_per_batch", "one_buffer"):
        keep = torch.empty(batch, dtype=torch.uint8, pin_memory=True) if kind == "one_buffer" else None
        for rep in range(2):  # the first round warms the cache
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(batches):
                h = keep if keep is not None else torch.empty(batch, dtype=torch.uint8, pin_memory=True)
                with torch.cuda.stream(side):
                    dev.copy_(h, non_blocking=True)
                del h
            torch.cuda.synchronize()
            res[kind] = round(batch * batches / (time.perf_counter() - t0) / 1e9, 2)
    return res


def child(mode):
    import torch

    if mode in ("cachalot", "cachalot_c"):
        import cachalot.torch

        cachalot.torch.install(route="backend")
    torch.cuda.init()
    rows = {}
    if mode == "cudart":
        cudart = ctypes.CDLL("libcudart.so")
        p = ctypes.c_void_p()

        def bare(size):
            def af():
                assert cudart.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(size), 0) == 0
                assert cudart.cudaFreeHost(p) == 0
            return af

        for size in SIZES:
            rows[str(size)] = timed_pairs(bare(size), 5)
        return {"pair": rows}
    if mode == "cachalot_c":
        import cachalot.torch as ct

        lib, a = ct._library(), ctypes.c_void_p(ct._allocator())
        p = ctypes.c_void_p()

        def direct(size):
            def af():
                assert lib.cachalot_host_malloc(a, ctypes.c_size_t(size), ctypes.byref(p)) == 0
                assert lib.cachalot_host_free(a, p) == 0
            return af

        for size in SIZES:
            rows[str(size)] = timed_pairs(direct(size), 2000)
        return {"pair": rows}

    def via_torch(size):
        def af():
            t = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            del t
        return af

    for size in SIZES:
        rows[str(size)] = timed_pairs(via_torch(size), 2000)
    out = {"pair": rows, "pipeline": pipeline(torch)}
    st = torch.cuda.host_memory_stats()
    out["num_host_alloc"] = st.get("num_host_alloc")
    return out


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
        return 0
    results = {}
    for mode in ("native", "cachalot", "cachalot_c", "cudart"):
        p = subprocess.run([sys.executable, HERE, "--child", mode], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            print("FAIL %s: %s" % (mode, (p.stdout + p.stderr)[-2000:]))
            return 1
        results[mode] = json.loads(p.stdout.strip().splitlines()[-1])
    names = {"native": "PyTorch's caching host allocator (torch.empty pin_memory)",
             "cachalot": "cachalot's host cache through PyTorch (torch.empty pin_memory)",
             "cachalot_c": "cachalot_host_malloc / cachalot_host_free",
             "cudart": "cudaHostAlloc / cudaFreeHost"}
    print("ns per alloc+free pair of a pinned block (median of %d passes)" % PASSES)
    print("%-62s" % "" + "".join("%12s" % ("%d KiB" % (s >> 10) if s < 1 << 20 else "%d MiB" % (s >> 20))
                                 for s in SIZES))
    for mode, name in names.items():
        print("%-62s" % name + "".join("%12.0f" % results[mode]["pair"][str(s)] for s in SIZES))
    print("H2D pipeline, 64 MiB batches, GB/s: pinned per batch and freed at once / one buffer kept")
    for mode in ("native", "cachalot"):
        pl = results[mode]["pipeline"]
        print("  %-60s %6.2f / %6.2f  (pinnings: %s)" % (names[mode], pl["pin_per_batch"], pl["one_buffer"],
                                                         results[mode]["num_host_alloc"]))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
