// The broker dashboard: polls /stats and /dlq each second and draws what it gets.
// No framework and no network beyond this broker: charts are drawn on <canvas> here.
// Every number shown is also in a data-value attribute, so tests read what people see.
"use strict";

const POLL_MS = 1000;
const HISTORY = 60; // samples kept per chart: one minute at one poll a second
const FAILED_EVENTS = ["nacked", "timeout"];
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

const charts = {
  rates: { canvas: "chart-rates", legend: "legend-rates", value: (row) => row.rates.acked },
  backlog: { canvas: "chart-backlog", legend: "legend-backlog", value: (row) => row.backlog },
  inflight: { canvas: "chart-inflight", legend: "legend-inflight", value: (row) => row.inflight },
};
const history = []; // [{group: row}] oldest first
let previous = null; // the last /stats, for rates
let shownDead = ""; // the dead-letter list last drawn, to redraw only on change
const colors = new Map(); // group -> colour, stable for the page's life

function $(id) {
  return document.getElementById(id);
}

function show(element, value, text) {
  element.dataset.value = String(value);
  element.textContent = text === undefined ? String(value) : text;
}

function colorOf(group) {
  if (!colors.has(group)) colors.set(group, PALETTE[colors.size % PALETTE.length]);
  return colors.get(group);
}

function rate(now, before, seconds, events) {
  if (!before || seconds <= 0) return 0;
  let delta = 0;
  for (const event of events) delta += (now[event] || 0) - (before[event] || 0);
  return Math.max(0, delta) / seconds;
}

function round(value) {
  return Math.round(value * 10) / 10;
}

// One row per group: counts from /stats, rates from the difference with the previous poll.
function groupRows(stats) {
  const seconds = previous ? stats.uptime - previous.uptime : 0;
  const rows = {};
  for (const [group, info] of Object.entries(stats.groups)) {
    const before = previous && previous.groups[group] ? previous.groups[group].events : null;
    rows[group] = {
      connections: info.connections,
      inflight: info.inflight,
      queued: info.queued,
      backlog: info.backlog,
      acked: info.events.acked || 0,
      rates: {
        delivered: round(rate(info.events, before, seconds, ["delivered"])),
        acked: round(rate(info.events, before, seconds, ["acked"])),
        failed: round(rate(info.events, before, seconds, FAILED_EVENTS)),
      },
    };
  }
  return rows;
}

function renderSummary(stats, rows) {
  $("broker-address").textContent = stats.address;
  show($("uptime"), Math.floor(stats.uptime), formatDuration(stats.uptime));
  const registry = $("registry-state");
  registry.dataset.connected = String(stats.registry.connected);
  registry.textContent = `${stats.registry.state} (${stats.registry.uri})`;
  show($("connections-total"), stats.connections.total);
  const seconds = previous ? stats.uptime - previous.uptime : 0;
  const stored = previous ? rate(stats.events, previous.events, seconds, ["stored"]) : 0;
  show($("stored-rate"), round(stored));
  show($("backlog-total"), Object.values(stats.store.backlog_by_topic).reduce((a, b) => a + b, 0));
  show($("inflight-total"), Object.values(rows).reduce((a, row) => a + row.inflight, 0));
  show($("dead-total"), stats.dead_letters.total);
  show($("tx-waiting"), Object.values(stats.tx.waiting_for_producer).reduce((a, b) => a + b, 0));
}

