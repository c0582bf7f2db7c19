/* alloc_snapshot plot's explorer, the view: the page's controls, the totals timeline and the
 * active-memory view (canvas, one column per pixel, only the visible range) with the peaks marked, their
 * legends, the details panel and the segment map at a chosen entry. State in the URL hash (#t=ENTRY|end&sel=ENTRY&
 * x0=&x1=&axis=time&color=pool&dev=N) so a view can be reopened or screenshotted. window.explorer is
 * what tests drive. */

const T0 = performance.now();
const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#ff9da7',
  '#9c755f', '#8cd17d', '#499894', '#d37295'];
const STATE_COLOUR = ['#3b6fb6', '#f0a030', '#e4e7eb'], PEAK_COLOUR = '#c2410c', PEAK_RESERVED_COLOUR = '#5b6470';
const RESERVED_COLOUR = '#9aa5b1', ALLOC_COLOUR = '#3b6fb6', OOM_COLOUR = '#d62728', NAME_COLOUR = '#7b3fa0';
const RANGE_FILL = 'rgba(176,122,161,0.13)';
const MARGIN_L = 78, MARGIN_R = 12, LIMIT = 1500, ROW_H = 14, ROW_GAP = 3, LABEL_W = 290;

/* A byte count as src/common/text.c writes it for the tools (cl_format_bytes, CL_BYTES_BINARY), so that
 * the page and alloc_snapshot's other output agree: "1023 B", then two decimals in the largest unit that
 * keeps the value at or above 1, rounded as C's printf rounds the exact value: half to even on a tie,
 * where toFixed rounds half up (1152 B is "1.12 KiB", not "1.13"). The explorer suite pins it to the
 * strings of the C unit test (tests/unit/test_text.c). */
function fmtSize(b) {
  if (b < 1024) return b + ' B';
  const units = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'];
  let v = b / 1024, u = 0;
  while (v >= 1024 && u + 1 < units.length) { v /= 1024; u++; }
  if (!Number.isSafeInteger(b)) return v.toFixed(2) + ' ' + units[u];
  const d = 1024n ** BigInt(u + 1), x = BigInt(b) * 100n, r2 = 2n * (x % d);
  let q = x / d;
  if (r2 > d || (r2 === d && q % 2n === 1n)) q++;
  return q / 100n + '.' + String(q % 100n).padStart(2, '0') + ' ' + units[u];
}
const fmtExact = (b) => fmtSize(b) + (b >= 1024 ? ' (' + b + ' B)' : '');
function fmtUs(us) {
  const a = Math.abs(us);
  return a >= 1e6 ? (us / 1e6).toFixed(3) + ' s' : a >= 1e3 ? (us / 1e3).toFixed(3) + ' ms' : us + ' \u00b5s';
}
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) if (k === 'text') e.textContent = attrs[k]; else e.setAttribute(k, attrs[k]);
  for (const c of kids) e.append(c);
  return e;
}

const S = decodeSnapshot(JSON.parse(document.getElementById('snapshot-data').textContent));
const T1 = performance.now();
const st = {dev: 0, D: null, axis: 'event', x0: 0, x1: 1, color: 'allocation', k: 0, sel: -1, hover: -1, lay: null,
  drag: null, peakPx: {}, peakSort: {col: 0, dir: -1}};
const ui = {};

/* --- the axis: entry positions or wall time since the first entry --- */
const xOf = (i) => (i < 0 ? 0 : st.axis === 'time' ? st.D.time[i] - st.D.time[0] : i); /* -1: the left edge */
function xMax() {
  const D = st.D;
  if (st.axis !== 'time') return Math.max(D.n, 1);
  const span = D.time[D.n - 1] - D.time[0];
  return span + Math.max(span / 1000, 1);
}
/* the first entry whose x is at or after x */
function lowerBound(x) {
  const D = st.D;
  if (st.axis !== 'time') return Math.min(D.n, Math.max(0, Math.ceil(x)));
  let lo = 0, hi = D.n;
  while (lo < hi) { const m = (lo + hi) >> 1; if (xOf(m) < x) lo = m + 1; else hi = m; }
  return lo;
}
const plotW = () => Math.max(50, ui.tl.clientWidth - MARGIN_L - MARGIN_R);
const pxToX = (px) => st.x0 + (px - MARGIN_L) / plotW() * (st.x1 - st.x0);
const xToPx = (x) => MARGIN_L + (x - st.x0) / (st.x1 - st.x0) * plotW();
/* the entry a pixel shows: the last one at or before its x (-1: before the first) */
const entryAtPx = (px) => lowerBound(pxToX(px + 1)) - 1;

