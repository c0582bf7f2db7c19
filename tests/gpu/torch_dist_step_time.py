"""Step time through PyTorch, cachalot's backend against PyTorch's native allocator (issue 31): data parallel
training on two GPUs over NCCL, DDP and FSDP2, and a loop that prefetches its next batch on a side stream
and hands it over with record_stream. Every run is a fresh process (two, one per GPU, for DDP and FSDP2);
the allocators alternate run by run, so that a drift of the shared machine shows as a spread, not as a
difference.

    python3 tests/gpu/torch_dist_step_time.py [ROUNDS] [WORKLOAD,...]   (the cachalot package installed)

Workloads (default all; ddp and fsdp2 need 2 GPUs and are skipped with fewer):
  ddp       a GPT-2-small-shaped transformer (12 layers, d=768, sequence 512, batch 8 per rank, bf16
            autocast) under DistributedDataParallel
  fsdp2     the same model under FSDP2 (torch.distributed.fsdp.fully_shard per layer, then the whole model)
  prefetch  one GPU: a 4-layer MLP trained on batches that a side stream copies from pinned host memory;
            each batch is record_stream'd onto the compute stream and freed there (the data-prefetcher
            pattern: every free waits for an event)
A run times STEPS steps after WARMUP (rank 0's median step, torch.cuda.synchronize() around each step).
Prints one JSON line per run, then per workload the median and the spread (min-max) of each allocator's
run medians, and cachalot / native.
"""
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

STEPS, WARMUP = 30, 5


def install(mode):
    if mode == "cachalot":
        import cachalot.torch

        cachalot.torch.install(route="backend")


def gpt(torch, layers=12, d=768, heads=12, vocab=50304):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=False, is_causal=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.emb(idx)
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    return GPT()


def timed_steps(torch, step):
    times = []
    for i in range(WARMUP + STEPS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(i)
        torch.cuda.synchronize()
        if i >= WARMUP:
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def dist_worker(rank, world, mode, kind, port, outdir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    install(mode)
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    torch.manual_seed(0)
    net = gpt(torch).cuda()
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(net, device_ids=[rank])
    else:
        from torch.distributed.fsdp import fully_shard

        for b in net.blocks:
            fully_shard(b)
        fully_shard(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    g = torch.Generator(device="cuda").manual_seed(100 + rank)

    def step(_):
        idx = torch.randint(0, 50304, (8, 512), device="cuda", generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(net(idx).flatten(0, 1).float(), idx.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = timed_steps(torch, step)
    if rank == 0:
        st = torch.cuda.memory_stats()
        with open(os.path.join(outdir, "rank0.json"), "w") as f:
            json.dump({"times": times, "peak_reserved": st.get("reserved_bytes.all.peak", -1),
                       "peak_allocated": st.get("allocated_bytes.all.peak", -1)}, f)
    dist.destroy_process_group()


def run_dist(mode, kind):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(dist_worker, args=(2, mode, kind, port, d), nprocs=2, join=True)
        return json.load(open(os.path.join(d, "rank0.json")))


def run_prefetch(mode):
    install(mode)
    import torch

    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                        nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    side = torch.cuda.Stream()
    host = [torch.randn(512, 4096).pin_memory() for _ in range(4)]
    state = {}

    def fetch(i):
        with torch.cuda.stream(side):
            state["next"] = host[i % len(host)].to("cuda", non_blocking=True)

    def step(i):
        torch.cuda.current_stream().wait_stream(side)
        x = state.pop("next")
        x.record_stream(torch.cuda.current_stream())
        fetch(i + 1)  # the next batch copies while this one computes
        # many small temporaries on the compute stream, as a real step has, while the batch's free waits
        loss = sum(net(x[k * 64:(k + 1) * 64]).square().mean() for k in range(8))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x

    fetch(0)
    times = timed_steps(torch, step)
    st = torch.cuda.memory_stats()
    return {"times": times, "peak_reserved": st.get("reserved_bytes.all.peak", -1),
            "peak_allocated": st.get("allocated_bytes.all.peak", -1)}


def child(kind, mode):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "run", kind, mode], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError("%s on %s failed:\n%s%s" % (kind, mode, out.stdout[-2000:], out.stderr[-4000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    import torch

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    kinds = sys.argv[2].split(",") if len(sys.argv) > 2 else ["ddp", "fsdp2", "prefetch"]
    gpus = torch.cuda.device_count()
    print("torch %s, %d GPU(s): %s" % (torch.__version__, gpus, torch.cuda.get_device_name(0)), flush=True)
    results = {}
    for kind in kinds:
        if kind in ("ddp", "fsdp2") and gpus < 2:
            print("%s: skipped: %d GPU(s), NCCL needs 2" % (kind, gpus))
            continue
        for r in range(rounds):
            for mode in (("native", "cachalot") if r % 2 == 0 else ("cachalot", "native")):
                res = child(kind, mode)
                med = statistics.median(res["times"])
                results.setdefault(kind, {}).setdefault(mode, []).append(med)
                print(json.dumps({"workload": kind, "allocator": mode, "round": r, "median_ms": round(med, 3),
                                  "peak_reserved": res["peak_reserved"], "peak_allocated": res["peak_allocated"]}),
                      flush=True)
    print("\n%-9s %-9s %6s %10s %18s %9s" % ("workload", "allocator", "runs", "median ms", "spread (min-max)",
                                              "/ native"))
    for kind, by in results.items():
        base = statistics.median(by["native"])
        for mode in ("native", "cachalot"):
            v = by[mode]
            print("%-9s %-9s %6d %10.3f %8.3f-%-9.3f %9.3f" % (kind, mode, len(v), statistics.median(v), min(v), max(v),
                                                            statistics.median(v) / base))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        kind, mode = sys.argv[2], sys.argv[3]
        print(json.dumps(run_prefetch(mode) if kind == "prefetch" else run_dist(mode, kind)))
    else:
        sys.exit(main())
