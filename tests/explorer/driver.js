/* The explorer's test driver (tests/explorer/run.py appends it to pages of alloc_snapshot plot): it
 * drives the page with real DOM events (wheel, drag, keys, clicks, hover) and checks exact state against
 * tests/explorer/explorer.json, then writes PASS / FAIL lines between BEGIN and END into the DOM for
 * run.py to read. The mode is run.py's: window.__mode ('full', 'hash', 'pending', 'smoke' or 'empty'). */
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
      check('hash: its frames', frames(), ['Frames of the alloc entry = backward model.py:57']);
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
      check('hover: frames', frames(), ['Frames of the alloc entry = forward model.py:42 / cachalot_malloc libcachalot.so:0',
        'Frames of the block in the snapshot = block_frame model.py:7']);
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
        'Frames of the block in the snapshot = warmup init.py:3']);
      const colour = document.querySelector('select[aria-label=colour]');
      colour.value = 'annotation';
      colour.dispatchEvent(new Event('change'));
      check('colour by annotation', [...document.querySelectorAll('.legend li')].map((li) => li.textContent).sort(),
        ['before the trace (2)', 'fwd (2)', 'no annotation (1)', 'phase two (1)']);
      const legendBy = (c) => {
        colour.value = c;
        colour.dispatchEvent(new Event('change'));
        return [...document.querySelectorAll('.legend li')].map((li) => li.textContent).sort();
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
