// instrument HTML report: unpacks the embedded data and draws it as SVG. No library, no network.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
// well-separated hues for the top-level regions; a region below takes its parent's hue,
// turned by its place among its siblings, and a lightness by its depth, so neighbours differ
const HUES = [212, 28, 140, 354, 268, 184, 46, 320, 96, 10];
const TURN = [0, 24, -24, 12, -12, 36, -36];
const LIGHT = [50, 60, 70, 78];
const REST_COLOR = "#8d96a6";   // "other regions": regions outside the top ones
const OTHER_COLOR = "#d6dae1";  // "(other)": step time no region covered
const FLUSH_COLOR = "#b8aa8e";  // "(instrument flush)": the previous report's own time
const FLUSH_ROW = "(instrument flush)";
const SMALL = 0.01;  // "hide regions under 1 % of the step"

// a search: every word of the query in the path, in any case
const matches = (path, query) => query.toLowerCase().split(/\s+/).every((word) => path.toLowerCase().includes(word));

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  if (parent) parent.appendChild(node);
  return node;
}

function html(tag, attrs, text, parent) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  if (text !== undefined && text !== null) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

function fmt(ms) {
  if (ms === null || ms === undefined) return "–";
  const a = Math.abs(ms);
  if (a >= 1000) return (ms / 1000).toFixed(3) + " s";
  if (a >= 1) return ms.toFixed(3) + " ms";
  return (ms * 1000).toFixed(1) + " µs";
}

function num(value, digits) {
  if (value === null || value === undefined) return "–";
  return Number(value).toLocaleString("en-US", { maximumFractionDigits: digits });
}

function signed(value, digits) {
  if (value === null || value === undefined) return "–";
  const text = value.toFixed(digits);
  if (Number(text) === 0) return "+" + (0).toFixed(digits);  // never "-0.0"
  return (value > 0 ? "+" : "") + text;
}

// each path's colour as [hue, saturation, lightness], fixed for the whole page: siblings are
// placed in order of their time over the run, as the icicle places them
function assignColors(data) {
  const totals = new Array(data.paths.length).fill(0);
  for (const iv of data.intervals) for (const row of iv.d) totals[row[0]] += row[1] || 0;
  const children = new Map();
  data.parents.forEach((parent, i) => {
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(i);
  });
  const colors = new Map();
  const pending = [[-1, null, 0]];
  while (pending.length) {
    const [parent, base, depth] = pending.pop();
    const kids = (children.get(parent) || []).sort((a, b) => totals[b] - totals[a]);
    kids.forEach((i, k) => {
      const hue = base === null ? HUES[k % HUES.length] : (base[0] + TURN[k % TURN.length] + 360) % 360;
      const light = LIGHT[depth % LIGHT.length] - (base !== null && k % 2 ? 5 : 0);
      const color = [hue, base === null && k >= HUES.length ? 45 : 62, light];
      colors.set(data.paths[i], color);
      pending.push([i, color, depth + 1]);
    });
  }
  return colors;
}

let COLORS = new Map();
const hsl = ([h, s, l]) => `hsl(${h}, ${s}%, ${l}%)`;
const colorOf = (path) => hsl(COLORS.get(path) || [215, 15, 62]);
// a region's own time (its "(self)" row): a lighter shade of the region's colour
const selfColorOf = (path) => {
  const [h, s, l] = COLORS.get(path) || [215, 15, 62];
  return hsl([h, s, Math.min(l + 16, 90)]);
};

// the widest label that fits: the full text, else the name, else the name cut with "…"
const measure = (() => {
  let context = null;
  return (text) => {
    if (!context) {
      context = document.createElement("canvas").getContext("2d");
      context.font = `11px ${getComputedStyle(document.body).fontFamily}`;
    }
    return context.measureText(text).width;
  };
})();

function fitLabel(choices, width) {
  for (const text of choices) if (measure(text) <= width) return text;
  const name = choices[choices.length - 1];
  let lo = 0, hi = name.length - 1;  // the longest prefix that fits with its "…"
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (measure(name.slice(0, mid) + "…") <= width) lo = mid; else hi = mid - 1;
  }
  return lo > 0 ? name.slice(0, lo) + "…" : "";
}