/* The plot's pixel columns: column c stands for the states after entries lo[c] .. hi[c] - 1 (-1: before
 * the first entry), those seen over its x span: the entries in it, and the one before it unless an entry
 * sits exactly on its left edge. The left edge of the trace (x 0) is where the state before the first
 * entry is seen, so the first column there stands for it too (it can be the peak). */
function columns() {
  const W = Math.floor(plotW()), lo = new Int32Array(W), hi = new Int32Array(W), n = st.D.n;
  const xAt = (c) => st.x0 + c / W * (st.x1 - st.x0);
  let a = lowerBound(xAt(0));
  for (let c = 0; c < W; c++) {
    lo[c] = a < n && xOf(a) === xAt(c) && xAt(c) > 0 ? a : a - 1;
    hi[c] = a = lowerBound(xAt(c + 1));
  }
  return {lo, hi};
}

/* --- colours by stream, pool or annotation --- */
function colourKey(id) {
  const D = st.D, A = D.A;
  if (st.color === 'stream') return 'stream ' + S.streams[A.stream[id]];
  if (st.color === 'pool') {
    const seg = segmentOf(D, A.addrNum[id]);
    return seg ? 'pool (' + seg.pool[0] + ', ' + seg.pool[1] + ')' + (seg.small ? ' small' : ' large') : 'pool unknown';
  }
  return annotationOf(A.start[id]);
}
function segmentOf(D, addr) {
  let lo = 0, hi = D.segs.length - 1, seg = null;
  while (lo <= hi) { const m = (lo + hi) >> 1; if (D.segs[m].addr <= addr) { seg = D.segs[m]; lo = m + 1; } else hi = m - 1; }
  return seg && addr < seg.addr + seg.size ? seg : null;
}
/* the external annotation range open at entry i, else the last user_defined marker before it */
function annotationOf(i) {
  const D = st.D;
  if (i < 0) return 'before the trace';
  for (const r of D.ranges) if (r.e0 <= i && i < r.e1) return r.name;
  let best = 'no annotation', at = -1;
  for (const [e, name] of D.names) if (e <= i && e > at) { at = e; best = name; }
  return best;
}
function colourOf(key) {
  let map = st.colourMap;
  if (!map.has(key)) map.set(key, PALETTE[map.size % PALETTE.length]);
  return map.get(key);
}

/* external_annotations' START/END pairs (matched by name, in order) as entry ranges */
function ranges(D) {
  const open = new Map(), out = [];
  const entryAtTime = (t) => { let lo = 0, hi = D.n; while (lo < hi) { const m = (lo + hi) >> 1; if (D.time[m] < t) lo = m + 1; else hi = m; } return lo; };
  for (const a of D.ann) {
    if (a.start) open.set(a.name, a);
    else if (open.has(a.name)) {
      out.push({name: a.name, t0: open.get(a.name).time, t1: a.time, e0: entryAtTime(open.get(a.name).time), e1: entryAtTime(a.time)});
      open.delete(a.name);
    }
  }
  for (const [name, a] of open) out.push({name, t0: a.time, t1: Infinity, e0: entryAtTime(a.time), e1: D.n});
  return out;
}

