// The report page's script (report/html_page.h): draws each section whose data the page holds,
// with Chart.js. Inlined into the page with the data; it loads nothing.
(function () {
  'use strict';
  const started = performance.now();
  const D = JSON.parse(document.getElementById('fsdplab-data').textContent);
  const R = D.report || null;
  const main = document.getElementById('sections');

  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = false;
  Chart.defaults.responsive = true;
  Chart.defaults.font.size = 12;
  Chart.defaults.color = '#1d232b';
  Chart.defaults.plugins.legend.labels.boxWidth = 14;

  // The colours of op kinds and memory categories (colour-blind safe, Tableau 10).
  const KIND_COLOR = {
    compute: '#4e79a7', all_gather: '#f28e2b', reduce_scatter: '#59a14f',
    all_reduce: '#b07aa1', memory_wait: '#e15759'
  };
  const CATEGORY_COLOR = {
    sharded_params: '#4e79a7', unsharded_params: '#f28e2b', sharded_grads: '#59a14f',
    unsharded_grads: '#8cd17d', reduce_scatter_buffers: '#b07aa1', activations: '#76b7b2',
    master_params: '#9c755f', optimizer_state: '#bab0ac', grad_accumulation: '#edc948'
  };
  const CATEGORY_LABEL = {
    sharded_params: 'sharded parameters', unsharded_params: 'unsharded parameters (gathered)',
    sharded_grads: 'sharded gradients', unsharded_grads: 'unsharded gradients',
    reduce_scatter_buffers: 'reduce-scatter buffers', activations: 'activations',
    master_params: 'master parameters (fp32)', optimizer_state: 'optimizer state',
    grad_accumulation: 'gradient accumulator'
  };

  // ---- formatting, as the text report writes its numbers ----
  function fmtUs(us) {
    if (us >= 1e6) return (us / 1e6).toFixed(3) + ' s';
    if (us >= 1e3) return (us / 1e3).toFixed(3) + ' ms';
    return us.toFixed(1) + ' us';
  }
  function fmtBytes(b) {
    if (b >= 2 ** 30) return (b / 2 ** 30).toFixed(2) + ' GiB';
    if (b >= 2 ** 20) return (b / 2 ** 20).toFixed(1) + ' MiB';
    if (b >= 2 ** 10) return (b / 2 ** 10).toFixed(1) + ' KiB';
    return b + ' B';
  }
  function fmtPct(x) { return (100 * x).toFixed(1) + '%'; }
  function fmtSize(b) {  // axis ticks of sizes: powers of 1024
    const units = ['B', 'K', 'M', 'G', 'T'];
    let u = 0;
    while (b >= 1024 && u < 4) { b /= 1024; ++u; }
    return (Math.round(b * 100) / 100) + units[u];
  }

  // ---- the DOM ----
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) {
      if (c !== null && c !== undefined) e.append(c);
    }
    return e;
  }
  const toc = document.getElementById('toc');
  function section(id, title, intro) {
    const s = el('section', {id: id, 'data-section': id}, el('h2', {text: title}));
    if (intro) s.append(el('p', {class: 'intro', text: intro}));
    main.append(s);
    toc.append(el('a', {href: '#' + id, text: title}));
    return s;
  }
  function chartBox(parent, id, height) {
    const canvas = el('canvas', {id: id, role: 'img'});
    const box = el('div', {class: 'chart', style: 'height:' + Math.round(height) + 'px'}, canvas);
    parent.append(box);
    return canvas;
  }
  function numCell(value, text, key) {
    return el('td', {class: 'num', 'data-key': key, 'data-value': String(value), text: text});
  }
  const charts = {};

  // ---- Summary ----
  function memoryCap() {
    if (R && R.timeline && R.timeline.memory_cap_bytes) return R.timeline.memory_cap_bytes;
    for (const n of (R && R.notes) || []) {
      const m = /^memory cap: (\d+) bytes per rank/.exec(n);
      if (m) return Number(m[1]);
    }
    return null;
  }

  function verdict(s, cap) {
    if (R.errors && R.errors.length) {
      return ['bad', 'The step would fail: ' + R.errors[0]];
    }
    const held = s.peak_reserved_bytes || s.peak_memory_bytes;
    if (cap && held > cap) {
      return ['bad', 'Over the memory cap: ' + fmtBytes(held) + ' against ' + fmtBytes(cap) + '.'];
    }
    const exposed = s.step_time_us > 0 ? s.exposed_comm_us / s.step_time_us : 0;
    const idle = s.step_time_us > 0 ? s.idle_us / s.step_time_us : 0;
    const bound = s.lower_bound_us > 0 ? s.step_time_us / s.lower_bound_us : 0;
    const parts = [];
    let kind = 'good';
    if (exposed >= 0.1) {
      kind = 'warn';
      parts.push('Communication-bound: ' + fmtPct(exposed) + ' of the step waits for ' +
                 'collectives that no compute hides');
    } else {
      parts.push('Compute-bound: collectives are hidden, ' + fmtPct(exposed) +
                 ' of the step is exposed communication');
    }
    if (idle >= 0.1) {
      kind = 'warn';
      parts.push(fmtPct(idle) + ' of the step is idle (host, stalls, late launches)');
    }
    if (bound > 0) parts.push('the step is ' + bound.toFixed(2) + 'x its lower bound');
    if (cap) parts.push('memory ' + fmtPct(held / cap) + ' of the cap');
    return [kind, parts.join('; ') + '.'];
  }

  function drawSummary() {
    const s = R.summary;
    const m = D.measured ? D.measured.summary : null;
    const sec = section('summary', 'Summary',
      (R.measured ? 'Measured' : 'Simulated') + ' (' + R.source + '); the mean of the steps ' +
      'after the first. ' + (R.cluster && R.cluster.world_size ? R.cluster.world_size +
      ' ranks. ' : '') + 'Compute, exposed communication and idle split the step.');
    const cap = memoryCap();
    const [kind, text] = verdict(s, cap);
    sec.append(el('div', {class: 'verdict ' + kind, id: 'verdict', text: text}));
    if (D.comparison) {
      const c = D.comparison.summary;
      sec.append(el('div', {class: 'verdict ' + (c.within_threshold ? 'good' : 'bad'),
        id: 'compare-verdict', text: D.comparison.verdict}));
    }
    const head = el('tr', {}, el('th', {text: ''}),
                    el('th', {text: R.measured ? 'measured' : 'predicted'}));
    if (m) head.append(el('th', {text: 'measured'}));
    const table = el('table', {class: 'grid', id: 'summary-table'}, el('thead', {}, head));
    const body = el('tbody');
    function row(label, key, value, text, mvalue, mtext) {
      const tr = el('tr', {'data-key': key}, el('th', {text: label}), numCell(value, text, key));
      if (m) tr.append(mvalue === undefined ? el('td') : numCell(mvalue, mtext, 'measured.' + key));
      body.append(tr);
      return tr;
    }
    const share = (x) => s.step_time_us > 0 ? ' (' + fmtPct(x / s.step_time_us) + ')' : '';
    row('Step time', 'step_time_us', s.step_time_us, fmtUs(s.step_time_us),
        m && m.step_time_us, m && fmtUs(m.step_time_us)).querySelector('td').id =
        'summary-step-time';
    row('Compute', 'compute_us', s.compute_us, fmtUs(s.compute_us) + share(s.compute_us),
        m && m.compute_us, m && fmtUs(m.compute_us));
    row('Exposed communication', 'exposed_comm_us', s.exposed_comm_us,
        fmtUs(s.exposed_comm_us) + share(s.exposed_comm_us), m && m.exposed_comm_us,
        m && fmtUs(m.exposed_comm_us));
    row('Idle', 'idle_us', s.idle_us, fmtUs(s.idle_us) + share(s.idle_us), m && m.idle_us,
        m && fmtUs(m.idle_us));
    row('Overlap', 'overlap_ratio', s.overlap_ratio,
        s.overlapped + ' of ' + s.collectives + ' collectives (' + fmtPct(s.overlap_ratio) + ')',
        m && m.overlap_ratio, m && fmtPct(m.overlap_ratio));
    row('Lower bound', 'lower_bound_us', s.lower_bound_us, fmtUs(s.lower_bound_us));
    row('Peak memory (tensors)', 'peak_memory_bytes', s.peak_memory_bytes,
        fmtBytes(s.peak_memory_bytes) + ' on rank ' + s.peak_memory_rank,
        m && m.peak_memory_bytes, m && fmtBytes(m.peak_memory_bytes));
    if (s.peak_memory_if_late_bytes > s.peak_memory_bytes) {
      row('Peak if one collective ends late', 'peak_memory_if_late_bytes',
          s.peak_memory_if_late_bytes, fmtBytes(s.peak_memory_if_late_bytes));
    }
    if (s.peak_reserved_bytes > 0) {
      row('Reserved (caching allocator)', 'peak_reserved_bytes', s.peak_reserved_bytes,
          fmtBytes(s.peak_reserved_bytes) + ' on rank ' + s.peak_reserved_rank,
          m && m.peak_reserved_bytes, m && fmtBytes(m.peak_reserved_bytes));
    }
    if (cap) row('Memory cap', 'memory_cap_bytes', cap, fmtBytes(cap));
    table.append(body);

    const left = el('div', {}, table);
    const right = el('div');
    sec.append(el('div', {class: 'row'}, left, right));
    // The step split, and the memory against the cap.
    const split = chartBox(right, 'summary-step-chart', 150);
    const labels = m ? ['predicted', 'measured'] : [R.measured ? 'measured' : 'predicted'];
    const pick = (k) => m ? [s[k], m[k]] : [s[k]];
    charts.step = new Chart(split, {
      type: 'bar',
      data: {labels: labels, datasets: [
        {label: 'compute', data: pick('compute_us'), backgroundColor: KIND_COLOR.compute},
        {label: 'exposed communication', data: pick('exposed_comm_us'),
         backgroundColor: '#e15759'},
        {label: 'idle', data: pick('idle_us'), backgroundColor: '#bab0ac'}]},
      options: {indexAxis: 'y', scales: {
        x: {stacked: true, title: {display: true, text: 'time in the step (ms)'},
            ticks: {callback: (v) => v / 1000}},
        y: {stacked: true, ticks: {autoSkip: false}}},
        plugins: {title: {display: true, text: 'Where the step goes'},
                  tooltip: {callbacks: {label: (c) => c.dataset.label + ': ' + fmtUs(c.raw)}}}}
    });
    const memLabels = ['peak (tensors)'];
    const memData = [s.peak_memory_bytes];
    if (s.peak_memory_if_late_bytes > s.peak_memory_bytes) {
      memLabels.push('peak if one collective is late');
      memData.push(s.peak_memory_if_late_bytes);
    }
    if (s.peak_reserved_bytes > 0) {
      memLabels.push('reserved');
      memData.push(s.peak_reserved_bytes);
    }
    if (cap) {
      memLabels.push('memory cap');
      memData.push(cap);
    }
    const gib = Math.max(...memData) >= 2 ** 30;
    const unit = gib ? 2 ** 30 : 2 ** 20;
    const mem = chartBox(right, 'summary-memory-chart', 70 + 30 * memLabels.length);
    charts.memorySummary = new Chart(mem, {
      type: 'bar',
      data: {labels: memLabels, datasets: [{label: 'memory per rank', data: memData.map((b) => b / unit),
        backgroundColor: memLabels.map((l) => l === 'memory cap' ? '#c0392b' : '#4e79a7')}]},
      options: {indexAxis: 'y', plugins: {legend: {display: false},
        title: {display: true, text: 'Memory per rank against the cap'},
        tooltip: {callbacks: {label: (c) => fmtBytes(memData[c.dataIndex])}}},
        scales: {x: {beginAtZero: true, title: {display: true, text: gib ? 'GiB' : 'MiB'}}}}
    });
  }

  // ---- Timeline ----
  // The lanes and bars: the report's "timeline" (ranks that matter, exposed time, the critical
  // path), or, without it, rank 0's ops from the report's "ops".
  function timelineModel() {
    const T = R.timeline;
    const lanes = [];
    const ops = [];   // {lane, kind, start, dur, unit, step, mb, bytes, reason, phase, wait, rank}
    const exposed = [];
    const path = [];
    let note = '';
    if (T && T.ranks && T.ranks.length) {
      const trackOrder = ['compute', 'all_gather', 'reduce_scatter', 'all_reduce'];
      for (const r of T.ranks) {
        const present = new Set(r.ops.map((o) => T.tracks[o[0]]));
        const laneOf = {};
        for (const t of trackOrder.concat([...present].filter((t) => !trackOrder.includes(t)))) {
          if (!present.has(t)) continue;
          laneOf[t] = 'rank ' + r.rank + ' ' + t;
          lanes.push(laneOf[t]);
        }
        if (r.exposed.length) {
          const lane = 'rank ' + r.rank + ' exposed';
          lanes.push(lane);
          for (const [a, b] of r.exposed) exposed.push({x: [a, b], y: lane});
        }
        for (const o of r.ops) {
          ops.push({lane: laneOf[T.tracks[o[0]]], kind: T.kinds[o[1]], start: o[2], dur: o[3],
            unit: o[4] >= 0 ? T.unit_names[o[4]] : '', step: o[5], mb: o[6], bytes: o[7],
            reason: o[8] >= 0 ? T.reasons[o[8]] : '', phase: T.phases[o[9]], wait: o[10],
            rank: r.rank});
        }
      }
      for (const [rank, track, a, b] of T.critical_path) {
        const lane = 'rank ' + rank + ' ' + T.tracks[track];
        path.push({x: a, y: lane}, {x: b, y: lane});
      }
      const shown = T.ranks.map((r) => r.rank + ' (' + r.why.join(', ') + ')');
      note = 'Ranks shown: ' + shown.join('; ') + '. ' + T.ranks.length + ' of ' +
        T.world_size + ' ranks' + (T.ranks_with_ops < T.world_size ? ' (' + T.ranks_with_ops +
        ' recorded: ranks that run alike are simulated once, as a class)' : '') + '.';
      if (T.critical_path_hidden > 0) {
        note += ' ' + T.critical_path_hidden + ' ops of the critical path ran on ranks not shown.';
      }
      if (!T.critical_path.length) note += ' Run with --explain to draw the critical path.';
    } else if (R.ops && R.ops.length) {
      const seen = new Set();
      for (const o of R.ops) seen.add(o.kind);
      for (const k of ['compute', 'all_gather', 'reduce_scatter', 'all_reduce']) {
        if (seen.has(k)) lanes.push('rank 0 ' + k);
      }
      for (const o of R.ops) {
        ops.push({lane: 'rank 0 ' + o.kind, kind: o.kind, start: o.start_us, dur: o.dur_us,
          unit: o.unit || '', step: o.step, mb: o.microbatch, bytes: o.bytes,
          reason: o.reason || '', phase: o.phase, wait: o.wait_us || 0, rank: 0});
      }
      note = 'The lowest rank\'s ops from the report. A report written with --html beside -o ' +
        'also carries the slowest and fastest ranks, exposed time and memory over time.';
    }
    return {lanes, ops, exposed, path, note};
  }

  function drawTimeline() {
    const M = timelineModel();
    if (!M.ops.length) return false;
    const sec = section('timeline', 'Timeline',
      'Each stream of each rank shown, coloured by kind. The "exposed" lane marks when a ' +
      'collective runs and no compute does; the black line is the critical path. Hover an op ' +
      'for its unit, step, microbatch, bytes and why it was issued.');
    sec.append(el('p', {class: 'note', id: 'timeline-note', text: M.note}));
    const controls = el('div', {class: 'controls'}, el('span', {text: 'Show:'}));
    sec.append(controls);
    const byKind = {};
    M.ops.forEach((o, i) => {
      (byKind[o.kind] = byKind[o.kind] || []).push({x: [o.start, o.start + o.dur], y: o.lane, i});
    });
    const datasets = Object.keys(byKind).map((k) => ({
      label: k, data: byKind[k], backgroundColor: KIND_COLOR[k] || '#888', fsdplabRole: 'op',
      grouped: false, barPercentage: 0.9, categoryPercentage: 0.9, minBarLength: 1
    }));
    if (M.exposed.length) {
      datasets.push({label: 'exposed communication', data: M.exposed, backgroundColor: '#e15759',
        grouped: false, barPercentage: 0.6, categoryPercentage: 0.9, minBarLength: 1,
        fsdplabRole: 'exposed'});
    }
    if (M.path.length) {
      datasets.push({type: 'line', label: 'critical path', data: M.path, borderColor: '#111',
        backgroundColor: '#111', borderWidth: 1.5, pointRadius: 0, fsdplabRole: 'path',
        indexAxis: 'y'});
    }
    const t0 = Math.min(...M.ops.map((o) => o.start));
    const t1 = Math.max(...M.ops.map((o) => o.start + o.dur));
    const canvas = chartBox(sec, 'timeline-chart', 70 + 22 * M.lanes.length);
    const chart = new Chart(canvas, {
      type: 'bar',
      data: {labels: M.lanes, datasets: datasets},
      options: {
        indexAxis: 'y',
        interaction: {mode: 'nearest', intersect: true},
        scales: {
          x: {type: 'linear', min: t0, max: t1, title: {display: true, text: 'time (ms)'},
              ticks: {includeBounds: false, callback: (v) => (v / 1000).toLocaleString()}},
          y: {type: 'category', ticks: {autoSkip: false}}
        },
        plugins: {
          tooltip: {callbacks: {label: (c) => {
            if (c.dataset.fsdplabRole === 'path') return 'critical path';
            if (c.dataset.fsdplabRole === 'exposed') {
              return 'exposed communication: ' + fmtUs(c.raw.x[1] - c.raw.x[0]);
            }
            const o = M.ops[c.raw.i];
            const lines = [o.kind + (o.unit ? ' ' + o.unit : '') + ' (' + o.phase + ')',
              'rank ' + o.rank + ', step ' + o.step + ', microbatch ' + o.mb,
              fmtUs(o.dur) + ' from ' + fmtUs(o.start)];
            if (o.bytes) lines.push(fmtBytes(o.bytes));
            if (o.reason) lines.push('issued: ' + o.reason);
            if (o.wait > 0) lines.push('waited ' + fmtUs(o.wait) + ' for the other ranks');
            return lines;
          }}}
        }
      }
    });
    charts.timeline = chart;
    // The step windows to zoom to.
    const buttons = [];
    function zoom(button, lo, hi) {
      chart.options.scales.x.min = lo;
      chart.options.scales.x.max = hi;
      chart.update();
      for (const b of buttons) b.classList.toggle('on', b === button);
    }
    const all = el('button', {class: 'on', type: 'button', text: 'all steps'});
    all.addEventListener('click', () => zoom(all, t0, t1));
    buttons.push(all);
    controls.append(all);
    for (const s of R.steps || []) {
      const b = el('button', {type: 'button', text: 'step ' + s.index});
      b.addEventListener('click', () => zoom(b, s.start_us, s.end_us));
      buttons.push(b);
      controls.append(b);
    }
  }

  // ---- Memory over time ----
  function drawMemory() {
    const T = R.timeline;
    const mem = T && T.memory;
    if (!mem || !mem.t_us.length) return false;
    const s = R.summary;
    const cap = memoryCap();
    const top = Math.max(s.peak_memory_if_late_bytes || 0, s.peak_memory_bytes, cap || 0,
                         ...(mem.reserved.length ? mem.reserved : [0]));
    const unit = top >= 2 ** 30 ? 2 ** 30 : 2 ** 20;
    const unitName = unit === 2 ** 30 ? 'GiB' : 'MiB';
    const sec = section('memory', 'Memory over time',
      'Rank ' + mem.rank + ' (the rank with the peak), stacked by category. The red dashed ' +
      'line is the memory cap, the marker the peak, the bracket above it how high one ' +
      'collective ending late could raise it.');
    if (mem.kept < mem.samples) {
      sec.append(el('p', {class: 'note', text: mem.kept + ' of ' + mem.samples + ' samples drawn, ' +
        'each the highest of its slice of time (the peak is one of them).'}));
    }
    const t = mem.t_us;
    const datasets = mem.categories.map((c, k) => ({
      label: CATEGORY_LABEL[c] || c, data: t.map((x, i) => ({x: x, y: mem.bytes[k][i] / unit})),
      backgroundColor: CATEGORY_COLOR[c] || '#888', borderColor: CATEGORY_COLOR[c] || '#888',
      borderWidth: 0.5, pointRadius: 0, stepped: 'after', fill: k === 0 ? 'origin' : '-1',
      stack: 'categories', fsdplabRole: 'category'
    }));
    const t0 = t[0];
    const t1 = t[t.length - 1];
    if (mem.reserved.length) {
      datasets.push({label: 'reserved (caching allocator)', stack: 'reserved', stepped: 'after',
        data: t.map((x, i) => ({x: x, y: mem.reserved[i] / unit})), borderColor: '#555',
        borderDash: [2, 2], borderWidth: 1, pointRadius: 0, fill: false});
    }
    if (cap) {
      datasets.push({label: 'memory cap', stack: 'cap', data: [{x: t0, y: cap / unit},
        {x: t1, y: cap / unit}], borderColor: '#c0392b', borderDash: [6, 4], borderWidth: 2,
        pointRadius: 0, fill: false, fsdplabRole: 'cap'});
    }
    if (s.peak_memory_rank === mem.rank) {
      datasets.push({label: 'peak ' + fmtBytes(s.peak_memory_bytes), stack: 'peak',
        data: [{x: s.peak_memory_at_us, y: s.peak_memory_bytes / unit}], showLine: false,
        pointRadius: 6, pointStyle: 'triangle', backgroundColor: '#c0392b',
        borderColor: '#c0392b', fsdplabRole: 'peak'});
      if (s.peak_memory_if_late_bytes > s.peak_memory_bytes) {
        datasets.push({label: 'up to ' + fmtBytes(s.peak_memory_if_late_bytes) +
          ' if one collective ends late', stack: 'late',
          data: [{x: s.peak_memory_at_us, y: s.peak_memory_bytes / unit},
                 {x: s.peak_memory_at_us, y: s.peak_memory_if_late_bytes / unit}],
          borderColor: '#7f3c8d', borderWidth: 3, pointRadius: 4, pointStyle: 'line',
          fill: false, fsdplabRole: 'late'});
      }
    }
    charts.memory = new Chart(chartBox(sec, 'memory-chart', 380), {
      type: 'line',
      data: {datasets: datasets},
      options: {
        parsing: true,
        interaction: {mode: 'nearest', axis: 'x', intersect: false},
        scales: {
          x: {type: 'linear', min: t0, max: t1, title: {display: true, text: 'time (ms)'},
              ticks: {includeBounds: false, callback: (v) => (v / 1000).toLocaleString()}},
          y: {stacked: true, beginAtZero: true, title: {display: true, text: unitName + ' per rank'}}
        },
        plugins: {
          legend: {position: 'bottom'},
          tooltip: {callbacks: {
            title: (items) => items.length ? 'at ' + fmtUs(items[0].parsed.x) : '',
            label: (c) => c.dataset.label + ': ' + fmtBytes(Math.round(c.raw.y * unit))}}
        }
      }
    });
  }

  // ---- Per unit ----
  function drawUnits() {
    const units = (R.units || []).filter((u) => u.gathers > 0);
    if (!units.length) return false;
    const slack = {};
    const cp = R.critical_path;
    if (cp && cp.gathers) {
      for (const g of cp.gathers) {
        const k = g.unit || '(none)';
        const cur = slack[k];
        if (!cur || g.slack_us < cur.min) slack[k] = {min: g.slack_us, onPath: 0};
        if (g.on_path) slack[k].onPath += 1;
      }
    }
    const haveSlack = Object.keys(slack).length > 0;
    const sec = section('units', 'Per unit',
      'Each unit\'s all-gathers over the run (lowest rank): how long they took, how much of ' +
      'that no compute hid (exposed)' + (haveSlack ? ', and the least slack of its gathers ' +
      '(how much later one could have ended without lengthening the run)' : '') + '.' +
      (haveSlack ? '' : ' Run with --explain for each unit\'s slack.'));
    const controls = el('div', {class: 'controls'}, el('label', {for: 'units-sort',
      text: 'Sort by:'}));
    const select = el('select', {id: 'units-sort'});
    const keys = [['model', 'model order'], ['exposed', 'exposed time'],
      ['gather', 'gather time'], ['gathers', 'gathers']];
    if (haveSlack) keys.push(['slack', 'least slack']);
    for (const [k, label] of keys) select.append(el('option', {value: k, text: label}));
    controls.append(select);
    sec.append(controls);
    const rows = units.map((u, i) => ({u, i, s: slack[u.unit]}));
    let ordered = rows;
    const datasets = [
      {label: 'exposed', backgroundColor: '#e15759', stack: 'gather'},
      {label: 'hidden behind compute', backgroundColor: '#f2b880', stack: 'gather'}];
    if (haveSlack) datasets.push({label: 'least slack', backgroundColor: '#59a14f', stack: 'slack'});
    const chart = new Chart(chartBox(sec, 'units-chart', 80 + 18 * units.length), {
      type: 'bar',
      data: {labels: [], datasets: datasets},
      options: {indexAxis: 'y',
        scales: {x: {stacked: true, title: {display: true, text: 'ms over the run'}},
                 y: {stacked: true, ticks: {autoSkip: false}}},
        plugins: {legend: {position: 'top'}, tooltip: {callbacks: {
          afterTitle: (items) => {
            const r = ordered[items[0].dataIndex];
            return r.u.gathers + ' gathers (' + r.u.demand + ' demand, ' + r.u.prefetch +
              ' prefetch, ' + r.u.first_unit + ' first unit), ' + fmtBytes(r.u.gather_bytes) +
              (r.s ? '; ' + r.s.onPath + ' on the critical path' : '');
          },
          label: (c) => c.dataset.label + ': ' + fmtUs(c.raw * 1000)}}}}
    });
    function sortBy(k) {
      const by = {
        model: (a, b) => a.i - b.i,
        exposed: (a, b) => b.u.exposed_us - a.u.exposed_us,
        gather: (a, b) => b.u.gather_us - a.u.gather_us,
        gathers: (a, b) => b.u.gathers - a.u.gathers,
        slack: (a, b) => (a.s ? a.s.min : Infinity) - (b.s ? b.s.min : Infinity)
      }[k];
      ordered = rows.slice().sort(by);
      chart.data.labels = ordered.map((r) => r.u.unit + ' (' + r.u.gathers + ')');
      chart.data.datasets[0].data = ordered.map((r) => r.u.exposed_us / 1000);
      chart.data.datasets[1].data = ordered.map((r) => (r.u.gather_us - r.u.exposed_us) / 1000);
      if (haveSlack) chart.data.datasets[2].data = ordered.map((r) => r.s ? r.s.min / 1000 : 0);
      chart.update();
    }
    select.addEventListener('change', () => sortBy(select.value));
    sortBy('model');
    charts.units = chart;
  }

  // ---- Predicted against measured ----
  function drawMeasured() {
    const C = D.comparison;
    if (!C) return false;
    const sec = section('measured', 'Predicted against measured',
      'The prediction (' + C.predicted.file + ') beside the measured run (' + C.measured.file +
      '): per step, and per kind of op summed over the run. Error = (predicted - measured) / ' +
      'measured.');
    const steps = C.steps;
    const row = el('div', {class: 'row'});
    sec.append(row);
    const left = el('div');
    const right = el('div');
    row.append(left, right);
    // Predicted beside measured, one pair of bars per row (rows: predicted_us, measured_us,
    // error_pct), in ms.
    function pairs(parent, id, rows, labels, title) {
      return new Chart(chartBox(parent, id, 300), {
        type: 'bar',
        data: {labels: labels, datasets: [
          {label: 'predicted', data: rows.map((r) => r.predicted_us / 1000),
           backgroundColor: '#4e79a7'},
          {label: 'measured', data: rows.map((r) => r.measured_us / 1000),
           backgroundColor: '#f28e2b'}]},
        options: {plugins: {title: {display: true, text: title},
          tooltip: {callbacks: {afterBody: (items) => 'error ' +
            rows[items[0].dataIndex].error_pct.toFixed(1) + '%'}}},
          scales: {y: {beginAtZero: true, title: {display: true, text: 'ms'}}}}
      });
    }
    charts.measuredSteps = pairs(left, 'measured-steps-chart', steps,
                                 steps.map((s) => 'step ' + s.index), 'Step time per step');
    const kinds = C.op_kinds || [];
    if (kinds.length) {
      charts.measuredKinds = pairs(right, 'measured-kinds-chart', kinds, kinds.map((k) => k.kind),
                                   'Time per op kind (all steps)');
    }
    const table = el('table', {class: 'grid', id: 'measured-table'}, el('thead', {}, el('tr', {},
      el('th', {text: 'step'}), el('th', {text: 'predicted'}), el('th', {text: 'measured'}),
      el('th', {text: 'error'}))));
    const body = el('tbody');
    for (const s of steps) {
      body.append(el('tr', {'data-step': String(s.index)}, el('td', {text: String(s.index) +
        (s.index === steps[0].index && steps.length > 1 ? ' (warm-up)' : '')}),
        numCell(s.predicted_us, fmtUs(s.predicted_us), 'predicted_us'),
        numCell(s.measured_us, fmtUs(s.measured_us), 'measured_us'),
        numCell(s.error_pct, s.error_pct.toFixed(1) + '%', 'error_pct')));
    }
    table.append(body);
    sec.append(table);
  }

  // ---- Sweep / tune ----
  // Writes each policy point's label beside it; policies on the same spot share one label. With
  // many points only the Pareto front's are written (hover names every point).
  const pointLabels = {
    id: 'fsdplabPointLabels',
    afterDatasetsDraw(chart) {
      const spots = new Map();
      const all = chart.data.datasets.reduce((n, ds) => n + (ds.fsdplabRole === 'policy' ?
        ds.data.length : 0), 0);
      chart.data.datasets.forEach((ds, i) => {
        if (ds.fsdplabRole !== 'policy' || !chart.isDatasetVisible(i)) return;
        if (all > 40 && !ds.fsdplabFront) return;
        chart.getDatasetMeta(i).data.forEach((pt, j) => {
          const key = Math.round(pt.x) + ',' + Math.round(pt.y);
          if (!spots.has(key)) spots.set(key, {x: pt.x, y: pt.y, tags: []});
          spots.get(key).tags.push(ds.data[j].tag);
        });
      });
      const ctx = chart.ctx;
      ctx.save();
      ctx.font = '11px system-ui, sans-serif';
      ctx.fillStyle = '#1d232b';
      const right = chart.chartArea.right;
      for (const s of spots.values()) {
        const text = s.tags.join(', ');
        const w = ctx.measureText(text).width;
        // Inside the plot: to the left of a point near the right edge.
        const x = s.x + 7 + w > right ? s.x - 7 - w : s.x + 7;
        ctx.fillText(text, x, s.y - 6);
      }
      ctx.restore();
    }
  };

  function drawSweep() {
    const S = D.sweep;
    if (!S) return false;
    const tune = S.kind === 'tune';
    // #n: the policy's row in the command's table and CSV (by step time).
    const rows = S.rows.map((r, i) => Object.assign({n: r.rank || i + 1, index: i}, r));
    const ok = rows.filter((r) => r.ok);
    const cap = S.memory_cap_bytes;
    const sec = section('sweep', tune ? 'Tune' : 'Sweep',
      (tune ? 'Every policy the search simulated' : 'Every policy of the sweep') + ': step time ' +
      'against the memory the cap holds (what the caching allocator reserves). The Pareto ' +
      'front joins the policies that nothing beats on both; the ring is ' +
      (S.chosen_why || 'the chosen policy') + '. Hover a point for its policy.');
    const shortLabels = rows.length <= 40 && rows.every((r) => r.values.join('/').length <= 14);
    const keyText = S.varied_keys.join(' / ');
    if (shortLabels && keyText) {
      sec.append(el('p', {class: 'note', text: 'Points are labelled ' + keyText + '.'}));
    }
    const gib = 2 ** 30;
    const point = (r) => ({x: r.memory_bytes / gib, y: r.step_time_us / 1000, r: r,
      tag: shortLabels && r.values.length ? r.values.join('/') : '#' + r.n});
    const front = ok.filter((r) => r.pareto).sort((a, b) => a.memory_bytes - b.memory_bytes);
    const others = ok.filter((r) => !r.pareto);
    const datasets = [
      {label: 'Pareto front', data: front.map(point), showLine: true, borderColor: '#1f77b4',
       backgroundColor: '#1f77b4', pointRadius: 5, fsdplabRole: 'policy', fsdplabFront: true},
      {label: 'other policies', data: others.map(point), backgroundColor: '#8c8c8c',
       borderColor: '#8c8c8c', pointRadius: 4, fsdplabRole: 'policy'}];
    const chosen = S.chosen === null || S.chosen === undefined ? null : rows[S.chosen];
    if (chosen && chosen.ok) {
      datasets.push({label: 'chosen: ' + (S.chosen_why || ''), data: [point(chosen)],
        pointRadius: 10, pointHoverRadius: 11, backgroundColor: 'rgba(0,0,0,0)',
        borderColor: '#2ca02c', borderWidth: 2.5, fsdplabRole: 'chosen'});
    }
    if (cap) {
      const ys = ok.map((r) => r.step_time_us / 1000);
      const lo = ys.length ? Math.min(...ys) : 0;
      const hi = ys.length ? Math.max(...ys) : 1;
      datasets.push({label: 'memory cap ' + fmtBytes(cap), type: 'line', data: [
        {x: cap / gib, y: lo - 0.05 * (hi - lo + 1e-9)}, {x: cap / gib, y: hi + 0.05 * (hi - lo + 1e-9)}],
        borderColor: '#c0392b', borderDash: [6, 4], borderWidth: 2, pointRadius: 0,
        fsdplabRole: 'cap'});
    }
    charts.sweep = new Chart(chartBox(sec, 'sweep-chart', 440), {
      type: 'scatter',
      data: {datasets: datasets},
      plugins: [pointLabels],
      options: {
        layout: {padding: {right: 40, top: 10}},
        scales: {x: {title: {display: true, text: 'memory per rank (GiB reserved)'}},
                 y: {title: {display: true, text: 'step time (ms)'}}},
        plugins: {legend: {position: 'bottom'}, tooltip: {callbacks: {label: (c) => {
          if (!c.raw.r) return c.dataset.label;
          const r = c.raw.r;
          const lines = ['#' + r.n + ' ' + r.label, 'step ' + fmtUs(r.step_time_us) +
            ', exposed ' + fmtUs(r.exposed_comm_us) + ', reserved ' + fmtBytes(r.memory_bytes)];
          if (r.fits_cap === false) lines.push('over the cap');
          return lines;
        }}}}
      }
    });
    // The table: every policy, failed ones too.
    const table = el('table', {class: 'grid', id: 'sweep-table'}, el('thead', {}, el('tr', {},
      el('th', {text: '#'}), el('th', {text: 'policy'}), el('th', {text: 'step time'}),
      el('th', {text: 'exposed'}), el('th', {text: 'reserved'}), el('th', {text: 'note'}))));
    const body = el('tbody');
    const order = rows.slice().sort((a, b) => a.n - b.n);
    for (const r of order) {
      const notes = [];
      if (r.pareto) notes.push('Pareto front');
      if (chosen && r.n === chosen.n) notes.push('chosen');
      if (r.fits_cap === false && r.ok) notes.push('over the cap');
      if (!r.ok) notes.push('fails: ' + r.error);
      body.append(el('tr', {'data-row': String(r.index)}, el('td', {text: '#' + r.n}),
        el('td', {text: r.label, title: r.policy ? JSON.stringify(r.policy) : null}),
        r.ok ? numCell(r.step_time_us, fmtUs(r.step_time_us), 'step_time_us') : el('td'),
        r.ok ? numCell(r.exposed_comm_us, fmtUs(r.exposed_comm_us), 'exposed_comm_us') : el('td'),
        r.ok ? numCell(r.memory_bytes, fmtBytes(r.memory_bytes), 'memory_bytes') : el('td'),
        el('td', {text: notes.join(', ')})));
    }
    table.append(body);
    sec.append(el('div', {class: 'scroll'}, table));
  }

  // ---- Calibration ----
  function drawCalibration() {
    const C = D.calibration;
    if (!C) return false;
    const sec = section('calibration', 'Calibration',
      'The collective cost model against what was measured: per size the measured time (dots), ' +
      'the fitted curve, and one alpha-beta line through the same points (dashed), on log ' +
      'scales.');
    const logAxes = (yTitle) => ({
      x: {type: 'logarithmic', title: {display: true, text: 'size (bytes)'},
          ticks: {callback: (v) => {
            const e = Math.log10(v);
            if (Math.abs(e - Math.round(e)) > 1e-9) return '';
            const units = ['B', 'kB', 'MB', 'GB', 'TB'];
            const k = Math.min(4, Math.floor(Math.round(e) / 3));
            return Math.round(v / 10 ** (3 * k)) + ' ' + units[k];
          }}},
      y: {type: 'logarithmic', title: {display: true, text: yTitle},
          ticks: {callback: (v) => {
            const e = Math.log10(v);
            return Math.abs(e - Math.round(e)) < 1e-9 ? v.toLocaleString() : '';
          }}}
    });
    const fits = C.fits || [];
    const grid = el('div', {class: 'row'});
    sec.append(grid);
    fits.forEach((f, i) => {
      if (!f.points || !f.points.length) return;
      const box = el('div');
      grid.append(box);
      const title = f.collective + ' ' + f.tier + ' (' + f.world_size + ' ranks): max |error| ' +
        f.max_error_pct.toFixed(1) + '%, median ' + f.median_error_pct.toFixed(1) +
        '%; one line ' + f.single_line.max_error_pct.toFixed(1) + '%, ' +
        f.single_line.median_error_pct.toFixed(1) + '%';
      const plot = f.plot || [];
      charts['calibration' + i] = new Chart(chartBox(box, 'calibration-chart-' + i, 340), {
        type: 'scatter',
        data: {datasets: [
          {label: 'measured', data: f.points.map((p) => ({x: p.bytes, y: p.measured_us, p})),
           backgroundColor: '#d62728', pointRadius: 3.5, fsdplabRole: 'measured'},
          {label: 'fitted curve', data: plot.map((p) => ({x: p.bytes, y: p.curve_us})),
           showLine: true, borderColor: '#1f77b4', borderWidth: 2, pointRadius: 0},
          {label: 'alpha-beta line (' + f.single_line.latency_us.toFixed(1) + ' us, ' +
           f.single_line.bandwidth_GBps.toFixed(1) + ' GB/s)',
           data: plot.map((p) => ({x: p.bytes, y: p.single_line_us})), showLine: true,
           borderColor: '#7f7f7f', borderDash: [3, 3], borderWidth: 1.5, pointRadius: 0}]},
        options: {scales: logAxes('time (us)'),
          plugins: {title: {display: true, text: title}, legend: {position: 'bottom'},
            tooltip: {callbacks: {label: (c) => {
              if (c.raw.p) {
                const p = c.raw.p;
                return fmtSize(p.bytes) + ': measured ' + p.measured_us.toFixed(2) + ' us, fitted ' +
                  p.fitted_us.toFixed(2) + ' us (' + (p.error_pct >= 0 ? '+' : '') +
                  p.error_pct.toFixed(1) + '%)';
              }
              return c.dataset.label + ': ' + fmtSize(c.raw.x) + ', ' + c.raw.y.toFixed(2) + ' us';
            }}}}}
      });
    });
    if (!fits.length && C.calibration) {
      // A cluster file: its curves' knots (no measured points in it).
      sec.append(el('p', {class: 'note', text: 'A cluster file holds the fitted curves only; ' +
        '`fsdplab calibrate --json` output also holds the measured points.'}));
      let i = 0;
      for (const [collective, tiers] of Object.entries(C.calibration)) {
        for (const [tier, curve] of Object.entries(tiers || {})) {
          if (!curve || !curve.knots) continue;
          const box = el('div');
          grid.append(box);
          charts['calibration' + i] = new Chart(chartBox(box, 'calibration-chart-' + i, 300), {
            type: 'scatter',
            data: {datasets: [{label: 'curve knots', data: curve.knots.map((k) =>
              ({x: k.bytes, y: k.time_us})), showLine: true, borderColor: '#1f77b4',
              backgroundColor: '#1f77b4', fsdplabRole: 'knot'}]},
            options: {scales: logAxes('time (us)'), plugins: {title: {display: true,
              text: collective + ' ' + tier + ' (' + curve.world_size + ' ranks)'}}}
          });
          ++i;
        }
      }
    }
  }

  // ---- the page ----
  const sub = [];
  if (R) {
    sub.push((R.measured ? 'measured, ' : 'simulated, ') + 'source ' + R.source);
    if (R.policy) sub.push('policy: ' + Object.entries(R.policy)
      .filter(([k, v]) => typeof v !== 'object').map(([k, v]) => k + '=' + v).join(' '));
  }
  document.getElementById('subtitle').textContent = sub.join(' · ');
  const drawn = [];
  for (const [name, draw, needs] of [['summary', drawSummary, R], ['timeline', drawTimeline, R],
    ['memory', drawMemory, R], ['units', drawUnits, R], ['measured', drawMeasured, D.comparison],
    ['sweep', drawSweep, D.sweep], ['calibration', drawCalibration, D.calibration]]) {
    if (!needs) continue;
    try {
      if (draw() !== false) drawn.push(name);
    } catch (e) {
      // One section's failure leaves the others drawn, and says so (the browser tests fail on it).
      console.error('fsdplab report page: the ' + name + ' section failed: ' + e.stack);
      main.append(el('p', {class: 'warn', text: 'The ' + name + ' section could not be drawn: ' +
        e.message}));
    }
  }
  if (R && R.warnings && R.warnings.length) {
    const w = section('warnings', 'Warnings and notes');
    for (const t of R.warnings) w.append(el('p', {class: 'warn', text: 'warning: ' + t}));
    for (const t of R.notes || []) w.append(el('p', {class: 'note', text: 'note: ' + t}));
  } else if (R && R.notes && R.notes.length) {
    const w = section('notes', 'Notes');
    for (const t of R.notes) w.append(el('p', {class: 'note', text: t}));
  }
  // For the browser tests and for people: what was drawn, how long this script took and how long
  // from the start of the page's navigation until everything was drawn.
  window.fsdplabPage = {charts: charts, sections: drawn, scriptMs: performance.now() - started,
    renderMs: performance.now()};
  document.body.setAttribute('data-rendered', drawn.join(' '));
})();
