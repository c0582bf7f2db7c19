"""What preset:low_fragmentation costs a PyTorch program (issue 20): the same GPU runs with PyTorch's native
allocator, cachalot's defaults and cachalot's preset, side by side, each in a fresh process.

    python3 tests/gpu/torch_step_time.py [ROUNDS] [WORKLOAD,...]   (the cachalot package installed)

Workloads:
  lm_train      tests/gpu/record_traces.py's GPT-2-small-shaped language model training (fixed shapes): the
                median step time of 30 steps after 5 warm-up steps
  moe_train     tests/gpu/record_traces.py's mixture-of-experts training (token counts vary every step)
  seg_multires  record_traces.py's segmentation training at a resolution drawn every step
  var_inference record_traces.py's transformer inference on batches of random shape
The record_traces workloads run twice in one process: the first run (the allocator warms up: every map
and unmap of the preset happens there) and the second (the cache is warm) are timed on their own.
Each (workload, allocator) runs ROUNDS times (default 2), the allocators interleaved, so that a drift of
the machine shows as a spread rather than as a difference. One JSON line per run, then a table of medians.
"""
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = [("native", None), ("cachalot", ""), ("cachalot preset", "preset:low_fragmentation")]


def child(name, conf):
    if conf is not None:
        import cachalot.torch

        cachalot.torch.install(conf, route="backend")
    import torch

    sys.path.insert(0, HERE)
    import record_traces

    torch.manual_seed(0)
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    timed = {}
    if name == "lm_train":
        steps = []
        record_traces.lm_train(torch, 35, steps)
        timed["step_ms"] = statistics.median(steps[5:]) * 1e3
    else:
        for run in ("first_s", "second_s"):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            record_traces.WORKLOADS[name](torch)
            torch.cuda.synchronize()
            timed[run] = time.perf_counter() - t0
    st = torch.cuda.memory_stats()
    timed["reserved_peak_mb"] = st["reserved_bytes.all.peak"] / 2**20
    timed["requested_peak_mb"] = st["requested_bytes.all.peak"] / 2**20
    print(json.dumps(timed))


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["lm_train", "moe_train", "seg_multires",
                                                              "var_inference"]
    results, failed = {}, 0
    for name in names:
        for r in range(rounds):
            for label, conf in CONFIGS:
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "child", name,
                                    "" if conf is None else "conf=" + conf], capture_output=True, text=True)
                if p.returncode != 0:
                    print("FAIL %s %s:\n%s" % (name, label, p.stderr[-2000:]), flush=True)
                    failed += 1
                    continue
                res = json.loads(p.stdout.strip().splitlines()[-1])
                print(json.dumps({"workload": name, "allocator": label, "round": r, **res}), flush=True)
                results.setdefault((name, label), []).append(res)
    print("%-14s %-16s %10s %10s %10s %10s %8s" % ("workload", "allocator", "step ms", "1st run s", "2nd run s",
                                                   "reserved", "ratio"))
    for name in names:
        for label, _ in CONFIGS:
            rs = results.get((name, label))
            if not rs:
                continue

            def med(k):
                v = [x[k] for x in rs if k in x]
                return "%.3f" % statistics.median(v) if v else "-"

            res_mb = statistics.median(x["reserved_peak_mb"] for x in rs)
            req_mb = statistics.median(x["requested_peak_mb"] for x in rs)
            print("%-14s %-16s %10s %10s %10s %8.0f MB %8.3f" % (name, label, med("step_ms"), med("first_s"),
                                                                  med("second_s"), res_mb, res_mb / req_mb))
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        arg = sys.argv[3]
        child(sys.argv[2], arg[len("conf="):] if arg.startswith("conf=") else None)
    else:
        sys.exit(main())