/* --- drawing --- */
function sizeCanvas(cv, h) {
  const r = window.devicePixelRatio || 1, w = cv.clientWidth;
  cv.width = Math.round(w * r);
  cv.height = Math.round(h * r);
  cv.style.height = h + 'px';
  const g = cv.getContext('2d');
  g.setTransform(r, 0, 0, r, 0, 0);
  g.clearRect(0, 0, w, h);
  return g;
}
function yAxis(g, h, top, bottom, max) {
  g.fillStyle = '#4b5360';
  g.font = '11px system-ui, sans-serif';
  g.textAlign = 'right';
  g.strokeStyle = '#eceef1';
  for (let q = 0; q <= 4; q++) {
    const y = bottom - (bottom - top) * q / 4;
    g.fillText(fmtSize(Math.round(max * q / 4)), MARGIN_L - 6, y + 4);
    g.beginPath(); g.moveTo(MARGIN_L, y); g.lineTo(MARGIN_L + plotW(), y); g.stroke();
  }
}
function markers(g, top, bottom, labels) {
  const D = st.D, x = (i) => xToPx(xOf(i)), L = MARGIN_L, R = MARGIN_L + plotW();
  g.save();
  g.beginPath(); g.rect(L, 0, R - L, bottom + 20); g.clip();
  g.font = '11px system-ui, sans-serif';
  g.textAlign = 'left';
  for (const r of D.ranges) {
    const a = xToPx(st.axis === 'time' ? r.t0 - D.time[0] : r.e0), b = r.t1 === Infinity ? R :
      xToPx(st.axis === 'time' ? r.t1 - D.time[0] : r.e1);
    g.fillStyle = RANGE_FILL;
    g.fillRect(a, top, Math.max(b - a, 1), bottom - top);
    if (labels) { g.fillStyle = '#7a4d6e'; g.fillText(r.name, Math.max(a, L) + 3, top + 11); }
  }
  for (const [i, name] of D.names) {
    const px = x(i);
    if (px < L || px > R) continue;
    g.strokeStyle = NAME_COLOUR; g.setLineDash([3, 3]);
    g.beginPath(); g.moveTo(px, top); g.lineTo(px, bottom); g.stroke(); g.setLineDash([]);
    if (labels) { g.fillStyle = NAME_COLOUR; g.fillText(name, px + 3, top + 24); }
  }
  for (const [i] of D.oom) {
    const px = x(i);
    g.strokeStyle = OOM_COLOUR; g.lineWidth = 2;
    g.beginPath(); g.moveTo(px, top); g.lineTo(px, bottom); g.stroke(); g.lineWidth = 1;
    if (labels) { g.fillStyle = OOM_COLOUR; g.fillText('OOM', px + 3, top + 37); }
  }
  if (st.k < D.n) {
    const px = x(st.k);
    g.strokeStyle = '#111'; g.beginPath(); g.moveTo(px, top); g.lineTo(px, bottom); g.stroke();
  }
  g.restore();
}
function drawTimeline({lo, hi}) {
  const D = st.D, h = 170, top = 8, bottom = h - 22, W = lo.length, g = sizeCanvas(ui.tl, h);
  const series = [[D.reservedTotal, RESERVED_COLOUR, D.reservedBefore], [D.allocTotal, ALLOC_COLOUR, D.allocBefore]];
  let max = 1;
  const cmax = series.map(([arr, , before]) => {
    const out = new Float64Array(W);
    for (let c = 0; c < W; c++) {
      let m = lo[c] < 0 ? before : arr[lo[c]];
      for (let i = lo[c] + 1; i < hi[c]; i++) if (arr[i] > m) m = arr[i];
      out[c] = m;
      if (m > max) max = m;
    }
    return out;
  });
  st.tlScale = {top, bottom, max};
  yAxis(g, h, top, bottom, max);
  series.forEach(([, colour], s) => {
    g.strokeStyle = colour; g.lineWidth = 1.5; g.beginPath();
    for (let c = 0; c < W; c++) {
      const y = bottom - (bottom - top) * cmax[s][c] / max;
      if (c === 0) g.moveTo(MARGIN_L, y); else g.lineTo(MARGIN_L + c, y);
      g.lineTo(MARGIN_L + c + 1, y);
    }
    g.stroke(); g.lineWidth = 1;
  });
  markers(g, top, bottom, true);
  /* reserved first: where both peaks are at one entry, the allocated one is drawn over it */
  const yOf = (v) => bottom - (bottom - top) * v / max;
  st.peakLabels = [];
  st.peakPx.reserved = peakMarker(g, top, bottom, 'reserved', yOf(D.peakReserved), st.peakLabels);
  st.peakPx.timeline = peakMarker(g, top, bottom, 'allocated', yOf(D.peakAlloc), st.peakLabels);
  g.fillStyle = '#4b5360'; g.textAlign = 'left';
  g.fillText(axisText(st.x0), MARGIN_L, h - 6);
  g.textAlign = 'right';
  g.fillText(axisText(st.x1), MARGIN_L + plotW(), h - 6);
}
/* The two peaks, as the timeline marks them: allocated (what the program holds) and reserved (what the
 * allocator holds of the device), each after the first entry that reaches it (-1: before the first entry). */
