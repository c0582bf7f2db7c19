#!/usr/bin/env python3
"""The explorer suite: alloc_snapshot plot's pages driven in headless Chromium.

usage: run.py ALLOC_SNAPSHOT TESTS_EXPLORER_DIR CLI_FIXTURES_DIR WORK_DIR

Plots fixtures, puts an error catcher at the top of each page (window.onerror, unhandledrejection) and
driver.js at its end, loads it with `chromium --headless --dump-dom` and reads the PASS / FAIL lines the
driver wrote. Exit 0 when every page ran with no FAIL, 1 otherwise, 77 (skipped) without chromium.

The peak pages (mode 'peak': traces generated here, one of which peaks before its first entry and one
whose two peaks meet, and traces/var_inference; mode 'peaks', the same without the peak table's checks:
traces/gpt_train, whose peak holds more allocations than the table lists) are checked against what
this script computes from the snapshot's JSON by itself (expectations(), passed to the page as
window.__expect): the allocated bytes after every entry and before the first, both peaks (allocated
and reserved), the allocations live then, the axis maxima of chosen ranges; and against
`alloc_snapshot folded` on the same file: a frame it writes, searched for in the page's table, and (for
the generated traces) its peak bytes. The page of a snapshot without trace entries (mode 'notrace') must
list the blocks allocated at the snapshot.
"""
import bisect
import gzip
import json
import os
import random
import shutil
import subprocess
import sys

CATCHER = ("<script>window.__errors=[];window.onerror=function(m,s,l,c){window.__errors.push(m+' at '+l+':'+c)};"
           "window.addEventListener('unhandledrejection',function(e){window.__errors.push('rejection '+e.reason)});"
           "window.__mode=%r;window.__devices=%d;window.__expect=%s;</script>")
MIB = 1 << 20
SEARCH = "DeCoder"  # typed into the peak table's filter: matched case-insensitively


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def unusable(browser, work):
    """Why the browser cannot load a page here (found is not enough: a broken install or a sandbox that
    forbids it would fail every page), or None when it loaded a blank one."""
    blank = os.path.join(work, "blank.html")
    with open(blank, "w", encoding="utf-8") as f:
        f.write("<html><body><p id=ok>ok</p></body></html>")
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--user-data-dir=" + os.path.join(work, "profile"), "--dump-dom", "file://" + os.path.abspath(blank)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if 'id="ok"' not in r.stdout:
        return "exit %d, %s" % (r.returncode, (r.stderr.strip().splitlines() or ["no output"])[-1])
    return None


def run_page(browser, tool, fixture, work, name, mode, devices=1, hash_="", expect=None):
    page = os.path.join(work, name + ".html")
    r = subprocess.run([tool, "plot", fixture, "-o", page], capture_output=True, text=True)
    if r.returncode != 0:
        return ["FAIL %s: alloc_snapshot plot exited %d: %s" % (name, r.returncode, r.stderr.strip())]
    with open(page, encoding="utf-8") as f:
        html = f.read()
    with open(os.path.join(os.path.dirname(__file__), "driver.js"), encoding="utf-8") as f:
        driver = f.read()
    if "<body>" not in html or "</body>" not in html:
        return ["FAIL %s: the page has no <body> ... </body>" % name]
    html = html.replace("<body>", "<body>" + CATCHER % (mode, devices, json.dumps(expect).replace("<", "\\u003c")), 1)
    html = html.replace("</body>", "<script>\n" + driver + "\n</script>\n</body>", 1)
    test_page = os.path.join(work, name + ".test.html")
    with open(test_page, "w", encoding="utf-8") as f:
        f.write(html)
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--window-size=1400,1000",
           "--user-data-dir=" + os.path.join(work, "profile"), "--virtual-time-budget=20000", "--dump-dom",
           "file://" + os.path.abspath(test_page) + hash_]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return ["FAIL %s: chromium did not finish in 120 s" % name]
    dom = r.stdout.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
    if "BEGIN\n" not in dom or "\nEND\n" not in dom:
        return ["FAIL %s: the driver wrote no results (chromium exit %d): %s" % (name, r.returncode, r.stderr[-400:])]
    lines = dom.split("BEGIN\n", 1)[1].split("\nEND\n", 1)[0].splitlines()
    return ["%s [%s]" % (line, name) for line in lines]


