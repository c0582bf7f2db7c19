/* alloc_snapshot plot's explorer, the model: the page's JSON data (explorer_data.c) decoded into typed
 * arrays, the trace walked into allocations (the rules of tools/common/trace_walk.h), the totals per
 * entry and their peak, the allocations live at an entry, the segment map at any entry, and the
 * level-of-detail layout of the active-memory view. explorer_view.js draws what these return. No
 * library, no network. */
'use strict';

const ACT = {ALLOC: 0, FREE_REQ: 1, FREE_DONE: 2, SEG_ALLOC: 3, SEG_FREE: 4, SEG_MAP: 5, SEG_UNMAP: 6,
  OOM: 7, SNAPSHOT: 8, USER: 9, OTHER: 10};
const STATE = ['active_allocated', 'active_pending_free', 'inactive'];

function decodeSnapshot(raw) {
  const S = {file: raw.file, conf: raw.conf, str: raw.str, streams: raw.streams, addrHex: raw.addrs,
    addrNum: Float64Array.from(raw.addrs, (h) => parseInt(h, 16)), fr: raw.fr, st: raw.st, ann: [], devices: []};
  for (let i = 0; i + 3 < raw.ann.length; i += 4)
    S.ann.push({device: raw.ann[i], time: raw.ann[i + 1], start: raw.ann[i + 2] === 1, name: raw.str[raw.ann[i + 3]]});
  S.frames = (id) => (S.st[id] || []).map((f) => ({name: S.str[S.fr[3 * f]], filename: S.str[S.fr[3 * f + 1]],
    line: S.fr[3 * f + 2]}));
  for (const rd of raw.dev) S.devices.push(decodeDevice(S, rd));
  return S;
}

function decodeDevice(S, rd) {
  const n = rd.n, time = new Float64Array(n);
  let t = rd.t0, mono = n > 1;
  for (let i = 0; i < n; i++) {
    t += rd.dt[i];
    time[i] = t;
    if (i && rd.dt[i] < 0) mono = false;
  }
  const D = {d: rd.d, n, act: Int8Array.from(rd.act), addr: Int32Array.from(rd.addr), size: Float64Array.from(rd.size),
    stream: Int32Array.from(rd.stream), stk: Int32Array.from(rd.stk), time, byTimeOk: mono && time[n - 1] > time[0],
    names: new Map(), oom: new Map(), segs: [], S};
  for (let i = 0; i < rd.nm.length; i += 2) D.names.set(rd.nm[i], S.str[rd.nm[i + 1]]);
  for (let i = 0; i < rd.oom.length; i += 2) D.oom.set(rd.oom[i], rd.oom[i + 1]);
  for (const s of rd.segs) {
    const seg = {addr: S.addrNum[s.a], hex: S.addrHex[s.a], size: s.n, stream: s.s, pool: s.p, small: !!s.sm,
      expandable: !!s.x, blocks: []};
    for (let k = 0; k < s.b.length; k += 5)
      seg.blocks.push({addr: S.addrNum[s.b[k]], hex: S.addrHex[s.b[k]], size: s.b[k + 1], req: s.b[k + 2],
        state: s.b[k + 3], stk: s.b[k + 4]});
    D.segs.push(seg);
  }
  D.segs.sort((a, b) => a.addr - b.addr);
  D.ann = S.ann.filter((a) => a.device === D.d);
  walk(D);
  matchFinal(S, D);
  return D;
}

/* Allocations as intervals over entry positions: live after entry i when start <= i < end; pending free
 * when end <= i < done. start -1: allocated before the trace began (the ring dropped it, or recording
 * began later); end n: still live at the snapshot. */
