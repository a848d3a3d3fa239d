// dld's dashboard: requests over POST /rpc, live changes over /ws (subscribe). No framework,
// no external resources; every text from the daemon goes into the page as text, never as HTML.
"use strict";

const PAGE = 50;
const view = { states: null, group: null, after: 0, cursors: [], next: null, rows: new Map(), selected: new Set() };
const live = { seq: null, socket: null, retry: 500, refreshTimer: null, queuePaused: false };

const $ = (selector) => document.querySelector(selector);

class RPCError extends Error {
  constructor(error) {
    super(error.message);
    this.code = (error.data && error.data.code) || String(error.code);
  }
}

let nextID = 1;
async function rpc(method, params = {}) {
  const response = await fetch("/rpc", {
    method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: nextID++, method, params }),
  });
  if (response.status === 401) {
    throw new RPCError({ message: "not logged in: open the login link that `dlctl web` prints", data: { code: "unauthorized" } });
  }
  const reply = await response.json();
  if (reply.error) throw new RPCError(reply.error);
  return reply.result;
}

function say(text, isError = false) {
  const message = $("#message");
  message.textContent = text;
  message.classList.toggle("error", isError);
}

function failed(error) {
  say(error.code ? `${error.message} [${error.code}]` : String(error.message || error), true);
}

// MARK: numbers as people read them

function bytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit++; }
  return `${value < 10 && unit > 0 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
}

function duration(seconds) {
  if (!isFinite(seconds) || seconds < 0) return "";
  if (seconds < 60) return `${Math.ceil(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} min`;
}

/** `2M`, `512K`, `100000`, `none`: bytes per second; null when it is not a rate. */
function rate(text) {
  const match = /^\s*(none|off|0|(\d+(?:\.\d+)?)\s*([kmg]?)i?b?(?:\/s)?)\s*$/i.exec(text);
  if (!match) return null;
  if (!match[2]) return 0;
  const scale = { "": 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3 }[match[3].toLowerCase()];
  return Math.round(parseFloat(match[2]) * scale);
}

// MARK: the jobs table

function why(job) {
  if (job.state === "waiting" && job.wait_reason) {
    const at = job.next_attempt_at ? ` until ${new Date(job.next_attempt_at).toLocaleTimeString()}` : "";
    return `${job.wait_reason}${at}${job.error ? `: ${job.error.message} [${job.error.code}]` : ""}`;
  }
  if (job.error && job.state !== "completed") return `${job.error.message} [${job.error.code}]`;
  if (job.state === "queued") return live.queuePaused ? "the queue is paused" : "waiting for a free slot";
  return "";
}

function cell(row, className, text) {
  const td = document.createElement("td");
  if (className) td.className = className;
  if (text !== undefined) td.textContent = text;
  row.appendChild(td);
  return td;
}

function button(label, title, action) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.title = title;
  b.setAttribute("aria-label", title);
  b.addEventListener("click", action);
  return b;
}

function renderRow(job) {
  const row = document.createElement("tr");
  row.dataset.id = job.id;
  const select = document.createElement("input");
  select.type = "checkbox";
  select.checked = view.selected.has(job.id);
  select.setAttribute("aria-label", `Select job ${job.id}`);
  select.addEventListener("change", () => {
    if (select.checked) view.selected.add(job.id); else view.selected.delete(job.id);
    $("#selected-count").textContent = `${view.selected.size} selected`;
  });
  cell(row).appendChild(select);
  cell(row, "num", String(job.id));
  const name = cell(row, "name", job.name);
  name.title = job.path;
  const state = cell(row, `state state-${job.state}`, job.state);
  const reason = why(job);
  if (reason) {
    const span = document.createElement("span");
    span.className = "why";
    span.textContent = reason;
    state.appendChild(span);
  }
  const progress = cell(row, "progress");
  const bar = document.createElement("progress");
  bar.max = 1;
  bar.setAttribute("aria-label", `Progress of ${job.name}`);
  const pct = document.createElement("span");
  pct.className = "pct";
  progress.append(bar, pct);
  cell(row, "num speed");
  cell(row, "num eta");
  cell(row, "num", job.group === null ? "" : String(job.group));
  const actions = cell(row, "actions");
  if (["queued", "running", "waiting"].includes(job.state)) {
    actions.appendChild(button("Pause", `Pause job ${job.id}`, () => act("pause", { id: job.id })));
  }
  if (["paused", "failed", "waiting"].includes(job.state)) {
    actions.appendChild(button("Resume", `Resume job ${job.id}`, () => act("resume", { id: job.id })));
  }
  if (!["completed", "canceled"].includes(job.state)) {
    actions.appendChild(button("Cancel", `Cancel job ${job.id}`, () => act("cancel", { id: job.id })));
  }
  actions.appendChild(button("Remove", `Remove the record of job ${job.id} (its file stays)`, () => act("remove", { id: job.id })));
  updateProgress(row, job.received, job.size, job.speed, job.state);
  return row;
}

function updateProgress(row, received, size, speed, state) {
  const bar = row.querySelector("progress");
  const fraction = state === "completed" ? 1 : size ? Math.min(1, received / size) : null;
  // A bar that moves without a size only while bytes come; a stopped job's bar stands still.
  if (fraction === null && state === "running") bar.removeAttribute("value"); else bar.value = fraction || 0;
  row.querySelector(".pct").textContent =
    fraction === null ? bytes(received) : `${Math.floor(fraction * 100)} % of ${bytes(size)}`;
  row.querySelector(".speed").textContent = speed ? `${bytes(speed)}/s` : "";
  row.querySelector(".eta").textContent = speed && size ? duration((size - received) / speed) : "";
}

/** A group's line: its state, members done, bytes, folder and error. */
async function loadGroup() {
  const info = $("#group-info");
  if (view.group === null) { info.hidden = true; return; }
  const { group } = await rpc("status", { group: view.group });
  const total = group.bytes_total === null ? "?" : bytes(group.bytes_total);
  const error = group.error ? ` · ${group.error.message} [${group.error.code}]` : "";
  info.textContent = `group ${group.id} “${group.name}”: ${group.state}, ${group.members_done} of ${group.members} files, ` +
    `${bytes(group.bytes_done)} of ${total} → ${group.dir}${error}`;
  info.hidden = false;
}

async function loadPage() {
  const params = { limit: PAGE };
  if (view.states) params.state = view.states;
  if (view.group !== null) params.group = view.group;
  else if (view.after) params.after_id = view.after;
  const result = await rpc("list", params);
  const body = $("#jobs tbody");
  const rows = result.jobs.map(renderRow);
  body.replaceChildren(...rows);
  view.rows = new Map(result.jobs.map((job, index) => [job.id, { job, row: rows[index] }]));
  view.next = result.next_after_id;
  $("#next-page").disabled = view.next === null;
  $("#first-page").disabled = view.after === 0;
  const first = result.jobs.length ? result.jobs[0].id : null;
  $("#page-info").textContent = first === null ? "no jobs" : `jobs ${first}…${result.jobs[result.jobs.length - 1].id}`;
}

async function loadStats() {
  const stats = await rpc("stats");
  const counts = Object.entries(stats.counts).filter(([, n]) => n > 0).map(([state, n]) => `${n} ${state}`);
  live.queuePaused = stats.queue_paused;
  const speed = stats.speed ? ` · ${bytes(stats.speed)}/s` : "";
  const queue = stats.queue_paused ? ` · queue paused${stats.queue_paused_reason ? ` (${stats.queue_paused_reason})` : ""}` : "";
  $("#summary").textContent = `${stats.total} jobs${counts.length ? ": " + counts.join(", ") : ""}${speed}${queue}`;
  $("#queue-toggle").textContent = stats.queue_paused ? "Restart queue" : "Pause queue";
  const limit = stats.max_speed && stats.max_speed.limit;
  $("#speed-input").placeholder = limit ? `${bytes(limit)}/s` : "none";
}

async function refresh() {
  try {
    await Promise.all([loadStats(), loadPage(), loadGroup()]);
  } catch (error) {
    failed(error);
  }
}

/** Many events come in bursts: one refresh for each burst, not one for each event. */
function refreshSoon() {
  if (live.refreshTimer) return;
  live.refreshTimer = setTimeout(() => { live.refreshTimer = null; refresh(); }, 250);
}

async function act(method, params) {
  try {
    if (method === "cancel" && !confirm("Cancel and delete the partial data?")) return;
    if (method === "remove" && $("#delete-files").checked) {
      if (!confirm("Remove the records and delete the files of completed jobs?")) return;
      params = { ...params, delete_file: true };
    }
    const result = await rpc(method, params);
    const count = result.count === undefined ? "" : ` ${result.count} job${result.count === 1 ? "" : "s"}`;
    say(`${method}:${count} done`);
    refreshSoon();
  } catch (error) {
    failed(error);
  }
}

function bulk(method) {
  if ($("#scope-all").checked) {
    act(method, view.group !== null ? { group: view.group } : { all: true });
  } else if (view.selected.size === 0) {
    say("select jobs first, or tick “every job”", true);
  } else {
    act(method, { ids: [...view.selected] });
    view.selected.clear();
    $("#selected-count").textContent = "0 selected";
  }
}

// MARK: live changes

function connect() {
  const socket = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`);
  live.socket = socket;
  socket.addEventListener("open", () => {
    live.retry = 500;
    const params = live.seq === null ? {} : { since: live.seq };
    socket.send(JSON.stringify({ jsonrpc: "2.0", id: "events", method: "subscribe", params }));
  });
  socket.addEventListener("message", (event) => {
    let message;
    try { message = JSON.parse(event.data); } catch { return; }
    if (message.id === "events") {
      if (message.result) live.seq = message.result.seq; else if (message.error) failed(new RPCError(message.error));
      refreshSoon();
      return;
    }
    const params = message.params || {};
    if (message.method === "job.progress") {
      const entry = view.rows.get(params.id);
      if (entry) updateProgress(entry.row, params.received, params.size, params.speed, "running");
      return;
    }
    if (typeof params.seq === "number") live.seq = params.seq;
    refreshSoon();
  });
  socket.addEventListener("close", () => {
    live.socket = null;
    setTimeout(connect, live.retry);
    live.retry = Math.min(live.retry * 2, 10000);
  });
}

