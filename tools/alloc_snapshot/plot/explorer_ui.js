/* alloc_snapshot plot's explorer, the interaction: the details panel, the table of the allocations live
 * at the peak, the segment map panel and its legend, the controls (zoom, pan, peak, axis, colour, entry slider, device),
 * mouse and keys, the URL hash, and the window.explorer object that tests drive. */

function entryText(i) {
  const D = st.D;
  if (i < 0) return 'before the trace began';
  if (i >= D.n) return 'live at the snapshot';
  return 'entry ' + i + ' (+' + fmtUs(D.time[i] - D.time[0]) + ', time_us ' + D.time[i] + ')';
}
/* A frame as alloc_snapshot folded writes it, "name (file:line)": "??" for no name, no ":line" for line
 * 0, no parenthesis for no file; so that a frame copied from folded output finds its rows. */
const frameName = (f) => f.name || '??';
const frameWhere = (f) => (f.filename ? ' (' + f.filename + (f.line > 0 ? ':' + f.line : '') + ')' : '');
const frameText = (f) => frameName(f) + frameWhere(f);
const frameItem = (tag, f) => el(tag, {}, el('b', {text: frameName(f)}), frameWhere(f));
/* what the filter compares, the frame text and the query alike: lower case, and ';' as ':' (folded
 * writes a ';' of a frame's text as ':', ';' parting its frames) */
const searchText = (t) => t.toLowerCase().replace(/;/g, ':');
function framesList(title, frames) {
  const box = el('div', {class: 'frames'}, el('h4', {text: title}));
  if (!frames.length) box.append(el('p', {class: 'note', text: 'no frames recorded'}));
  else box.append(el('ol', {}, ...frames.map((f) => frameItem('li', f))));
  return box;
}
/* the details of allocation id into the panel */
function showAllocation(id, extra) {
  const D = st.D, A = D.A, seg = segmentOf(D, A.addrNum[id]);
  const rows = [['address', '0x' + A.hexOf(id)], ['size', fmtExact(A.size[id])],
    ['requested', A.req[id] >= 0 ? fmtExact(A.req[id]) : 'not recorded (the block is not in the snapshot)'],
    ['stream', S.streams[A.stream[id]]],
    ['pool', seg ? '(' + seg.pool[0] + ', ' + seg.pool[1] + ') ' + (seg.small ? 'small' : 'large') + ', segment 0x' + seg.hex
      : 'unknown (its segment is not in the snapshot)'],
    ['allocated', A.start[id] < 0 ? 'before the trace began (time and frames unknown)' : entryText(A.start[id])],
    ['freed', A.end[id] < 0 ? 'before the trace began' : A.end[id] >= D.n ? 'live at the snapshot'
      : entryText(A.end[id]) + (A.done[id] > A.end[id] && A.done[id] < D.n ? '; completed at entry ' + A.done[id]
        : A.done[id] >= D.n && D.hasDone ? '; still pending at the snapshot' : '')]];
  if (A.start[id] >= 0) rows.push(['annotation', annotationOf(A.start[id])]);
  const box = el('div', {}, el('h3', {text: 'Allocation 0x' + A.hexOf(id)}),
    el('table', {class: 'kv'}, ...rows.map(([k, v]) => el('tr', {}, el('th', {text: k}), el('td', {text: v})))));
  if (extra) box.append(el('p', {class: 'note', text: extra}));
  box.append(framesList('Frames of the alloc entry', A.start[id] >= 0 ? S.frames(A.stk[id]) : []));
  if (A.bstk[id] > 0 || A.req[id] >= 0) box.append(framesList('Frames of the block in the snapshot', S.frames(A.bstk[id])));
  ui.details.replaceChildren(box);
}
function showText(title, text) { ui.details.replaceChildren(el('h3', {text: title}), el('p', {text})); }

/* The selection, one state whether a band or a row of the peak table was clicked: the band drawn dark
 * (as a band even where it would be summed: layout's keep), its details pinned, its row marked. The
 * caller redraws. */
function select(id) {
  st.sel = id;
  if (id >= 0) showAllocation(id);
  for (const tr of ui.peakBody.children) tr.classList.toggle('sel', +tr.dataset.id === id);
}

