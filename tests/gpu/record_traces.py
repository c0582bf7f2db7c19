"""Records PyTorch allocation traces of workloads that fragment memory, for replay benchmarks.

    python3 tests/gpu/record_traces.py OUT_DIR            (on a GPU machine with PyTorch)

Each workload runs in a fresh process with torch.cuda.memory._record_memory_history, three times: with
PyTorch's native allocator (its trace is saved as OUT_DIR/NAME.snapshot.json.gz, frames removed, the
schema of ../shared/traces) and with expandable_segments:True, and the reserved / requested peaks of
each run are printed as one JSON line per workload.

Workloads:
  kv_generate    a small decoder (4 layers, width 512) generating for 16 requests of random prompt
                 (16-640 tokens) and output (16-192 tokens) lengths, batch 1-4, fp16; the KV cache grows
                 by torch.cat every step
  var_inference  a transformer encoder on 80 batches of random shape (1-32 x 16-1024 tokens), fp16
"""
import gzip
import json
import os
import random
import subprocess
import sys


def kv_generate(torch):
    d, heads, layers, vocab = 512, 8, 4, 8192
    hd = d // heads
    emb = torch.nn.Embedding(vocab, d).cuda().half()
    qkv = [torch.nn.Linear(d, 3 * d).cuda().half() for _ in range(layers)]
    out = [torch.nn.Linear(d, d).cuda().half() for _ in range(layers)]
    mlp = [torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)).cuda().half()
           for _ in range(layers)]
    head = torch.nn.Linear(d, vocab).cuda().half()
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


WORKLOADS = {"kv_generate": kv_generate, "var_inference": var_inference}


def strip_frames(o):
    if isinstance(o, dict):
        return {k: ([] if k == "frames" else strip_frames(v)) for k, v in o.items()}
    if isinstance(o, list):
        return [strip_frames(v) for v in o]
    return o


def child(name, out_path):
    import torch

    torch.manual_seed(0)
    if out_path:
        torch.cuda.memory._record_memory_history(max_entries=3_000_000, context=None, stacks="python")
    WORKLOADS[name](torch)
    torch.cuda.synchronize()
    st = torch.cuda.memory_stats()
    res = {"reserved_peak": st["reserved_bytes.all.peak"], "requested_peak": st["requested_bytes.all.peak"]}
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


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name in WORKLOADS:
        path = os.path.join(out, name + ".snapshot.json.gz")
        native = run(name, path, None)
        exp = run(name, None, "expandable_segments:True")
        print(json.dumps({"workload": name, "native": native, "expandable": exp,
                          "native_ratio": native["reserved_peak"] / native["requested_peak"],
                          "expandable_ratio": exp["reserved_peak"] / exp["requested_peak"]}))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(sys.argv[2], sys.argv[3] or None)
    else:
        main()
