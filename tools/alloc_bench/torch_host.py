#!/usr/bin/env python3
"""alloc_bench's PyTorch rows (docs/benchmarks.md): PyTorch's caching host allocator, the allocator that
pin_memory=True uses (the host workload), and its CUDA caching allocator (the device workloads), on the
sequence alloc_bench sends. alloc_bench runs this script; its loops are C++ in cachalot's PyTorch backend
library (src/torch/bench.cpp, reached with ctypes), so that the time is the allocator's alone, not Python's
or a tensor's. The rows need the cachalot package installed with its backend, against this torch; nothing
here makes cachalot PyTorch's allocator.

usage: torch_host.py probe   prints "ok TORCH_VERSION" when the row can run here, else "no REASON"
       torch_host.py serve   alloc_bench's child: one command a line on stdin, one reply a line on stdout
                             (alloc_torch.c describes the protocol)
"""
import ctypes
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))


def one_line(text, limit=300):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load():
    """torch, with CUDA initialised, and the loop's extension; raises RuntimeError saying why the row
    cannot run here."""
    warnings.filterwarnings("ignore")  # an import's warnings would land in the middle of alloc_bench's table
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(f"python3 has no torch ({one_line(e)})") from e
    if not torch.cuda.is_available():
        raise RuntimeError(f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)")
    torch.cuda.init()
    try:
        import cachalot
        import cachalot.torch as ct
    except ImportError as e:
        raise RuntimeError(f"the cachalot package is not installed ({one_line(e)})") from e
    why = ct.backend_unavailable()
    if why:
        raise RuntimeError(f"cachalot's PyTorch backend cannot be used: {why}")
    ext = Loop(ctypes.CDLL(cachalot.library_path("cachalot_torch_backend")))
    return torch, ext


class Loop:
    """The timed loop of src/torch/bench.cpp."""

    def __init__(self, lib):
        self.lib = lib
        lib.cachalot_torch_bench_host_load.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
                                                       ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
        lib.cachalot_torch_bench_host_run.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, ctypes.c_size_t]
        lib.cachalot_torch_bench_host_run.restype = ctypes.c_int64
        i64p = ctypes.POINTER(ctypes.c_int64)
        lib.cachalot_torch_bench_device_load.argtypes = [i64p, i64p, i64p, i64p, ctypes.c_size_t, ctypes.c_int64,
                                                         ctypes.c_char_p, ctypes.c_size_t]
        lib.cachalot_torch_bench_device_run.argtypes = [i64p, ctypes.c_char_p, ctypes.c_size_t]
        lib.cachalot_torch_bench_device_run.restype = ctypes.c_int64
        self.err = ctypes.create_string_buffer(1024)

    def load(self, sizes, slots):
        n = len(sizes)
        arr = ctypes.c_int64 * n
        if self.lib.cachalot_torch_bench_host_load(arr(*sizes), arr(*slots), n, self.err, len(self.err)) != 0:
            raise RuntimeError(self.err.value.decode())

    def timed(self, loop):
        """One pass of a loop of bench.cpp: the reply to a pass command, 'ok NS' or 'error DONE MESSAGE'."""
        done = ctypes.c_int64()
        ns = loop(ctypes.byref(done), self.err, len(self.err))
        return f"ok {ns}" if ns >= 0 else f"error {done.value} {one_line(self.err.value.decode())}"

    def run(self):
        return self.timed(self.lib.cachalot_torch_bench_host_run)

    def release(self):
        self.lib.cachalot_torch_bench_host_release()
        self.lib.cachalot_torch_bench_device_release()

    def device_load(self, cols, n_streams):
        n = len(cols[0])
        arr = ctypes.c_int64 * n
        if self.lib.cachalot_torch_bench_device_load(*(arr(*c) for c in cols), n, n_streams, self.err,
                                                     len(self.err)) != 0:
            raise RuntimeError(self.err.value.decode())

    def device_run(self):
        return self.timed(self.lib.cachalot_torch_bench_device_run)


def host_stats(torch):
    """(pinned bytes: peak, now; handed-out bytes: peak, now; pinnings) from torch.cuda.host_memory_stats(),
    -1 for what this torch does not say. Its names changed: later torch says allocated_bytes for the
    pinned blocks (cached or handed out) and active_bytes for those handed out, as cachalot does; earlier
    torch said reserved_bytes and allocated_bytes."""
    get = getattr(torch.cuda, "host_memory_stats", None)
    try:
        st = get() if get is not None else {}
    except Exception:  # noqa: BLE001 - a torch whose host allocator keeps no stats
        st = {}
    pinned, handed = ("allocated_bytes", "active_bytes") if "active_bytes.peak" in st else \
        ("reserved_bytes", "allocated_bytes")
    return (st.get(pinned + ".peak", -1), st.get(pinned + ".current", -1), st.get(handed + ".peak", -1),
            st.get(handed + ".current", -1), st.get("num_host_alloc", -1))


