#!/usr/bin/env python3
"""PyTorch's memory viewer must accept cachalot's snapshots: make one (CUDA backend when a GPU answers,
else the simulated device) with memory history, a pending free and a private pool, load the JSON, pickle
it, and render it with `python3 -m torch.cuda._memory_viz trace_plot` and `segment_plot`. Then the
same with the pickle that `alloc_snapshot convert snapshot.json` writes (no Python pickling), and a
pickle that torch itself wrote (`torch.cuda.memory._dump_snapshot`) converted back to JSON by
`alloc_snapshot convert` and read by `alloc_snapshot show`.

usage: torch_viz_check.py LIBCACHALOT.so OUTDIR ALLOC_SNAPSHOT
"""
import ctypes as C
import json
import os
import pickle
import subprocess
import sys

FILTER = C.CFUNCTYPE(C.c_bool, C.c_void_p, C.c_void_p)


class MempoolId(C.Structure):
    _fields_ = [("first", C.c_uint64), ("second", C.c_uint64)]


def main():
    lib_path, out, tool = os.path.abspath(sys.argv[1]), sys.argv[2], os.path.abspath(sys.argv[3])
    os.makedirs(out, exist_ok=True)
    lib = C.CDLL(lib_path)
    lib.cachalot_last_error.restype = C.c_char_p
    lib.cachalot_malloc.argtypes = [C.c_void_p, C.c_int, C.c_size_t, C.c_void_p, C.POINTER(C.c_void_p)]
    lib.cachalot_free.argtypes = [C.c_void_p, C.c_void_p]
    lib.cachalot_record_stream.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p]
    lib.cachalot_graph_pool_handle.restype = MempoolId
    lib.cachalot_begin_allocate_to_pool.argtypes = [C.c_void_p, C.c_int, MempoolId, FILTER, C.c_void_p]
    lib.cachalot_end_allocate_to_pool.argtypes = [C.c_void_p, C.c_int, MempoolId]
    lib.cachalot_record_history.argtypes = [C.c_void_p, C.c_bool, C.c_size_t]
    lib.cachalot_snapshot_json.argtypes = [C.c_void_p, C.POINTER(C.c_void_p)]
    backend, alloc = C.c_void_p(), C.c_void_p()
    kind = "cuda"
    if lib.cachalot_backend_cuda(C.byref(backend)) != 0:
        kind = "sim"
        assert lib.cachalot_backend_sim(None, C.byref(backend)) == 0
    assert lib.cachalot_create(backend, b"", C.byref(alloc)) == 0, lib.cachalot_last_error()
    lib.cachalot_record_history_stacks.argtypes = [C.c_void_p, C.c_bool]
    lib.cachalot_annotate.argtypes = [C.c_void_p, C.c_int, C.c_char_p]
    assert lib.cachalot_record_history_stacks(alloc, True) == 0
    assert lib.cachalot_record_history(alloc, True, 10000) == 0
    assert lib.cachalot_annotate(alloc, 0, b"phase: warm-up") == 0, lib.cachalot_last_error()
    side = C.c_void_p()
    if kind == "cuda":
        cudart = C.CDLL("libcudart.so")
        assert cudart.cudaStreamCreate(C.byref(side)) == 0
    else:
        assert lib.cachalot_sim_stream_create(backend, 0, C.byref(side)) == 0
    ptrs = []
    for size in [1, 4096, 1 << 20, (1 << 20) + 1, 5 << 20, 12 << 20, 64 << 20]:
        p = C.c_void_p()
        assert lib.cachalot_malloc(alloc, 0, size, None, C.byref(p)) == 0, lib.cachalot_last_error()
        ptrs.append(p)
    for p in ptrs[1::2]:
        assert lib.cachalot_free(alloc, p) == 0
    # a pending free: used by another stream, whose work is not known to be done
    assert lib.cachalot_record_stream(alloc, ptrs[0], side) == 0
    assert lib.cachalot_free(alloc, ptrs[0]) == 0
    pool = lib.cachalot_graph_pool_handle(alloc)
    everything = FILTER(lambda s, ctx: True)
    assert lib.cachalot_begin_allocate_to_pool(alloc, 0, pool, everything, None) == 0
    q = C.c_void_p()
    assert lib.cachalot_malloc(alloc, 0, 3 << 20, None, C.byref(q)) == 0
    assert lib.cachalot_end_allocate_to_pool(alloc, 0, pool) == 0
    text = C.c_void_p()
    assert lib.cachalot_snapshot_json(alloc, C.byref(text)) == 0
    snap = json.loads(C.string_at(text).decode())
    C.CDLL(None).free(text)
    states = sorted({b["state"] for s in snap["segments"] for b in s["blocks"]})
    pools = sorted({tuple(s["segment_pool_id"]) for s in snap["segments"]})
    print(f"{kind}: {len(snap['segments'])} segments, states {states}, pools {pools}, "
          f"{len(snap['device_traces'][0])} trace entries")
    with open(os.path.join(out, "snapshot.json"), "w") as f:
        json.dump(snap, f)
    with open(os.path.join(out, "snapshot.pickle"), "wb") as f:
        pickle.dump(snap, f)
    checks = []

    def check(what, ok, detail=""):
        checks.append(ok)
        print(f"  {what}: {'ok' if ok else 'FAILED'} {detail}".rstrip())

    def run(args):
        return subprocess.run(args, capture_output=True, text=True)

    # C stacks were on: live blocks carry their alloc's frames, and the annotation is a user_defined entry.
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    check("every live block carries frames", bool(live) and all(b["frames"] for b in live),
          f"({sum(1 for b in live if b['frames'])} of {len(live)})")
    notes = [e for e in snap["device_traces"][0] if e["action"] == "user_defined"]
    check("cachalot_annotate's user_defined entry", [e.get("name") for e in notes] == ["phase: warm-up"])
    print("  first frame of a live block:", live[0]["frames"][0] if live and live[0]["frames"] else None)
    # Python's pickle of the JSON, then alloc_snapshot's own pickle of the same file.
    converted = os.path.join(out, "converted.pickle")
    r = run([tool, "convert", os.path.join(out, "snapshot.json"), converted])
    check("alloc_snapshot convert snapshot.json converted.pickle", r.returncode == 0 and os.path.exists(converted),
          f"(exit {r.returncode}) {r.stderr.strip()[-300:]}")
    if os.path.exists(converted):
        with open(converted, "rb") as f:
            check("pickle.load(converted.pickle) == the snapshot", pickle.load(f) == snap)
    for source in ("snapshot.pickle", "converted.pickle"):
        for plot in ("trace_plot", "segment_plot"):
            html = os.path.join(out, f"{source.split('.')[0]}_{plot}.html")
            r = run([sys.executable, "-m", "torch.cuda._memory_viz", plot, os.path.join(out, source), "-o", html])
            ok = r.returncode == 0 and os.path.exists(html) and os.path.getsize(html) > 1000
            check(f"_memory_viz {plot} {source}", ok, f"(exit {r.returncode}, "
                  f"{os.path.getsize(html) if os.path.exists(html) else 0} bytes) {r.stderr.strip()[-300:]}")
    # A pickle torch wrote itself, from its own allocator (needs a GPU), back to JSON for alloc_snapshot.
    try:
        import torch
        have_gpu = torch.cuda.is_available()
    except ImportError:
        have_gpu = False
    if have_gpu:
        torch.cuda.memory._record_memory_history(max_entries=10000, stacks="python")
        xs = [torch.empty(n, device="cuda") for n in (1, 1000, 1 << 20, 3 << 20)]
        del xs[1]
        torch_pickle = os.path.join(out, "torch_dump.pickle")
        torch.cuda.memory._dump_snapshot(torch_pickle)
        torch.cuda.memory._record_memory_history(enabled=None)
        torch_json = os.path.join(out, "torch_dump.json")
        r = run([tool, "convert", torch_pickle, torch_json])
        check("alloc_snapshot convert torch_dump.pickle torch_dump.json", r.returncode == 0,
              f"(exit {r.returncode}) {r.stderr.strip()[-300:]}")
        r = run([tool, "show", torch_json])
        check("alloc_snapshot show torch_dump.json", r.returncode == 0 and "device" in r.stdout,
              f"(exit {r.returncode}) {(r.stdout + r.stderr).strip()[-300:]}")
        r = run([tool, "show", torch_pickle])
        check("alloc_snapshot show torch_dump.pickle", r.returncode == 0 and "device" in r.stdout,
              f"(exit {r.returncode}) {(r.stdout + r.stderr).strip()[-300:]}")
        page = os.path.join(out, "torch_dump_explorer.html")
        r = run([tool, "plot", torch_pickle, "-o", page])
        check("alloc_snapshot plot torch_dump.pickle (the explorer)", r.returncode == 0 and os.path.exists(page)
              and os.path.getsize(page) > 1000, f"(exit {r.returncode}) {r.stderr.strip()[-300:]}")
        del xs
    else:
        check("torch with a GPU, for a pickle torch writes itself", False, "(torch or its GPU is missing)")
    failed = checks.count(False)
    print(f"{len(checks) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