async function unpack() {
  const text = document.getElementById("data").textContent.trim();
  const bytes = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

// -- tooltip -------------------------------------------------------------------------------

const tip = () => document.getElementById("tip");

function showTip(event, rows, title) {
  const box = tip();
  box.replaceChildren();
  html("strong", {}, title, box);
  const table = html("table", {}, null, box);
  for (const [label, value] of rows) {
    if (value === null || value === undefined) continue;
    const tr = html("tr", {}, null, table);
    html("td", {}, label, tr);
    html("td", {}, value, tr);
  }
  box.hidden = false;
  const x = Math.min(event.clientX + 14, window.innerWidth - box.offsetWidth - 8);
  const y = Math.min(event.clientY + 14, window.innerHeight - box.offsetHeight - 8);
  box.style.left = x + "px";
  box.style.top = y + "px";
}

function hideTip() { tip().hidden = true; }

// -- the timing tree of one interval -------------------------------------------------------

// self time of every region of an interval: its total minus its children's (concurrent
// children overlap their parent, so they are not subtracted); computed once per interval
function selfTimes(data, interval) {
  if (interval.self) return interval.self;
  const self = new Map();
  for (const row of interval.d) self.set(row[0], row[1] || 0);
  for (const row of interval.d) {
    const parent = data.parents[row[0]];
    if (parent >= 0 && self.has(parent) && !data.concurrent[row[0]]) self.set(parent, self.get(parent) - (row[1] || 0));
  }
  for (const [key, value] of self) self.set(key, Math.max(value, 0));
  interval.self = self;
  return self;
}

function buildTree(data, interval) {
  const per = data.per;
  const root = { path: "", name: per === "step" ? "step" : "report", total: 0, children: [],
    depth: 0 };
  const byPath = new Map([["", root]]);
  const self = selfTimes(data, interval);
  const steps = interval.n || 1;
  for (const row of interval.d) {
    const path = data.paths[row[0]];
    const cut = path.lastIndexOf("/");
    byPath.set(path, { path, name: path.slice(cut + 1), parentPath: cut < 0 ? "" : path.slice(0, cut),
      total: row[1] || 0, self: self.get(row[0]), count: row[2],
      mean: row.length > 9 ? row[9] : row[2] ? (row[1] || 0) * steps / row[2] : null,
      p50: row[3], p90: row[4], p99: row[5],
      host: row.length > 6 ? row[6] : null, device: row.length > 6 ? row[7] : null, open: row[8] === 1,
      concurrent: data.concurrent[row[0]] === 1, children: [] });
  }
  for (const node of byPath.values()) {
    if (node === root) continue;
    const parent = byPath.get(node.parentPath) || root;
    parent.children.push(node);
  }
  let covered = 0;
  for (const child of root.children) if (!child.concurrent) covered += child.total;
  root.total = interval.st !== null && interval.st !== undefined ? interval.st : covered;
  if (interval.f) root.children.push({ path: FLUSH_ROW, name: FLUSH_ROW, total: interval.f,
    children: [], other: true, flush: true, self: interval.f });
  if (interval.o) root.children.push({ path: "(other)", name: "(other)", total: interval.o,
    children: [], other: true, self: interval.o });
  root.self = root.total - covered;
  // walks here and below keep their own stack: a tree thousands of levels deep must not
  // overflow the browser's call stack
  // regions by size, then the flush and (other) as pushed, as the text tree has them
  const order = (a, b) => ((a.other ? 1 : 0) - (b.other ? 1 : 0)) || (a.other ? 0 : b.total - a.total);
  const pending = [root];
  while (pending.length) {
    const node = pending.pop();
    node.children.sort(order);
    for (const child of node.children) { child.parent = node; child.depth = node.depth + 1; pending.push(child); }
  }
  return { root, byPath };
}

function drawIcicle(data, state) {
  const svg = document.getElementById("icicle");
  svg.replaceChildren();
  const interval = data.intervals[state.interval];
  const { root, byPath } = buildTree(data, interval);
  let focus = byPath.get(state.focus) || root;
  if (focus.other) focus = root;
  state.focus = focus.path;
  const width = Math.max(svg.clientWidth || 0, 600), rowH = 24;
  const ancestors = [];
  for (let node = focus.parent; node; node = node.parent) ancestors.unshift(node);
  const stepTotal = root.total || 1;
  const shown = (node) => !state.hideSmall || node.total >= SMALL * stepTotal;
  let maxDepth = 0;
  for (const pending = [focus]; pending.length;) {
    const node = pending.pop();
    maxDepth = Math.max(maxDepth, node.depth);
    for (const child of node.children) if (shown(child)) pending.push(child);
  }
  const rows = ancestors.length + (maxDepth - focus.depth) + 1;
  svg.setAttribute("viewBox", `0 0 ${width} ${rows * rowH}`);
  svg.setAttribute("height", rows * rowH);
  const query = state.query;
  const place = (node, x, w, row, cls) => {
    const kind = (node.other ? " other" : "") + (node.flush ? " flush" : "");
    const found = query && node.path !== "" ? (matches(node.path, query) ? " match" : " dim") : "";
    const g = el("g", { class: "node" + (cls ? " " + cls : "") + kind + found,
      "data-path": node.path || "(root)", "aria-label": node.path || root.name,
      transform: `translate(${x},${row * rowH})` }, svg);
    const fill = node.flush ? FLUSH_COLOR : node.other ? OTHER_COLOR : node.path === "" ? "#9aa5b8" : colorOf(node.path);
    el("rect", { width: Math.max(w, 0.5), height: rowH - 1, fill, rx: 2 }, g);
    const name = node.name + (node.open ? " (open)" : "");
    const text = w > 12 ? fitLabel([`${name} · ${fmt(node.total)}`, name], w - 8) : "";
    if (text) el("text", { x: 4, y: rowH / 2 + 4 }, g).textContent = text;
    g.addEventListener("mousemove", (event) => showTip(event, nodeRows(node, stepTotal, data.per),
      node.path || root.name));
    g.addEventListener("mouseleave", hideTip);
    g.addEventListener("click", () => {
      state.focus = node === focus ? (node.parent ? node.parent.path : "") : node.path;
      if (node.other) state.focus = "";
      state.redraw();
    });
    return g;
  };
  ancestors.forEach((node, i) => place(node, 0, width, i, "ancestor"));
  // depth first, parents before children and siblings in order, as the SVG stacks them
  const pending = [[focus, 0, width, ancestors.length]];
  while (pending.length) {
    const [node, x, w, row] = pending.pop();
    place(node, x, w, row, node === focus ? "focus" : "");
    const kids = node.children;
    let sum = 0;
    for (const kid of kids) sum += kid.total;
    const scale = node.total > 0 ? w / Math.max(node.total, sum) : 0;
    const placed = [];
    let cursor = x;
    for (const kid of kids) {
      const kw = kid.total * scale;
      if (shown(kid)) placed.push([kid, cursor, kw, row + 1]);
      cursor += kw;
    }
    for (let i = placed.length - 1; i >= 0; i--) pending.push(placed[i]);
  }
  document.getElementById("crumb").textContent = focus === root ? "" : "zoomed into " + focus.path;
  document.getElementById("unzoom").disabled = focus === root;
}

function nodeRows(node, stepTotal, per) {
  const rows = [[`total per ${per}`, fmt(node.total)], ["of the " + per, num(100 * node.total / stepTotal, 1) + " %"],
    ["self", node.self === undefined ? null : fmt(node.self)]];
  if (node.count !== undefined) {
    rows.push(["calls", num(node.count, 0)], ["mean", fmt(node.mean)], ["p50", fmt(node.p50)],
      ["p90", fmt(node.p90)], ["p99", fmt(node.p99)]);
    if (node.device !== null && node.device !== undefined) {
      rows.push([`host per ${per}`, fmt(node.host)], [`device per ${per}`, fmt(node.device)]);
    }
    if (node.open) rows.push(["open", "still running at the flush"]);
    if (node.concurrent) rows.push(["concurrent", "overlaps its siblings"]);
  }
  return rows;
}

// -- the timeline across intervals ---------------------------------------------------------

function chart(parent, title, xs, series, options) {
  const box = html("div", { class: "chart", "data-chart": title }, null, parent);
  html("h3", {}, title, box);
  const W = 520, H = 180, L = 56, R = 8, T = 8, B = 24;
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, height: H }, box);
  const stacked = options && options.stacked;
  const n = xs.length;
  let top = 0;
  for (let i = 0; i < n; i++) {
    let sum = 0;
    for (const s of series) {
      const v = s.values[i] || 0;
      sum = stacked ? sum + v : Math.max(sum, v);
    }
    if (options && options.line) top = Math.max(top, options.line.values[i] || 0);
    top = Math.max(top, sum);
  }
  top = top > 0 ? top * 1.08 : 1;
  const x0 = xs[0], x1 = xs[n - 1];
  const sx = (x) => L + (n === 1 ? (W - L - R) / 2 : ((x - x0) / (x1 - x0)) * (W - L - R));
  const sy = (y) => T + (H - T - B) * (1 - y / top);
  for (let k = 0; k <= 4; k++) {
    const y = (top / 1.08) * k / 4;
    el("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), class: "grid" }, svg);
    el("text", { x: L - 4, y: sy(y) + 4, "text-anchor": "end" }, svg).textContent = num(y, y < 10 ? 2 : 0);
  }
  el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }, svg);
  const ticks = Math.min(n, 8);
  const seen = new Set();
  for (let k = 0; k < ticks; k++) {
    const x = xs[Math.round(k * (n - 1) / Math.max(ticks - 1, 1))];
    if (seen.has(x)) continue;
    seen.add(x);
    el("text", { x: sx(x), y: H - 6, "text-anchor": "middle" }, svg).textContent = String(x);
  }
  const base = new Array(n).fill(0);
  const points = (values, color, name) => values.forEach((v, i) => {
    if (v === null || v === undefined) return;
    el("circle", { cx: sx(xs[i]), cy: sy(v), r: i === options.current ? 4.5 : 2.5, fill: color,
      class: "point" + (i === options.current ? " current" : ""), "data-series": name, "data-index": i }, svg);
  });
  const faded = (s) => options.query && s.path && !matches(s.path, options.query);
  for (const s of series) {
    const upper = s.values.map((v, i) => (stacked ? base[i] : 0) + (v || 0));
    if (stacked || n > 1) {
      let d = "";
      if (stacked) {
        upper.forEach((v, i) => { d += (i ? "L" : "M") + sx(xs[i]) + "," + sy(v); });
        for (let i = n - 1; i >= 0; i--) d += "L" + sx(xs[i]) + "," + sy(base[i]);
        if (n === 1) d = `M${sx(xs[0]) - 20},${sy(upper[0])}h40V${sy(base[0])}h-40Z`;
        el("path", { d: d + "Z", fill: s.color, "fill-opacity": faded(s) ? 0.2 : 0.9, "data-series": s.name,
          class: options.query && !faded(s) && s.path ? "match" : "" }, svg);
      } else {
        upper.forEach((v, i) => { d += (i ? "L" : "M") + sx(xs[i]) + "," + sy(v); });
        el("path", { d, fill: "none", stroke: s.color, "stroke-width": 2, "data-series": s.name }, svg);
      }
    }
    if (!stacked) points(s.values, s.color, s.name);
    if (stacked) upper.forEach((v, i) => { base[i] = v; });
  }
  if (options && options.line) {
    let d = "";
    options.line.values.forEach((v, i) => { if (v !== null) d += (d ? "L" : "M") + sx(xs[i]) + "," + sy(v); });
    el("path", { d, fill: "none", stroke: "#1d2330", "stroke-width": 1.5, "data-series": options.line.name }, svg);
    points(options.line.values, "#1d2330", options.line.name);
  }
  const hover = el("rect", { x: L, y: T, width: W - L - R, height: H - T - B, fill: "transparent" }, svg);
  const nearest = (event) => {
    const box2 = svg.getBoundingClientRect();
    const px = (event.clientX - box2.left) * (W / box2.width);
    let best = 0;
    for (let i = 1; i < n; i++) if (Math.abs(sx(xs[i]) - px) < Math.abs(sx(xs[best]) - px)) best = i;
    return best;
  };
  hover.addEventListener("mousemove", (event) => {
    const i = nearest(event);
    const rows = series.map((s) => [s.name, options.unit(s.values[i])]);
    if (options.line) rows.unshift([options.line.name, options.unit(options.line.values[i])]);
    showTip(event, rows.reverse(), `${options.xlabel} ${xs[i]}`);
  });
  hover.addEventListener("mouseleave", hideTip);
  if (options.onPick) hover.addEventListener("click", (event) => options.onPick(nearest(event)));
  const legend = html("div", { class: "legend" }, null, box);
  const entries = series.slice().reverse();
  if (options.line) entries.unshift({ name: options.line.name, color: "#1d2330" });
  for (const s of entries) {
    const item = html("span", {}, null, legend);
    html("i", { style: `background:${s.color}` }, null, item);
    item.appendChild(document.createTextNode(s.name));
  }
  return box;
}

