/* The explorer's test driver (tests/explorer/run.py appends it to pages of alloc_snapshot plot): it
 * drives the page with real DOM events (wheel, drag, keys, clicks, hover) and checks exact state against
 * tests/explorer/explorer.json, then writes PASS / FAIL lines between BEGIN and END into the DOM for
 * run.py to read. The mode is run.py's: window.__mode ('full', 'hash', 'pending', 'peak', 'peaks', 'notrace', 'smoke' or 'empty');
 * in 'peak' and 'peaks' modes window.__expect holds what run.py computed from the snapshot itself. */
window.addEventListener('load', function () {
  const out = [];
  const check = (name, got, want) => {
    const ok = JSON.stringify(got) === JSON.stringify(want);
    out.push((ok ? 'PASS ' : 'FAIL ') + name + (ok ? '' : ': got ' + JSON.stringify(got) + ', want ' + JSON.stringify(want)));
  };
  const $ = (id) => document.getElementById(id);
  const text = (e) => (e ? e.textContent : null);
  const ex = window.explorer;
  const at = (canvas, px, py, more) => {
    const r = canvas.getBoundingClientRect();
    return Object.assign({clientX: r.left + px, clientY: r.top + py, bubbles: true, cancelable: true}, more || {});
  };
  const mouse = (canvas, type, px, py) => canvas.dispatchEvent(new MouseEvent(type, at(canvas, px, py)));
  const range = () => [+ex.st.x0.toFixed(6), +ex.st.x1.toFixed(6)];
  const button = (label) => [...document.querySelectorAll('button')].find((b) => b.textContent === label);
  const rows = () => [...$('details').querySelectorAll('tr')].map((tr) => tr.children[0].textContent + ': ' + tr.children[1].textContent);
  const frames = () => [...$('details').querySelectorAll('.frames')].map((f) =>
    f.querySelector('h4').textContent + ' = ' + [...f.querySelectorAll('li')].map((li) => li.textContent).join(' / '));
  /* a legend's items, and the names in bold that start them */
  const items = (id) => [...document.querySelectorAll('#' + id + ' li')].map((li) => li.textContent);
  const names = (id) => [...document.querySelectorAll('#' + id + ' li > b')].map((b) => b.textContent);
  /* whether a pixel of exactly colour rgb is in columns x0 .. x1 of canvas cv */
  const colourIn = (cv, x0, x1, rgb) => {
    const g = cv.getContext('2d');
    for (let x = Math.max(Math.floor(x0), 0); x <= x1 && x < cv.width; x++) {
      const d = g.getImageData(x, 0, 1, cv.height).data;
      for (let y = 0; y < cv.height; y++) if (d[4 * y] === rgb[0] && d[4 * y + 1] === rgb[1] && d[4 * y + 2] === rgb[2]) return true;
    }
    return false;
  };
  const RESERVED_PEAK_RGB = [0x5b, 0x64, 0x70];
  /* the peak labels drawn on the timeline: which, and whether any two of them overlap */
  const labels = () => {
    const L = ex.st.peakLabels;
    const apart = L.every((a, i) => L.every((b, j) => i >= j || !(a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h)));
    return [L.map((b) => b.which), apart ? 'apart' : 'overlapping'];
  };
  const MAP_END = '3 segments, reserved 6.00 MiB (6291456 B); active_allocated 3 blocks 1.50 MiB (1573376 B); ' +
    'active_pending_free 1 block 512.00 KiB (524288 B); inactive 3 blocks 4.00 MiB (4193792 B)';
  const MAP_12 = '4 segments, reserved 8.00 MiB (8388608 B); active_allocated 4 blocks 3.50 MiB (3670528 B); ' +
    'active_pending_free 1 block 512.00 KiB (524288 B); inactive 3 blocks 4.00 MiB (4193792 B)';
  const MAP_3 = '2 segments, reserved 4.00 MiB (4194304 B); active_allocated 4 blocks 3.00 MiB (3145728 B); ' +
    'active_pending_free 0 blocks 0 B; inactive 1 block 1.00 MiB (1048576 B)';
  try {
    check('the page drew', !!ex, true);
    const mode = window.__mode;
    if (mode === 'empty') {
      check('nothing to draw, said', text(document.querySelector('#app .empty')),
        'The snapshot holds no segments and no trace entries: nothing to draw.');
    } else if (mode === 'smoke') {
      check('devices in the selector', document.querySelectorAll('select[aria-label=device] option').length, window.__devices);
    } else if (mode === 'peak' || mode === 'peaks') {
      /* 'peaks': the peaks, their markers and legend only (a trace with more live allocations at its peak
       * than the table lists) */
      const E = window.__expect, D = ex.st.D, n = E.n;
      /* first the axes, with what the page has had from the start (so that this fails on a page
       * without the rest): the scale's max is the value the axis shows at its top */
      check('axis: active memory zoomed out is the peak', ex.st.yScale.max, E.peak.bytes);
      for (const z of E.zooms) {
        if (ex.st.axis !== z.axis) ex.setAxis(z.axis);
        ex.setRange(z.x0, z.x1);
        const at = z.axis + ' [' + z.x0 + ', ' + z.x1 + ')';
        check('axis: active memory over ' + at, ex.st.yScale.max, z.active);
        check('axis: allocated and reserved over ' + at, ex.st.tlScale && ex.st.tlScale.max, z.timeline);
      }
      ex.setAxis('event');
      button('reset').click();
      const ac = $('active'), tl = $('timeline'), lineAt = (cv, px) => {
        /* the peak colour at some height of the pixel column px (the line is dashed) */
        const g = cv.getContext('2d'), d = g.getImageData(Math.floor(px), 0, 1, cv.height).data;
        for (let y = 0; y < cv.height; y++) if (d[4 * y] === 0xc2 && d[4 * y + 1] === 0x41 && d[4 * y + 2] === 0x0c) return true;
        return false;
      };
      /* E.peak.entry -1: the peak is before the first entry, its marker at the trace's left edge (x 0) */
      const pe = E.peak.entry, px0 = Math.max(pe, 0);
      check('peak: entry', D.peakEntry, pe);
      check('peak: its time_us', pe < 0 ? null : D.time[D.peakEntry], E.peak.time_us);
      check('peak: value', D.peakAlloc, E.peak.bytes);
      check('peak marker: active memory, at the peak entry', ex.st.peakPx.active, ex.xToPx(px0));
      check('peak marker: timeline', ex.st.peakPx.timeline, ex.xToPx(px0));
      if (pe < 0) check('peak marker: at the left edge', [ex.st.peakPx.active, ex.st.peakPx.timeline], [78, 78]);
      check('peak marker: drawn', [lineAt(ac, ex.st.peakPx.active), lineAt(tl, ex.st.peakPx.timeline)], [true, true]);
      /* the reserved peak, marked as the static page marked it; E.peak_reserved from the snapshot's segments
       * and the trace's segment entries */
      const pr = E.peak_reserved.entry, moment = (p) => (p < 0 ? 'before the first trace entry' : 'after entry ' + p + ' ');
      check('peak reserved: entry and value', [D.peakReservedEntry, D.peakReserved], [pr, E.peak_reserved.bytes]);
      check('peak reserved marker: timeline', ex.st.peakPx.reserved, ex.xToPx(Math.max(pr, 0)));
      check('peak reserved marker: drawn', colourIn(tl, ex.st.peakPx.reserved - 2, ex.st.peakPx.reserved + 2, RESERVED_PEAK_RGB), true);
      check('peak labels: both drawn, apart', labels(), [['reserved', 'allocated'], 'apart']);
      const legendPeaks = items('timeline-legend').filter((t) => t.startsWith('peak '));
      check('legend: the peaks, their bytes and moments', [legendPeaks.length,
        legendPeaks[0].startsWith('peak allocated: ') && legendPeaks[0].includes('(' + E.peak.bytes + ' B) ' + moment(pe)),
        legendPeaks[1].startsWith('peak reserved: ') && legendPeaks[1].includes('(' + E.peak_reserved.bytes + ' B) ' + moment(pr))],
      [2, true, true]);
      ex.setAxis('time');
      check('peak marker: wall time, at the peak time', ex.st.peakPx.active, ex.xToPx(E.peak.x_time));
      check('peak marker: wall time, drawn', lineAt(ac, ex.st.peakPx.active), true);
      ex.setAxis('event');
      if (pe >= 14) ex.setRange(0, Math.max(pe - 10, 4)); else ex.setRange(px0 + 5, px0 + 20);
      check('peak marker: none when out of view', [ex.st.peakPx.active, ex.st.peakPx.timeline], [null, null]);
      const rx = Math.max(pr, 0);
      if (pr >= 14) ex.setRange(0, Math.max(pr - 10, 4)); else ex.setRange(rx + 5, rx + 20);
      check('peak reserved marker: none when out of view', ex.st.peakPx.reserved, null);
      const spanBefore = ex.st.x1 - ex.st.x0; /* the button zooms in to a twentieth, never out */
      button('peak').click();
      check('peak button: the peak in view', ex.st.x0 <= px0 && px0 < ex.st.x1, true);
      check('peak button: zoomed to a twentieth', +(ex.st.x1 - ex.st.x0).toFixed(6), +Math.min(spanBefore, n / 20).toFixed(6));
      check('peak button: its moment picked', ex.st.k, pe);
      const heading = text(document.querySelector('.plots > h3:nth-of-type(3)'));
      if (pe < 0) check('peak button: segment map heading', heading, 'Segment map before the first trace entry');
      else check('peak button: segment map heading', [heading.startsWith('Segment map after entry ' + pe + ' (+'),
        heading.endsWith(', time_us ' + E.peak.time_us + ')')], [true, true]);
      check('peak: the table says when', text(document.querySelector('#peak p.note')).includes('(' + E.peak.bytes + ' B) allocated ' +
        (pe < 0 ? 'before the first trace entry' : 'after entry ' + pe + ' ')), true);
      button('reset').click();
      if (mode === 'peak') {
        /* the table, open from the start */
        const trs = () => [...document.querySelectorAll('#peak-table tbody tr')];
        const live = () => trs().map((tr) => [+tr.children[0].dataset.bytes, tr.children[2].textContent]);
        const stacks = () => trs().map((tr) => tr.querySelector('td.fr').title);
        const first = document.querySelector('#peak-table tbody tr');
        check('table: its first rows in the window as the page opens', !!first && first.getBoundingClientRect().bottom <= window.innerHeight, true);
        check('table: the allocations live at the peak, largest first', live(), E.live);
        check('table: they add up to the peak', live().reduce((s, r) => s + r[0], 0), E.peak.bytes);
        check('table: their stacks', stacks(), E.frames);
        const th = (t) => [...document.querySelectorAll('#peak-table th')].find((h) => h.textContent.startsWith(t));
        th('size').click();
        check('sort: size ascending', live().map((r) => r[0]), E.live.map((r) => r[0]).sort((a, b) => a - b));
        check('sort: its heading says so', th('size').getAttribute('aria-sort'), 'ascending');
        th('frames').click();
        const byText = E.frames.slice().sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
        check('sort: by frame text', stacks(), byText);
        th('frames').click();
        check('sort: by frame text, reversed', stacks(), byText.slice().reverse());
        th('size').click();
        check('sort: size, largest first again', live(), E.live);
        const find = document.querySelector('#peak input[type=search]');
        find.value = E.search.q;
        find.dispatchEvent(new Event('input', {bubbles: true}));
        check('search: rows whose frames hold "' + E.search.q + '"', trs().length, E.search.count);
        check('search: every one does', stacks().every((t) => t.toLowerCase().includes(E.search.q.toLowerCase())), true);
        if (E.folded) {
          /* a frame as alloc_snapshot folded wrote it for this snapshot, "name (file:line)" */
          find.value = E.folded.q;
          find.dispatchEvent(new Event('input', {bubbles: true}));
          check('search: a frame copied from folded output, "' + E.folded.q + '"', trs().length, E.folded.count);
          check('search: the folded frame found at all', trs().length > 0, true);
          find.value = E.folded.q.toUpperCase();
          find.dispatchEvent(new Event('input', {bubbles: true}));
          check('search: the folded frame, upper case', trs().length, E.folded.count);
        }
        find.value = '';
        find.dispatchEvent(new Event('input', {bubbles: true}));
        check('search: cleared', trs().length, E.live.length);
        /* a row selects its band, the state clicking the band gives; zoomed in, the state after the peak
         * entry spans several columns: every row's band is drawn there, away from its edges */
        ex.setRange(pe - 10, pe + 10);
        const row = trs()[0], id = +row.dataset.id, hex = row.children[2].textContent;
        const sel = () => [ex.st.sel, text($('details').querySelector('h3')), trs().filter((tr) => tr.classList.contains('sel')).map((tr) => +tr.dataset.id)];
        row.click();
        check('row click: selects', sel(), [id, 'Allocation ' + hex, [id]]);
        check('row click: hash', /[#&]sel=/.test(location.hash) === (ex.st.D.A.start[id] >= 0), true);
        /* before the first entry: the first column, the only one that stands for that state */
        const c = pe < 0 ? 0 : Math.floor((ex.xToPx(pe) + ex.xToPx(pe + 1)) / 2) - 78, r = ex.st.lay.bands[c];
        let base = -1;
        for (let j = 0; j < r.length; j += 2) if (r[j] === id) base = r[j + 1];
        const {top, bottom, max} = ex.st.yScale, yMid = bottom - (bottom - top) * (base + D.A.size[id] / 2) / max;
        const px = ac.getContext('2d').getImageData(c + 78, Math.round(yMid), 1, 1).data;
        if (pe >= 0) check('row click: its band drawn selected (#111)', base >= 0 && [px[0], px[1], px[2]], [17, 17, 17]);
        else check('row click: its band drawn in the first column', base >= 0, true);
        mouse(ac, 'mousedown', c + 78, yMid);
        mouse(ac, 'mouseup', c + 78, yMid);
        check('band click on it: unselects, row too', sel()[0] === -1 && sel()[2].length === 0, true);
        mouse(ac, 'mousedown', c + 78, yMid);
        mouse(ac, 'mouseup', c + 78, yMid);
        check('band click: the same state as the row click', sel(), [id, 'Allocation ' + hex, [id]]);
        const multi = trs().find((tr) => tr.querySelector('button.more'));
        if (multi) {
          const n0 = multi.querySelectorAll('td.fr > div').length, frames = multi.querySelector('td.fr').title.split('\n').length;
          multi.querySelector('button.more').click();
          check('frames: expand shows the whole stack', [n0, multi.querySelectorAll('td.fr > div').length], [1, frames]);
          check('frames: expanding does not select', ex.st.sel, id);
        }
      }
    } else if (mode === 'notrace') {
      /* no trace entries: the table lists the blocks allocated at the snapshot (what alloc_snapshot folded
       * gives then), E: [[bytes, address]] of device 0's active_allocated blocks */
      const E = window.__expect, trs = () => [...document.querySelectorAll('#peak-table tbody tr')];
      const live = () => trs().map((tr) => [+tr.children[0].dataset.bytes, tr.children[2].textContent]);
      check('no trace: the table shown', $('peak').hidden, false);
      check('no trace: its heading', text(document.querySelector('#peak h3')), 'Who holds the memory at the snapshot');
      check('no trace: its note says so', text(document.querySelector('#peak p.note')).includes(
        'allocated in the blocks allocated at the snapshot (the snapshot has no trace entries), held by ' + E.live.length + ' live allocation'), true);
      check('no trace: the blocks allocated at the snapshot, largest first', live(), E.live);
      check('no trace: they add up', live().reduce((s, r) => s + r[0], 0), E.bytes);
      check('no trace: the summary says so', text($('summary')).includes('the trace is empty'), true);
      trs()[0].click();
      check('no trace: a row shows its details', text($('details').querySelector('h3')), 'Allocation ' + E.live[0][1]);
      check('no trace: timeline hidden', [$('timeline').hidden, $('active').hidden], [true, true]);
      check('no trace: no empty plot boxes', [$('timeline').offsetHeight, $('active').offsetHeight], [0, 0]);
      const dev = document.querySelector('select[aria-label=device]');
      dev.value = '1';
      dev.dispatchEvent(new Event('change'));
      check('no trace: a device with nothing allocated has no table', $('peak').hidden, true);
    } else if (mode === 'pending') {
      check('pending: entry', ex.st.k, 0);
      check('pending: segment map after entry 0', text($('segmap-figures')), '1 segment, reserved 2.00 MiB (2097152 B); ' +
        'active_allocated 1 block 1.00 MiB (1048576 B); active_pending_free 1 block 1.00 MiB (1048576 B); ' +
        'inactive 0 blocks 0 B');
    } else if (mode === 'hash') {
      check('hash: entry', ex.st.k, 3);
      check('hash: segment map', text($('segmap-figures')), MAP_3);
      check('hash: range', range(), [2, 10]);
      check('hash: selected', text($('details').querySelector('h3')), 'Allocation 0x7f0000100000');
      check('hash: its frames', frames(), ['Frames of the alloc entry = backward (model.py:57)']);
    } else {
      const ac = $('active'), tl = $('timeline');
      check('summary', text($('summary')), 'device 0: 16 trace entries, 3 segments, reserved 6.00 MiB, allocated 1.50 MiB; ' +
        'peak allocated 3.50 MiB, peak reserved 8.00 MiB; 1 OOM, 2 annotations, 1 annotated range; ' +
        '1 free of an allocation made before the trace began.');
      check('annotation markers', [...ex.st.D.names], [[2, 'step 1'], [10, 'phase two']]);
      check('annotated range', ex.st.D.ranges.map((r) => [r.name, r.e0, r.e1]), [['fwd', 3, 10]]);
      check('oom marker', [...ex.st.D.oom], [[8, 1073741824]]);
      check('initial range', text(document.querySelector('.range')), 'showing entries 0\u201315 of 16');
      check('segment map of the snapshot', text($('segmap-figures')), MAP_END);
      /* the page's byte counts are src/common/text.c's binary style: the strings of tests/unit/test_text.c */
      check('fmtSize: the strings of cl_format_bytes', [0, 1023, 1024, 1000000, 1048575, 1048576, 1152, 1408, 1664,
        7.5 * 2 ** 30, 2 ** 60].map(ex.fmtSize), ['0 B', '1023 B', '1.00 KiB', '976.56 KiB', '1024.00 KiB', '1.00 MiB',
        '1.12 KiB', '1.38 KiB', '1.62 KiB', '7.50 GiB', '1.00 EiB']);
      /* the static page's legends and peak markers, now the explorer's */
      check('timeline legend: what it names', names('timeline-legend'), ['reserved', 'allocated', 'peak allocated',
        'peak reserved', 'OOM', 'annotation', 'annotated range', 'picked entry']);
      check('timeline legend: the peaks, with their moments', items('timeline-legend').slice(2, 5), [
        'peak allocated: 3.50 MiB (3670528 B) after entry 12 (+120 \u00b5s, time_us 1120)',
        'peak reserved: 8.00 MiB (8388608 B) after entry 11 (+110 \u00b5s, time_us 1110)', 'OOM: 1 out-of-memory entry']);
      check('timeline legend: its swatches in the drawn colours', [...document.querySelectorAll('#timeline-legend .ln')].slice(0, 5)
        .map((e) => getComputedStyle(e).borderTopColor), ['rgb(154, 165, 177)', 'rgb(59, 111, 182)', 'rgb(194, 65, 12)',
        'rgb(91, 100, 112)', 'rgb(214, 39, 40)']);
      check('peak reserved marker: at entry 11', ex.st.peakPx.reserved, ex.xToPx(11));
      check('peak reserved marker: drawn', colourIn(tl, ex.xToPx(11) - 2, ex.xToPx(11) + 2, RESERVED_PEAK_RGB), true);
      check('peak labels: both drawn, apart', labels(), [['reserved', 'allocated'], 'apart']);
      ex.setRange(0, 8);
      check('peak markers: none when out of view', [ex.st.peakPx.reserved, ex.st.peakPx.timeline, labels()[0]], [null, null, []]);
      ex.setRange(0, 16);
      check('segment map legend: the states, the strip', names('segmap-legend'),
        ['active_allocated', 'active_pending_free', 'inactive', 'dark strip']);
      check('segment map legend: what a state means', items('segmap-legend')[1],
        'active_pending_free: freed by the program, waiting for its streams\' events before reuse');
      check('segment map legend: its swatches in the drawn colours', [...document.querySelectorAll('#segmap-legend .sw')].slice(0, 3)
        .map((e) => getComputedStyle(e).backgroundColor), ['rgb(59, 111, 182)', 'rgb(240, 160, 48)', 'rgb(228, 231, 235)']);
      /* events carry whole pixels: the pointer's x is that of the pixel nearest entry 8 */
      const px8 = Math.round(ex.xToPx(8)), x8 = ex.pxToX(px8);
      ac.dispatchEvent(new WheelEvent('wheel', at(ac, px8, 100, {deltaY: -100})));
      check('wheel zooms in around the pointer', range(), [+(x8 - x8 * 0.8).toFixed(6), +(x8 + (16 - x8) * 0.8).toFixed(6)]);
      check('the pointer stays on its x', +ex.pxToX(px8).toFixed(6), +x8.toFixed(6));
      check('range text after zoom', text(document.querySelector('.range')), 'showing entries 2\u201314 of 16');
      ac.dispatchEvent(new WheelEvent('wheel', at(ac, px8, 100, {deltaY: 100})));
      check('wheel zooms out', range(), [0, 16]);
      button('zoom in').click();
      check('zoom in button', range(), [4, 12]);
      const dx = Math.round(2 * (ex.xToPx(5) - ex.xToPx(4))), shift = dx / (ex.xToPx(12) - ex.xToPx(4)) * 8;
      mouse(tl, 'mousedown', 400, 50);
      mouse(tl, 'mousemove', 400 - dx, 50);
      mouse(tl, 'mouseup', 400 - dx, 50);
      check('drag pans by the pixels dragged', range(), [+(4 + shift).toFixed(6), +(12 + shift).toFixed(6)]);
      check('about two entries', Math.round(shift), 2);
      ex.setRange(6, 14);
      check('a drag is not a click', ex.st.k, 16);
      document.body.dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowLeft', bubbles: true}));
      check('left arrow pans', range(), [4.4, 12.4]);
      button('reset').click();
      check('reset', range(), [0, 16]);
      mouse(tl, 'mousedown', ex.xToPx(12.5), 50);
      mouse(tl, 'mouseup', ex.xToPx(12.5), 50);
      check('click picks the entry', ex.st.k, 12);
      check('segment map after entry 12', text($('segmap-figures')), MAP_12);
      check('segment map legend after entry 12: the dashed outline', names('segmap-legend'),
        ['active_allocated', 'active_pending_free', 'inactive', 'dark strip', 'dashed outline']);
      check('its heading', text(document.querySelector('.plots h3:nth-of-type(3)')), 'Segment map after entry 12 (+120 \u00b5s, time_us 1120)');
      check('hash follows', location.hash, '#t=12&x0=0&x1=16');
      /* hover the band of entry 1's allocation, half way up, at entry 5 */
      const id = ex.st.D.A.byStart.get(1), c = Math.floor(ex.xToPx(5.5) - 78), row = ex.st.lay.bands[c];
      let base = -1;
      for (let j = 0; j < row.length; j += 2) if (row[j] === id) base = row[j + 1];
      const {top, bottom, max} = ex.st.yScale, y = bottom - (bottom - top) * (base + 524288) / max;
      mouse(ac, 'mousemove', ex.xToPx(5.5), y);
      check('hover: heading', text($('details').querySelector('h3')), 'Allocation 0x7f0000000000');
      check('hover: fields', rows(), ['address: 0x7f0000000000', 'size: 1.00 MiB (1048576 B)',
        'requested: 976.56 KiB (1000000 B)', 'stream: 0', 'pool: (0, 0) large, segment 0x7f0000000000',
        'allocated: entry 1 (+10 \u00b5s, time_us 1010)', 'freed: live at the snapshot', 'annotation: no annotation']);
      check('hover: frames', frames(), ['Frames of the alloc entry = forward (model.py:42) / cachalot_malloc (libcachalot.so)',
        'Frames of the block in the snapshot = block_frame (model.py:7)']);
      const slider = document.querySelector('input[type=range]');
      slider.value = '3';
      slider.dispatchEvent(new Event('input', {bubbles: true}));
      check('slider: segment map after entry 3', text($('segmap-figures')), MAP_3);
      slider.value = '16';
      slider.dispatchEvent(new Event('input', {bubbles: true}));
      check('slider: back to the snapshot', text($('segmap-figures')), MAP_END);
      mouse($('segmap'), 'mousemove', 290 + 20, 2 + 17 + 7); /* row 1 (0x7f0000200000), its first block */
      check('map hover: heading', text($('details').querySelector('h3')), 'Allocation 0x7f0000200000');
      check('map hover: state', text($('details').querySelector('p.note')), 'Block state: active_allocated');
      check('map hover: allocated', rows()[5], 'allocated: before the trace began (time and frames unknown)');
      check('map hover: frames', frames(), ['Frames of the alloc entry = ',
        'Frames of the block in the snapshot = warmup (init.py:3)']);
      const colour = document.querySelector('select[aria-label=colour]');
      colour.value = 'annotation';
      colour.dispatchEvent(new Event('change'));
      check('colour by annotation', items('colour-legend').sort(),
        ['before the trace (2)', 'fwd (2)', 'no annotation (1)', 'phase two (1)']);
      const legendBy = (c) => {
        colour.value = c;
        colour.dispatchEvent(new Event('change'));
        return items('colour-legend').sort();
      };
      check('colour by stream', legendBy('stream'), ['stream 0 (5)', 'stream 140000000000000 (1)']);
      check('colour by pool', legendBy('pool'), ['pool (0, 0) large (4)', 'pool (1, 2) small (1)', 'pool unknown (1)']);
      const axis = document.querySelector('select[aria-label="x axis"]');
      axis.value = 'time';
      axis.dispatchEvent(new Event('change'));
      check('wall-time axis', text(document.querySelector('.range')), 'showing entries 0\u201315 of 16, +0 \u00b5s to +151 \u00b5s');
    }
  } catch (e) {
    out.push('FAIL exception: ' + e + ' ' + (e.stack || ''));
  }
  check('no script errors', window.__errors, []);
  const pre = document.createElement('pre');
  pre.id = 'explorer-test';
  pre.textContent = 'BEGIN\n' + out.join('\n') + '\nEND\n';
  document.body.append(pre);
});
