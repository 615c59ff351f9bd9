// The broker dashboard: one hour of history from /stats/history (kept by the broker, rates
// computed there between consecutive samples), the current state from /stats, dead letters
// from /dlq, and a message's trace from /messages/{id}.
// No framework and no network beyond this broker: charts are SVG drawn here.
// Every number shown is also in a data-value attribute, so tests read what people see.
"use strict";

const POLL_MS = 1000;
const HISTORY_SECONDS = 3600;
const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const RATE_SERIES = [
  ["stored", (r) => r.stored || 0],
  ["delivered", (r) => r.delivered || 0],
  ["acked", (r) => r.acked || 0],
  ["failed", (r) => (r.nacked || 0) + (r.timeout || 0)],
];
// Seconds between time-axis labels: the first that gives at most six labels.
const TICK_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];

const samples = []; // /stats/history samples, oldest first, at most an hour
let shownDead = ""; // the dead-letter list last drawn, to redraw only on change
const colors = new Map(); // series name -> colour, stable for the page's life

function $(id) {
  return document.getElementById(id);
}

function show(element, value, text) {
  element.dataset.value = value === null || value === undefined ? "" : String(value);
  element.textContent = text !== undefined ? text : value === null || value === undefined ? "-" : String(value);
}

function colorOf(name) {
  if (!colors.has(name)) colors.set(name, PALETTE[colors.size % PALETTE.length]);
  return colors.get(name);
}

function round(value) {
  return Math.round(value * 10) / 10;
}

function sum(values) {
  return values.reduce((a, b) => a + b, 0);
}