// each region's total per interval, computed once per interval
function totalsOf(interval) {
  if (!interval.totals) interval.totals = new Map(interval.d.map((row) => [row[0], row[1] || 0]));
  return interval.totals;
}

// the time of the tree's focus (the step, or the region the tree is zoomed into) over the
// intervals: its total as a line with one point per interval, its top regions stacked below
function drawTimeline(data, state, pick) {
  const root = document.getElementById("timeline");
  root.replaceChildren();
  const ivs = data.intervals;
  const xlabel = data.per === "step" ? "step" : "report";
  const xs = ivs.map((iv) => (data.per === "step" ? iv.s : iv.i));
  const charts = html("div", { class: "charts" }, null, root);
  const focus = state.focus === "" ? -1 : data.paths.indexOf(state.focus);
  const kids = [];
  data.parents.forEach((parent, i) => { if (parent === focus && !data.concurrent[i]) kids.push(i); });
  const covered = (iv) => kids.reduce((sum, i) => sum + (totalsOf(iv).get(i) || 0), 0);
  const totals = ivs.map((iv) => (focus >= 0 ? totalsOf(iv).get(focus) ?? null
    : iv.st !== null && iv.st !== undefined ? iv.st : covered(iv)));
  const step = ivs.reduce((sum, iv) => sum + (iv.st || covered(iv)), 0);
  const overall = new Map(kids.map((i) => [i, ivs.reduce((sum, iv) => sum + (totalsOf(iv).get(i) || 0), 0)]));
  const ranked = kids.filter((i) => overall.get(i) > 0).sort((a, b) => overall.get(b) - overall.get(a));
  const top = ranked.filter((i, k) => k < 8 && !(state.hideSmall && overall.get(i) < SMALL * step));
  const series = top.map((i) => ({ name: data.paths[i], path: data.paths[i], color: colorOf(data.paths[i]),
    values: ivs.map((iv) => totalsOf(iv).get(i) || 0) }));
  const rest = ranked.filter((i) => !top.includes(i));
  if (rest.length) {
    series.push({ name: `other regions (${rest.length})`, color: REST_COLOR,
      values: ivs.map((iv) => rest.reduce((sum, i) => sum + (totalsOf(iv).get(i) || 0), 0)) });
  }
  if (focus >= 0) {
    const own = ivs.map((iv) => selfTimes(data, iv).get(focus) || 0);
    if (own.some((v) => v > 0)) series.push({ name: `${state.focus} (self)`, path: state.focus, color: selfColorOf(state.focus), values: own });
  } else {
    if (ivs.some((iv) => iv.f)) series.push({ name: FLUSH_ROW, color: FLUSH_COLOR, values: ivs.map((iv) => iv.f || 0) });
    if (ivs.some((iv) => iv.o)) series.push({ name: "(other): no region", color: OTHER_COLOR, values: ivs.map((iv) => iv.o || 0) });
  }
  const name = focus >= 0 ? state.focus : `${data.per} time`;
  chart(charts, focus >= 0 ? `time per ${data.per} in ${state.focus} (ms)` : `time per ${data.per} (ms)`, xs, series,
    { stacked: true, line: { name, values: totals }, unit: fmt, xlabel, onPick: pick, current: state.interval,
      query: state.query });
  document.getElementById("timeline-hint").textContent = `One point per report. The line is the ${focus >= 0 ? "region's" : data.per} time; ` +
    `below it, ${focus >= 0 ? "its" : "the top-level"} regions stacked, largest first. Click a point to see that interval's tree; ` +
    "zoom the tree into a region to see its parts here.";
  const metric = (title, get, unit) => {
    const values = ivs.map(get);
    if (!values.some((v) => v !== null && v !== undefined)) return;
    chart(charts, title, xs, [{ name: title, color: "#4e79a7", values }], { unit, xlabel, onPick: pick, current: state.interval });
  };
  for (const key of ["samples/s", "tokens/s", "steps/s"]) {
    if (ivs.some((iv) => iv.tp && iv.tp[key])) { metric("throughput: " + key, (iv) => (iv.tp ? iv.tp[key] : null), (v) => num(v, 1)); break; }
  }
  metric("MFU (%)", (iv) => (iv.tp ? iv.tp["MFU %"] : null), (v) => num(v, 2) + " %");
  const memKey = ["device_peak_allocated", "device_allocated", "host_peak_rss", "host_rss"]
    .find((k) => ivs.some((iv) => iv.mem && iv.mem[k]));
  if (memKey) metric(`memory: ${memKey} (MiB)`, (iv) => (iv.mem ? iv.mem[memKey] : null), (v) => num(v, 1) + " MiB");
}

