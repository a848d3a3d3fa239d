// The popup: the switch that turns the taking of downloads off, the last answer of dld, and
// dld's jobs (those not finished, and the last ones this extension sent) with their progress,
// read with `list` and `status` in one batch every second while the popup is open.
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
  $("jobs").replaceChildren(...jobs.map(row));
  const running = jobs.filter((job) => job.state === "running").length;
  $("summary").textContent = jobs.length === 0 ? "no jobs" : running + " running, " + jobs.length + " shown";
}

$("enabled").addEventListener("change", () => api.storage.local.set({ enabled: $("enabled").checked }));

loadSettings().then((settings) => {
  $("enabled").checked = !!settings.enabled;
});
refresh();
setInterval(refresh, 1000);