function formatDuration(seconds) {
  const s = Math.floor(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  return h ? `${h}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`;
}

function clock(t, withSeconds) {
  const date = new Date(t * 1000);
  const two = (n) => String(n).padStart(2, "0");
  const hm = `${two(date.getHours())}:${two(date.getMinutes())}`;
  return withSeconds ? `${hm}:${two(date.getSeconds())}` : hm;
}

function svgElement(name, attributes, text) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

// -- charts ------------------------------------------------------------------------------

// Lines over time: series is [{name, points: [[t, value|null]]}], x from t0 to t1.
// A null value (no rate yet, a group not present) breaks the line instead of drawing 0.
function lineChart(svg, legend, series, t0, t1, options = {}) {
  const width = options.width || 460;
  const height = options.height || 170;
  const pad = { left: 46, right: 10, top: 8, bottom: 20 };
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.replaceChildren();
  let top = 0;
  for (const s of series) for (const [, v] of s.points) if (v !== null) top = Math.max(top, v);
  top = top > 0 ? top * 1.1 : 1;
  const span = Math.max(t1 - t0, 1);
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const x = (t) => pad.left + (plotW * (t - t0)) / span;
  const y = (v) => pad.top + plotH - (plotH * v) / top;

  for (const fraction of [0, 0.5, 1]) {
    const value = top * fraction;
    svg.appendChild(svgElement("line", { x1: pad.left, x2: width - pad.right, y1: y(value), y2: y(value), class: "grid" }));
    svg.appendChild(svgElement("text", { x: pad.left - 4, y: y(value) + 3, class: "tick-y" }, String(round(value))));
  }
  const step = TICK_STEPS.find((s) => span / s <= 6) || 3600;
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
    svg.appendChild(svgElement("line", { x1: x(t), x2: x(t), y1: pad.top + plotH, y2: pad.top + plotH + 4, class: "axis" }));
    const label = svgElement("text", { x: x(t), y: height - 4, class: "tick-x" }, clock(t, step < 60));
    label.dataset.t = String(t);
    svg.appendChild(label);
  }
  svg.appendChild(svgElement("line", { x1: pad.left, x2: width - pad.right, y1: pad.top + plotH, y2: pad.top + plotH, class: "axis" }));

  if (legend) legend.replaceChildren();
  for (const s of series) {
    let d = "";
    let drawing = false;
    for (const [t, v] of s.points) {
      if (v === null) {
        drawing = false;
        continue;
      }
      d += `${drawing ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      drawing = true;
    }
    const plotted = s.points.filter(([, v]) => v !== null).map(([, v]) => v);
    const path = svgElement("path", { d, class: "series", stroke: s.color || colorOf(s.name) });
    path.dataset.series = s.name;
    path.dataset.values = plotted.join(",");
    svg.appendChild(path);
    if (legend) {
      const item = document.createElement("li");
      item.dataset.series = s.name;
      item.style.setProperty("--color", s.color || colorOf(s.name));
      const latest = plotted.length ? plotted[plotted.length - 1] : null;
      show(item, latest, `${s.name}: ${latest === null ? "-" : round(latest)}`);
      legend.appendChild(item);
    }
  }
  svg.dataset.points = String(series.length ? series[0].points.length : 0);
}

function timeRange() {
  const t1 = samples.length ? samples[samples.length - 1].t : Date.now() / 1000;
  const t0 = samples.length > 1 ? Math.max(samples[0].t, t1 - HISTORY_SECONDS) : t1 - 60;
  return [t0, t1];
}

function pointsOf(value) {
  return samples.map((sample) => [sample.t, value(sample)]);
}

function drawCharts() {
  const [t0, t1] = timeRange();
  const rate = (pick) => (s) => (s.rates ? pick(s.rates) : null);
  lineChart(
    $("chart-rates"),
    $("legend-rates"),
    RATE_SERIES.map(([name, pick]) => ({ name, points: pointsOf(rate(pick)) })),
    t0,
    t1,
  );
  lineChart(
    $("chart-backlog"),
    $("legend-backlog"),
    [
      { name: "backlog", points: pointsOf((s) => s.backlog) },
      { name: "in flight", points: pointsOf((s) => s.inflight) },
    ],
    t0,
    t1,
  );
  lineChart(
    $("chart-connections"),
    $("legend-connections"),
    [{ name: "connections", points: pointsOf((s) => s.connections) }],
    t0,
    t1,
  );
  const latency = (figure, q) => (s) => (s.latency && s.latency[figure] ? s.latency[figure][q] : null);
  lineChart(
    $("chart-latency"),
    $("legend-latency"),
    [
      { name: "end to end p50", points: pointsOf(latency("end_to_end", "p50")) },
      { name: "end to end p99", points: pointsOf(latency("end_to_end", "p99")) },
      { name: "store p99", points: pointsOf(latency("store", "p99")) },
    ],
    t0,
    t1,
  );
  drawGroupMultiples(t0, t1);
  const span = $("history-span");
  span.textContent = samples.length ? `${clock(t0, true)} – ${clock(t1, true)}, ${samples.length} samples` : "";
  document.body.dataset.samples = String(samples.length);
}

// Small multiples: each group its own pair of charts on its own scale, so lines of
// groups with equal values never hide each other.
function drawGroupMultiples(t0, t1) {
  const container = $("group-multiples");
  const groups = [...new Set(samples.flatMap((s) => Object.keys(s.groups)))].sort();
  container.replaceChildren();
  for (const group of groups) {
    const figure = document.createElement("figure");
    figure.dataset.group = group;
    figure.style.setProperty("--color", colorOf(`group:${group}`));
    const caption = document.createElement("figcaption");
    caption.textContent = group;
    figure.appendChild(caption);
    const row = (s) => s.groups[group];
    for (const [kind, value] of [
      ["backlog", (s) => (row(s) ? row(s).backlog : null)],
      ["acked/s", (s) => (row(s) && row(s).rates ? row(s).rates.acked : null)],
    ]) {
      const svg = svgElement("svg", { class: "chart small" });
      svg.dataset.kind = kind;
      const legend = document.createElement("ul");
      legend.className = "legend";
      figure.appendChild(svg);
      figure.appendChild(legend);
      const series = [{ name: kind, color: colorOf(`group:${group}`), points: pointsOf(value) }];
      lineChart(svg, legend, series, t0, t1, { width: 300, height: 110 });
    }
    container.appendChild(figure);
  }
}

// -- tables ------------------------------------------------------------------------------

function cell(tr, field, value, text) {
  const td = document.createElement("td");
  td.dataset.field = field;
  show(td, value, text);
  tr.appendChild(td);
  return td;
}

function nameCell(tr, name, color) {
  const td = document.createElement("td");
  td.textContent = name;
  if (color) td.style.borderLeft = `4px solid ${color}`;
  tr.appendChild(td);
}

function fillTable(id, rows) {
  $(id).tBodies[0].replaceChildren(...rows);
}

function latestSample() {
  return samples.length ? samples[samples.length - 1] : null;
}

function rateOf(rates, name) {
  return rates ? round(rates[name] || 0) : null;
}

function renderSummary(stats) {
  $("broker-address").textContent = stats.address;
  show($("uptime"), Math.floor(stats.uptime), formatDuration(stats.uptime));
  const registry = $("registry-state");
  registry.dataset.connected = String(stats.registry.connected);
  registry.textContent = `${stats.registry.state} (${stats.registry.uri})`;
  show($("connections-total"), stats.connections.total);
  const latest = latestSample();
  show($("stored-rate"), rateOf(latest && latest.rates, "stored"));
  show($("backlog-total"), sum(Object.values(stats.store.backlog_by_topic)));
  show($("inflight-total"), sum(Object.values(stats.groups).map((g) => g.inflight)));
  show($("dead-total"), stats.dead_letters.total);
  const scheduled = stats.scheduled;
  const next = scheduled.by_hour.length ? ` (next: ${scheduled.by_hour[0].count} in ${scheduled.by_hour[0].hour})` : "";
  show($("scheduled-total"), scheduled.total, `${scheduled.total}${next}`);
  show($("tx-waiting"), sum(Object.values(stats.tx.waiting_for_producer)));
  const e2e = stats.latency ? stats.latency.end_to_end.interval.p99 : null;
  show($("e2e-p99"), e2e, e2e === null ? "-" : `${round(e2e)} ms`);
}

function renderTopics(stats) {
  const latest = latestSample();
  fillTable(
    "topics",
    Object.entries(stats.topics).map(([topic, info]) => {
      const tr = document.createElement("tr");
      tr.dataset.topic = topic;
      nameCell(tr, topic);
      const rates = latest && latest.topics[topic] ? latest.topics[topic].rates : null;
      cell(tr, "backlog", info.backlog);
      cell(tr, "inflight", info.inflight);
      cell(tr, "rate_stored", rateOf(rates, "stored"));
      cell(tr, "rate_acked", rateOf(rates, "acked"));
      cell(tr, "stored", info.events.stored || 0);
      cell(tr, "acked", info.events.acked || 0);
      return tr;
    }),
  );
}

function renderGroups(stats) {
  const latest = latestSample();
  const e2e = stats.latency ? stats.latency.end_to_end.by_group : {};
  const bindings = [];
  fillTable(
    "groups",
    Object.entries(stats.groups).map(([group, info]) => {
      const tr = document.createElement("tr");
      tr.dataset.group = group;
      nameCell(tr, group, colorOf(`group:${group}`));
      const rates = latest && latest.groups[group] ? latest.groups[group].rates : null;
      cell(tr, "connections", info.connections);
      cell(tr, "rate_delivered", rateOf(rates, "delivered"));
      cell(tr, "rate_acked", rateOf(rates, "acked"));
      cell(tr, "rate_failed", rateOf(rates, "failed"));
      cell(tr, "inflight", info.inflight);
      cell(tr, "queued", info.queued);
      cell(tr, "backlog", info.backlog);
      cell(tr, "acked", info.events.acked || 0);
      const p99 = e2e[group] ? e2e[group].cumulative.p99 : null;
      cell(tr, "e2e_p99", p99);
      for (const binding of info.bindings || []) bindings.push([group, binding]);
      return tr;
    }),
  );
  fillTable(
    "bindings",
    bindings.map(([group, binding]) => {
      const tr = document.createElement("tr");
      tr.dataset.group = group;
      tr.dataset.topic = binding.topic;
      tr.dataset.messageType = binding.message_type;
      nameCell(tr, group, colorOf(`group:${group}`));
      cell(tr, "topic", binding.topic);
      cell(tr, "message_type", binding.message_type);
      cell(tr, "persistent", binding.persistent);
      cell(tr, "backlog", binding.backlog);
      cell(tr, "inflight", binding.inflight);
      cell(tr, "queued", binding.queued);
      const age = binding.oldest_waiting_age;
      cell(tr, "oldest_waiting_age", age, age === null || age === undefined ? "-" : String(round(age)));
      return tr;
    }),
  );
  fillTable(
    "lanes",
    stats.lanes.map((lane) => {
      const tr = document.createElement("tr");
      tr.dataset.group = lane.group;
      tr.dataset.topic = lane.topic;
      nameCell(tr, lane.group, colorOf(`group:${lane.group}`));
      for (const field of ["topic", "message_type", "watermark", "inflight", "queued"]) cell(tr, field, lane[field]);
      return tr;
    }),
  );
}

function renderConnections(stats) {
  fillTable(
    "connections",
    Object.entries(stats.connections.by_group).map(([group, count]) => {
      const tr = document.createElement("tr");
      tr.dataset.group = group;
      nameCell(tr, group);
      cell(tr, "connections", count);
      return tr;
    }),
  );
  show($("connections-unauthenticated"), stats.connections.unauthenticated);
  fillTable(
    "refusals",
    Object.entries(stats.security.refusals).map(([kind, count]) => {
      const tr = document.createElement("tr");
      tr.dataset.kind = kind;
      nameCell(tr, kind);
      cell(tr, "count", count);
      return tr;
    }),
  );
}

function renderLatency(stats) {
  if (!stats.latency) return;
  const rows = [["store", "", stats.latency.store]];
  for (const figure of ["end_to_end", "ack"]) {
    rows.push([figure, "(all groups)", stats.latency[figure]]);
    for (const [group, window] of Object.entries(stats.latency[figure].by_group)) rows.push([figure, group, window]);
  }
  fillTable(
    "latency",
    rows.map(([figure, group, window]) => {
      const tr = document.createElement("tr");
      tr.dataset.kind = figure;
      tr.dataset.group = group;
      nameCell(tr, figure.replaceAll("_", " "));
      nameCell(tr, group);
      for (const span of ["interval", "cumulative"]) {
        for (const q of ["count", "p50", "p90", "p99"]) cell(tr, `${span}_${q}`, window[span][q]);
      }
      return tr;
    }),
  );
}

// -- messages ----------------------------------------------------------------------------

// A message id that opens its detail (GET /messages/{id}) when clicked.
function messageLink(messageId) {
  const td = document.createElement("td");
  td.dataset.field = "message_id";
  const link = document.createElement("a");
  link.href = `#message-${messageId}`;
  link.className = "message-link";
  link.dataset.messageId = messageId;
  link.textContent = messageId;
  link.addEventListener("click", (event) => {
    event.preventDefault();
    openMessage(messageId);
  });
  td.appendChild(link);
  return td;
}

// A table row that starts with a message's id (a link to its detail), topic and type.
function messageRow(message) {
  const tr = document.createElement("tr");
  tr.dataset.messageId = message.message_id;
  tr.appendChild(messageLink(message.message_id));
  cell(tr, "topic", message.topic);
  cell(tr, "message_type", message.message_type);
  return tr;
}

function describe(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value === "object") return JSON.stringify(value, null, 2);
  return String(value);
}

async function openMessage(messageId) {
  const dialog = $("message-detail");
  const fields = $("message-detail-fields");
  const error = $("message-detail-error");
  $("message-detail-id").textContent = messageId;
  dialog.dataset.messageId = messageId;
  dialog.dataset.state = "loading";
  fields.replaceChildren();
  error.textContent = "";
  if (!dialog.open) dialog.showModal();
  try {
    const response = await fetch(`/messages/${encodeURIComponent(messageId)}`, { cache: "no-store" });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.error || `HTTP ${response.status} ${response.statusText}`);
    for (const [key, value] of Object.entries(body)) {
      const dt = document.createElement("dt");
      dt.textContent = key;
      const dd = document.createElement("dd");
      dd.dataset.field = key;
      const text = describe(value);
      if (typeof value === "object" && value !== null) {
        const pre = document.createElement("pre");
        pre.textContent = text;
        dd.appendChild(pre);
      } else {
        dd.textContent = text;
      }
      fields.append(dt, dd);
    }
    dialog.dataset.state = "loaded";
  } catch (failure) {
    error.textContent = `cannot show ${messageId}: ${failure.message}`;
    dialog.dataset.state = "error";
  }
}