// -- ranks × regions -----------------------------------------------------------------------

function drawHeat(data) {
  const heat = data.heat;
  if (!heat || !heat.rows.length) return;
  document.getElementById("heat-section").hidden = false;
  const root = document.getElementById("heat");
  const rows = heat.rows.slice().sort((a, b) => Math.max(...b.v.map((v) => v || 0)) - Math.max(...a.v.map((v) => v || 0))).slice(0, 40);
  const reported = heat.reported || [];
  const labels = heat.labels, columns = labels.length;
  const labelW = 260, cell = Math.max(Math.min(Math.floor(700 / columns), 48), 14), rowH = 20;
  const W = labelW + cell * columns + 10, H = 22 + rowH * rows.length;
  const svg = el("svg", { id: "heatmap", viewBox: `0 0 ${W} ${H}`, height: H, style: `max-width:${W}px` }, root);
  labels.forEach((label, r) => {
    el("text", { x: labelW + r * cell + cell / 2, y: 14, "text-anchor": "middle" }, svg).textContent = label;
  });
  rows.forEach((row, y) => {
    const label = el("text", { x: labelW - 6, y: 22 + y * rowH + 14, "text-anchor": "end", "data-path": row.p }, svg);
    label.textContent = fitLabel([row.p], labelW - 10) || row.p;
    const present = row.v.filter((v) => v !== null).sort((a, b) => a - b);
    const mid = present.length ? present[Math.floor(present.length / 2)] : 0;
    const flagged = new Set(row.s);
    row.v.forEach((v, r) => {
      const slow = flagged.has(r);
      const g = el("g", { class: "cell" + (slow ? " straggler" : ""), "data-path": row.p, "data-rank": labels[r] }, svg);
      const ratio = v === null || !mid ? 0 : Math.max(Math.min((v - mid) / mid, 1), -1);
      const fill = v === null ? "#f3f4f6" : ratio >= 0 ? `rgb(255,${Math.round(245 - 170 * ratio)},${Math.round(235 - 190 * ratio)})`
        : `rgb(${Math.round(235 + 150 * ratio)},${Math.round(245 + 40 * ratio)},255)`;
      el("rect", { x: labelW + r * cell + 1, y: 22 + y * rowH + 1, width: cell - 2, height: rowH - 2, fill, rx: 2 }, g);
      if (slow) el("text", { x: labelW + r * cell + cell / 2, y: 22 + y * rowH + 14, "text-anchor": "middle" }, g).textContent = "▲";
      g.addEventListener("mousemove", (event) => showTip(event, [[labels[r].includes("-") ? "ranks (mean)" : "rank", labels[r]], [`mean per ${data.per}`, fmt(v)],
        ["median rank", fmt(mid)], ["straggler", slow ? "yes" : null]], row.p));
      g.addEventListener("mouseleave", hideTip);
    });
  });
  html("p", { class: "hint" }, `cells: each rank's mean time per ${data.per} (${heat.mode === "all" ? "every rank" : "fastest and slowest rank only"}); red: slower than the median rank, ▲: straggler (more than 10 % above it)`, root);
  if (heat.stragglers.length) {
    const list = html("p", { class: "stragglers", id: "straggler-list" }, null, root);
    list.textContent = "stragglers: " + heat.stragglers.slice(0, 8).map((s) => `rank ${s.r} in ${s.p} (+${s.pct.toFixed(0)} %)`).join(", ");
  }
  if (reported.length) {
    const list = html("p", { class: "stragglers", id: "reported-stragglers" }, null, root);
    list.textContent = "named by the run: " + reported.slice(0, 8).map((s) =>
      `rank ${s.r}${s.host ? " on " + s.host : ""} (${s.regions.join(", ")}; ${s.intervals} intervals)`).join(", ");
  }
}