function walk(D) {
  const n = D.n, A = {start: [], end: [], done: [], addr: [], size: [], stream: [], stk: [], req: [], bstk: []};
  const live = new Map(), pending = new Map();
  let unknownFrees = 0, hasDone = false;
  const add = (start, addr, size, stream, stk) => {
    const id = A.start.length;
    A.start.push(start); A.end.push(n); A.done.push(n); A.addr.push(addr); A.size.push(size);
    A.stream.push(stream); A.stk.push(stk); A.req.push(-1); A.bstk.push(0);
    return id;
  };
  for (let i = 0; i < n; i++) {
    const a = D.act[i], ad = D.addr[i];
    if (a === ACT.ALLOC) {
      const old = live.get(ad);
      if (old !== undefined) A.end[old] = A.done[old] = i; /* its free was lost: free right before */
      live.set(ad, add(i, ad, D.size[i], D.stream[i], D.stk[i]));
    } else if (a === ACT.FREE_REQ) {
      let id = live.get(ad);
      if (id === undefined) { /* allocated before the trace began */
        unknownFrees++;
        id = add(-1, ad, D.size[i], D.stream[i], 0);
      }
      live.delete(ad);
      A.end[id] = i;
      pending.set(ad, id);
    } else if (a === ACT.FREE_DONE) {
      hasDone = true;
      const id = pending.get(ad);
      if (id !== undefined) { A.done[id] = i; pending.delete(ad); }
    }
  }
  /* Without free_completed entries nothing is known to be pending: free is free. */
  if (!hasDone) for (let id = 0; id < A.start.length; id++) A.done[id] = A.end[id];
  D.A = A;
  D.live = live;
  D.unknownFrees = unknownFrees;
  D.hasDone = hasDone;
}

/* The final blocks against the walk's live allocations; needs S for the address table. */
function matchFinal(S, D) {
  const A = D.A, n = D.n, byAddr = new Map();
  for (const [ad, id] of D.live) byAddr.set(S.addrNum[ad], id);
  const pendingByAddr = new Map();
  /* freed in the trace and not completed; without free_completed entries at all, any freed one: a block
   * pending at the snapshot is then the last free at its address, pending from it on */
  for (let id = 0; id < A.start.length; id++)
    if (A.end[id] < n && (A.done[id] === n || !D.hasDone)) pendingByAddr.set(S.addrNum[A.addr[id]], id);
  D.preLive = 0;
  for (const seg of D.segs) for (const b of seg.blocks) {
    if (b.state === 2) continue;
    let id = (b.state === 0 ? byAddr : pendingByAddr).get(b.addr);
    if (id === undefined) { /* live since before the trace began */
      id = A.start.length;
      A.start.push(-1); A.end.push(b.state === 0 ? n : -1); A.done.push(n); A.addr.push(-1); A.size.push(b.size);
      A.stream.push(seg.stream); A.stk.push(0); A.req.push(b.req); A.bstk.push(b.stk);
      A.hex = A.hex || new Map();
      A.hex.set(id, b.hex);
      D.preLive++;
    } else {
      A.req[id] = b.req;
      A.bstk[id] = b.stk;
      if (b.state === 1) A.done[id] = n;
    }
    b.alloc = id;
  }
  for (const k of ['start', 'end', 'done', 'size']) A[k] = Float64Array.from(A[k]);
  A.count = A.start.length;
  A.addrNum = new Float64Array(A.count);
  for (let id = 0; id < A.count; id++)
    A.addrNum[id] = A.addr[id] >= 0 ? S.addrNum[A.addr[id]] : parseInt(A.hex.get(id), 16);
  A.hexOf = (id) => (A.addr[id] >= 0 ? S.addrHex[A.addr[id]] : A.hex.get(id));
  A.byStart = new Map();
  for (let id = 0; id < A.count; id++) if (A.start[id] >= 0) A.byStart.set(A.start[id], id);
  totals(D);
}

/* Allocated and reserved bytes after each entry. Allocated counts the allocations of the walk (those
 * made before the trace began too); reserved starts from what the snapshot's segments say was reserved
 * before the first entry (their total less what the trace added), where the snapshot has segments. */
