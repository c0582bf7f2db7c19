"""Two-process data-parallel training (torch.distributed, DistributedDataParallel) with cachalot's
PyTorch backend (the installed package, cachalot.torch.install()), against the same run on PyTorch's
native allocator: the losses and final weights must be bit-identical.

    python3 tests/gpu/torch_ddp_test.py BUILD_DIR [STEPS]

With 2 GPUs or more: NCCL, one process per GPU. With one GPU: gloo, both processes on GPU 0 (DDP's
buckets, hooks and copies through the backend; NCCL itself needs a GPU per rank). DDP_BACKEND=nccl asks
for NCCL only (exit 77 with fewer than 2 GPUs).

Prints each run's per-step losses digest, rank 0's memory figures side by side, and 'N passed, N failed'.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

KEYS = ["allocated_bytes.all.peak", "reserved_bytes.all.peak", "allocation.all.allocated", "num_device_alloc"]


def worker(rank, world, mode, lib, steps, port, outdir, backend):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if mode == "cachalot":
        import cachalot.torch as cachalot_torch

        cachalot_torch.install(route="backend")
    from torch_plugin_test import deterministic, memory_stats, model, train

    torch = deterministic()
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = rank if backend == "nccl" else 0
    torch.cuda.set_device(dev)
    if backend == "nccl":
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", dev))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)  # the same initial weights on both ranks
    net = DDP(model(torch), device_ids=[dev])
    g = torch.Generator(device="cuda").manual_seed(100 + rank)  # each rank its own data
    losses = train(torch, net, g, steps)
    params = [p.detach().double().sum().item().hex() for p in net.parameters()]
    with open(os.path.join(outdir, "rank%d.json" % rank), "w") as f:
        json.dump({"losses": losses, "params": params, "stats": memory_stats(torch, mode, dev, KEYS)}, f)
    dist.destroy_process_group()


def run(mode, lib, steps, backend):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(2, mode, lib, steps, port, d, backend), nprocs=2, join=True)
        ranks = [json.load(open(os.path.join(d, "rank%d.json" % r))) for r in range(2)]
    print(json.dumps(ranks))


def child(mode, lib, steps, backend):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "run", mode, lib, str(steps), backend],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("%s run failed:\n%s%s" % (mode, out.stdout, out.stderr[-4000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    import torch

    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    if os.environ.get("DDP_BACKEND") == "nccl" and backend != "nccl":
        print("SKIP: %d GPU(s); NCCL needs 2" % torch.cuda.device_count())
        return 77
    print("DDP over %s: %s" % (backend, "one process per GPU" if backend == "nccl" else "2 processes on GPU 0"))
    lib = os.path.abspath(os.path.join(sys.argv[1], "libcachalot_torch.so"))
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    native = child("native", lib, steps, backend)
    mine = child("cachalot", lib, steps, backend)
    passed = failed = 0
    for r in range(2):
        same = native[r]["losses"] == mine[r]["losses"] and native[r]["params"] == mine[r]["params"]
        print("%s rank %d: %d steps, losses and final weights %s (last loss %s)" % (
            "PASS" if same else "FAIL", r, steps, "bit-identical" if same else "DIFFER",
            float.fromhex(mine[r]["losses"][-1])))
        passed += same
        failed += not same
        print("  %-28s %16s %16s" % ("stat (rank %d)" % r, "native", "cachalot"))
        for k in KEYS:
            print("  %-28s %16s %16s" % (k, native[r]["stats"][k], mine[r]["stats"][k]))
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        sys.exit(main())
