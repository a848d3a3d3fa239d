// The popup: the switch that turns the taking of downloads off, the last answer of dld, and
// dld's jobs (those not finished, and the last ones this extension sent) with their progress.
// The jobs are read with `list` and `status` in one batch on `POST /rpc`; then dld's `/ws`
// (subscribed) moves the progress bars as `job.progress` comes and asks for the list again on
// each `job.state`. Without the WebSocket (an older dld, a socket that closed), the batch is
// asked every second.
"use strict";

const $ = (id) => document.getElementById(id);
const ACTIVE = ["running", "queued", "waiting", "paused"];

function row(job) {
  const item = document.createElement("li");
  item.dataset.id = job.id;
  item.className = "job " + job.state;
  const top = document.createElement("div");
  top.className = "top";
  const name = document.createElement("span");
  name.className = "name";
  name.textContent = job.name;
  name.title = job.url;
  const state = document.createElement("span");
  state.className = "state";
  state.textContent = job.state + (job.wait_reason ? " (" + job.wait_reason + ")" : "");
  top.append(name, state);
  const bar = document.createElement("progress");
  bar.max = 1;
  if (job.progress != null) bar.value = job.progress;
  const detail = document.createElement("div");
  detail.className = "detail";
  let text = formatBytes(job.received) + " of " + formatBytes(job.size);
  if (job.state === "running" && job.speed > 0) text += ", " + formatBytes(job.speed) + "/s";
  if (job.error && job.state !== "completed") text += " · " + job.error.code + ": " + job.error.message;
  detail.textContent = text;
  item.append(top, bar, detail);
  return item;
}

let refreshing = false;
const shown = new Map(); // id → the job as last drawn
const live = { socket: null, soon: null };

async function refresh() {
  if (refreshing) return; // the last one has not been answered yet
  refreshing = true;
  try {
    await show();
  } finally {
    refreshing = false;
  }
}

async function show() {
  const settings = await loadSettings();
  const stored = await api.storage.local.get(["recentJobs", "lastResult"]);
  const last = stored.lastResult;
  if (last) {
    $("last").hidden = false;
    $("last").className = last.ok ? "ok" : "error";
    $("last").textContent = (last.ok ? "Sent: " : "Not sent: ") + last.message;
  }
  const recent = Array.isArray(stored.recentJobs) ? stored.recentJobs : [];
  const calls = [{ method: "list", params: { state: ACTIVE, limit: 100 } }].concat(
    recent.map((id) => ({ method: "status", params: { id } }))
  );
  let replies;
  try {
    replies = await dldCall(settings, calls);
  } catch (error) {
    $("message").hidden = false;
    $("message").className = "error";
    $("message").textContent = error.message;
    return;
  }
  $("message").hidden = true;
  const byId = new Map();
  for (const reply of Array.isArray(replies) ? replies : []) {
    const result = reply && reply.result;
    if (!result) continue; // a job removed since
    for (const job of result.jobs || [result]) if (job && job.id != null) byId.set(job.id, job);
  }
  const jobs = [...byId.values()].sort((a, b) => b.id - a.id);
  shown.clear();
  for (const job of jobs) shown.set(job.id, job);
  $("jobs").replaceChildren(...jobs.map(row));
  const running = jobs.filter((job) => job.state === "running").length;
  $("summary").textContent = jobs.length === 0 ? "no jobs" : running + " running, " + jobs.length + " shown";
}

$("enabled").addEventListener("change", () => api.storage.local.set({ enabled: $("enabled").checked }));

// A running job's counters from `job.progress`: its row drawn again, nothing asked of dld.
function progress(params) {
  const job = shown.get(params.id);
  if (!job) return;
  Object.assign(job, { state: "running", received: params.received, size: params.size, speed: params.speed });
  job.progress = params.size > 0 ? params.received / params.size : null;
  const item = $("jobs").querySelector(`li[data-id="${Number(params.id)}"]`);
  if (item) item.replaceWith(row(job));
}

function refreshSoon() {
  if (live.soon) return;
  live.soon = setTimeout(() => {
    live.soon = null;
    refresh();
  }, 200);
}

// dld's /ws, the token sent as the subprotocol `dld.token.<token>` beside `dld` (a browser's
// WebSocket can send no Authorization header; docs/protocol.md). `data-live="ws"` on the body
// says the popup is live (the end-to-end test reads it).
function connect(settings) {
  const base = baseAddress(settings.address);
  if (!/^https?:\/\/[^/]+$/.test(base) || !settings.token) return;
  let socket;
  try {
    socket = new WebSocket(base.replace(/^http/, "ws") + "/ws", ["dld", "dld.token." + settings.token]);
  } catch (error) {
    return;
  }
  socket.addEventListener("open", () => {
    live.socket = socket;
    document.body.dataset.live = "ws";
    socket.send(JSON.stringify({ jsonrpc: "2.0", id: "events", method: "subscribe", params: {} }));
  });
  socket.addEventListener("message", (event) => {
    let message;
    try {
      message = JSON.parse(event.data);
    } catch (error) {
      return;
    }
    if (message.id === "events") return refresh();
    if (message.method === "job.progress") return progress(message.params || {});
    if (message.method === "job.state") refreshSoon();
  });
  socket.addEventListener("close", () => {
    if (live.socket === socket) live.socket = null;
    delete document.body.dataset.live;
    setTimeout(() => connect(settings), 2000);
  });
}

loadSettings().then((settings) => {
  $("enabled").checked = !!settings.enabled;
  connect(settings);
});
refresh();
setInterval(() => {
  if (!live.socket) refresh();
}, 1000);
