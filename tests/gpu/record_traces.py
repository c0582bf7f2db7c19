"""Records PyTorch allocation traces of workloads that fragment memory, for replay benchmarks.

    python3 tests/gpu/record_traces.py OUT_DIR [NAME[:STEPS],...] [native,expandable,async]
    (on a GPU machine with PyTorch; STEPS for the fixed-shape training workloads)

Each workload runs in a fresh process with torch.cuda.memory._record_memory_history, three times: with
PyTorch's native allocator (its trace is saved as OUT_DIR/NAME.snapshot.json.gz, frames removed, the
schema of traces/) and with expandable_segments:True, and the reserved / requested peaks of
each run are printed as one JSON line per workload.

Workloads:
  kv_generate    a small decoder (4 layers, width 512) generating for 16 requests of random prompt
                 (16-640 tokens) and output (16-192 tokens) lengths, batch 1-4, fp16; the KV cache grows
                 by torch.cat every step
  var_inference  a transformer encoder on 80 batches of random shape (1-32 x 16-1024 tokens), fp16
  llm_serving    continuous batching: requests (prompt 16-512, output 16-256 tokens) arrive at random steps
                 and finish at their own lengths; each keeps per-layer KV caches that grow by torch.cat
                 every decode step; the decode step runs the active requests as one batch (4 layers,
                 width 512, fp16)
  moe_train      a mixture-of-experts layer stack (8 experts, top-2 routing with skewed router logits)
                 trained on batches of 256-4096 tokens, so each expert sees a different token count every
                 step (width 512, fp16 autocast, SGD)
  seg_multires   a small convolutional encoder-decoder trained for segmentation on batches of 1-8 images
                 at a resolution picked from 192-768 every step (fp32)
  lm_train       a GPT-2-small-shaped language model (6 layers, width 768, sequence 512, batch 8) trained
                 for 20 steps, fp16 autocast, AdamW: fixed shapes, every step the same allocations
  kv_generate_large   kv_generate at the scale users run: a 1.4 B-parameter decoder (16 layers, width
                 2560, fp16) generating for 8 batches of 8-32 sequences (prompts 128-1024, 16-128 new tokens)
  llm_serving_large   llm_serving at that scale: 40 requests (prompts 256-2048, 16-160 new tokens), at most
                 16 at once, on the same 1.4 B-parameter decoder
  gpt_train, cnn_train   GPT-2 124M and ResNet-50 training (transformers, torchvision), the workloads of the
                 two traces recorded earlier on an H200; here for tests/gpu/torch_step_time.py

Besides the recorded native run and the expandable_segments:True run, each workload runs once more with
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (its reserved peak is the pool's; the workload's shapes
are seeded, so the requested peak is the native run's).
"""
import gzip
import json
import os
import random
import subprocess
import sys


def decoder(torch):
    """The small fp16 decoder of kv_generate and llm_serving (4 layers, width 512, 8 heads), its modules made
    in one order so that a seed gives the same weights."""
    d, heads, layers, vocab = 512, 8, 4, 8192
    emb = torch.nn.Embedding(vocab, d).cuda().half()
    qkv = [torch.nn.Linear(d, 3 * d).cuda().half() for _ in range(layers)]
    out = [torch.nn.Linear(d, d).cuda().half() for _ in range(layers)]
    mlp = [torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)).cuda().half()
           for _ in range(layers)]
    head = torch.nn.Linear(d, vocab).cuda().half()
    return d, heads, d // heads, layers, vocab, emb, qkv, out, mlp, head


