// The background of the extension: a service worker in Chromium, a background script in
// Firefox (manifest.json names both). It takes the browser's downloads that the settings say
// to take, and the link menu's "Download with dld", and enqueues them in dld. The browser's
// own download is cancelled only once dld has answered OK; when dld cannot be reached or
// refuses, the browser keeps its download (a link of the menu: starts one): nothing is lost.
"use strict";

if (typeof dldCall === "undefined" && typeof importScripts === "function") importScripts("common.js");

const MENU_ID = "dld-download-link";
const RECENT_JOBS = 20;

function basename(path) {
  const name = String(path || "")
    .split(/[\\/]/)
    .pop()
    .trim();
  return name === "." || name === ".." ? "" : name;
}

function sizeOf(item) {
  if (item.totalBytes > 0) return item.totalBytes;
  if (item.fileSize > 0) return item.fileSize;
  return -1;
}

// Whether this browser download goes to dld.
function wanted(settings, item, name) {
  if (!settings.enabled) return false;
  if (!/^https?:\/\//i.test(item.url || "")) return false; // blob:, data:, file: stay in the browser
  if (item.incognito) return false; // a private window's cookies never leave it
  if (item.byExtensionId && item.byExtensionId === api.runtime.id) return false; // our own fallback
  if (settings.mode === "always") return true;
  const size = sizeOf(item);
  const minimum = Number(settings.minSizeMB) * 1024 * 1024;
  if (size >= 0 && Number.isFinite(minimum) && size >= minimum) return true;
  const extension = (/\.([A-Za-z0-9]+)$/.exec(name) || [])[1];
  const types = String(settings.types || "")
    .toLowerCase()
    .split(/[\s,;]+/)
    .map((type) => type.replace(/^\./, ""))
    .filter(Boolean);
  return !!extension && types.includes(extension.toLowerCase());
}

// The request dld makes is the browser's: the URL, the referer, the user agent, and the
// cookies that the browser would send to that URL; no other site's.
async function enqueueInDld(settings, { url, finalUrl, name, referrer }) {
  const headers = { "User-Agent": navigator.userAgent };
  const cookies = await api.cookies.getAll({ url });
  if (cookies.length > 0) headers.Cookie = cookies.map((cookie) => cookie.name + "=" + cookie.value).join("; ");
  if (referrer && /^https?:\/\//i.test(referrer)) headers.Referer = referrer;
  const params = {
    url,
    headers,
    on_exists: "rename",
    meta: { from: "dld-extension", final_url: finalUrl || url, referrer: referrer || null },
  };
  if (name) params.name = name;
  const result = await dldCall(settings, "enqueue", params);
  if (!result || !result.job) throw new Error("dld's answer has no job");
  return result.job;
}

async function report(ok, name, message, job) {
  const stored = await api.storage.local.get(["recentJobs"]);
  const recent = Array.isArray(stored.recentJobs) ? stored.recentJobs : [];
  if (ok && job) {
    recent.unshift(job.id);
    recent.splice(RECENT_JOBS);
  }
  await api.storage.local.set({
    recentJobs: recent,
    lastResult: { ok, name: name || null, message, job: job ? job.id : null, at: new Date().toISOString() },
  });
  try {
    await api.action.setBadgeBackgroundColor({ color: ok ? "#1a7f37" : "#cf222e" });
    await api.action.setBadgeText({ text: ok ? "✓" : "!" });
    setTimeout(() => updateBadge(), 8000);
  } catch (error) {
    // a badge is only a hint
  }
  try {
    await api.notifications.create({
      type: "basic",
      iconUrl: api.runtime.getURL("icons/icon128.png"),
      title: ok ? "Sent to dld" : "dld did not take the download",
      message,
    });
  } catch (error) {
    // notifications may be off
  }
}

async function updateBadge() {
  const settings = await loadSettings();
  try {
    await api.action.setBadgeBackgroundColor({ color: "#57606a" });
    await api.action.setBadgeText({ text: settings.enabled ? "" : "off" });
  } catch (error) {
    // a badge is only a hint
  }
}

// Chromium: the download waits for its file name until we answer, so nothing is written
// under its name while dld is asked. dld OK: the browser's download is cancelled and erased.
// Else (or when cancelling fails) it goes on as if we had not been there.
async function takeFromChromium(item) {
  const name = basename(item.filename);
  const settings = await loadSettings();
  if (!wanted(settings, item, name)) return false;
  let job;
  try {
    job = await enqueueInDld(settings, { url: item.url, finalUrl: item.finalUrl, name, referrer: item.referrer });
  } catch (error) {
    await report(false, name, error.message + "; the browser keeps the download");
    return false;
  }
  try {
    await api.downloads.cancel(item.id);
  } catch (error) {
    await report(true, name, "dld job " + job.id + " (" + job.name + "); the browser could not stop its own copy", job);
    return false;
  }
  try {
    await api.downloads.erase({ id: item.id });
  } catch (error) {
    // only the history entry is left
  }
  await report(true, name, "dld job " + job.id + ": " + job.name, job);
  return true;
}

// Firefox has no onDeterminingFilename: the download goes on while dld is asked (pausing it
// and resuming it later lost it: a download that cannot resume would have to be started again,
// without the page's referer). dld OK: the browser's download is cancelled, its partial file
// removed and its entry erased; one that has already finished is kept (dld has a copy too).
async function takeFromFirefox(item) {
  const name = basename(item.filename);
  const settings = await loadSettings();
  if (!wanted(settings, item, name)) return;
  let job;
  try {
    job = await enqueueInDld(settings, { url: item.url, finalUrl: item.finalUrl, name, referrer: item.referrer });
  } catch (error) {
    await report(false, name, error.message + "; the browser keeps the download");
    return;
  }
  const [now] = await api.downloads.search({ id: item.id });
  if (now && now.state === "complete") {
    await report(true, name, "dld job " + job.id + " (" + job.name + "); the browser had already finished its own copy", job);
    return;
  }
  try {
    await api.downloads.cancel(item.id);
    try {
      await api.downloads.removeFile(item.id);
    } catch (error) {
      // no partial file
    }
    await api.downloads.erase({ id: item.id });
  } catch (error) {
    // the browser's copy stays too
  }
  await report(true, name, "dld job " + job.id + ": " + job.name, job);
}

// The link menu: dld, or the browser when dld does not take it.
async function sendLink(info, tab) {
  const url = info.linkUrl;
  if (!url) return;
  const settings = await loadSettings();
  if (!/^https?:\/\//i.test(url) || (tab && tab.incognito)) {
    await api.downloads.download({ url });
    return;
  }
  try {
    const job = await enqueueInDld(settings, { url, finalUrl: url, name: "", referrer: info.frameUrl || info.pageUrl });
    await report(true, job.name, "dld job " + job.id + ": " + job.name, job);
  } catch (error) {
    await report(false, basename(new URL(url).pathname), error.message + "; the browser downloads it");
    await api.downloads.download({ url });
  }
}

if (api.downloads.onDeterminingFilename) {
  api.downloads.onDeterminingFilename.addListener((item, suggest) => {
    takeFromChromium(item).then(
      (taken) => {
        if (!taken) suggest();
      },
      () => suggest()
    );
    return true; // suggest() is called later
  });
} else {
  api.downloads.onCreated.addListener((item) => {
    takeFromFirefox(item);
  });
}

async function createMenu() {
  await api.contextMenus.removeAll();
  api.contextMenus.create({ id: MENU_ID, title: "Download with dld", contexts: ["link"] });
}

api.runtime.onInstalled.addListener(async (details) => {
  createMenu();
  updateBadge();
  // Freshly installed and not connected yet: the options page says how.
  if (details.reason === "install" && !(await loadSettings()).token) api.runtime.openOptionsPage();
});
api.runtime.onStartup.addListener(() => updateBadge());
api.contextMenus.onClicked.addListener((info, tab) => {
  if (info.menuItemId === MENU_ID) sendLink(info, tab);
});
api.storage.onChanged.addListener((changes, area) => {
  if (area === "local" && "enabled" in changes) updateBadge();
});