/* --- the allocations live at the peak: who holds the memory then --- */
const PEAK_ROWS = 500; /* more would only slow the page: the filter still searches all */
const order = (a, b) => (a < b ? -1 : a > b ? 1 : 0);
/* key: the column's value to sort by; dir: its first direction (largest or earliest first) */
const PEAK_COLS = [
  {title: 'size', key: (r) => r.size, dir: -1}, {title: '% of peak', key: (r) => r.size, dir: -1},
  {title: 'address', key: (r) => st.D.A.addrNum[r.id], dir: 1}, {title: 'stream', key: (r) => BigInt(r.stream), dir: 1},
  {title: 'allocated', key: (r) => r.start, dir: 1}, {title: 'frames', key: (r) => r.text, dir: 1}];

/* the alloc entry's frames; for an allocation made before the trace, or recorded without them, its block's */
function stackOf(D, id) {
  const f = D.A.start[id] >= 0 ? S.frames(D.A.stk[id]) : [];
  return f.length ? f : S.frames(D.A.bstk[id]);
}
function peakRows(D) {
  const A = D.A;
  return liveAt(D, D.peakEntry).map((id, rank) => {
    const frames = stackOf(D, id), text = frames.map(frameText).join('\n');
    return {id, rank, size: A.size[id], start: A.start[id], stream: S.streams[A.stream[id]], frames, text,
      low: searchText(text)};
  });
}
function framesCell(r) {
  const td = el('td', {class: 'fr', title: r.text});
  if (!r.frames.length) { td.append(el('span', {class: 'none', text: 'no frames recorded'})); return td; }
  const open = st.peakOpen.has(r.id);
  for (const f of open ? r.frames : r.frames.slice(0, 1))
    td.append(frameItem('div', f));
  if (r.frames.length > 1) {
    const more = el('button', {type: 'button', class: 'more',
      text: open ? 'fewer' : '+' + plural(r.frames.length - 1, 'frame')});
    more.onclick = (ev) => {
      ev.stopPropagation(); /* expanding is not selecting */
      if (open) st.peakOpen.delete(r.id); else st.peakOpen.add(r.id);
      td.replaceWith(framesCell(r));
    };
    td.firstChild.append(more);
  }
  return td;
}
function peakRow(r) {
  const D = st.D, share = 100 * r.size / D.peakAlloc, tr = el('tr', {'data-id': r.id},
    el('td', {class: 'num', 'data-bytes': r.size, title: fmtExact(r.size), text: fmtSize(r.size)}),
    el('td', {class: 'num', text: share < 0.05 && r.size ? '<0.1%' : share.toFixed(1) + '%'}),
    el('td', {class: 'mono', text: '0x' + D.A.hexOf(r.id)}), el('td', {class: 'mono', text: r.stream}),
    el('td', {text: r.start < 0 ? 'before the trace' : 'entry ' + r.start}), framesCell(r));
  if (r.id === st.sel) tr.classList.add('sel');
  return tr;
}
/* Where the peak is, as a phrase: after an entry; before the first entry (the trace frees more than it
 * allocates first: a wrapped ring's blocks were allocated before it); an empty trace's is the snapshot. */
function peakWhen(D) {
  if (!D.n) return 'in the blocks allocated at the snapshot (the snapshot has no trace entries)';
  if (D.peakEntry < 0) return 'before the first trace entry (the trace frees what was allocated before it)';
  return 'after ' + entryText(D.peakEntry);
}
function renderPeak() {
  const D = st.D;
  ui.peak.hidden = !D.peakAlloc;
  if (ui.peak.hidden) return;
  ui.peakTitle.textContent = D.n ? 'Who holds the memory at the peak' : 'Who holds the memory at the snapshot';
  const rows = D.peakRows, q = searchText(ui.peakFind.value.trim()), {col, dir} = st.peakSort;
  const key = PEAK_COLS[col].key;
  const shown = rows.filter((r) => r.low.includes(q)).sort((a, b) => dir * order(key(a), key(b)) || a.rank - b.rank);
  ui.peakFig.textContent = fmtExact(D.peakAlloc) + ' allocated ' + peakWhen(D) + ', held by ' +
    plural(rows.length, 'live allocation') + ' (reserved then ' +
    fmtSize(D.peakEntry < 0 ? D.reservedBefore : D.reservedTotal[D.peakEntry]) + '). ' +
    (D.n ? 'Click a row to select its band, a heading to sort.' : 'Click a row for its details, a heading to sort.');
  ui.peakCount.textContent = (q ? shown.length + ' of ' + rows.length + ' match' : '') +
    (shown.length > PEAK_ROWS ? (q ? '; ' : '') + 'the first ' + PEAK_ROWS + ' shown' : '');
  ui.peakBody.replaceChildren(...shown.slice(0, PEAK_ROWS).map(peakRow));
  [...ui.peakHeadRow.children].forEach((th, i) => {
    th.setAttribute('aria-sort', i !== col ? 'none' : dir < 0 ? 'descending' : 'ascending');
    th.textContent = PEAK_COLS[i].title + (i === col ? (dir < 0 ? ' \u25bc' : ' \u25b2') : '');
  });
}
function sortPeak(col) {
  st.peakSort = st.peakSort.col === col ? {col, dir: -st.peakSort.dir} : {col, dir: PEAK_COLS[col].dir};
  renderPeak();
}
/* a row's band: selected, and the peak brought into view (every row's band is drawn there) */
function selectRow(id) {
  const x = xOf(st.D.peakEntry), span = st.x1 - st.x0;
  select(id);
  if (!st.D.n) return;
  if (x < st.x0 || x >= st.x1 || (st.D.peakEntry < 0 && st.x0 > 0)) setRange(x - span / 2, x + span / 2); else render();
}
/* the peak zoomed to (at most a twentieth of the trace around it) and picked as the segment map's entry
 * (-1: the map before the first entry) */