def kv_generate(torch):
    d, heads, hd, layers, vocab, emb, qkv, out, mlp, head = decoder(torch)
    rng = random.Random(7)

    def step(x, cache):
        for i in range(layers):
            b, t, _ = x.shape
            q, k, v = qkv[i](x).split(d, dim=-1)
            q = q.view(b, t, heads, hd).transpose(1, 2)
            k = k.view(b, t, heads, hd).transpose(1, 2)
            v = v.view(b, t, heads, hd).transpose(1, 2)
            if cache[i] is not None:  # the cache grows by a new tensor every step
                k = torch.cat([cache[i][0], k], dim=2)
                v = torch.cat([cache[i][1], v], dim=2)
            cache[i] = (k, v)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=cache[i][0].shape[2] == t)
            x = x + out[i](a.transpose(1, 2).reshape(b, t, d))
            x = x + mlp[i](x)
        return head(x[:, -1])

    with torch.no_grad():
        for _ in range(16):
            batch = rng.randint(1, 4)
            prompt = rng.randint(16, 640)
            gen = rng.randint(16, 192)
            cache = [None] * layers
            tok = torch.randint(0, vocab, (batch, prompt), device="cuda")
            logits = step(emb(tok), cache)
            for _ in range(gen):
                tok = logits.argmax(-1, keepdim=True)
                logits = step(emb(tok), cache)
            del cache, logits, tok


def var_inference(torch):
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 6).cuda().half().eval()
    rng = random.Random(11)
    with torch.no_grad():
        for _ in range(80):
            x = torch.randn(rng.randint(1, 32), rng.randint(16, 1024), 768, device="cuda", dtype=torch.half)
            y = enc(x)
            del x, y


def llm_serving(torch):
    d, heads, hd, layers, vocab, emb, qkv, out, mlp, head = decoder(torch)
    rng = random.Random(13)

    def attend(i, x, req):
        """x: (1, t, d) of one request; its cache for layer i grows by t tokens."""
        t = x.shape[1]
        q, k, v = qkv[i](x).split(d, dim=-1)
        q, k, v = (y.view(1, t, heads, hd).transpose(1, 2) for y in (q, k, v))
        if req["cache"][i] is not None:
            k = torch.cat([req["cache"][i][0], k], dim=2)
            v = torch.cat([req["cache"][i][1], v], dim=2)
        req["cache"][i] = (k, v)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=k.shape[2] == t)
        return out[i](a.transpose(1, 2).reshape(1, t, d))

    def prefill(req):
        x = emb(torch.randint(0, vocab, (1, req["prompt"]), device="cuda"))
        for i in range(layers):
            x = x + attend(i, x, req)
            x = x + mlp[i](x)
        req["last"] = head(x[:, -1]).argmax(-1)

    active, served, step = [], 0, 0
    with torch.no_grad():
        while served < 48 or active:
            if served < 48 and len(active) < 12 and rng.random() < 0.35:
                req = {"prompt": rng.randint(16, 512), "left": rng.randint(16, 256), "cache": [None] * layers}
                prefill(req)
                active.append(req)
                served += 1
            if not active:
                continue
            x = emb(torch.cat([r["last"] for r in active]).view(-1, 1))  # (B, 1, d): one token each
            for i in range(layers):
                a = torch.cat([attend(i, x[j:j + 1], r) for j, r in enumerate(active)])
                x = x + a
                x = x + mlp[i](x)
            nxt = head(x[:, -1]).argmax(-1)
            for j, r in enumerate(active):
                r["last"] = nxt[j:j + 1]
                r["left"] -= 1
            active = [r for r in active if r["left"] > 0]  # finished requests let go of their caches
            step += 1


