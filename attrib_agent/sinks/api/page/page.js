// The agent's page: KV blocks held by each request over time (whales coloured), each request's lane below
// (queued, prefill, decode) and the slowed requests' extra waits linked to whoever caused them.
// Vanilla JS, no network access but this agent's own /v1/timeline. Ids go into the DOM as text only.
'use strict';
(function () {
  const { el, text, fmtS, clippedLabels, niceStep, defs, drawKv, drawLane, drawLinks, drawGpu, legend, WHALE_COLOURS } =
    AttribDraw;
  const TOKEN_KEY = 'attrib-agent-token';
  const REFRESH_MS = 5000;

  // ---- token: `?token=` once, then kept in this tab's sessionStorage and sent as a header --------------
  const params = new URLSearchParams(location.search);
  if (params.has('token')) {
    sessionStorage.setItem(TOKEN_KEY, params.get('token'));
    params.delete('token');
    const rest = params.toString();
    history.replaceState(null, '', location.pathname + (rest ? '?' + rest : '') + location.hash);
  }
  const token = sessionStorage.getItem(TOKEN_KEY);
  const MAX_LANES = Math.max(parseInt(params.get('lanes'), 10) || 400, 1);  // `?lanes=N` draws at most N lanes
  const WINDOWS = [['1m', 60], ['2m', 120], ['5m', 300], ['15m', 900], ['1h', 3600]];
  // The time window follows live traffic: the last N minutes before the newest engine step (`?window=`).
  let windowParam = params.get('window') || '2m';
  let focused = params.get('request');  // request id whose span of time fills the axis (`?request=`, or a click)
  let selected = focused;  // request id whose culprits are shown
  let current = null;   // the last timeline drawn

  function setStatus(msg, isError) {
    const st = document.getElementById('status');
    st.textContent = msg;
    st.className = isError ? 'error' : '';
  }

  // A readable cut of a long id: its head and tail, which is where ids differ (`cmpl-3f9a…e41c-0`).
  function cut(s, max) {
    if (s.length <= max) return s;
    const tail = Math.floor((max - 1) / 3);
    return s.slice(0, max - 1 - tail) + '…' + s.slice(s.length - tail);
  }

  // Short lane labels: the part of the ids that differs (`cmpl-<tag>-s003-0` -> `s003`).
  function shortNames(ids) {
    const names = {};
    if (ids.length < 2) { ids.forEach(function (id) { names[id] = id; }); return names; }
    let pre = ids[0], suf = ids[0];
    ids.forEach(function (id) {
      while (!id.startsWith(pre)) pre = pre.slice(0, -1);
      while (!id.endsWith(suf)) suf = suf.slice(1);
    });
    pre = pre.slice(0, pre.lastIndexOf('-') + 1);
    suf = suf.indexOf('-') >= 0 ? suf.slice(suf.indexOf('-')) : '';
    ids.forEach(function (id) {
      names[id] = cut(id.slice(pre.length, id.length - suf.length) || id, 24);
    });
    return names;
  }


  // ---- data --------------------------------------------------------------------------------------------
  async function load() {
    const q = new URLSearchParams();
    ['since', 'until', 'max_steps'].forEach(function (k) { if (params.has(k)) q.set(k, params.get(k)); });
    if (!params.has('since') && windowParam !== 'all') q.set('window', windowParam);
    const headers = token ? { Authorization: 'Bearer ' + token } : {};
    let resp;
    try {
      resp = await fetch('v1/timeline' + (q.toString() ? '?' + q : ''), { headers: headers, cache: 'no-store' });
    } catch (e) {
      document.body.dataset.state = 'error';
      setStatus('Cannot reach the agent: ' + e.message, true);
      return null;
    }
    if (resp.status === 401) {
      document.body.dataset.state = 'unauthorized';
      setStatus(token ? 'The token kept in this tab was refused: open this page again as /?token=<token>.'
                      : 'This agent requires a token: open this page once as /?token=<token>.', true);
      return null;
    }
    const body = await resp.json().catch(function () { return null; });
    if (!resp.ok || !body) {
      document.body.dataset.state = 'error';
      setStatus('The agent answered ' + resp.status + (body && body.error ? ': ' + body.error : ''), true);
      return null;
    }
    return body;
  }

  async function refresh() {
    const data = await load();
    if (data) {
      current = data;
      draw(data);
      document.body.dataset.state = 'drawn';
    }
    const retry = !data && document.body.dataset.state === 'error';  // after a 401 only a reload helps
    if (retry || (data && data.live)) setTimeout(refresh, REFRESH_MS);
  }

  // ---- drawing -----------------------------------------------------------------------------------------
  // With many requests in view, lanes go to those that matter first: whales, slowed requests and culprits.
  function pickLanes(d) {
    if (d.requests.length <= MAX_LANES) return d.requests;
    const keep = new Set();
    d.requests.forEach(function (r) { if (r.is_whale) keep.add(r.request_id); });
    d.victims.slice().sort(function (a, b) { return b.slowdown_s - a.slowdown_s; }).forEach(function (v) {
      if (keep.size < MAX_LANES && v.slowdown_s >= d.victim_threshold_s) {
        keep.add(v.request_id);
        if (v.culprits.length) keep.add(v.culprits[0].request_id);
      }
    });
    d.requests.forEach(function (r) { if (keep.size < MAX_LANES) keep.add(r.request_id); });
    return d.requests.filter(function (r) { return keep.has(r.request_id); });
  }

  // [t0, t1] around one request's life (a sixth of it either side, at least 0.2 s), or null.
  function focusSpan(lanes, id, now) {
    const r = lanes.find(function (l) { return l.request_id === id; });
    if (!r || r.arrival_ts == null) return null;
    const end = r.finish_ts != null ? r.finish_ts : r.aborted_ts != null ? r.aborted_ts : now;
    const pad = Math.max((end - r.arrival_ts) / 6, 0.2);
    return [r.arrival_ts - pad, Math.max(end, r.arrival_ts) + pad];
  }

  function showFocus(id, span) {
    const box = document.getElementById('focus');
    box.textContent = '';
    if (id == null) return;
    const say = document.createElement('span');
    say.textContent = span ? 'Zoomed to ' + id + ' ' : 'Request ' + id + ' is not in this window. ';
    box.appendChild(say);
    const back = document.createElement('button');
    back.type = 'button';
    back.textContent = 'Show the whole window';
    back.addEventListener('click', function () { focus(null); });
    box.appendChild(back);
  }

  function draw(d) {
    let lanes = pickLanes(d);
    const steps = d.steps;
    // Names for the lanes, the KV areas and every culprit (a culprit without a lane is named beside its victims).
    const culpritIds = [].concat.apply([], d.victims.map(function (v) {
      return v.culprits.map(function (c) { return c.request_id; });
    }));
    const names = shortNames(Array.from(new Set(lanes.map(function (r) { return r.request_id; })
      .concat(Object.keys(d.kv), culpritIds))));
    const whaleColour = {};
    lanes.filter(function (r) { return r.is_whale; }).forEach(function (r, i) {
      whaleColour[r.request_id] = WHALE_COLOURS[i % WHALE_COLOURS.length];
    });
    const victims = {};
    d.victims.forEach(function (v) { victims[v.request_id] = v; });
    const laneIndex = {};
    lanes.forEach(function (r, i) { laneIndex[r.request_id] = i; });

    if (!steps.length && !lanes.length) {
      setStatus('No engine steps yet: the timeline fills once vLLM logs its iterations.', false);
    } else {
      setStatus((d.truncated ? 'Showing part of the timeline (bounded response); use ?since= to page on. ' : '') +
                (lanes.length < d.requests.length ? 'Lanes for ' + lanes.length + ' of ' + d.requests.length +
                 ' requests: whales, the most slowed and their culprits first.' : ''), false);
    }
    // The axis fits the data in the window: its steps and lanes, never "now" (an idle engine would squeeze
    // its last traffic to the right) and never before the window (a request arrived earlier is cut).
    let t0 = d.since, t1 = d.until;
    lanes.forEach(function (r) {
      if (r.arrival_ts != null) t0 = t0 == null ? r.arrival_ts : Math.min(t0, r.arrival_ts);
      const end = r.finish_ts != null ? r.finish_ts : r.aborted_ts;
      if (end != null) t1 = t1 == null ? end : Math.max(t1, end);
    });
    if (d.window_start != null && t0 != null) t0 = Math.max(t0, d.window_start);
    // A cut response (the newest max_steps, or max_steps from ?since=) holds no steps beyond its own: the KV
    // area would read 0 blocks there for requests that held some, so the axis stops at its steps.
    if (d.truncated && steps.length && d.since != null && d.until != null) {
      if (d.next_since == null) t0 = t0 == null ? d.since : Math.max(t0, d.since);
      else t1 = t1 == null ? d.until : Math.min(t1, d.until);
    }
    if (t0 == null || t1 == null || t1 <= t0) { t0 = (t0 || 0); t1 = t0 + 1; }
    const now = t1;  // running requests reach the newest data
    const span = focusSpan(lanes, focused, now);
    if (span) {  // zoomed to one request: its time, a margin either side, and the lanes it overlaps
      t0 = span[0]; t1 = span[1];
      lanes = lanes.filter(function (r) {
        const end = r.finish_ts != null ? r.finish_ts : r.aborted_ts != null ? r.aborted_ts : now;
        return r.arrival_ts != null && r.arrival_ts <= t1 && end >= t0;
      });
      Object.keys(laneIndex).forEach(function (id) { delete laneIndex[id]; });
      lanes.forEach(function (r, i) { laneIndex[r.request_id] = i; });
    }
    showFocus(focused, span);

    const chart = document.getElementById('chart');
    chart.textContent = '';
    const W = Math.max(chart.clientWidth || 0, 900);
    // The label column fits the longest lane name (monospace, ~7.3 px a character), and the start clock.
    const longest = lanes.reduce(function (m, r) { return Math.max(m, names[r.request_id].length); }, 6);
    const left = Math.min(Math.max(longest * 7.3 + 22, 125), 240), right = 200, top = 14, areaH = 230, axisH = 34,
      rowH = 20;
    const gpuH = d.gpu && d.gpu.length ? 40 : 0;  // the GPU's own row, only when NVML reports
    const lanesTop = top + areaH + gpuH + axisH;
    const H = lanesTop + lanes.length * rowH + 10;
    const x = function (t) { return left + (t - t0) / (t1 - t0) * (W - left - right); };
    const svg = el('svg', { width: W, height: H, viewBox: '0 0 ' + W + ' ' + H, role: 'img',
                            'aria-label': 'KV blocks by request over time, and request lanes',
                            'data-t0': t0, 'data-t1': t1 }, chart);
    defs(svg, left, W - right, H);

    // Time grid and axis
    const tick = niceStep(t1 - t0, 10);
    const grid = el('g', { class: 'axis' }, svg);
    for (let s = 0; s <= t1 - t0 + 1e-9; s += tick) {
      const gx = x(t0 + s);
      el('line', { x1: gx, x2: gx, y1: top, y2: H - 10, stroke: '#eeeeee' }, grid);
      text(grid, gx, lanesTop - 12, '+' + (+s.toFixed(3)) + ' s', { 'text-anchor': 'middle' });
    }
    const startClock = new Date(t0 * 1000).toLocaleTimeString([], { hour12: false });
    text(grid, left - 20, lanesTop - 12, 'since ' + startClock, { class: 'muted', 'text-anchor': 'end' });

    // KV stacked area
    drawKv(svg, d, lanes, steps, whaleColour, x, top, areaH, t1, left, W - right);
    if (gpuH) drawGpu(svg, d.gpu, x, top + areaH + 6, gpuH - 10, left, W - right);

    // Lanes
    const lanesG = el('g', { class: 'lanes' }, svg);
    const laneEls = {};
    lanes.forEach(function (r, i) {
      const lane = drawLane(lanesG, r, i, lanesTop + i * rowH, rowH, x, now, names, whaleColour,
                            victims[r.request_id], d.victim_threshold_s, W, right, left);
      lane.addEventListener('mousemove', function (ev) { showTip(ev, r, victims[r.request_id], names); });
      lane.addEventListener('mouseleave', hideTip);
      lane.addEventListener('click', function () { focus(r.request_id); });
      laneEls[r.request_id] = lane;
    });
    // Link from the selected victim's wait to its top culprit
    const links = el('g', { class: 'links' }, svg);
    const sel = selected && victims[selected] ? victims[selected] : null;
    if (sel) drawLinks(links, sel, laneIndex, lanes, lanesTop, rowH, x);
    if (selected in laneEls) laneEls[selected].classList.add('selected');
    if (span && focused in laneEls) {
      laneEls[focused].classList.add('focused');
      if (laneEls[focused].scrollIntoView) laneEls[focused].scrollIntoView({ block: 'center' });
    }
    if (sel) {
      sel.culprits.forEach(function (c) {
        if (c.request_id in laneEls) laneEls[c.request_id].classList.add('culprit');
      });
    }

    svg.setAttribute('data-clipped-labels', String(clippedLabels(svg, W)));
    legend(whaleColour, names, (d.kv_shared || []).some(function (pt) { return pt[1] > 0; }));
    details(sel, names, whaleColour);
    const wh = Object.keys(whaleColour).length;
    document.getElementById('summary').textContent =
      lanes.length + ' requests · ' + wh + ' whale' + (wh === 1 ? '' : 's') + ' · ' + d.victims.filter(function (v) {
        return v.slowdown_s >= d.victim_threshold_s; }).length + ' slowed · ' + steps.length + ' engine steps · ' +
      fmtS(t1 - t0) + (d.pool_blocks ? ' · KV pool ' + d.pool_blocks + ' blocks × ' + d.block_size + ' tokens' : '') +
      (d.live ? ' · live' : ' · replay');
  }

  // A culprit's seconds by cause, TTFT and ITL together (ITL per token times the victim's gaps; a result from
  // before ITL had causes gives its ITL blame as decode batching).
  function blameByCause(c, gaps) {
    const out = Object.assign({}, c.causes);
    const itl = c.itl_causes && Object.keys(c.itl_causes).length ? c.itl_causes
      : (c.itl_s > 0 ? { decode_batching: c.itl_s } : {});
    Object.keys(itl).forEach(function (k) { out[k] = (out[k] || 0) + itl[k] * gaps; });
    return out;
  }

  function causesText(causes) {
    const total = Object.values(causes).reduce(function (a, b) { return a + b; }, 0);
    if (!(total > 0)) return '';
    return Object.keys(causes).sort(function (a, b) { return causes[b] - causes[a]; })
      .filter(function (k) { return causes[k] / total >= 0.01; })
      .map(function (k) { return k.replace(/_/g, ' ') + ' ' + Math.round(causes[k] / total * 100) + '%'; })
      .join(', ');
  }

  function details(v, names, whaleColour) {
    const box = document.getElementById('details');
    box.textContent = '';
    if (!v) return;
    const add = function (tag, txt, cls) {
      const e = document.createElement(tag);
      e.textContent = txt;
      if (cls) e.className = cls;
      box.appendChild(e);
      return e;
    };
    add('span', names[v.request_id] || v.request_id, 'who').title = v.request_id;
    const parts = [];
    if (v.ttft_slowdown_s > 0) parts.push('waited ' + fmtS(v.ttft_slowdown_s) + ' longer for its first token (TTFT ' +
                                          fmtS(v.ttft_s) + ', baseline ' + fmtS(v.ttft_baseline_s) + ')');
    const dec = v.itl_slowdown_s * v.itl_gaps;
    if (dec > 0) parts.push('decoded ' + fmtS(dec) + ' slower over ' + v.itl_gaps + ' tokens');
    add('span', ' ' + parts.join(' and ') + (v.final ? '' : ' (partial: culprits still running)') + '. Slowed by ');
    v.culprits.forEach(function (c, k) {
      const a = add('a', names[c.request_id] || c.request_id);
      a.title = c.request_id;
      a.addEventListener('click', function (e) { e.preventDefault(); select(c.request_id); });
      if (whaleColour[c.request_id]) a.style.color = whaleColour[c.request_id];
      const why = causesText(blameByCause(c, v.itl_gaps));
      add('span', (c.is_whale ? ' (whale)' : '') + ': ' + fmtS(c.seconds));
      if (why) add('span', ' via ' + why, 'causes');
      add('span', k < v.culprits.length - 1 ? '; ' : '.');
    });
    if (v.unexplained_s > 0.0005) add('span', ' Unexplained: ' + fmtS(v.unexplained_s) + '.', 'causes');
  }

  function select(id) {
    selected = id;
    if (current) draw(current);
  }

  // Zoom to one request (null: the whole window); the URL keeps it, so the view can be shared.
  function focus(id) {
    focused = id;
    if (id != null) selected = id;
    const q = new URLSearchParams(location.search);
    if (id == null) q.delete('request'); else q.set('request', id);
    history.replaceState(null, '', location.pathname + (q.toString() ? '?' + q : '') + location.hash);
    if (current) draw(current);
  }

  function windowPicker() {
    const pick = document.getElementById('window');
    if (!WINDOWS.some(function (w) { return w[0] === windowParam; })) WINDOWS.push([windowParam, null]);
    WINDOWS.concat([['all', null]]).forEach(function (w) {
      const o = document.createElement('option');
      o.value = w[0];
      o.textContent = w[0] === 'all' ? 'all kept' : 'last ' + w[0];
      pick.appendChild(o);
    });
    pick.value = windowParam;
    pick.addEventListener('change', function () {
      windowParam = pick.value;
      const q = new URLSearchParams(location.search);
      q.set('window', windowParam);
      history.replaceState(null, '', location.pathname + '?' + q + location.hash);
      load().then(function (data) { if (data) { current = data; draw(data); } });
    });
  }

  function showTip(ev, r, v, names) {
    const tip = document.getElementById('tip');
    tip.textContent = '';
    const line = function (s, bold) {
      const e = document.createElement(bold ? 'b' : 'div');
      e.textContent = s;
      tip.appendChild(e);
    };
    line(r.request_id, true);
    const ttft = r.first_token_ts != null && r.arrival_ts != null ? r.first_token_ts - r.arrival_ts : null;
    const qd = r.scheduled_ts != null && r.arrival_ts != null ? r.scheduled_ts - r.arrival_ts : null;
    line((r.is_whale ? 'whale · ' : '') + (r.prompt_tokens != null ? r.prompt_tokens + ' prompt tokens · ' : '') +
         (r.completion_tokens != null ? r.completion_tokens + ' output tokens' : r.status));
    line('queued ' + fmtS(qd) + ' · TTFT ' + fmtS(ttft) +
         (r.finish_ts != null && r.arrival_ts != null ? ' · total ' + fmtS(r.finish_ts - r.arrival_ts) : ''));
    (r.preemptions || []).forEach(function (p) {
      line((p.actionable === false ? 'possibly preempted (not corroborated) for ' : 'preempted for ') +
           fmtS((p.resumed_ts || p.ts) - p.ts) + ' (confidence ' + Math.round(p.confidence * 100) + '%)');
    });
    if (v && v.culprits.length) {
      const c = v.culprits[0];
      line('slowed ' + fmtS(v.slowdown_s) + ', most by ' + (names[c.request_id] || c.request_id) + ' (' +
           fmtS(c.seconds) + ') — click for details');
    }
    tip.hidden = false;
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 470) + 'px';
    tip.style.top = (ev.clientY + 14) + 'px';
  }
  function hideTip() { document.getElementById('tip').hidden = true; }

  document.addEventListener('DOMContentLoaded', function () {
    windowPicker();
    refresh().then(function () {
      // Start with the worst-slowed request selected, so its culprits show without a click.
      if (current && selected == null && current.victims.length) {
        const worst = current.victims.slice().sort(function (a, b) { return b.slowdown_s - a.slowdown_s; })
          .filter(function (v) { return !v.is_whale; })[0] || current.victims[0];
        select(worst.request_id);
      }
    });
  });
  window.addEventListener('resize', function () { if (current) draw(current); });
})();