// MARK: adding downloads

/** A list as `dlctl enqueue -i` reads it: a URL a line; indented `out=` and `dir=` lines. */
function parseList(text) {
  const jobs = [];
  for (const line of text.split(/\r?\n/)) {
    if (!line.trim() || line.trim().startsWith("#")) continue;
    const option = /^\s+(\w+)=(.*)$/.exec(line);
    if (option && jobs.length) {
      const [, key, value] = option;
      if (key === "out") jobs[jobs.length - 1].name = value.trim();
      if (key === "dir") jobs[jobs.length - 1].dir = value.trim();
      continue;
    }
    jobs.push({ url: line.trim().split(/\s+/)[0] });
  }
  return jobs;
}

async function add(event) {
  event.preventDefault();
  const jobs = parseList($("#add-urls").value);
  if (!jobs.length) { say("give at least one URL", true); return; }
  const dir = $("#add-dir").value.trim();
  const group = $("#add-group").value.trim();
  const checksum = $("#add-checksum").value.trim();
  const paused = $("#add-paused").checked;
  try {
    let result;
    if (group) {
      if (!dir) throw new Error("a group needs a folder (an absolute path)");
      const members = jobs.map(({ url, name }) => (name ? { url, name } : { url }));
      result = await rpc("enqueue", { group: { name: group, dir }, jobs: members, paused });
      say(`group ${result.group.id}: ${result.count} files`);
    } else {
      if (checksum && jobs.length > 1) throw new Error("a checksum goes with one URL");
      const list = jobs.map((job) => {
        const params = { ...job, paused };
        if (dir && !job.dir) params.dir = dir;
        if (checksum) params.checksum = checksum;
        return params;
      });
      result = await rpc("enqueue", { jobs: list });
      say(`added ${result.created} of ${result.count}`);
    }
    $("#add-urls").value = "";
    refreshSoon();
  } catch (error) {
    failed(error);
  }
}