const PEAKS = {
  allocated: {entry: (D) => D.peakEntry, bytes: (D) => D.peakAlloc, colour: PEAK_COLOUR, dash: [4, 2]},
  reserved: {entry: (D) => D.peakReservedEntry, bytes: (D) => D.peakReserved, colour: PEAK_RESERVED_COLOUR, dash: [2, 3]}};
/* A peak's moment in the axis' terms: "at entry 12", "at +1.250 ms", "before entry 0". */
function peakMoment(p) {
  if (p < 0) return 'before entry 0';
  return 'at ' + (st.axis === 'time' ? '+' + fmtUs(st.D.time[p] - st.D.time[0]) : 'entry ' + p);
}
/* A peak (PEAKS[which]): a line at its entry (before the first entry: at the trace's left edge), a dot
 * at yDot (-1: none) and its label, moved down a line while it would overlap one in `labels` (the boxes
 * drawn so far, where its own is added). Returns the line's pixel x, null when the peak is out of view. */
function peakMarker(g, top, bottom, which, yDot, labels) {
  const D = st.D, P = PEAKS[which], p = P.entry(D), bytes = P.bytes(D);
  if (!D.n || !bytes) return null;
  const px = xToPx(xOf(p)), L = MARGIN_L, R = MARGIN_L + plotW();
  if (px < L || px >= R) return null;
  const x = Math.floor(px) + 0.5, text = 'peak ' + which + ' ' + fmtSize(bytes) + ' ' + peakMoment(p);
  g.save();
  g.strokeStyle = g.fillStyle = P.colour; g.lineWidth = 1.5; g.setLineDash(P.dash);
  g.beginPath(); g.moveTo(x, top); g.lineTo(x, bottom); g.stroke(); g.setLineDash([]);
  g.beginPath(); g.moveTo(x - 5, top); g.lineTo(x + 5, top); g.lineTo(x, top + 7); g.fill();
  if (yDot >= 0) { g.beginPath(); g.arc(x, yDot, 3.5, 0, 2 * Math.PI); g.fill(); }
  g.font = 'bold 11px system-ui, sans-serif';
  const w = g.measureText(text).width + 8, left = x + 8 + w > R ? x - 8 - w : x + 8;
  let y = yDot >= 0 ? Math.max(yDot - 20, top) : top + 4;
  const overlaps = (b) => left < b.x + b.w && b.x < left + w && y < b.y + b.h && b.y < y + 15;
  for (let k = 0; k < 4 && labels.some(overlaps); k++) y += 17;
  g.fillStyle = 'rgba(255,255,255,0.88)'; g.fillRect(left, y, w, 15);
  g.fillStyle = P.colour; g.textAlign = 'left'; g.fillText(text, left + 4, y + 11);
  g.restore();
  labels.push({which, x: left, y, w, h: 15});
  return px;
}
const axisText = (x) => (st.axis === 'time' ? '+' + fmtUs(Math.round(x)) : 'entry ' + Math.floor(x));