def peak_fixture(path):
    """Writes a snapshot whose trace has far more entries than the plot has pixel columns: 300 MiB
    buffers allocated and freed one after another (never two at once), then the peak (457 MiB), a
    phase of smaller allocations with frames. Zoomed out, each column holds several entries; stacking
    everything live at any of them (the old bug) read at least two buffers on top of what is held:
    666 MiB."""
    rnd = random.Random(7)
    seg1, seg2 = 0x7f0000000000, 0x7f4000000000
    stacks = {
        "attn": [("attention", "model/decoder.py", 88), ("Decoder.forward", "model/decoder.py", 40), ("main", "infer.py", 12)],
        "mlp": [("mlp", "model/decoder.py", 120), ("Decoder.forward", "model/decoder.py", 41), ("main", "infer.py", 12)],
        "kv": [("KVCache.grow", "model/cache.py", 64), ("main", "infer.py", 15)],
        "embed": [("embed", "model/embedding.py", 21), ("main", "infer.py", 11)],
        "weights": [("load_weights", "infer.py", 5)],
        "buffer": [("workspace", "kernels/gemm.py", 9), ("mlp", "model/decoder.py", 122)],
    }
    entries, live, time = [], {seg1: 8 * MIB}, [1000]  # live: address -> size; 8 MiB from before the trace

    def entry(action, addr, size, stack=None):
        time[0] += rnd.randint(1, 40)
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time[0]}
        if stack:
            e["frames"] = [{"name": n, "filename": f, "line": line} for n, f, line in stacks[stack]]
        entries.append(e)

    def alloc(size, stack, seg=seg1):  # first fit in the segment
        at = seg
        for a in sorted(a for a in live if seg <= a < seg + (1 << 30)):
            if a - at >= size:
                break
            at = max(at, a + live[a])
        live[at] = size
        entry("alloc", at, size, stack)
        return at

    def free(addr):
        size = live.pop(addr)
        entry("free_requested", addr, size)
        entry("free_completed", addr, size)

    weights = alloc(64 * MIB, "weights")
    free(seg1)  # allocated before the trace began
    for i in range(1500):
        act = alloc(rnd.randint(1, 4096) * 512, rnd.choice(["attn", "mlp"])) if i % 50 == 0 else None
        free(alloc(300 * MIB, "buffer"))
        if act is not None:
            free(act)
    entry("segment_alloc", seg2, 256 * MIB)
    held = []
    for i in range(40):
        stack = rnd.choice(["attn", "mlp", "kv", "embed"])
        held.append(alloc(rnd.randint(2048, 40960) * 512 + i * 512, stack, seg2 if stack == "kv" else seg1))
        if i % 7 == 6:
            free(held.pop(rnd.randrange(len(held))))
    rnd.shuffle(held)
    for a in held:
        free(a)
    entry("segment_free", seg2, 256 * MIB)
    block = lambda addr, size, state, frames: {"address": addr, "size": size, "requested_size": size if state != "inactive" else 0,
                                                "state": state, "frames": frames}
    snap = {"segments": [{"device": 0, "address": seg1, "total_size": 1 << 30, "allocated_size": 64 * MIB,
                          "active_size": 64 * MIB, "requested_size": 64 * MIB, "stream": 0, "segment_type": "large",
                          "segment_pool_id": [0, 0], "is_expandable": False, "frames": [],
                          "blocks": [block(seg1, 8 * MIB, "inactive", []),
                                     block(weights, 64 * MIB, "active_allocated", entries[0]["frames"]),
                                     block(weights + 64 * MIB, (1 << 30) - 72 * MIB, "inactive", [])]}],
            "device_traces": [entries], "allocator_settings": {"CACHALOT_ALLOC_CONF": ""}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(snap, f)


def ring_fixture(path):
    """Writes a snapshot of a wrapped ring: 48 blocks allocated before the first entry (the ring dropped
    their allocs), which the trace frees one by one, with a few smaller allocations of its own in
    between, all freed by the end; two more blocks from before the trace are still allocated at the
    snapshot, with frames. Allocated memory is at its peak before the first entry: every later state
    holds less (alloc_snapshot folded says "before the first trace entry")."""
    rnd = random.Random(11)
    seg1 = 0x7f0000000000
    frames = lambda *fs: [{"name": n, "filename": f, "line": line} for n, f, line in fs]
    attn = frames(("attention", "model/decoder.py", 88), ("Decoder.forward", "model/decoder.py", 40), ("main", "infer.py", 12))
    weights_frames = frames(("load_weights", "infer.py", 5), ("main", "infer.py", 3))
    kv_frames = frames(("KVCache.grow", "model/cache.py", 64), ("Decoder.forward", "model/decoder.py", 41), ("main", "infer.py", 15))
    weights, kv = seg1, seg1 + 64 * MIB
    at, ring = seg1 + 80 * MIB, []
    for i in range(48):
        size = rnd.randint(1, 16) * MIB + (i + 1) * 512
        ring.append((at, size))
        at += size
    scratch, entries, t = at, [], 5000
    for i, (addr, size) in enumerate(ring):
        for action in ("free_requested", "free_completed"):
            t += rnd.randint(1, 30)
            entries.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t})
        if i % 6 == 2:  # a scratch allocation, freed two ring frees later at the latest: never over the start
            t += 5
            entries.append({"action": "alloc", "addr": scratch, "size": 2 * MIB, "stream": 0, "time_us": t, "frames": attn})
            for action in ("free_requested", "free_completed"):
                t += 3
                entries.append({"action": action, "addr": scratch, "size": 2 * MIB, "stream": 0, "time_us": t})
    block = lambda addr, size, state, fr: {"address": addr, "size": size, "requested_size": size if state != "inactive" else 0,
                                           "state": state, "frames": fr}
    snap = {"segments": [{"device": 0, "address": seg1, "total_size": 1 << 30, "allocated_size": 80 * MIB,
                          "active_size": 80 * MIB, "requested_size": 80 * MIB, "stream": 0, "segment_type": "large",
                          "segment_pool_id": [0, 0], "is_expandable": False, "frames": [],
                          "blocks": [block(weights, 64 * MIB, "active_allocated", weights_frames),
                                     block(kv, 16 * MIB, "active_allocated", kv_frames),
                                     block(seg1 + 80 * MIB, (1 << 30) - 80 * MIB, "inactive", [])]}],
            "device_traces": [entries], "allocator_settings": {"CACHALOT_ALLOC_CONF": ""}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(snap, f)


def twin_fixture(path):
    """Writes a trace whose two peaks meet: a 64 MiB segment, then one allocation filling it, so that
    reserved peaks after entry 0 and allocated after entry 1 at the same height, less than a pixel apart
    (their labels would cover each other), then 400 smaller allocations and frees in the segment."""
    seg, entries = 0x7f0000000000, []

    def entry(action, size):
        entries.append({"action": action, "addr": seg, "size": size, "stream": 0, "time_us": 1000 + 7 * len(entries)})

    entry("segment_alloc", 64 * MIB)
    for i in range(401):
        size = 64 * MIB if i == 0 else (1 + i % 32) * MIB
        for action in ("alloc", "free_requested", "free_completed"):
            entry(action, size)
    inactive = {"address": seg, "size": 64 * MIB, "requested_size": 0, "state": "inactive", "frames": []}
    snap = {"segments": [{"device": 0, "address": seg, "total_size": 64 * MIB, "allocated_size": 0, "active_size": 0,
                          "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": [0, 0],
                          "is_expandable": False, "frames": [], "blocks": [inactive]}],
            "device_traces": [entries], "allocator_settings": {"CACHALOT_ALLOC_CONF": ""}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(snap, f)


def frame_text(f):
    """A frame as alloc_snapshot folded writes it: "name (file:line)", "??" for no name, no ":line" for
    line 0, no parenthesis for no file."""
    where = " (%s%s)" % (f["filename"], ":%d" % f["line"] if f.get("line", 0) > 0 else "") if f.get("filename") else ""
    return (f.get("name") or "??") + where


def folded(tool, path):
    """alloc_snapshot folded on the file: its lines as (frames outermost first, bytes), and its peak line;
    None when it failed."""
    r = subprocess.run([tool, "folded", path, "-o", "-"], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    lines = []
    for line in r.stdout.splitlines():
        stack, count = line.rsplit(" ", 1)
        lines.append((stack.split(";"), int(count)))
    return lines, r.stderr.strip()


def notrace_expectations(path):
    """Device 0's blocks allocated at the snapshot, largest first (then by address): what the table of a
    snapshot without trace entries lists."""
    with open(path, encoding="utf-8") as f:
        snap = json.load(f)
    blocks = [b for s in snap["segments"] if s["device"] == 0 for b in s["blocks"] if b["state"] == "active_allocated"]
    blocks.sort(key=lambda b: (-b["size"], b["address"]))
    return {"live": [[b["size"], "0x%x" % b["address"]] for b in blocks], "bytes": sum(b["size"] for b in blocks)}


def expectations(path, tool=None):
    """What the page must show of device 0, replayed here from the snapshot's JSON as the explorer's
    definition has it: an allocation is live from its alloc entry until its free_requested; a free of
    an address the trace never allocated, and an active_allocated block the trace leaves unaccounted,
    were live since before the trace."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        snap = json.load(f)
    trace = snap["device_traces"][0]
    n = len(trace)
    allocs, live = [], {}  # allocs: [start, end, size, address, frames]; live: address -> index in allocs
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            if e["addr"] in live:
                allocs[live[e["addr"]]][1] = i
            live[e["addr"]] = len(allocs)
            allocs.append([i, n, e["size"], e["addr"], e.get("frames", [])])
        elif e["action"] == "free_requested":
            if e["addr"] in live:
                allocs[live.pop(e["addr"])][1] = i
            else:
                allocs.append([-1, i, e["size"], e["addr"], []])
    segs = [s for s in snap["segments"] if s["device"] == 0]
    for s in segs:
        for b in s["blocks"]:
            if b["state"] == "active_allocated" and b["address"] not in live:
                allocs.append([-1, n, b["size"], b["address"], b.get("frames", [])])
    delta = [0] * (n + 2)
    for start, end, size, _, _ in allocs:
        delta[start + 1] += size  # delta[i + 1]: the change after entry i (-1: before the trace)
        delta[end + 1] -= size
    allocated, a = [], 0
    for i in range(-1, n):
        a += delta[i + 1]
        allocated.append(a)  # allocated[i + 1]: after entry i
    grow, shrink = ("segment_alloc", "segment_map"), ("segment_free", "segment_unmap")
    net = sum(e["size"] if e["action"] in grow else -e["size"] for e in trace if e["action"] in grow + shrink)
    r = max(0, sum(s["total_size"] for s in segs) - net) if segs else 0
    reserved = [r]
    for e in trace:
        if e["action"] in grow:
            r += e["size"]
        elif e["action"] in shrink:
            r = max(0, r - e["size"])
        reserved.append(r)
    peak = max(allocated)  # the first state at its maximum; allocated[0], before the first entry, too
    p = allocated.index(peak) - 1
    times = [e["time_us"] - trace[0]["time_us"] for e in trace]

    def zoom(axis, x0, x1):
        """The axis maxima over [x0, x1): the states after the entry at or before x0 (the one at x0
        if any) through the last entry before x1."""
        xs = times if axis == "time" else list(range(n))
        a = bisect.bisect_left(xs, x0)
        lo = a if a < n and xs[a] == x0 and x0 > 0 else a - 1  # at x 0: the state before the first entry too
        hi = bisect.bisect_left(xs, x1)
        states = range(lo + 1, hi + 1)
        return {"axis": axis, "x0": x0, "x1": x1, "active": max(allocated[s] for s in states),
                "timeline": max(1, max(max(allocated[s], reserved[s]) for s in states))}

    text = lambda frames: "\n".join(frame_text(f) for f in frames)
    at_peak = sorted((al for al in allocs if al[0] <= p < al[1]), key=lambda al: (-al[2], al[0]))
    span = times[-1] + max(times[-1] / 1000, 1)
    t_peak = times[p] if p >= 0 else 0  # before the first entry: the trace's left edge
    fold = folded(tool, path) if tool else None
    q = None
    if fold:  # the innermost frame of folded's first line that names a file
        q = next((fr for stack, _ in fold[0] for fr in reversed(stack) if " (" in fr), None)
    return {
        "n": n, "peak": {"entry": p, "time_us": trace[p]["time_us"] if p >= 0 else None, "x_time": t_peak, "bytes": peak},
        # reserved[i + 1]: after entry i; the first state at the maximum, as for allocated
        "peak_reserved": {"entry": reserved.index(max(reserved)) - 1, "bytes": max(reserved)},
        "zooms": [zoom("event", 0, n), zoom("event", 0, n // 2), zoom("event", n // 3, 2 * n // 3),
                  zoom("event", max(p - 500, 0), min(p + 500, n)), zoom("event", max(p - 20, 0), min(p + 20, n)),
                  zoom("event", max(p - 20, 0), max(p, 4)), zoom("time", 0, span),
                  zoom("time", t_peak - span / 9.5, t_peak + span / 13.25), zoom("time", span * 0.3 + 0.5, span * 0.45)],
        "live": [[al[2], "0x%x" % al[3]] for al in at_peak],
        "frames": [text(al[4]) for al in at_peak],
        "search": {"q": SEARCH, "count": sum(SEARCH.lower() in text(al[4]).lower() for al in at_peak)},
        "folded": q and {"q": q, "count": sum(q.lower() in text(al[4]).lower() for al in at_peak)},
        "folded_bytes": sum(c for _, c in fold[0]) if fold else None,
        "folded_line": fold[1] if fold else None,
    }


def check_folded(name, expect, before):
    """The page's peak against alloc_snapshot folded's on the same generated trace: the same bytes, and
    the same moment where it is before the first entry."""
    out = ["%s peak: alloc_snapshot folded's bytes, %s [%s]" % (
        "PASS" if expect["folded_bytes"] == expect["peak"]["bytes"] else "FAIL", expect["folded_bytes"], name)]
    said = "before the first trace entry" in (expect["folded_line"] or "")
    out.append("%s peak: folded %s it before the first entry [%s]" % ("PASS" if said == before else "FAIL",
                                                                     "puts" if said else "does not put", name))
    out.append("%s peak: the page %s it before the first entry [%s]" % (
        "PASS" if (expect["peak"]["entry"] < 0) == before else "FAIL", "puts" if expect["peak"]["entry"] < 0 else "does not put", name))
    return out


def main():
    tool, here, fixtures, work = sys.argv[1:5]
    browser = chromium()
    if browser is None:
        print("skip: no chromium (apt-get install chromium)")
        return 77
    os.makedirs(work, exist_ok=True)
    why = unusable(browser, work)
    if why:
        print("skip: %s cannot run here: %s" % (browser, why))
        return 77
    fx = os.path.join(here, "explorer.json")
    results = run_page(browser, tool, fx, work, "explorer", "full")
    results += run_page(browser, tool, fx, work, "explorer_hash", "hash", hash_="#t=3&sel=3&x0=2&x1=10")
    # a block pending free at the snapshot whose free the trace does not hold: pending after every entry
    results += run_page(browser, tool, os.path.join(here, "pending.json"), work, "pending", "pending", hash_="#t=0")
    gen = os.path.join(work, "peak.json")
    peak_fixture(gen)
    ex = expectations(gen, tool)
    results += check_folded("peak", ex, False) + run_page(browser, tool, gen, work, "peak", "peak", expect=ex)
    # a wrapped ring: the peak is before the first entry, the marker at the left edge, the table what was
    # live then
    ring = os.path.join(work, "ring.json")
    ring_fixture(ring)
    ex = expectations(ring, tool)
    results += check_folded("ring", ex, True) + run_page(browser, tool, ring, work, "ring", "peak", expect=ex)
    # both peaks at one spot: their labels one under the other
    twin = os.path.join(work, "twin.json")
    twin_fixture(twin)
    ex = expectations(twin, tool)
    results += check_folded("twin", ex, False) + run_page(browser, tool, twin, work, "twin", "peak", expect=ex)
    var = os.path.join(here, "..", "..", "traces", "var_inference.snapshot.json.gz")
    results += run_page(browser, tool, var, work, "var_inference", "peak", expect=expectations(var, tool))
    # the trace whose peaks the static page marked (7.17 GiB allocated, 7.53 GiB reserved)
    gpt = os.path.join(here, "..", "..", "traces", "gpt_train.snapshot.json.gz")
    results += run_page(browser, tool, gpt, work, "gpt_train", "peaks", expect=expectations(gpt, tool))
    results += run_page(browser, tool, os.path.join(fixtures, "cachalot_small.json"), work, "two_devices", "smoke", 2)
    results += run_page(browser, tool, os.path.join(fixtures, "trace_small.json"), work, "trace_only", "smoke")
    empty_trace = os.path.join(fixtures, "segments_empty_trace.json")
    results += run_page(browser, tool, empty_trace, work, "no_trace", "smoke", 2)
    results += run_page(browser, tool, empty_trace, work, "no_trace_table", "notrace", 2, expect=notrace_expectations(empty_trace))
    results += run_page(browser, tool, os.path.join(fixtures, "no_trace.json"), work, "nothing", "empty", 0)
    for line in results:
        print(line)
    passed = sum(line.startswith("PASS ") for line in results)
    failed = len(results) - passed
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