function totals(D) {
  const n = D.n, A = D.A, delta = new Float64Array(n + 1);
  let base = 0;
  for (let id = 0; id < A.count; id++) {
    if (A.end[id] < 0) continue; /* pending at the snapshot, freed before the trace: not allocated */
    if (A.start[id] < 0) base += A.size[id]; else delta[A.start[id]] += A.size[id];
    if (A.end[id] < n) delta[A.end[id]] -= A.size[id];
  }
  const alloc = new Float64Array(n), reserved = new Float64Array(n);
  let a = base, r = 0, net = 0;
  for (let i = 0; i < n; i++) {
    const act = D.act[i];
    if (act === ACT.SEG_ALLOC || act === ACT.SEG_MAP) net += D.size[i];
    else if (act === ACT.SEG_FREE || act === ACT.SEG_UNMAP) net -= D.size[i];
  }
  const finalReserved = D.segs.reduce((s, g) => s + g.size, 0);
  r = D.segs.length ? Math.max(0, finalReserved - net) : 0;
  D.reservedBefore = r;
  D.allocBefore = base;
  /* the search starts before the first entry: a trace that mostly frees (a wrapped ring whose blocks
   * were allocated before it) peaks there, as alloc_snapshot folded says; so does an empty trace, whose
   * allocations are the blocks allocated at the snapshot */
  let pa = base, pr = r, pe = -1, pre = -1;
  for (let i = 0; i < n; i++) {
    a += delta[i];
    const act = D.act[i];
    if (act === ACT.SEG_ALLOC || act === ACT.SEG_MAP) r += D.size[i];
    else if (act === ACT.SEG_FREE || act === ACT.SEG_UNMAP) r = Math.max(0, r - D.size[i]);
    alloc[i] = a;
    reserved[i] = r;
    if (a > pa) { pa = a; pe = i; }
    if (r > pr) { pr = r; pre = i; }
  }
  D.allocTotal = alloc;
  D.reservedTotal = reserved;
  D.peakAlloc = pa;
  D.peakEntry = pe; /* the first entry after which allocated is at its peak; -1: before the first entry */
  D.peakReserved = pr;
  D.peakReservedEntry = pre; /* the same for reserved */
}

/* The allocations live after entry k (-1: before the first entry), largest first, then in allocation
 * order; at D.peakEntry their sizes add up to D.peakAlloc. */
function liveAt(D, k) {
  const A = D.A, ids = [];
  for (let id = 0; id < A.count; id++) if (A.start[id] <= k && k < A.end[id]) ids.push(id);
  return ids.sort((a, b) => A.size[b] - A.size[a] || A.start[a] - A.start[b] || a - b);
}

/* The segment map after entry k (k === D.n: the snapshot's own segments and blocks). Segments: the
 * snapshot's, with the trace's segment_alloc / segment_free after k undone; blocks: the allocations live
 * or pending free after k, the rest of each segment inactive (how the allocator had split it is not in
 * the trace). */
function segmentsAt(D, k) {
  const n = D.n, A = D.A;
  if (k >= n || n === 0)
    return {exact: true, segs: D.segs.map((s) => ({...s, blocks: s.blocks.map((b) => ({...b}))})), outside: [], k: n};
  const segs = new Map();
  for (const s of D.segs) segs.set(s.addr, {...s, blocks: [], known: true});
  for (let i = n - 1; i > k; i--) {
    const a = D.act[i];
    if (a === ACT.SEG_ALLOC) segs.delete(D.S.addrNum[D.addr[i]]);
    else if (a === ACT.SEG_FREE) {
      const ad = D.S.addrNum[D.addr[i]];
      segs.set(ad, {addr: ad, hex: D.S.addrHex[D.addr[i]], size: D.size[i], stream: D.stream[i], pool: null,
        small: false, expandable: false, blocks: [], known: false});
    }
  }
  const list = [...segs.values()].sort((a, b) => a.addr - b.addr), outside = [];
  for (let id = 0; id < A.count; id++) {
    let state = -1;
    if (A.start[id] <= k && k < A.end[id]) state = 0;
    else if (A.end[id] <= k && k < A.done[id]) state = 1; /* end -1: pending since before the trace */
    if (state < 0) continue;
    const ad = A.addrNum[id];
    let lo = 0, hi = list.length - 1, seg = null;
    while (lo <= hi) {
      const m = (lo + hi) >> 1;
      if (list[m].addr <= ad) { seg = list[m]; lo = m + 1; } else hi = m - 1;
    }
    const b = {addr: ad, hex: A.hexOf(id), size: A.size[id], req: A.req[id], state, alloc: id};
    if (seg && ad + A.size[id] <= seg.addr + seg.size) seg.blocks.push(b); else outside.push(b);
  }
  for (const s of list) {
    s.blocks.sort((a, b) => a.addr - b.addr);
    const full = [];
    let at = s.addr;
    for (const b of s.blocks) {
      if (b.addr > at) full.push({addr: at, size: b.addr - at, state: 2, gap: true});
      full.push(b);
      at = Math.max(at, b.addr + b.size);
    }
    if (at < s.addr + s.size) full.push({addr: at, size: s.addr + s.size - at, state: 2, gap: true});
    s.blocks = full;
  }
  return {exact: false, segs: list, outside, k};
}