function goPeak() {
  const x = xOf(st.D.peakEntry), span = Math.min(st.x1 - st.x0, xMax() / 20);
  clampRange(x - span / 2, x + span / 2);
  setEntry(st.D.peakEntry);
}

/* --- the segment map at st.k --- */
/* "1 block", "2 blocks" */
function plural(n, word) {
  return n + ' ' + word + (n === 1 ? '' : 's');
}

function renderMap() {
  const D = st.D, map = segmentsAt(D, st.k), f = mapFigures(map);
  st.map = map;
  const when = map.exact ? 'of the snapshot itself' : st.k < 0 ? 'before the first trace entry' : 'after ' + entryText(st.k);
  const fig = plural(f.segments, 'segment') + ', reserved ' + fmtExact(f.reserved) + '; ' + STATE.map((s, i) =>
    s + ' ' + plural(f.count[i], 'block') + ' ' + fmtExact(f.bytes[i])).join('; ');
  ui.mapWhen.textContent = 'Segment map ' + when;
  ui.mapFig.textContent = fig;
  const notes = [];
  if (!map.exact) {
    notes.push('Reconstructed from the snapshot\'s segments and the trace: blocks are the allocations live ' +
      '(or pending free) then; the rest of each segment is shown inactive, as how the allocator had split it ' +
      'is not in the trace. Expandable segments are shown at their final extent.');
    const pre = map.segs.reduce((n, s) => n + s.blocks.filter((b) => b.alloc !== undefined && D.A.start[b.alloc] < 0).length, 0);
    if (pre) notes.push(pre + ' of these blocks were allocated before the trace began: their alloc time and frames are unknown.');
    if (map.outside.length) notes.push(map.outside.length + ' live allocations lie in no segment known at this entry.');
    if (map.segs.some((s) => s.known === false)) notes.push('Segments drawn dashed were freed later in the trace: their pool is unknown.');
  }
  ui.mapNote.textContent = notes.join(' ');
  const cv = ui.map, rows = map.segs.length, h = Math.max(rows * (ROW_H + ROW_GAP) + 4, 20);
  const g = sizeCanvas(cv, Math.min(h, 30000)), bar = cv.clientWidth - LABEL_W - 8;
  g.font = '11px ui-monospace, monospace';
  map.segs.forEach((s, r) => {
    const y = 2 + r * (ROW_H + ROW_GAP);
    g.fillStyle = '#1d2126'; g.textAlign = 'left';
    g.fillText('0x' + s.hex + ' ' + fmtSize(s.size) + (s.pool ? ' (' + s.pool[0] + ',' + s.pool[1] + ')' : ' (?)') +
      (s.small ? ' small' : '') + (s.expandable ? ' exp' : ''), 2, y + ROW_H - 3);
    for (const b of s.blocks) {
      const x0 = LABEL_W + (b.addr - s.addr) / s.size * bar, w = Math.max(b.size / s.size * bar, 1);
      g.fillStyle = STATE_COLOUR[b.state];
      g.fillRect(x0, y, w, ROW_H);
      if (b.alloc !== undefined && D.A.start[b.alloc] < 0 && b.state !== 2) { g.fillStyle = 'rgba(0,0,0,0.25)'; g.fillRect(x0, y + ROW_H - 3, w, 3); }
    }
    g.strokeStyle = s.known === false ? '#c00' : '#5f6672';
    if (s.known === false) g.setLineDash([3, 2]);
    g.strokeRect(LABEL_W + 0.5, y + 0.5, bar - 1, ROW_H - 1);
    g.setLineDash([]);
  });
  mapLegend(map);
  ui.slider.value = String(st.k);
  ui.sliderText.textContent = st.k >= D.n ? 'snapshot' : st.k < 0 ? 'before entry 0' : 'entry ' + st.k;
}
/* What the map's colours and marks mean; the strip and the dashed outline only where the map has them. */
const STATE_MEANING = ['in use by the program', 'freed by the program, waiting for its streams\' events before reuse',
  'free: cached in the segment, reusable'];