async function dropList(event) {
  event.preventDefault();
  $("#add-urls").classList.remove("dropping");
  const file = event.dataTransfer.files[0];
  if (file) $("#add-urls").value = await file.text();
}

// MARK: the cache

async function loadCache() {
  try {
    const result = await rpc("cache_list");
    $("#cache-table tbody").replaceChildren(...result.entries.map((entry) => {
      const row = document.createElement("tr");
      cell(row, "name", entry.url);
      cell(row, "num", bytes(entry.size));
      cell(row, "", [entry.pinned ? "pinned" : "", entry.in_use ? "in use" : ""].filter(Boolean).join(", "));
      cell(row, "name", entry.path);
      return row;
    }));
  } catch (error) {
    failed(error);
  }
}

// MARK: wiring

function start() {
  $("#add-form").addEventListener("submit", add);
  const urls = $("#add-urls");
  urls.addEventListener("dragover", (event) => { event.preventDefault(); urls.classList.add("dropping"); });
  urls.addEventListener("dragleave", () => urls.classList.remove("dropping"));
  urls.addEventListener("drop", dropList);
  $("#filter").addEventListener("change", (event) => {
    view.states = event.target.value ? event.target.value.split(",") : null;
    view.after = 0; view.cursors = [];
    refresh();
  });
  $("#group-filter").addEventListener("change", (event) => {
    const text = event.target.value.trim();
    view.group = text === "" ? null : /^\d+$/.test(text) ? Number(text) : text;
    view.after = 0; view.cursors = [];
    refresh();
  });
  $("#select-page").addEventListener("change", (event) => {
    for (const [id, { row }] of view.rows) {
      row.querySelector("input").checked = event.target.checked;
      if (event.target.checked) view.selected.add(id); else view.selected.delete(id);
    }
    $("#selected-count").textContent = `${view.selected.size} selected`;
  });
  for (const b of document.querySelectorAll("[data-bulk]")) b.addEventListener("click", () => bulk(b.dataset.bulk));
  $("#next-page").addEventListener("click", () => {
    if (view.next === null) return;
    view.cursors.push(view.after); view.after = view.next;
    refresh();
  });
  $("#first-page").addEventListener("click", () => { view.after = 0; view.cursors = []; refresh(); });
  $("#queue-toggle").addEventListener("click", () => act("queue", { paused: !live.queuePaused }));
  $("#speed-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = rate($("#speed-input").value);
    if (value === null) { say("a speed is bytes per second: 2M, 512K, 100000, or none", true); return; }
    act("set_speed", { global: true, max_speed: value });
    $("#speed-input").value = "";
  });
  $("#cache").addEventListener("toggle", (event) => { if (event.target.open) loadCache(); });
  document.addEventListener("keydown", (event) => {
    if (event.target.closest("input, textarea, select") || event.ctrlKey || event.metaKey || event.altKey) return;
    const keys = {
      "/": () => $("#add-urls").focus(), p: () => bulk("pause"), r: () => bulk("resume"),
      q: () => $("#queue-toggle").click(), n: () => $("#next-page").click(), "?": () => $("#help").showModal(),
    };
    if (keys[event.key]) { event.preventDefault(); keys[event.key](); }
  });
  refresh();
  connect();
}

document.addEventListener("DOMContentLoaded", start);