function drawActive({lo, hi}) {
  const D = st.D, h = 300, top = 6, bottom = h - 6, g = sizeCanvas(ui.ac, h);
  const key = [st.dev, st.axis, st.x0, st.x1, lo.length, st.sel].join();
  if (!st.lay || st.layKey !== key) { st.lay = layout(D, lo, hi, LIMIT, st.sel); st.layKey = key; }
  const lay = st.lay, W = lo.length, max = Math.max(lay.yMax, 1), y = (v) => bottom - (bottom - top) * v / max;
  st.yScale = {top, bottom, max};
  yAxis(g, h, top, bottom, max);
  g.fillStyle = '#c8ccd2';
  g.beginPath(); g.moveTo(MARGIN_L, bottom);
  for (let c = 0; c < W; c++) { g.lineTo(MARGIN_L + c, y(lay.summary[c])); g.lineTo(MARGIN_L + c + 1, y(lay.summary[c])); }
  g.lineTo(MARGIN_L + W, bottom); g.fill();
  /* each band: one polygon over the columns it is drawn in (contiguous: it is live from its alloc to
   * its free), a corner only where its base moves; runs are [first column, last column, base] */
  const runs = new Map();
  for (let c = 0; c < W; c++) {
    const row = lay.bands[c];
    for (let j = 0; j < row.length; j += 2) {
      let r = runs.get(row[j]);
      if (!r) runs.set(row[j], r = []);
      const n = r.length;
      if (n && r[n - 2] === c - 1 && r[n - 1] === row[j + 1]) r[n - 2] = c; else r.push(c, c, row[j + 1]);
    }
  }
  for (const [id, r] of runs) {
    const size = D.A.size[id];
    g.fillStyle = id === st.sel ? '#111' : id === st.hover ? '#333' :
      st.color === 'allocation' ? PALETTE[(id * 7) % PALETTE.length] : colourOf(colourKey(id));
    g.beginPath();
    for (let j = 0; j < r.length; j += 3) {
      g.lineTo(MARGIN_L + r[j], y(r[j + 2] + size)); g.lineTo(MARGIN_L + r[j + 1] + 1, y(r[j + 2] + size));
    }
    for (let j = r.length - 3; j >= 0; j -= 3) {
      g.lineTo(MARGIN_L + r[j + 1] + 1, y(r[j + 2])); g.lineTo(MARGIN_L + r[j], y(r[j + 2]));
    }
    g.closePath();
    g.globalAlpha = id === st.sel || id === st.hover ? 1 : 0.72 + 0.28 * ((id * 2654435761) % 4) / 3;
    g.fill();
    g.globalAlpha = 1;
    g.strokeStyle = '#fff'; g.lineWidth = 0.6; g.stroke(); g.lineWidth = 1;
  }
  markers(g, top, bottom, false);
  st.peakPx.active = peakMarker(g, top, bottom, 'allocated', -1, []);
  ui.acNote.textContent = lay.nBig + ' allocation' + (lay.nBig === 1 ? '' : 's') + ' drawn as bands' +
    (lay.nSmall ? '; ' + lay.nSmall + ' smaller than ' + fmtSize(lay.thr) + ' summed in the grey band' : '') +
    '; colour by ' + st.color + '; hover or click a band for its details.';
  legend(runs);
}
function legend(runs) {
  if (st.color === 'allocation') { ui.legend.replaceChildren(); return; }
  const keys = new Map();
  for (const [id] of runs) { const k = colourKey(id); keys.set(k, (keys.get(k) || 0) + 1); }
  ui.legend.replaceChildren(...[...keys].slice(0, 16).map(([k, n]) =>
    el('li', {}, el('span', {class: 'sw', style: 'background:' + colourOf(k)}), k + ' (' + n + ')')));
}
/* What the timeline's lines and markers mean; the peaks with their values and moments, there even where
 * a marker is out of view; OOM, annotation and range markers only where the trace has them. */
function timelineLegend() {
  const D = st.D, item = (swatch, name, text) => el('li', {}, swatch, el('b', {text: name}), ': ' + text);
  const line = (colour, dashed) => el('span', {class: dashed ? 'ln dash' : 'ln', style: 'color:' + colour});
  const items = [
    item(line(RESERVED_COLOUR), 'reserved', 'segment_alloc \u2212 segment_free and segment_map \u2212 segment_unmap, ' +
      'from what the snapshot\'s segments held before the first entry (what the allocator holds of the device)'),
    item(line(ALLOC_COLOUR), 'allocated', 'the sizes of live allocations, from alloc to free_requested, those made ' +
      'before the trace began included (what the program holds)')];
  for (const which of ['allocated', 'reserved']) {
    const P = PEAKS[which], p = P.entry(D);
    if (P.bytes(D)) items.push(item(line(P.colour, true), 'peak ' + which, fmtExact(P.bytes(D)) + ' ' +
      (p < 0 ? 'before the first trace entry' : 'after ' + entryText(p))));
  }
  if (D.oom.size) items.push(item(line(OOM_COLOUR), 'OOM', D.oom.size + ' out-of-memory entr' + (D.oom.size === 1 ? 'y' : 'ies')));
  if (D.names.size) items.push(item(line(NAME_COLOUR, true), 'annotation', 'a user_defined entry, with its name'));
  if (D.ranges.length) items.push(item(el('span', {class: 'sw', style: 'background:' + RANGE_FILL}), 'annotated range',
    'an external_annotations START/END pair, with its name'));
  items.push(item(line('#111'), 'picked entry', 'the segment map\'s moment (click a timeline or move the slider)'));
  ui.tlLegend.replaceChildren(...items);
}