def moe_train(torch):
    d, hidden, experts, layers = 512, 1408, 8, 2
    rng = random.Random(17)

    class MoE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.router = torch.nn.Linear(d, experts)
            self.w1 = torch.nn.ModuleList(torch.nn.Linear(d, hidden) for _ in range(experts))
            self.w2 = torch.nn.ModuleList(torch.nn.Linear(hidden, d) for _ in range(experts))
            self.skew = torch.nn.Parameter(torch.zeros(experts), requires_grad=False)

        def forward(self, x):
            logits = self.router(x) + self.skew
            w, idx = logits.softmax(-1).topk(2, dim=-1)
            y = torch.zeros_like(x)
            for e in range(experts):
                rows, slot = (idx == e).nonzero(as_tuple=True)
                if rows.numel() == 0:
                    continue
                h = self.w2[e](torch.nn.functional.gelu(self.w1[e](x[rows])))
                y = y.index_add(0, rows, (h * w[rows, slot].unsqueeze(-1)).to(y.dtype))
            return x + y

    model = torch.nn.Sequential(*[MoE() for _ in range(layers)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(60):
        for m in model:  # a router that favours other experts every step: token counts per expert vary
            m.skew.copy_(torch.tensor([rng.gauss(0, 2) for _ in range(experts)]))
        x = torch.randn(rng.randint(256, 4096), d, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del x, loss


def seg_multires(torch):
    nn = torch.nn
    rng = random.Random(19)

    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True),
                             nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True))

    class Net(nn.Module):
        def __init__(self, classes=8):
            super().__init__()
            self.e1, self.e2, self.e3 = block(3, 16), block(16, 32), block(32, 64)
            self.d2, self.d1 = block(64 + 32, 32), block(32 + 16, 16)
            self.out = nn.Conv2d(16, classes, 1)

        def forward(self, x):
            a = self.e1(x)
            b = self.e2(nn.functional.max_pool2d(a, 2))
            c = self.e3(nn.functional.max_pool2d(b, 2))
            u = self.d2(torch.cat([nn.functional.interpolate(c, scale_factor=2), b], 1))
            u = self.d1(torch.cat([nn.functional.interpolate(u, scale_factor=2), a], 1))
            return self.out(u)

    model = Net().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    for _ in range(50):
        side = rng.choice([192, 256, 320, 384, 448, 512, 640, 768])
        batch = rng.randint(1, 8)
        x = torch.randn(batch, 3, side, side, device="cuda")
        y = torch.randint(0, 8, (batch, side, side), device="cuda")
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del x, y, loss


