// The options page: dld's address and token, and which downloads go to dld.
"use strict";

const $ = (id) => document.getElementById(id);

function show(message, ok) {
  $("status").textContent = message;
  $("status").className = ok ? "ok" : "error";
}

async function fill() {
  const settings = await loadSettings();
  $("address").value = settings.address;
  $("token").value = settings.token;
  $("enabled").checked = !!settings.enabled;
  $("minSizeMB").value = settings.minSizeMB;
  $("types").value = settings.types;
  for (const radio of document.querySelectorAll("input[name=mode]")) radio.checked = radio.value === settings.mode;
  $("origin").textContent = location.origin;
}

function read() {
  const mode = document.querySelector("input[name=mode]:checked");
  return {
    address: baseAddress($("address").value),
    token: $("token").value.trim(),
    enabled: $("enabled").checked,
    mode: mode ? mode.value : "rules",
    minSizeMB: Math.max(0, Number($("minSizeMB").value) || 0),
    types: $("types").value.trim(),
  };
}

// Asks dld for its version with the settings as they are on the page.
async function check(settings) {
  try {
    const version = await dldCall(settings, "version");
    show("Saved. dld " + version.version + " answers at " + settings.address + ".", true);
    return true;
  } catch (error) {
    show("Saved, but: " + error.message, false);
    return false;
  }
}

$("form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const settings = read();
  await api.storage.local.set(settings);
  $("address").value = settings.address;
  await check(settings);
});

$("check").addEventListener("click", async () => {
  const settings = read();
  await api.storage.local.set(settings);
  await check(settings);
});

fill();