// -- diff ----------------------------------------------------------------------------------

// a row worth reading: a verdict (slower, faster), or a region only one run has
const changed = (row) => row.v !== "" || row.a === null || row.b === null;

function drawDiff(data, state) {
  const diff = data.diff;
  if (!diff) return;
  document.getElementById("diff-section").hidden = false;
  const root = document.getElementById("diff");
  root.replaceChildren();
  html("p", {}, `A (base): ${diff.a} · B: ${diff.b}. A region is called slower or faster when the whole 95 % interval of the change of its median over the reports lies beyond ${diff.threshold} % and it moved by at least ${fmt(diff.floor_ms)} per ${diff.per}; else it is noise.`, root);
  const noise = diff.rows.filter((row) => !changed(row)).length;
  const controls = html("p", { class: "diff-controls" }, null, root);
  const toggle = html("label", {}, null, controls);
  const box = html("input", { type: "checkbox", id: "show-noise" }, null, toggle);
  box.checked = state.showNoise;
  box.addEventListener("change", () => { state.showNoise = box.checked; drawDiff(data, state); });
  toggle.appendChild(document.createTextNode(` show the ${noise} rows within the noise`));
  const step = diff.rows.find((row) => row.p === "(step)");
  const stepMs = step ? Math.max(step.a || 0, step.b || 0) : 0;
  const rows = diff.rows.filter((row) => (state.showNoise || changed(row))
    && !(state.hideSmall && stepMs > 0 && Math.max(row.a || 0, row.b || 0) < SMALL * stepMs));
  if (!rows.length) {
    html("p", { id: "diff-empty" }, `No region changed beyond the noise (${diff.rows.length} regions compared).`, root);
    return;
  }
  const table = html("table", { class: "data", id: "diff-table" }, null, root);
  const head = html("tr", {}, null, html("thead", {}, null, table));
  for (const title of ["region", `A per ${diff.per}`, `B per ${diff.per}`, "delta", "median change [95% CI]", "", "verdict"]) html("th", {}, title, head);
  const body = html("tbody", {}, null, table);
  const span = Math.max(50, ...diff.rows.filter((r) => r.hi !== null).map((r) => Math.min(Math.max(Math.abs(r.lo), Math.abs(r.hi)), 1000)));
  for (const row of rows) {
    const found = state.query ? (matches(row.p, state.query) ? " match" : " dim") : "";
    const tr = html("tr", { class: (row.v || "noise") + found, "data-path": row.p }, null, body);
    html("td", {}, row.p, tr);
    html("td", {}, fmt(row.a), tr);
    html("td", {}, fmt(row.b), tr);
    html("td", {}, row.a === null ? "new" : row.b === null ? "removed" : (row.b - row.a >= 0 ? "+" : "") + fmt(row.b - row.a), tr);
    html("td", {}, row.est === null ? "–" : `${signed(row.est, 1)} % [${signed(row.lo, 1)}, ${signed(row.hi, 1)}]`, tr);
    const bar = html("td", {}, null, tr);
    if (row.lo !== null) {
      const svg = el("svg", { viewBox: "0 0 160 14", width: 160, height: 14 }, bar);
      const sx = (p) => 80 + 78 * Math.max(Math.min(p / span, 1), -1);
      el("line", { x1: 80, x2: 80, y1: 0, y2: 14, class: "axis" }, svg);
      el("rect", { x: Math.min(sx(row.lo), sx(row.hi)), y: 4, width: Math.max(Math.abs(sx(row.hi) - sx(row.lo)), 1.5), height: 6,
        fill: row.v === "slower" ? "#e15759" : row.v === "faster" ? "#59a14f" : "#aab2c0" }, svg);
      el("circle", { cx: sx(row.est), cy: 7, r: 2.5, fill: "#1d2330" }, svg);
    }
    html("td", { class: "verdict" }, row.v || (row.lo === null ? "" : "noise"), tr);
  }
}