function formatDuration(seconds) {
  const s = Math.floor(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  return h ? `${h}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`;
}

function cell(tr, field, value) {
  const td = document.createElement("td");
  td.dataset.field = field;
  show(td, value);
  tr.appendChild(td);
}

function renderGroups(rows) {
  const body = $("groups").tBodies[0];
  body.replaceChildren();
  for (const group of Object.keys(rows).sort()) {
    const row = rows[group];
    const tr = document.createElement("tr");
    tr.dataset.group = group;
    const name = document.createElement("td");
    name.textContent = group;
    name.style.borderLeft = `4px solid ${colorOf(group)}`;
    tr.appendChild(name);
    cell(tr, "connections", row.connections);
    cell(tr, "rate_delivered", row.rates.delivered);
    cell(tr, "rate_acked", row.rates.acked);
    cell(tr, "rate_failed", row.rates.failed);
    cell(tr, "inflight", row.inflight);
    cell(tr, "queued", row.queued);
    cell(tr, "backlog", row.backlog);
    cell(tr, "acked", row.acked);
    body.appendChild(tr);
  }
}

// A line per group over the last HISTORY samples; y from 0 to the largest value seen.
function drawChart(chart) {
  const canvas = $(chart.canvas);
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.width;
  const height = canvas.clientHeight || canvas.height;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);

  const groups = [...new Set(history.flatMap((sample) => Object.keys(sample)))].sort();
  let top = 1;
  for (const sample of history) {
    for (const row of Object.values(sample)) top = Math.max(top, chart.value(row));
  }
  const pad = { left: 40, right: 8, top: 8, bottom: 16 };
  const plotWidth = width - pad.left - pad.right;
  const plotHeight = height - pad.top - pad.bottom;
  const x = (i) => pad.left + (plotWidth * i) / (HISTORY - 1);
  const y = (v) => pad.top + plotHeight - (plotHeight * v) / top;

  ctx.strokeStyle = "#e3e7ee";
  ctx.fillStyle = "#5a6475";
  ctx.font = "10px system-ui, sans-serif";
  ctx.lineWidth = 1;
  for (const fraction of [0, 0.5, 1]) {
    const value = top * fraction;
    ctx.beginPath();
    ctx.moveTo(pad.left, y(value));
    ctx.lineTo(width - pad.right, y(value));
    ctx.stroke();
    ctx.fillText(String(round(value)), 4, y(value) + 3);
  }
  const offset = HISTORY - history.length;
  ctx.lineWidth = 2;
  for (const group of groups) {
    ctx.strokeStyle = colorOf(group);
    ctx.beginPath();
    let drawing = false;
    history.forEach((sample, i) => {
      const row = sample[group];
      if (!row) {
        drawing = false;
        return;
      }
      const point = [x(offset + i), y(chart.value(row))];
      if (drawing) ctx.lineTo(...point);
      else ctx.moveTo(...point);
      drawing = true;
    });
    ctx.stroke();
  }
  canvas.dataset.points = String(history.length);

  const legend = $(chart.legend);
  legend.replaceChildren();
  const latest = history[history.length - 1] || {};
  for (const group of Object.keys(latest).sort()) {
    const item = document.createElement("li");
    item.dataset.series = group;
    item.style.setProperty("--color", colorOf(group));
    const value = chart.value(latest[group]);
    item.dataset.value = String(value);
    item.textContent = `${group}: ${value}`;
    legend.appendChild(item);
  }
}

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
  const body = $("dlq").tBodies[0];
  body.replaceChildren();
  for (const letter of dead) {
    const tr = document.createElement("tr");
    tr.dataset.messageId = letter.message_id;
    for (const [field, value] of [
      ["message_id", letter.message_id],
      ["topic", letter.topic],
      ["message_type", letter.message_type],
      ["reason", letter.reason],
      ["deliver_count", letter.deliver_count],
      ["fail_groups", letter.fail_groups.join(", ")],
    ]) {
      const td = document.createElement("td");
      td.dataset.field = field;
      td.textContent = String(value);
      tr.appendChild(td);
    }
    const action = document.createElement("td");
    const button = document.createElement("button");
    button.className = "redrive";
    button.type = "button";
    button.dataset.messageId = letter.message_id;
    button.textContent = "Redrive";
    button.addEventListener("click", () => redrive(letter.message_id, button));
    action.appendChild(button);
    tr.appendChild(action);
    body.appendChild(tr);
  }
}

async function getJson(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

async function refreshDeadLetters() {
  renderDeadLetters(await getJson("/dlq?limit=100"));
}

async function poll() {
  const stats = await getJson("/stats");
  const rows = groupRows(stats);
  history.push(rows);
  if (history.length > HISTORY) history.shift();
  renderSummary(stats, rows);
  renderGroups(rows);
  for (const chart of Object.values(charts)) drawChart(chart);
  await refreshDeadLetters();
  previous = stats;
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

loop();