def stats_reply(torch):
    """The 'stats' reply, asked once everything was freed. torch 2.11.0 lowers its handed-out figures
    where a block's events complete, and a block freed without events (no record_event, as here) has
    none: they only grow (after 6000 pairs, 6000 blocks "handed out" and a peak of the 6000 sizes summed).
    A handed-out figure that is not 0 now is such a count, so its peak is reported as unknown."""
    pinned, _, handed, handed_now, pinnings = host_stats(torch)
    return f"stats {pinned} {handed if handed_now == 0 else -1} {pinnings}"


def check_reply(torch):
    """The 'check' reply: every block came back to the cache, so that emptying it leaves nothing pinned.
    (The handed-out figures cannot say so: stats_reply says why.)"""
    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is None:
        return "ok"  # a torch that cannot empty its host cache from Python: nothing to check with
    empty()
    pinned_now = host_stats(torch)[1]
    if pinned_now > 0:
        return f"error everything was freed, yet {pinned_now} pinned bytes stay after emptying the host cache"
    return "ok"


def device_stats_reply(torch):
    """The 'dstats' reply: the CUDA caching allocator's reserved and allocated peaks and its cudaMalloc
    calls (-1 for what this torch does not say)."""
    st = torch.cuda.memory_stats()
    return (f"stats {st.get('reserved_bytes.all.peak', -1)} {st.get('allocated_bytes.all.peak', -1)} "
            f"{st.get('num_device_alloc', -1)}")


def device_check_reply(torch):
    """The 'dcheck' reply: with everything freed, emptying the cache leaves nothing allocated or reserved."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    if allocated or reserved:
        return f"error everything was freed, yet {allocated} bytes stay allocated and {reserved} reserved"
    return "ok"


def history(torch, mode):
    """History as the history rows ask: off, on without stacks (context None), or with Python stacks."""
    record = torch.cuda.memory._record_memory_history
    if mode == "off":
        record(enabled=None)
    elif mode == "plain":
        record(enabled="all", context=None, max_entries=100000)
    elif mode == "stacks":
        record(enabled="all", context="all", stacks="python", max_entries=100000)
    else:
        raise RuntimeError(f"unknown history mode {mode!r}")


def probe():
    try:
        torch, ext = load()
        ext.load([4096, 0], [0, 0])  # one pinned block, so that a pinning that fails says so now
        result = ext.run()
        if not result.startswith("ok "):
            raise RuntimeError(f"a 4 KiB pinned allocation failed: {result.split(' ', 2)[2]}")
    except Exception as e:  # noqa: BLE001
        print("no " + one_line(e), flush=True)
        return 0
    print("ok " + torch.__version__, flush=True)
    return 0


def serve():
    def reply(text):
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    try:
        torch, ext = load()
    except Exception as e:  # noqa: BLE001
        reply("error " + one_line(e))
        return 1
    reply("ready " + torch.__version__)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "ops":
            n = int(words[1])
            sizes, slots = [0] * n, [0] * n
            for i in range(n):
                size, slot = sys.stdin.readline().split()
                sizes[i], slots[i] = int(size), int(slot)
            ext.load(sizes, slots)
            reply("loaded")
        elif words[0] == "pass":
            reply(ext.run())
        elif words[0] == "stats":
            reply(stats_reply(torch))
        elif words[0] == "check":
            reply(check_reply(torch))
        elif words[0] == "dops":
            n, n_streams = int(words[1]), int(words[2])
            cols = [[0] * n for _ in range(4)]
            for i in range(n):
                for c, v in zip(cols, sys.stdin.readline().split()):
                    c[i] = int(v)
            try:
                ext.device_load(cols, n_streams)
                reply("loaded")
            except Exception as e:  # noqa: BLE001
                reply("error " + one_line(e))
        elif words[0] == "dpass":
            reply(ext.device_run())
        elif words[0] == "dstats":
            reply(device_stats_reply(torch))
        elif words[0] == "dcheck":
            reply(device_check_reply(torch))
        elif words[0] == "history" and len(words) == 2:
            try:
                history(torch, words[1])
                reply("ok")
            except Exception as e:  # noqa: BLE001
                reply("error " + one_line(e))
        else:
            reply(f"error unknown command {words[0]!r}")
    ext.release()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("probe", "serve"):
        sys.exit(__doc__)
    sys.exit(probe() if sys.argv[1] == "probe" else serve())
