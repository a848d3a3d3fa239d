// Shared by the background worker, the popup and the options page: the browser/chrome shim,
// the settings, and one JSON-RPC call to dld's `POST /rpc` (docs/protocol.md).
// The token is never logged, nor are cookies.
"use strict";

// Firefox has `browser.*`, whose calls return promises; Chromium has `chrome.*`, whose calls
// return promises in MV3 when given no callback. Everything here uses promises, never callbacks.
var api = globalThis.browser && globalThis.browser.runtime ? globalThis.browser : globalThis.chrome;

var DEFAULTS = {
  address: "http://127.0.0.1:6802",
  token: "",
  enabled: true,
  // "rules": files of at least minSizeMB, or whose name ends in one of `types`; "always": all.
  mode: "rules",
  minSizeMB: 10,
  types: "zip 7z rar tar gz xz zst iso img exe msi dmg deb rpm apk mp4 mkv webm avi mov mp3 flac pdf",
};

async function loadSettings() {
  const stored = await api.storage.local.get(Object.keys(DEFAULTS));
  return Object.assign({}, DEFAULTS, stored);
}

// "http://127.0.0.1:6802/" (as dld's http-url file says it) or with "/rpc": the base, no slash.
function baseAddress(address) {
  let base = String(address || "").trim();
  base = base.replace(/\/+$/, "").replace(/\/(rpc|ws|jsonrpc)$/, "");
  return base;
}

let nextId = 1;

// One call (or a batch: `method` an array of {method, params}). Resolves to the result (or the
// array of replies of a batch); rejects with an Error whose message says why dld did not answer
// OK: unreachable, HTTP status, or dld's JSON-RPC error.
async function dldCall(settings, method, params, timeoutMs = 8000) {
  const base = baseAddress(settings.address);
  if (!/^https?:\/\/[^/]+$/.test(base)) throw new Error("dld's address is not set (options page)");
  if (!settings.token) throw new Error("dld's token is not set (options page)");
  const body = Array.isArray(method)
    ? method.map((call) => ({ jsonrpc: "2.0", id: nextId++, method: call.method, params: call.params || {} }))
    : { jsonrpc: "2.0", id: nextId++, method, params: params || {} };
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), timeoutMs);
  let response;
  try {
    response = await fetch(base + "/rpc", {
      method: "POST",
      headers: { Authorization: "Bearer " + settings.token, "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: abort.signal,
      credentials: "omit",
      cache: "no-store",
    });
  } catch (error) {
    throw new Error("dld cannot be reached at " + base + (abort.signal.aborted ? " (no answer in time)" : ""));
  } finally {
    clearTimeout(timer);
  }
  if (response.status === 401) throw new Error("dld refused the token (401): check the options page");
  if (response.status === 403) throw new Error("dld refused this extension's origin (403): add it to http_origins");
  if (!response.ok) throw new Error("dld answered HTTP " + response.status);
  let reply;
  try {
    reply = await response.json();
  } catch (error) {
    throw new Error("dld's answer is not JSON");
  }
  if (Array.isArray(body)) return reply;
  if (reply && reply.error) {
    const code = reply.error.data && reply.error.data.code ? " (" + reply.error.data.code + ")" : "";
    throw new Error("dld refused: " + reply.error.message + code);
  }
  if (!reply || !("result" in reply)) throw new Error("dld's answer has no result");
  return reply.result;
}

function formatBytes(bytes) {
  if (bytes == null) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return (unit === 0 ? String(value) : value.toFixed(1)) + " " + units[unit];
}