function mapLegend(map) {
  const D = st.D, item = (style, name, text) => el('li', {}, el('span', {class: 'sw', style}), el('b', {text: name}), ': ' + text);
  const items = STATE.map((s, i) => item('background:' + STATE_COLOUR[i], s, STATE_MEANING[i] +
    (i === 2 && !map.exact ? '; here also what was not allocated at this entry (the split is not in the trace)' : '')));
  if (map.segs.some((s) => s.blocks.some((b) => b.alloc !== undefined && b.state !== 2 && D.A.start[b.alloc] < 0)))
    items.push(item('background:' + STATE_COLOUR[0] + ';box-shadow:inset 0 -3px rgba(0,0,0,0.25)', 'dark strip',
      'allocated before the trace began: its alloc time and frames are unknown'));
  if (map.segs.some((s) => s.known === false))
    items.push(item('background:#fff;border:1px dashed #c00', 'dashed outline',
      'a segment the trace frees after this entry: its pool is unknown'));
  ui.mapLegend.replaceChildren(...items);
}
function mapHit(ev) {
  const r = ui.map.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
  const s = st.map.segs[Math.floor((y - 2) / (ROW_H + ROW_GAP))], bar = ui.map.clientWidth - LABEL_W - 8;
  if (!s || x < LABEL_W) return null;
  const addr = s.addr + (x - LABEL_W) / bar * s.size;
  return s.blocks.find((b) => addr >= b.addr && addr < b.addr + b.size) || null;
}
function showBlock(b) {
  if (!b) return;
  if (b.alloc !== undefined && b.state !== 2) showAllocation(b.alloc, 'Block state: ' + STATE[b.state]);
  else showText('Inactive 0x' + (b.hex || Math.round(b.addr).toString(16)), fmtExact(b.size) + ' ' + (b.gap ?
    'not allocated at this entry (cached or released; the split is unknown)' : 'inactive block in the snapshot'));
}

/* --- view changes --- */
function clampRange(x0, x1) {
  const max = xMax(), minSpan = st.axis === 'time' ? 1 : 4;
  let span = Math.min(Math.max(x1 - x0, minSpan), max);
  x0 = Math.max(0, Math.min(x0, max - span));
  st.x0 = x0; st.x1 = x0 + span;
}
function setRange(x0, x1) { clampRange(x0, x1); render(); }
function zoomAt(px, factor) {
  const x = pxToX(px);
  setRange(x - (x - st.x0) * factor, x + (st.x1 - x) * factor);
}
function pan(frac) { setRange(st.x0 + (st.x1 - st.x0) * frac, st.x1 + (st.x1 - st.x0) * frac); }
function setAxis(a) {
  if (a === 'time' && !st.D.byTimeOk) a = 'event';
  const i0 = entryAtPx(MARGIN_L), i1 = entryAtPx(MARGIN_L + plotW());
  st.axis = a;
  ui.axis.value = a;
  st.x0 = 0; st.x1 = xMax();
  if (i1 > i0 && (i0 > 0 || i1 < st.D.n - 1)) setRange(xOf(Math.max(i0, 0)), xOf(Math.min(i1 + 1, st.D.n - 1)));
  else render();
}
/* k -1 (before the first entry) only as the peak's moment: the slider and clicks pick 0 .. n */
function setEntry(k) { st.k = Math.max(-1, Math.min(k, st.D.n)); renderMap(); render(); }
function render() {
  if (!st.D.n) return;
  const cols = columns();
  drawTimeline(cols);
  drawActive(cols);
  const i0 = Math.max(lowerBound(st.x0), 0), i1 = Math.max(cols.hi[cols.hi.length - 1] - 1, 0);
  ui.range.textContent = 'showing entries ' + i0 + '\u2013' + i1 + ' of ' + st.D.n +
    (st.axis === 'time' ? ', +' + fmtUs(Math.round(st.x0)) + ' to +' + fmtUs(Math.round(st.x1)) : '');
  writeHash();
}
function writeHash() {
  const h = 't=' + (st.k >= st.D.n ? 'end' : st.k) + (st.sel >= 0 && st.D.A.start[st.sel] >= 0 ? '&sel=' + st.D.A.start[st.sel] : '') +
    '&x0=' + +st.x0.toFixed(3) + '&x1=' + +st.x1.toFixed(3) + (st.axis === 'time' ? '&axis=time' : '') +
    (st.color !== 'allocation' ? '&color=' + st.color : '') + (st.dev ? '&dev=' + st.dev : '');
  if (location.hash.slice(1) !== h) history.replaceState(null, '', '#' + h);
}