// -- the page ------------------------------------------------------------------------------

function drawVerdict(data) {
  const run = data.verdict;
  if (!run || !run.verdict) return;
  const section = document.getElementById("verdict-section");
  const box = document.getElementById("verdict");
  const where = (f) => (f.path ? ` on ${f.path}` : "") + (f.rank !== null && f.rank !== undefined ? ` (rank ${f.rank})` : "");
  const label = (f) => f.kind.replace(/_/g, "-").toUpperCase();
  const v = run.verdict;
  section.className = v.severity;
  html("p", { class: "headline" }, `${label(v)} (${v.severity})${where(v)}: ${v.why}`, box);
  html("p", { class: "next" }, `next: ${v.next}`, box);
  const rest = run.findings.slice(1);
  if (rest.length) {
    const list = html("ul", {}, null, box);
    rest.forEach((f) => html("li", {}, `${label(f)} (${f.severity})${where(f)}: ${f.why}`, list));
  }
  section.hidden = false;
}

function drawAll(data, state, pick) {
  drawIcicle(data, state);
  drawTimeline(data, state, pick);
  markHeat(state);
  if (data.diff) drawDiff(data, state);
  const count = document.getElementById("search-count");
  if (!state.query) { count.textContent = ""; return; }
  const found = data.paths.filter((path) => matches(path, state.query)).length;
  count.textContent = found === 1 ? "1 region" : `${found} regions`;
}