def lm_train(torch, steps=20, step_times=None):
    """A GPT-2-small-shaped language model (6 layers, width 768, 12 heads, sequence 512, batch 8), fp16
    autocast, AdamW: fixed shapes, every step the same allocations. step_times, if a list, gets the time
    of each step (synchronized)."""
    d, heads, layers, vocab, seq, batch = 768, 12, 6, 16384, 512, 8
    layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True, norm_first=True)
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(vocab, d),
                                 "body": torch.nn.TransformerEncoder(layer, layers),
                                 "head": torch.nn.Linear(d, vocab)}).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(seq, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(steps):
        x = torch.randint(0, vocab, (batch, seq + 1), device="cuda", generator=g)
        t0 = timer(torch, step_times)
        with torch.autocast("cuda", dtype=torch.float16):
            h = model["body"](model["emb"](x[:, :-1]), mask=mask, is_causal=True)
            loss = torch.nn.functional.cross_entropy(model["head"](h).float().flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        lap(torch, step_times, t0)
        del x, h, loss


def big_decoder(torch):
    """The decoder of the large generation and serving workloads: 16 layers, width 2560, 20 heads of 128,
    vocabulary 32,000, fp16, 1.42 B parameters (2.6 GiB), made on the GPU in one order so that a seed gives
    the same weights. Each layer's projection to queries, keys and values is one matrix; keys and values
    sit next to each other in its output so that a cache holds both in one tensor."""
    d, heads, layers, vocab = 2560, 20, 16, 32000
    kw = {"device": "cuda", "dtype": torch.half}
    emb = torch.nn.Embedding(vocab, d, **kw)
    qkv = [torch.nn.Linear(d, 3 * d, **kw) for _ in range(layers)]
    out = [torch.nn.Linear(d, d, **kw) for _ in range(layers)]
    mlp = [torch.nn.Sequential(torch.nn.Linear(d, 4 * d, **kw), torch.nn.GELU(), torch.nn.Linear(4 * d, d, **kw))
           for _ in range(layers)]
    head = torch.nn.Linear(d, vocab, **kw)
    return d, heads, d // heads, layers, vocab, emb, qkv, out, mlp, head


def big_attend(torch, d, heads, hd, qkv_out, cache, i):
    """Attention of one sequence batch whose projected input is qkv_out (b, t, 3d). Its cache for layer i,
    one tensor (2, b, heads, T, hd) of keys and values, grows by t tokens with one torch.cat."""
    b, t, _ = qkv_out.shape
    q = qkv_out[..., :d].view(b, t, heads, hd).transpose(1, 2)
    kv = qkv_out[..., d:].view(b, t, 2, heads, hd).permute(2, 0, 3, 1, 4)
    if cache[i] is not None:
        kv = torch.cat([cache[i], kv], dim=3)
    cache[i] = kv
    a = torch.nn.functional.scaled_dot_product_attention(q, kv[0], kv[1], is_causal=kv.shape[3] == t)
    return a.transpose(1, 2).reshape(b, t, d)


def kv_generate_large(torch):
    """Batched generation with a 1.4 B-parameter decoder: 8 batches of 8-32 sequences, prompts of 128-1024
    tokens, 16-128 new tokens; every layer's KV cache grows by torch.cat every step (a requested peak of
    several GiB)."""
    d, heads, hd, layers, vocab, emb, qkv, out, mlp, head = big_decoder(torch)
    rng = random.Random(23)

    def step(x, cache):
        for i in range(layers):
            x = x + out[i](big_attend(torch, d, heads, hd, qkv[i](x), cache, i))
            x = x + mlp[i](x)
        return head(x[:, -1])

    with torch.no_grad():
        for _ in range(8):
            batch, prompt, gen = rng.randint(8, 32), rng.randint(128, 1024), rng.randint(16, 128)
            cache = [None] * layers
            logits = step(emb(torch.randint(0, vocab, (batch, prompt), device="cuda")), cache)
            for _ in range(gen):
                logits = step(emb(logits.argmax(-1, keepdim=True)), cache)
            del cache, logits


def llm_serving_large(torch):
    """Continuous batching with the 1.4 B-parameter decoder: 40 requests (prompts of 256-2048 tokens, 16-160
    new tokens) arriving at random steps, at most 16 at once, each finishing at its own length. Each request
    keeps one KV tensor per layer that grows by torch.cat every decode step; a decode step runs the active
    requests' projections and MLPs as one batch and their attention one by one."""
    d, heads, hd, layers, vocab, emb, qkv, out, mlp, head = big_decoder(torch)
    rng = random.Random(29)

    def prefill(req):
        x = emb(torch.randint(0, vocab, (1, req["prompt"]), device="cuda"))
        for i in range(layers):
            x = x + out[i](big_attend(torch, d, heads, hd, qkv[i](x), req["cache"], i))
            x = x + mlp[i](x)
        req["last"] = head(x[:, -1]).argmax(-1)

    active, served = [], 0
    with torch.no_grad():
        while served < 40 or active:
            if served < 40 and len(active) < 16 and rng.random() < 0.3:
                req = {"prompt": rng.randint(256, 2048), "left": rng.randint(16, 160), "cache": [None] * layers}
                prefill(req)
                active.append(req)
                served += 1
            if not active:
                continue
            x = emb(torch.cat([r["last"] for r in active]).view(-1, 1))  # (B, 1, d): one token each
            for i in range(layers):
                p = qkv[i](x)
                a = torch.cat([big_attend(torch, d, heads, hd, p[j:j + 1], r["cache"], i)
                               for j, r in enumerate(active)])
                x = x + out[i](a)
                x = x + mlp[i](x)
            nxt = head(x[:, -1]).argmax(-1)
            for j, r in enumerate(active):
                r["last"] = nxt[j:j + 1]
                r["left"] -= 1
            active = [r for r in active if r["left"] > 0]  # finished requests let go of their caches


def gpt_train(torch, steps=6, step_times=None):
    """GPT-2 124M (transformers' GPT2LMHeadModel, random weights) trained on batches of 8 x 512 tokens,
    bf16 autocast, AdamW: the workload of traces/gpt_train (recorded earlier on an H200)."""
    import transformers

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(steps):
        x = torch.randint(0, 50257, (8, 512), device="cuda", generator=g)
        t0 = timer(torch, step_times)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        lap(torch, step_times, t0)
        del x, loss


def cnn_train(torch, steps=6, step_times=None):
    """ResNet-50 (torchvision, random weights) trained on batches of 64 images of 224 x 224, channels_last,
    bf16 autocast, SGD: the workload of traces/cnn_train (recorded earlier on an H200)."""
    import torchvision

    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(steps):
        x = torch.randn(64, 3, 224, 224, device="cuda", generator=g).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (64,), device="cuda", generator=g)
        t0 = timer(torch, step_times)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        lap(torch, step_times, t0)
        del x, y, loss


def timer(torch, step_times):
    import time

    if step_times is None:
        return 0.0
    torch.cuda.synchronize()
    return time.perf_counter()


def lap(torch, step_times, t0):
    import time

    if step_times is not None:
        torch.cuda.synchronize()
        step_times.append(time.perf_counter() - t0)


WORKLOADS = {"kv_generate": kv_generate, "var_inference": var_inference, "llm_serving": llm_serving,
             "moe_train": moe_train, "seg_multires": seg_multires, "lm_train": lm_train,
             "kv_generate_large": kv_generate_large, "llm_serving_large": llm_serving_large,
             "gpt_train": gpt_train, "cnn_train": cnn_train}
# the workloads made of fixed-shape training steps (they take steps and step_times)
STEPPED = ("lm_train", "gpt_train", "cnn_train")


def strip_frames(o):
    if isinstance(o, dict):
        return {k: ([] if k == "frames" else strip_frames(v)) for k, v in o.items()}
    if isinstance(o, list):
        return [strip_frames(v) for v in o]
    return o


def child(name, out_path):
    import torch

    name, _, steps = name.partition(":")
    torch.manual_seed(0)
    if out_path:
        torch.cuda.memory._record_memory_history(max_entries=3_000_000, context=None, stacks="python")
    if steps:
        WORKLOADS[name](torch, int(steps))
    else:
        WORKLOADS[name](torch)
    torch.cuda.synchronize()
    st = torch.cuda.memory_stats()
    res = {"reserved_peak": st.get("reserved_bytes.all.peak") or torch.cuda.max_memory_reserved(),
           "requested_peak": st.get("requested_bytes.all.peak", 0)}
    if out_path:
        snap = strip_frames(torch.cuda.memory._snapshot())
        res["trace_entries"] = sum(len(t) for t in snap["device_traces"])
        with gzip.open(out_path, "wt") as f:
            json.dump(snap, f)
    print(json.dumps(res))


def run(name, out_path, conf):
    env = dict(os.environ)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "child", name, out_path or ""],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError("%s (%s) failed:\n%s" % (name, conf, p.stderr[-3000:]))
    return json.loads(p.stdout.strip().splitlines()[-1])


RUNS = {"native": None, "expandable": "expandable_segments:True", "async": "backend:cudaMallocAsync"}


def main():
    out = sys.argv[1]
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(WORKLOADS)
    runs = sys.argv[3].split(",") if len(sys.argv) > 3 else list(RUNS)
    os.makedirs(out, exist_ok=True)
    for name in names:
        path = os.path.join(out, name.replace(":", "_") + ".snapshot.json.gz")
        res = {r: run(name, path if r == "native" else None, RUNS[r]) for r in runs}
        # the shapes are seeded, so every run's requested peak is the native run's; cudaMallocAsync's
        # statistics have none
        req = max(x["requested_peak"] for x in res.values())
        print(json.dumps({"workload": name, **res, **{r + "_ratio": x["reserved_peak"] / req if req else None
                                                      for r, x in res.items()}}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(sys.argv[2], sys.argv[3] or None)
    else:
        main()
