"""What preset:low_fragmentation costs a PyTorch program (issues 20 and 33): the same GPU runs with PyTorch's
native allocator, cachalot's defaults and cachalot's preset, side by side, each in a fresh process.

    python3 tests/gpu/torch_step_time.py [ROUNDS] [WORKLOAD,...] [ALLOCATOR,...]   (the cachalot package
    installed; ALLOCATOR is native, cachalot or preset, all three by default)

Workloads: every one of tests/gpu/record_traces.py (its docstring says what each runs).
  lm_train, gpt_train, cnn_train   fixed-shape training: the median step time of 30 steps after 5 warm-up
                steps (a step plan forms in the warm-up), and the driver calls (maps, unmaps, cudaMalloc,
                cudaFree) of those 30 steps
  the others    shapes that change every step: the workload runs twice in one process, the first run (the
                allocator warms up: most maps and unmaps of the preset happen there) and the second (the
                cache is warm) timed on their own, each with its driver calls
Each (workload, allocator) runs ROUNDS times (default 2), the allocators interleaved, so that a drift of
the machine shows as a spread rather than as a difference. One JSON line per run, then a table of medians,
then each workload's preset against cachalot's defaults: the median of the per-round ratios and their
range.
"""
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = [("native", None), ("cachalot", ""), ("preset", "preset:low_fragmentation")]


def driver_calls(torch):
    st = torch.cuda.memory_stats()
    return st.get("num_device_alloc", 0) + st.get("num_device_free", 0)


class StepLog(list):
    """Step times that also note the driver calls made so far at the end of each step."""

    def __init__(self, torch):
        super().__init__()
        self.torch, self.calls = torch, []

    def append(self, t):
        super().append(t)
        self.calls.append(driver_calls(self.torch))


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
    if name in record_traces.STEPPED:
        steps = StepLog(torch)
        record_traces.WORKLOADS[name](torch, 35, steps)
        timed["step_ms"] = statistics.median(steps[5:]) * 1e3
        timed["calls_per_step"] = (steps.calls[-1] - steps.calls[4]) / (len(steps) - 5)
    else:
        for run in ("first", "second"):
            torch.cuda.synchronize()
            calls = driver_calls(torch)
            t0 = time.perf_counter()
            record_traces.WORKLOADS[name](torch)
            torch.cuda.synchronize()
            timed[run + "_s"] = time.perf_counter() - t0
            timed[run + "_calls"] = driver_calls(torch) - calls
    st = torch.cuda.memory_stats()
    timed["reserved_peak_mb"] = st["reserved_bytes.all.peak"] / 2**20
    timed["requested_peak_mb"] = st["requested_bytes.all.peak"] / 2**20
    print(json.dumps(timed))


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["lm_train", "moe_train", "seg_multires",
                                                              "var_inference"]
    labels = sys.argv[3].split(",") if len(sys.argv) > 3 else [c[0] for c in CONFIGS]
    configs = [c for c in CONFIGS if c[0] in labels]
    results, failed = {}, 0
    for name in names:
        for r in range(rounds):
            for label, conf in configs:
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "child", name,
                                    "" if conf is None else "conf=" + conf], capture_output=True, text=True)
                if p.returncode != 0:
                    print("FAIL %s %s:\n%s" % (name, label, p.stderr[-2000:]), flush=True)
                    failed += 1
                    continue
                res = json.loads(p.stdout.strip().splitlines()[-1])
                print(json.dumps({"workload": name, "allocator": label, "round": r, **res}), flush=True)
                results.setdefault((name, label), []).append(res)
    keys = ("step_ms", "calls_per_step", "first_s", "first_calls", "second_s", "second_calls")
    print("%-18s %-9s" % ("workload", "allocator") + "".join("%13s" % k for k in keys) + "%10s %7s" %
          ("reserved", "ratio"))
    for name in names:
        for label, _ in configs:
            rs = results.get((name, label))
            if not rs:
                continue

            def med(k):
                v = [x[k] for x in rs if k in x]
                return "%.3f" % statistics.median(v) if v else "-"

            res_mb = statistics.median(x["reserved_peak_mb"] for x in rs)
            req_mb = statistics.median(x["requested_peak_mb"] for x in rs)
            print("%-18s %-9s" % (name, label) + "".join("%13s" % med(k) for k in keys) +
                  "%7.0f MB %7.3f" % (res_mb, res_mb / req_mb))
    # the preset against cachalot's defaults, round by round (the rounds ran side by side)
    for name in names:
        base, pre = results.get((name, "cachalot"), []), results.get((name, "preset"), [])
        for k in ("step_ms", "first_s", "second_s"):
            ratios = [p[k] / b[k] for b, p in zip(base, pre) if k in b and k in p]
            if ratios:
                print("%-18s preset/defaults %-9s median %+.1f%% (%+.1f%% .. %+.1f%%) over %d rounds" %
                      (name, k, 100 * (statistics.median(ratios) - 1), 100 * (min(ratios) - 1),
                       100 * (max(ratios) - 1), len(ratios)))
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        arg = sys.argv[3]
        child(sys.argv[2], arg[len("conf="):] if arg.startswith("conf=") else None)
    else:
        sys.exit(main())