/* the band under a mouse position on the active view: an allocation id, -2 for the summed band */
function bandAt(ev) {
  const r = ui.ac.getBoundingClientRect(), px = ev.clientX - r.left, y = ev.clientY - r.top, c = Math.floor(px - MARGIN_L);
  if (!st.lay || c < 0 || c >= st.lay.bands.length) return -1;
  const {top, bottom, max} = st.yScale, v = (bottom - y) / (bottom - top) * max, row = st.lay.bands[c];
  for (let j = 0; j < row.length; j += 2) if (v >= row[j + 1] && v < row[j + 1] + st.D.A.size[row[j]]) return row[j];
  return v >= 0 && v < st.lay.summary[c] ? -2 : -1;
}
function onMove(ev, canvas) {
  if (st.drag) {
    const dx = ev.clientX - st.drag.px;
    if (Math.abs(dx) > 3) st.drag.moved = true;
    if (st.drag.moved) setRange(st.drag.x0 - dx / plotW() * (st.drag.x1 - st.drag.x0), st.drag.x1 - dx / plotW() * (st.drag.x1 - st.drag.x0));
    return;
  }
  if (canvas !== ui.ac) return;
  const id = bandAt(ev);
  if (id === -2) showText('Summed band', st.lay.nSmall + ' allocations smaller than ' + fmtSize(st.lay.thr) + ' in this range, drawn as one band.');
  else if (id >= 0 && st.sel < 0) showAllocation(id);
  if (id !== st.hover) { st.hover = id; if (st.sel < 0) drawActive(columns()); }
}
function onUp(ev, canvas) {
  const d = st.drag;
  st.drag = null;
  if (!d || d.moved) return;
  const px = ev.clientX - canvas.getBoundingClientRect().left;
  if (canvas === ui.ac) {
    const id = bandAt(ev);
    select(id >= 0 && id !== st.sel ? id : -1);
  }
  if (px >= MARGIN_L) setEntry(Math.max(entryAtPx(px), 0));
}
function wire(canvas) {
  canvas.addEventListener('wheel', (ev) => {
    ev.preventDefault();
    zoomAt(ev.clientX - canvas.getBoundingClientRect().left, ev.deltaY > 0 ? 1.25 : 0.8);
  }, {passive: false});
  canvas.addEventListener('mousedown', (ev) => { st.drag = {px: ev.clientX, x0: st.x0, x1: st.x1, moved: false}; });
  canvas.addEventListener('mousemove', (ev) => onMove(ev, canvas));
  canvas.addEventListener('mouseup', (ev) => onUp(ev, canvas));
  canvas.addEventListener('mouseleave', () => { st.drag = null; });
}

