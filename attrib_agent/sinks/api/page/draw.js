// Drawing for the agent's page: the stacked KV area, request lanes, culprit links and the legend, as SVG.
// Pure functions of the timeline JSON (see sinks/api/timeline.py); page.js fetches it and wires the events.
'use strict';
const AttribDraw = (function () {
  const NS = 'http://www.w3.org/2000/svg';
  const WHALE_COLOURS = ['#1f77b4', '#ff7f0e', '#9467bd', '#17becf', '#8c564b', '#e377c2', '#bcbd22', '#2ca02c'];
  const GREYS = ['#b9b9b9', '#d2d2d2'];
  const LANE_GREY = '#8a8a8a';
  const RED = '#d62728';
  const SHARED = '#5aa48f';  // prefix blocks several requests share, drawn once (sinks/api/timeline.py kv_shared)
  const MAX_GREY_AREAS = 300;  // beyond this, the other requests' KV is drawn as one grey area

  function el(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function text(parent, x, y, s, attrs) {
    const t = el('text', Object.assign({ x: x, y: y }, attrs || {}), parent);
    t.textContent = s;
    return t;
  }
  function fmtS(s) {
    if (s == null) return '–';
    const a = Math.abs(s);
    return a >= 10 ? s.toFixed(1) + ' s' : a >= 0.1 ? s.toFixed(2) + ' s' : (s * 1000).toFixed(0) + ' ms';
  }
  function niceStep(span, target) {
    const raw = span / Math.max(target, 1);
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
  }

  // Patterns, and the plot's clip (zoomed to one request, what lies outside its time is cut at the axes).
  function defs(svg, xMin, xMax, H) {
    const defs = el('defs', {}, svg);
    el('rect', { x: xMin, y: 0, width: Math.max(xMax - xMin, 1), height: H }, el('clipPath', { id: 'plot' }, defs));
    const hatch = el('pattern', { id: 'hatch-red', width: 6, height: 6, patternUnits: 'userSpaceOnUse',
                                  patternTransform: 'rotate(45)' }, defs);
    el('rect', { width: 6, height: 6, fill: '#fde0e0' }, hatch);
    el('line', { x1: 0, y1: 0, x2: 0, y2: 6, stroke: RED, 'stroke-width': 2.5 }, hatch);
    const pre = el('pattern', { id: 'hatch-preempt', width: 5, height: 5, patternUnits: 'userSpaceOnUse',
                                patternTransform: 'rotate(-45)' }, defs);
    el('rect', { width: 5, height: 5, fill: '#ffffff' }, pre);
    el('line', { x1: 0, y1: 0, x2: 0, y2: 5, stroke: '#333', 'stroke-width': 1.2 }, pre);
    const shared = el('pattern', { id: 'hatch-shared', width: 4, height: 4, patternUnits: 'userSpaceOnUse' }, defs);
    el('rect', { width: 4, height: 4, fill: '#cfe8df' }, shared);
    el('line', { x1: 0, y1: 2, x2: 4, y2: 2, stroke: SHARED, 'stroke-width': 1.2 }, shared);
  }

  // Change points [[ts, value], ...] expanded to the value in force at each step time.
  function atSteps(pts, ts) {
    const vals = new Array(ts.length).fill(0);
    let j = 0, v = 0;
    for (let i = 0; i < ts.length; i++) {
      while (j < pts.length && pts[j][0] <= ts[i]) { v = pts[j][1]; j++; }
      vals[i] = v;
    }
    return vals;
  }

  function drawKv(svg, d, lanes, steps, whaleColour, x, top, areaH, t1, xMin, xMax) {
    const g = el('g', { class: 'kv' }, svg);
    const n = steps.length;
    const ts = steps.map(function (s) { return s.ts; });
    const arrival = {};
    lanes.forEach(function (r, i) { arrival[r.request_id] = i; });
    const ids = Object.keys(d.kv).sort(function (a, b) {
      const wa = whaleColour[a] ? 0 : 1, wb = whaleColour[b] ? 0 : 1;
      if (wa !== wb) return wa - wb;
      const ia = a in arrival ? arrival[a] : 1e9, ib = b in arrival ? arrival[b] : 1e9;
      return ia - ib || (a < b ? -1 : 1);
    });
    // Blocks per request at each step (change points expanded): the shared prefix blocks once at the bottom,
    // then each request's own blocks, whales first.
    const series = [];
    const shared = atSteps(d.kv_shared || [], ts);
    if (shared.some(function (v) { return v > 0; })) series.push({ id: 'shared prefix', shared: true, vals: shared });
    let others = null;
    ids.forEach(function (id) {
      const vals = atSteps(d.kv[id], ts);
      if (!whaleColour[id] && series.filter(function (s) { return !s.whale && !s.shared; }).length >= MAX_GREY_AREAS) {
        if (!others) { others = { id: 'others', whale: false, vals: new Array(n).fill(0) }; }
        for (let i = 0; i < n; i++) others.vals[i] += vals[i];
      } else {
        series.push({ id: id, whale: !!whaleColour[id], vals: vals });
      }
    });
    if (others) series.push(others);
    const base = new Array(n).fill(0);
    let maxStack = 0;
    const stacks = series.map(function (s) {
      const lo = base.slice();
      for (let i = 0; i < n; i++) base[i] += s.vals[i];
      return { s: s, lo: lo, hi: base.slice() };
    });
    base.forEach(function (b) { maxStack = Math.max(maxStack, b); });
    const ymax = Math.max(d.pool_blocks || 0, maxStack, 1) * 1.06;
    const y = function (b) { return top + areaH - b / ymax * areaH; };
    const xs = ts.map(x).concat([x(t1)]);

    // Axis
    const ax = el('g', { class: 'axis' }, g);
    el('line', { x1: xMin, x2: xMax, y1: y(0), y2: y(0), stroke: '#999' }, ax);
    const bt = niceStep(ymax, 4);
    for (let b = 0; b <= ymax; b += bt) {
      el('line', { x1: xMin - 4, x2: xMin, y1: y(b), y2: y(b), stroke: '#999' }, ax);
      text(ax, xMin - 7, y(b) + 4, String(b), { 'text-anchor': 'end' });
    }
    text(ax, 14, top + areaH / 2, 'KV blocks held', { transform: 'rotate(-90 14 ' + (top + areaH / 2) + ')',
                                                      'text-anchor': 'middle' });

    let grey = 0;
    stacks.forEach(function (st) {
      let first = -1, last = -1;
      for (let i = 0; i < n; i++) if (st.s.vals[i] > 0) { if (first < 0) first = i; last = i; }
      if (first < 0) return;
      let p = 'M' + xs[first].toFixed(1) + ',' + y(st.hi[first]).toFixed(1);
      for (let i = first; i <= last; i++) {
        p += 'H' + xs[i + 1].toFixed(1);
        if (i < last && st.hi[i + 1] !== st.hi[i]) p += 'V' + y(st.hi[i + 1]).toFixed(1);
      }
      p += 'V' + y(st.lo[last]).toFixed(1);
      for (let i = last; i >= first; i--) {
        p += 'H' + xs[i].toFixed(1);
        if (i > first && st.lo[i - 1] !== st.lo[i]) p += 'V' + y(st.lo[i - 1]).toFixed(1);
      }
      const fill = st.s.shared ? 'url(#hatch-shared)'
        : st.s.whale ? whaleColour[st.s.id] : GREYS[grey++ % GREYS.length];
      const attrs = { d: p + 'Z', fill: fill, stroke: st.s.shared ? SHARED : '#ffffff', 'stroke-width': 0.4,
                      class: st.s.shared ? 'kv-shared' : 'kv-area' + (st.s.whale ? ' whale' : '') };
      if (!st.s.shared) attrs['data-request-id'] = st.s.id;  // the band is nobody's area
      attrs['clip-path'] = 'url(#plot)';
      const path = el('path', attrs, g);
      el('title', {}, path).textContent = st.s.shared
        ? 'prefix blocks shared by several requests, counted once: up to ' + Math.max.apply(null, st.s.vals)
        : st.s.id + ': up to ' + Math.max.apply(null, st.s.vals) + ' KV blocks of its own';
    });

    // vLLM's own KV figure and the pool size
    let vp = '';
    steps.forEach(function (s, i) {
      if (s.vllm_kv_blocks == null) return;
      vp += (vp ? 'H' + xs[i].toFixed(1) + 'V' : 'M' + xs[i].toFixed(1) + ',') + y(s.vllm_kv_blocks).toFixed(1);
    });
    if (vp) el('path', { d: vp + 'H' + xs[n].toFixed(1), fill: 'none', stroke: '#222', 'stroke-width': 1,
                         'stroke-dasharray': '2 2', class: 'vllm-kv', 'clip-path': 'url(#plot)' }, g);
    if (d.pool_blocks) {
      el('line', { x1: xMin, x2: xMax, y1: y(d.pool_blocks), y2: y(d.pool_blocks), stroke: RED,
                   'stroke-dasharray': '6 4', 'stroke-width': 1.2 }, g);
      text(g, xMax + 6, y(d.pool_blocks) + 4, 'pool: ' + d.pool_blocks + ' blocks', { fill: RED });
    }
  }

  function drawLane(g, r, i, y0, rowH, x, now, names, whaleColour, victim, threshold, W, right, left) {
    const lane = el('g', { class: 'lane', 'data-request-id': r.request_id }, g);
    el('rect', { class: 'lane-bg', x: 0, y: y0, width: W - right + 190, height: rowH,
                 fill: i % 2 ? '#fafafa' : '#ffffff' }, lane);
    const colour = whaleColour[r.request_id] || LANE_GREY;
    const label = text(lane, left - 8, y0 + rowH / 2 + 4, names[r.request_id],
                       { 'text-anchor': 'end', class: 'lane-label' + (r.is_whale ? ' whale' : ''),
                         fill: r.is_whale ? colour : '#333' });
    el('title', {}, label).textContent = r.request_id;  // the full id on hover, whatever the cut
    const h = rowH - 6, yb = y0 + 3;
    const end = r.finish_ts != null ? r.finish_ts : r.aborted_ts != null ? r.aborted_ts : now;
    const seg = function (a, b, attrs) {
      if (a == null || b == null || b < a) return;
      el('rect', Object.assign({ x: x(a), y: yb, width: Math.max(x(b) - x(a), 1), height: h,
                                 'clip-path': 'url(#plot)' }, attrs), lane);
    };
    const sched = r.scheduled_ts != null ? r.scheduled_ts : (r.first_token_ts != null ? r.first_token_ts : end);
    seg(r.arrival_ts, sched, { fill: '#ffffff', stroke: colour, 'stroke-dasharray': '3 2', class: 'queued' });
    const first = r.first_token_ts != null ? r.first_token_ts : end;
    seg(sched, first, { fill: colour, 'fill-opacity': 0.45, class: 'prefill' });
    seg(first, end, { fill: colour, class: 'decode' });
    (r.preemptions || []).forEach(function (p) {  // an uncorroborated sighting is outlined, not hatched
      const back = p.resumed_ts != null ? p.resumed_ts : end;
      seg(p.ts, back, p.actionable === false ? { fill: 'none', stroke: '#333', 'stroke-dasharray': '1 2',
                                                 class: 'preempted-doubtful' }
                                              : { fill: 'url(#hatch-preempt)', stroke: '#333', class: 'preempted' });
    });
    if (r.aborted_ts != null) text(lane, x(r.aborted_ts) + 3, y0 + rowH / 2 + 4, '✕ aborted', { class: 'muted' });
    if (victim && victim.slowdown_s >= threshold) {
      if (victim.ttft_slowdown_s > 0 && r.first_token_ts != null) {
        seg(r.first_token_ts - victim.ttft_slowdown_s, r.first_token_ts,
            { fill: 'url(#hatch-red)', stroke: RED, class: 'wait' });
      }
      const decodeExtra = victim.itl_slowdown_s * victim.itl_gaps;
      if (decodeExtra > 0 && r.finish_ts != null) {
        el('rect', { x: x(r.finish_ts - decodeExtra), y: yb + h - 3, width: Math.max(x(r.finish_ts) -
                     x(r.finish_ts - decodeExtra), 1), height: 3, fill: RED, class: 'decode-extra',
                     'clip-path': 'url(#plot)' }, lane);
      }
      const top = victim.culprits[0];
      const head = '+' + fmtS(victim.slowdown_s) + (top ? ' ← ' : '');
      const label = text(lane, W - right + 8, y0 + rowH / 2 + 4, '', { class: 'victim-label' });
      fitText(label, head, top ? (names[top.request_id] || top.request_id) : '', right - 12);
      el('title', {}, label).textContent = head + (top ? top.request_id : '');  // the full id on hover
    }
    return lane;
  }

  // `head` then as much of `name` as fits in `maxPx` (cut in the middle, '…'): ids differ at both ends.
  function fitText(t, head, name, maxPx) {
    t.textContent = head + name;
    const width = function () { return t.getComputedTextLength ? t.getComputedTextLength() : 0; };
    for (let keep = name.length - 1; keep >= 2 && width() > maxPx; keep--) {
      const tail = Math.floor(keep / 2);
      t.textContent = head + name.slice(0, keep - tail) + '…' + name.slice(name.length - tail);
    }
  }

  // Labels drawn outside their column (the left ones past the chart's edge, the right ones past its width):
  // the page says how many on its chart (`data-clipped-labels`), so a browser test can hold it at 0.
  function clippedLabels(svg, W) {
    let n = 0;
    svg.querySelectorAll('text.lane-label, text.victim-label').forEach(function (t) {
      const b = t.getBBox();
      if (b.x < 0 || b.x + b.width > W) n++;
    });
    return n;
  }

  function drawLinks(g, v, laneIndex, lanes, lanesTop, rowH, x) {
    const r = lanes[laneIndex[v.request_id]];
    if (!r) return;
    const at = r.first_token_ts != null && v.ttft_slowdown_s > 0 ? r.first_token_ts - v.ttft_slowdown_s / 2
      : r.finish_ts != null ? r.finish_ts - v.itl_slowdown_s * v.itl_gaps / 2 : r.arrival_ts;
    const yv = lanesTop + laneIndex[v.request_id] * rowH + rowH / 2;
    v.culprits.forEach(function (c, k) {
      if (!(c.request_id in laneIndex)) return;
      const yc = lanesTop + laneIndex[c.request_id] * rowH + rowH / 2;
      const xl = x(at) + k * 5;
      el('line', { x1: xl, x2: xl, y1: yv, y2: yc, stroke: RED, 'stroke-width': k === 0 ? 2 : 1,
                   'stroke-dasharray': k === 0 ? '' : '3 3', class: 'culprit-link' }, g);
      el('circle', { cx: xl, cy: yc, r: k === 0 ? 4.5 : 3, fill: RED, stroke: '#fff' }, g);
    });
    el('circle', { cx: x(at), cy: yv, r: 4.5, fill: '#fff', stroke: RED, 'stroke-width': 2 }, g);
  }

  function legend(whaleColour, names, hasShared) {
    const box = document.getElementById('legend');
    box.textContent = '';
    const item = function (draw, label) {
      const span = document.createElement('span');
      span.className = 'item';
      const s = el('svg', { width: 26, height: 14 }, span);
      draw(s);
      span.appendChild(document.createTextNode(label));
      box.appendChild(span);
    };
    Object.keys(whaleColour).forEach(function (id) {
      item(function (s) { el('rect', { x: 1, y: 1, width: 24, height: 12, fill: whaleColour[id] }, s); },
           'whale ' + names[id]);
    });
    item(function (s) { el('rect', { x: 1, y: 1, width: 24, height: 12, fill: GREYS[0] }, s); }, 'other requests');
    if (hasShared) {
      item(function (s) { el('rect', { x: 1, y: 1, width: 24, height: 12, fill: 'url(#hatch-shared)', stroke: SHARED },
                             s); }, 'shared prefix blocks (counted once)');
    }
    item(function (s) { el('rect', { x: 1, y: 2, width: 24, height: 10, fill: '#fff', stroke: LANE_GREY,
                                     'stroke-dasharray': '3 2' }, s); }, 'queued');
    item(function (s) { el('rect', { x: 1, y: 2, width: 24, height: 10, fill: LANE_GREY, 'fill-opacity': 0.45 }, s); },
         'prefill');
    item(function (s) { el('rect', { x: 1, y: 2, width: 24, height: 10, fill: LANE_GREY }, s); }, 'decode');
    item(function (s) { el('rect', { x: 1, y: 2, width: 24, height: 10, fill: 'url(#hatch-red)',
                                              stroke: RED }, s); }, 'extra wait for first token');
    item(function (s) { el('rect', { x: 1, y: 8, width: 24, height: 3, fill: RED }, s); }, 'extra decode time');
    item(function (s) { el('rect', { x: 1, y: 2, width: 24, height: 10, fill: 'url(#hatch-preempt)',
                                     stroke: '#333' }, s); }, 'preempted');
    item(function (s) { el('line', { x1: 1, x2: 25, y1: 7, y2: 7, stroke: RED, 'stroke-dasharray': '6 4' }, s); },
         'KV pool');
    item(function (s) { el('line', { x1: 1, x2: 25, y1: 7, y2: 7, stroke: '#222', 'stroke-dasharray': '2 2' }, s); },
         'vLLM’s KV usage');
  }

  // The GPU's own row under the KV chart (NVML): DRAM bandwidth in use (0..1) per GPU as a line, memory as text.
  function drawGpu(svg, gpu, x, top, h, xMin, xMax) {
    const g = el('g', { class: 'gpu' }, svg);
    const byGpu = {};
    gpu.forEach(function (s) { (byGpu[s.gpu] = byGpu[s.gpu] || []).push(s); });
    el('rect', { x: xMin, y: top, width: xMax - xMin, height: h, fill: 'none', stroke: '#dddddd' }, g);
    text(g, xMin - 6, top + h / 2 + 4, 'GPU DRAM bw', { 'text-anchor': 'end', class: 'muted' });
    Object.keys(byGpu).forEach(function (id, i) {
      const pts = byGpu[id].filter(function (s) { return s.dram_bandwidth_ratio != null; }).map(function (s) {
        const px = Math.min(Math.max(x(s.ts), xMin), xMax);
        return px.toFixed(1) + ',' + (top + h - s.dram_bandwidth_ratio * h).toFixed(1);
      });
      if (pts.length) {
        el('polyline', { points: pts.join(' '), fill: 'none', stroke: WHALE_COLOURS[i % WHALE_COLOURS.length],
                         'stroke-width': 1.5, class: 'gpu-bw', 'data-gpu': id }, g);
      }
      const last = byGpu[id][byGpu[id].length - 1];
      if (last.memory_used_bytes != null && last.memory_total_bytes) {
        text(g, xMax + 6, top + 12 + i * 12, 'GPU ' + id + ' mem ' +
             (last.memory_used_bytes / 2 ** 30).toFixed(1) + '/' + (last.memory_total_bytes / 2 ** 30).toFixed(1) +
             ' GiB', { class: 'muted' });
      }
    });
  }

  return { el: el, text: text, fmtS: fmtS, clippedLabels: clippedLabels, niceStep: niceStep, defs: defs, drawKv: drawKv, drawLane: drawLane,
           drawLinks: drawLinks, drawGpu: drawGpu, legend: legend, WHALE_COLOURS: WHALE_COLOURS };
})();