async function listMessages(event) {
  event.preventDefault();
  const status = $("messages-status");
  const query = new URLSearchParams({ limit: "50" });
  for (const [key, value] of new FormData($("messages-form"))) if (value) query.set(key, value);
  try {
    const response = await fetch(`/messages?${query}`, { cache: "no-store" });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
    const messages = Array.isArray(body) ? body : body.messages || [];
    fillTable(
      "messages",
      messages.map((message) => {
        const tr = messageRow(message);
        cell(tr, "state", message.state);
        const preview = message.body_preview !== undefined ? message.body_preview : message.body;
        cell(tr, "body", describe(preview));
        return tr;
      }),
    );
    status.className = "";
    status.textContent = `${messages.length} message(s)`;
  } catch (failure) {
    status.className = "error";
    status.textContent = `cannot list messages: ${failure.message}`;
  }
}

// -- dead letters ------------------------------------------------------------------------

function adminHeaders() {
  const headers = { "Content-Type": "application/json" };
  const token = $("token").value;
  if (token) headers.Authorization = `Bearer ${token}`;
  return headers;
}

async function redrive(messageId, button) {
  const status = $("dlq-status");
  button.disabled = true;
  try {
    const response = await fetch("/dlq/redrive", {
      method: "POST",
      headers: adminHeaders(),
      body: JSON.stringify({ message_id: messageId }),
    });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    status.className = "";
    status.dataset.redriven = String(body.redriven);
    status.textContent = `redriven ${messageId}: ${body.redriven} message(s)`;
    await refreshDeadLetters();
  } catch (error) {
    status.className = "error";
    status.textContent = `redrive failed: ${error.message}`;
    button.disabled = false;
  }
}