/* Figures of a segment map: per state its block count and bytes, and the reserved bytes. */
function mapFigures(map) {
  const f = {segments: map.segs.length, reserved: 0, count: [0, 0, 0], bytes: [0, 0, 0]};
  for (const s of map.segs) {
    f.reserved += s.size;
    for (const b of s.blocks) {
      f.count[b.state]++;
      f.bytes[b.state] += b.size;
    }
  }
  return f;
}

/* The active-memory layout of W columns, column c standing for the states after entries lo[c] ..
 * hi[c] - 1 (-1: before the first entry). Each column draws one of its states, the first with its
 * highest total, so its height and the axis' top are the true maximum of what it stands for: stacking
 * every allocation live at any of its states instead piles up allocations that never coexisted (zoomed
 * out, var_inference's 429 MiB peak read 666 MiB). At most `limit` allocations, the largest live at a
 * drawn state, and `keep` (the selected one) wherever it ranks, are bands stacked in allocation order;
 * the rest are summed into one band under them. Returns per column the summary height and the bands
 * there as [id, base] pairs. */
function layout(D, lo, hi, limit, keep) {
  const A = D.A, W = lo.length, e0 = lo[0], e1 = hi[W - 1];
  const total = (i) => (i < 0 ? D.allocBefore : D.allocTotal[i]);
  const rep = new Int32Array(W);
  let yMax = 0;
  for (let c = 0; c < W; c++) {
    let r = lo[c];
    for (let i = lo[c] + 1; i < hi[c]; i++) if (total(i) > total(r)) r = i;
    rep[c] = r;
    if (total(r) > yMax) yMax = total(r);
  }
  /* live at a drawn state: rep is non-decreasing, so at the first one at or after its alloc */
  const drawn = (id) => {
    if (!(A.start[id] < e1 && A.end[id] > e0)) return false;
    let a = 0, b = W;
    while (a < b) { const m = (a + b) >> 1; if (rep[m] < A.start[id]) a = m + 1; else b = m; }
    return a < W && rep[a] < A.end[id];
  };
  const cand = [];
  for (let id = 0; id < A.count; id++) if (drawn(id)) cand.push(id);
  let thr = 0;
  if (cand.length > limit) {
    const sizes = Float64Array.from(cand, (id) => A.size[id]).sort();
    thr = sizes[sizes.length - limit];
  }
  const big = cand.filter((id) => A.size[id] >= thr && A.size[id] > 0).slice(0, Math.max(limit, 0));
  if (keep >= 0 && drawn(keep) && !big.includes(keep)) big.push(keep);
  big.sort((a, b) => A.start[a] - A.start[b] || a - b);
  const summary = new Float64Array(W), bands = new Array(W);
  let stack = [], next = 0;
  for (let c = 0; c < W; c++) {
    const r = rep[c];
    while (next < big.length && A.start[big[next]] <= r) stack.push(big[next++]);
    stack = stack.filter((id) => A.end[id] > r); /* later columns draw later states */
    let base = total(r);
    for (const id of stack) base -= A.size[id];
    summary[c] = base; /* the allocations not drawn as bands, summed */
    const row = [];
    for (const id of stack) { row.push(id, base); base += A.size[id]; }
    bands[c] = row;
  }
  return {summary, bands, yMax, nBig: big.length, nSmall: cand.length - big.length, thr};
}