function build() {
  const D0 = S.devices[0], app = document.getElementById('app');
  const btn = (text, f) => { const b = el('button', {type: 'button', text}); b.onclick = f; return b; };
  ui.dev = el('select', {'aria-label': 'device'}, ...S.devices.map((D, i) => el('option', {value: i, text: 'device ' + D.d})));
  ui.axis = el('select', {'aria-label': 'x axis'}, el('option', {value: 'event', text: 'x: entry order'}), el('option', {value: 'time', text: 'x: wall time'}));
  ui.colour = el('select', {'aria-label': 'colour'}, ...['allocation', 'stream', 'pool', 'annotation'].map((c) => el('option', {value: c, text: 'colour by ' + c})));
  ui.slider = el('input', {type: 'range', min: 0, max: D0 ? D0.n : 0, value: D0 ? D0.n : 0, 'aria-label': 'entry'});
  ui.sliderText = el('span', {class: 'mono'});
  ui.range = el('span', {class: 'range mono'});
  ui.tl = el('canvas', {id: 'timeline'}); ui.ac = el('canvas', {id: 'active'});
  ui.acNote = el('p', {class: 'note'}); ui.legend = el('ul', {class: 'legend', id: 'colour-legend'});
  ui.tlLegend = el('ul', {class: 'legend', id: 'timeline-legend'}); ui.mapLegend = el('ul', {class: 'legend', id: 'segmap-legend'});
  ui.details = el('div', {id: 'details'}, el('p', {class: 'note', text: 'Hover or click an allocation, or a block of the segment map.'}));
  ui.map = el('canvas', {id: 'segmap'}); ui.mapWhen = el('h3'); ui.mapFig = el('p', {id: 'segmap-figures', class: 'mono'});
  ui.mapNote = el('p', {class: 'note'}); ui.summary = el('p', {id: 'summary', class: 'meta'});
  ui.peakBtn = btn('peak', goPeak);
  ui.peakBtn.title = 'zoom to the peak of allocated memory and show the segment map there (key p)';
  ui.peakFig = el('p', {class: 'note'}); ui.peakCount = el('span', {class: 'note'});
  ui.peakFind = el('input', {type: 'search', placeholder: 'filter by frame text', 'aria-label': 'filter by frame text'});
  ui.peakHeadRow = el('tr', {}, ...PEAK_COLS.map((c, i) => {
    const th = el('th', {scope: 'col'});
    th.onclick = () => sortPeak(i);
    return th;
  }));
  ui.peakBody = el('tbody');
  ui.peakTitle = el('h3', {text: 'Who holds the memory at the peak'});
  ui.peak = el('section', {id: 'peak'}, el('div', {class: 'peakhead'}, ui.peakTitle,
    ui.peakCount, ui.peakFind), ui.peakFig,
    el('div', {class: 'peakbox'}, el('table', {id: 'peak-table'}, el('thead', {}, ui.peakHeadRow), ui.peakBody)));
  const bar = el('div', {class: 'bar'}, ui.dev, btn('zoom in', () => zoomAt(MARGIN_L + plotW() / 2, 0.5)),
    btn('zoom out', () => zoomAt(MARGIN_L + plotW() / 2, 2)), btn('reset', () => setRange(0, xMax())), ui.peakBtn, ui.axis,
    ui.colour, ui.range);
  ui.tlTitle = el('h3', {text: 'Allocated and reserved'});
  ui.acTitle = el('h3', {text: 'Active memory: each allocation from alloc to free'});
  app.replaceChildren(ui.summary, bar, el('div', {class: 'main'}, el('div', {class: 'plots'},
    ui.tlTitle, ui.tl, ui.tlLegend, ui.peak, ui.acTitle,
    ui.ac, ui.acNote, ui.legend, ui.mapWhen, el('div', {class: 'slider'}, 'entry ', ui.slider, ' ', ui.sliderText), ui.mapFig, ui.mapNote,
    ui.mapLegend, el('div', {class: 'mapbox'}, ui.map)), ui.details));
  wire(ui.tl); wire(ui.ac);
  ui.dev.onchange = () => selectDevice(+ui.dev.value);
  ui.axis.onchange = () => setAxis(ui.axis.value);
  ui.colour.onchange = () => { st.color = ui.colour.value; st.colourMap = new Map(); st.lay = null; render(); };
  ui.slider.oninput = () => setEntry(+ui.slider.value);
  ui.peakFind.oninput = renderPeak;
  ui.peakBody.addEventListener('click', (ev) => { const tr = ev.target.closest('tr'); if (tr) selectRow(+tr.dataset.id); });
  ui.map.addEventListener('mousemove', (ev) => { if (st.sel < 0) showBlock(mapHit(ev)); });
  ui.map.addEventListener('click', (ev) => showBlock(mapHit(ev)));
  document.addEventListener('keydown', (ev) => {
    if (ev.target.tagName === 'INPUT' || ev.target.tagName === 'SELECT') return;
    const k = {ArrowLeft: () => pan(-0.2), ArrowRight: () => pan(0.2), '+': () => zoomAt(MARGIN_L + plotW() / 2, 0.5),
      '=': () => zoomAt(MARGIN_L + plotW() / 2, 0.5), '-': () => zoomAt(MARGIN_L + plotW() / 2, 2), Home: () => setRange(0, xMax()), p: () => ui.peakBtn.click()}[ev.key];
    if (k) { ev.preventDefault(); k(); }
  });
  window.addEventListener('resize', () => { st.lay = null; render(); renderMap(); });
}
function selectDevice(i) {
  const D = st.D = S.devices[i];
  st.dev = i; st.sel = -1; st.hover = -1; st.lay = null; st.colourMap = new Map();
  if (!D.ranges) D.ranges = ranges(D);
  if (!D.peakRows) D.peakRows = peakRows(D);
  st.peakOpen = new Set();
  st.axis = 'event'; ui.axis.value = 'event';
  ui.axis.disabled = !D.byTimeOk;
  st.x0 = 0; st.x1 = xMax(); st.k = D.n;
  ui.slider.max = String(D.n);
  const f = mapFigures(segmentsAt(D, D.n));
  ui.summary.textContent = 'device ' + D.d + ': ' + D.n + ' trace entr' + (D.n === 1 ? 'y' : 'ies') + ', ' +
    plural(D.segs.length, 'segment') + ', reserved ' +
    fmtSize(f.reserved) + ', allocated ' + fmtSize(f.bytes[0]) + '; peak allocated ' + fmtSize(D.peakAlloc) +
    ', peak reserved ' + fmtSize(D.peakReserved) + '; ' + D.oom.size + ' OOM, ' + plural(D.names.size, 'annotation') + ', ' +
    plural(D.ranges.length, 'annotated range') +
    (D.unknownFrees ? '; ' + (D.unknownFrees === 1 ? '1 free of an allocation' : D.unknownFrees + ' frees of allocations') +
      ' made before the trace began' : '') +
    (D.n ? '' : '; the trace is empty (memory history was not recorded): only the segment map and the blocks ' +
      'allocated at the snapshot are shown') + '.';
  ui.tl.hidden = ui.ac.hidden = ui.tlTitle.hidden = ui.acTitle.hidden = ui.tlLegend.hidden = !D.n;
  timelineLegend();
  ui.peakBtn.disabled = !D.n || !D.peakAlloc;
  render();
  renderMap();
  renderPeak();
}
function readHash(h) {
  const D = st.D;
  if (h.has('dev') && S.devices[+h.get('dev')]) { ui.dev.value = h.get('dev'); selectDevice(+h.get('dev')); }
  if (h.get('color')) { st.color = ui.colour.value = h.get('color'); st.colourMap = new Map(); }
  if (h.get('axis') === 'time' && st.D.byTimeOk) { st.axis = ui.axis.value = 'time'; st.x1 = xMax(); }
  if (h.has('x0') && h.has('x1')) setRange(+h.get('x0'), +h.get('x1'));
  if (h.has('t')) st.k = h.get('t') === 'end' ? st.D.n : Math.max(-1, Math.min(+h.get('t') || 0, st.D.n));
  if (h.has('sel') && st.D.A.byStart.has(+h.get('sel'))) select(st.D.A.byStart.get(+h.get('sel')));
  return D;
}

build();
if (!S.devices.length) document.getElementById('app').replaceChildren(el('p', {class: 'empty', text: 'The snapshot holds no segments and no trace entries: nothing to draw.'}));
else {
  const hash = new URLSearchParams(location.hash.slice(1)); /* read before the first draw rewrites it */
  selectDevice(0);
  readHash(hash);
  render();
  renderMap();
}
const T2 = performance.now();
window.explorer = {S, st, ui, render, renderMap, setEntry, setRange, setAxis, zoomAt, entryAtPx, xToPx, xOf, pxToX,
  showAllocation, goPeak, segmentsAt, mapFigures, fmtSize, timing: {parse: T1 - T0, firstDraw: T2 - T0, sinceNavigation: T2}};
document.getElementById('timing').textContent = 'Drawn ' + Math.round(T2) + ' ms after the page was opened (' +
  Math.round(T1 - T0) + ' ms to read and walk the trace, ' + Math.round(T2 - T1) + ' ms to draw).';