function renderDeadLetters(dead) {
  const text = JSON.stringify(dead);
  if (text === shownDead) return; // keep the buttons under the pointer still
  shownDead = text;
  show($("dlq-count"), dead.length);
  fillTable(
    "dlq",
    dead.map((letter) => {
      const tr = messageRow(letter);
      cell(tr, "reason", letter.reason);
      cell(tr, "deliver_count", letter.deliver_count);
      cell(tr, "fail_groups", letter.fail_groups.join(", "));
      const action = document.createElement("td");
      const button = document.createElement("button");
      button.className = "redrive";
      button.type = "button";
      button.dataset.messageId = letter.message_id;
      button.textContent = "Redrive";
      button.addEventListener("click", () => redrive(letter.message_id, button));
      action.appendChild(button);
      tr.appendChild(action);
      return tr;
    }),
  );
}

// -- polling -----------------------------------------------------------------------------

async function getJson(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

async function refreshDeadLetters() {
  renderDeadLetters(await getJson("/dlq?limit=100"));
}

// New samples only (the first call loads the whole hour); older than an hour are dropped.
async function refreshHistory() {
  const latest = latestSample();
  const fresh = await getJson(latest ? `/stats/history?since=${latest.t}` : "/stats/history");
  if (!fresh.length) return false;
  samples.push(...fresh);
  const oldest = samples[samples.length - 1].t - HISTORY_SECONDS;
  while (samples.length && samples[0].t < oldest) samples.shift();
  return true;
}

async function poll() {
  const [stats, changed] = await Promise.all([getJson("/stats"), refreshHistory()]);
  renderSummary(stats);
  renderTopics(stats);
  renderGroups(stats);
  renderConnections(stats);
  renderLatency(stats);
  if (changed || !samples.length) drawCharts();
  await refreshDeadLetters();
  document.body.dataset.polls = String(Number(document.body.dataset.polls) + 1);
  const status = $("status");
  status.className = "";
  status.textContent = `updated ${new Date().toLocaleTimeString()}`;
}

async function loop() {
  try {
    await poll();
  } catch (error) {
    const status = $("status");
    status.className = "error";
    status.textContent = `cannot read the broker: ${error.message}`;
  }
  setTimeout(loop, POLL_MS);
}

$("messages-form").addEventListener("submit", listMessages);
loop();
