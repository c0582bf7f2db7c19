"""The PyTorch plug-in on a real GPU (issue: using cachalot in real CUDA programs).

    python3 tests/gpu/torch_plugin_test.py BUILD_DIR [STEPS]

1. train: a small CNN trains STEPS steps under deterministic settings, once with PyTorch's native
   allocator and once with cachalot plugged in (each in a fresh process: the allocator is chosen before
   the first CUDA allocation). The losses must be bit-identical; memory figures are printed side by side.
2. graph: with cachalot plugged in, torch.cuda.graph captures a forward pass with temporaries and
   replays it on new inputs; every replay must equal the eager result, tensors allocated after the
   capture must be untouched by replays, and the capture's memory must sit in a private pool of its own
   (capture detection), which release_capture_pools gives up once the graph is gone.
Prints 'N passed, N failed' last; exits non-zero on any failure.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def deterministic():
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True)
    return torch


def model(torch):
    # strided convolutions instead of pooling: the pooling layers' backward passes have no deterministic
    # CUDA implementation
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(32 * 8 * 8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).cuda()


def train(torch, net, g, steps):
    """SGD with momentum on random batches from generator `g`; the per-step losses as exact hex floats."""
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        batch = 32 + 16 * (step % 4)  # sizes that vary, so that blocks are split and reused
        x = torch.randn(batch, 3, 32, 32, device="cuda", generator=g)
        y = torch.randint(0, 10, (batch,), device="cuda", generator=g)
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item().hex())
    torch.cuda.synchronize()
    return losses


def memory_stats(torch, mode, device, keys):
    """The figures `keys` of the allocator in use: cachalot's through the plug-in module, or PyTorch's."""
    if mode == "cachalot":
        import cachalot.torch as cachalot_torch

        st = cachalot_torch.memory_stats(device)
    else:
        st = torch.cuda.memory_stats(device)
    return {k: st.get(k) for k in keys}


def child_train(mode, lib, steps):
    if mode == "cachalot":
        import cachalot.torch as cachalot_torch

        cachalot_torch.install(route="pluggable")
    torch = deterministic()
    losses = train(torch, model(torch), torch.Generator(device="cuda").manual_seed(1), steps)
    keys = ["allocated_bytes.all.peak", "reserved_bytes.all.peak", "requested_bytes.all.peak",
            "allocation.all.allocated", "segment.all.peak", "num_device_alloc"]
    print(json.dumps({"losses": losses, "stats": memory_stats(torch, mode, 0, keys)}))


def child_graph(lib):
    import cachalot.torch as cachalot_torch

    cachalot_torch.install(route="pluggable")
    torch = deterministic()
    net = model(torch).eval()
    static_in = torch.randn(16, 3, 32, 32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():  # warm-up off the capture stream, as PyTorch advises
        for _ in range(3):
            net(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        tmp = net(static_in) * 3.0  # temporaries freed inside the capture, reused by the graph
        static_out = torch.tanh(tmp) + 1.0
    pools = {tuple(s["segment_pool_id"]) for s in cachalot_torch.snapshot()["segments"]}
    private = sorted(p for p in pools if p != (0, 0))
    others = [torch.full((1 << 20,), float(i), device="cuda") for i in range(8)]  # allocated after the capture
    ok = True
    for i in range(5):
        new = torch.randn(16, 3, 32, 32, device="cuda")
        static_in.copy_(new)
        graph.replay()
        with torch.no_grad():
            want = torch.tanh(net(new) * 3.0) + 1.0
        torch.cuda.synchronize()
        ok = ok and torch.equal(static_out, want)
    untouched = all(bool((t == float(i)).all()) for i, t in enumerate(others))
    before = cachalot_torch.memory_stats()["reserved_bytes.all.current"]
    del graph, static_out, tmp, others
    cachalot_torch.release_capture_pools()
    cachalot_torch.empty_cache()
    after = cachalot_torch.memory_stats()["reserved_bytes.all.current"]
    print(json.dumps({"replays_equal": ok, "others_untouched": untouched, "private_pools": private,
                      "reserved_before_release": before, "reserved_after_release": after}))


def run_child(*args):
    out = subprocess.run([sys.executable, os.path.abspath(__file__)] + list(args), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("child %s failed:\n%s%s" % (args, out.stdout, out.stderr))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    build = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    lib = os.path.abspath(os.path.join(build, "libcachalot_torch.so"))
    passed = failed = 0

    def result(name, ok, detail):
        nonlocal passed, failed
        print("%s %s: %s" % ("PASS" if ok else "FAIL", name, detail))
        passed += ok
        failed += not ok

    native = run_child("train", "native", lib, str(steps))
    mine = run_child("train", "cachalot", lib, str(steps))
    same = native["losses"] == mine["losses"]
    first_diff = next((i for i, (a, b) in enumerate(zip(native["losses"], mine["losses"])) if a != b), None)
    result("train", same, "%d steps, losses %s (first %s, last %s)%s" % (
        steps, "bit-identical" if same else "DIFFER", float.fromhex(mine["losses"][0]),
        float.fromhex(mine["losses"][-1]), "" if same else ", first difference at step %d" % first_diff))
    print("  %-28s %16s %16s" % ("stat", "native", "cachalot"))
    for k in native["stats"]:
        print("  %-28s %16s %16s" % (k, native["stats"][k], mine["stats"][k]))

    g = run_child("graph", lib)
    ok = (g["replays_equal"] and g["others_untouched"] and len(g["private_pools"]) >= 1 and
          g["reserved_after_release"] < g["reserved_before_release"])
    result("graph", ok, json.dumps(g))
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "train":
        child_train(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "graph":
        child_graph(sys.argv[2])
    else:
        sys.exit(main())