// the search on the heatmap's rows
function markHeat(state) {
  for (const node of document.querySelectorAll("#heatmap [data-path]")) {
    node.classList.toggle("dim", Boolean(state.query) && !matches(node.dataset.path, state.query));
  }
}

function main(data) {
  COLORS = assignColors(data);
  window.instrumentData = data;
  const ivs = data.intervals;
  const summary = document.getElementById("summary");
  summary.textContent = `${data.run} · rank ${data.rank} · ${ivs.length} intervals · ${data.paths.length} regions · times per ${data.per}`;
  document.getElementById("tree-hint").textContent = `Width is time per ${data.per}; click a bar to zoom into it, the bar above to zoom out. Hover for its statistics.`;
  const select = document.getElementById("interval");
  ivs.forEach((iv, i) => {
    const option = html("option", { value: i }, `#${iv.i} · ${data.per === "step" ? "step " + iv.s : "report"}${iv.n ? ` (${iv.n} steps)` : ""}`, select);
    option.value = String(i);
  });
  let chosen = ivs.length - 1;
  while (chosen > 0 && data.per === "step" && !ivs[chosen].n) chosen--;
  const state = { interval: chosen, focus: "", query: "", hideSmall: false, showNoise: false };
  select.value = String(chosen);
  const pick = (i) => { state.interval = i; select.value = String(i); drawAll(data, state, pick); };
  select.addEventListener("change", () => pick(Number(select.value)));
  document.getElementById("unzoom").addEventListener("click", () => {
    const { byPath } = buildTree(data, ivs[state.interval]);
    const node = byPath.get(state.focus);
    state.focus = node && node.parent ? node.parent.path : "";
    drawAll(data, state, pick);
  });
  const search = document.getElementById("search");
  search.addEventListener("input", () => { state.query = search.value.trim(); drawAll(data, state, pick); });
  const small = document.getElementById("hide-small");
  small.addEventListener("change", () => { state.hideSmall = small.checked; drawAll(data, state, pick); });
  state.redraw = () => drawAll(data, state, pick);
  drawVerdict(data);
  drawHeat(data);
  drawAll(data, state, pick);
  document.body.dataset.ready = "1";
}

unpack().then(main).catch((error) => {
  const summary = document.getElementById("summary");
  summary.textContent = "could not read the report data: " + error;
  summary.className = "error";
  console.error(error);
});
