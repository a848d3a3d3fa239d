#!/usr/bin/python3
"""Drives dld's browser extension (extension/) in a real browser: Debian's chromium, with the
extension loaded unpacked, through chromium-driver and Selenium.

    /usr/bin/python3 scripts/extension_test.py MODE EXTENSION ORIGIN OTHER ADDRESS TOKEN DOWNLOADS SHOTS

MODE `with-dld`: dld answers at ADDRESS; clicking the page's link must give an answer OK from
dld (a job), and the browser's own download cancelled and erased (nothing in DOWNLOADS, nothing
in the browser's list of downloads). Prints `job: ID` for the caller, who checks the job. Then,
with the popup's switch turned off, the same click must be the browser's own download.
MODE `without-dld`: nothing answers at ADDRESS; the browser must download the file itself into
DOWNLOADS. ORIGIN serves /page.html (sets the cookie and links to /files/report.bin), OTHER
another site (/other.html) that sets a cookie of its own, which must never reach dld. The
options page is filled as a user would; screenshots of it and of the popup go to SHOTS.
Each step prints a line; the first that fails prints why and exits 1. Run by the end-to-end
test `ExtensionTests`, against a real dld and nginx.
"""
import base64
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


def extension_id(folder):
    """Chromium's ID of an unpacked extension with a `key`: the SHA-256 of the key, its first
    32 hex digits written with a…p."""
    with open(os.path.join(folder, "manifest.json")) as file:
        key = json.load(file)["key"]
    digest = hashlib.sha256(base64.b64decode(key)).hexdigest()[:32]
    return "".join(chr(ord("a") + int(c, 16)) for c in digest)


def browser(extension, downloads, profile):
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900",
                 f"--user-data-dir={profile}", f"--load-extension={extension}", f"--disable-extensions-except={extension}"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {
        "download.default_directory": downloads,
        "download.prompt_for_download": False,
        "download.directory_upgrade": True,
        "safebrowsing.enabled": False,
    })
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def fail(message):
    raise SystemExit(f"FAILED: {message}")


def wait(driver, what, check, timeout=30):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: check(d))
    except TimeoutException:
        fail(f"{what} within {timeout} s")


def in_extension(driver, script):
    """Runs `script` (an async function body that returns a value) in the extension's options
    tab, which can call chrome.storage and chrome.downloads."""
    handle = driver.current_window_handle
    driver.switch_to.window(driver.extension_tab)
    try:
        return driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            f"(async () => {{ {script} }})().then(done, (e) => done({{error: String(e)}}));")
    finally:
        driver.switch_to.window(handle)


def files_in(folder):
    return sorted(os.listdir(folder))


def main():
    mode, extension, origin, other, address, token, downloads, shots = sys.argv[1:9]
    origin, other = origin.rstrip("/"), other.rstrip("/")
    os.makedirs(downloads, exist_ok=True)
    os.makedirs(shots, exist_ok=True)
    ident = extension_id(extension)
    profile = tempfile.mkdtemp(prefix="dld-ext-profile-")
    driver = browser(extension, downloads, profile)
    try:
        base = f"chrome-extension://{ident}"
        driver.get(base + "/options.html")
        wait(driver, "the options page", lambda d: d.title == "dld: options" and d.find_element(By.ID, "origin").text)
        shown = driver.find_element(By.ID, "origin").text
        if shown != base:
            fail(f"the options page shows the origin {shown!r}, not {base!r}")
        driver.extension_tab = driver.current_window_handle
        print(f"ok: the extension is loaded as {ident}; its options page shows its origin")

        for field, value in (("address", address), ("token", token)):
            box = driver.find_element(By.ID, field)
            box.clear()
            box.send_keys(value)
        # The default mode, by size or type: the file is far below the size, but of a listed type.
        driver.find_element(By.CSS_SELECTOR, "input[name=mode][value=rules]").click()
        for field, value in (("minSizeMB", "1000"), ("types", "iso, .bin")):
            box = driver.find_element(By.ID, field)
            box.clear()
            box.send_keys(value)
        if not driver.find_element(By.ID, "enabled").is_selected():
            driver.find_element(By.ID, "enabled").click()
        driver.find_element(By.ID, "save").click()
        status = lambda d: d.find_element(By.ID, "status").text
        if mode == "with-dld":
            wait(driver, "the options page saying dld answers", lambda d: "answers at" in status(d))
            print(f"ok: options saved; the page says {status(driver)!r}")
            driver.save_screenshot(os.path.join(shots, "options.png"))
            print(f"ok: screenshot {shots}/options.png")
        else:
            wait(driver, "the options page saying dld cannot be reached", lambda d: "cannot be reached" in status(d))
            print(f"ok: options saved; the page says {status(driver)!r}")
        stored = in_extension(driver, "return await chrome.storage.local.get(null);")
        if stored.get("token") != token or stored.get("mode") != "rules" or stored.get("minSizeMB") != 1000:
            fail(f"the options were not stored: mode {stored.get('mode')!r}, size {stored.get('minSizeMB')!r}")

        # Another site sets a cookie: it must never reach dld (nginx refuses a request with it).
        driver.switch_to.new_window("tab")
        driver.get(other + "/other.html")
        wait(driver, "the other site's cookie", lambda d: "other=leak" in d.execute_script("return document.cookie"))
        driver.get(origin + "/page.html")
        wait(driver, "the page's link", lambda d: d.find_elements(By.ID, "file"))
        before = in_extension(driver, "return (await chrome.storage.local.get('lastResult')).lastResult || null;")
        driver.find_element(By.ID, "file").click()
        print("ok: clicked the link to /files/report.bin on the page that set the cookie")
        result = wait(driver, "the extension's answer to the download", lambda d: (
            r := in_extension(d, "return (await chrome.storage.local.get('lastResult')).lastResult || null;")) != before and r)
        print(f"ok: the extension says: ok={result['ok']} {result['message']!r}")
        badge = "\u2713" if mode == "with-dld" else "!"
        wait(driver, f"the badge saying {badge}", lambda d: in_extension(d, "return await chrome.action.getBadgeText({});") == badge,
             timeout=5)
        print(f"ok: the toolbar badge says {badge}")

        if mode == "with-dld":
            if not result["ok"] or not result.get("job"):
                fail(f"dld did not take the download: {result}")
            print(f"job: {result['job']}")
            # The browser's download: cancelled and erased, and no file of its own left.
            time.sleep(1.5)
            items = in_extension(driver, "return (await chrome.downloads.search({})).map(i => [i.url, i.state, i.filename]);")
            if items:
                fail(f"the browser's list of downloads still has {items}")
            if files_in(downloads):
                fail(f"the browser's download folder has {files_in(downloads)}")
            print("ok: the browser's own download was cancelled and erased; its folder is empty")

            driver.set_window_size(420, 640)
            driver.get(base + "/popup.html")
            wait(driver, "the popup listing the job completed", lambda d: d.execute_script(
                "const r = document.querySelector(`#jobs li[data-id='" + str(result["job"]) + "']`);"
                "return r && r.classList.contains('completed') && r.querySelector('progress').value === 1;"), timeout=60)
            print(f"ok: the popup lists the job, completed: {driver.find_element(By.ID, 'jobs').text!r}")
            driver.save_screenshot(os.path.join(shots, "popup.png"))
            print(f"ok: screenshot {shots}/popup.png")
            # Live from /ws (the token as its subprotocol): the popup asks for nothing while its
            # socket is open, so a job enqueued elsewhere shows only if its job.state came.
            wait(driver, "the popup live on dld's /ws", lambda d: d.execute_script("return document.body.dataset.live;") == "ws",
                 timeout=20)
            added = driver.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "loadSettings().then((s) => dldCall(s, 'enqueue', {url: 'http://127.0.0.1:9/popup-live.bin', paused: true}))"
                ".then((r) => done(r.job.id), (e) => done('error: ' + e));")
            if not isinstance(added, int):
                fail(f"enqueue from the popup's page: {added}")
            wait(driver, "the popup listing the job enqueued elsewhere", lambda d: d.execute_script(
                f"return !!document.querySelector(`#jobs li[data-id='{added}']`);"), timeout=20)
            print("ok: the popup is live on /ws: a job enqueued elsewhere appeared with no poll")
            removed = driver.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                f"loadSettings().then((s) => dldCall(s, 'remove', {{id: {added}}})).then((r) => done(r.count), (e) => done('error: ' + e));")
            if removed != 1:
                fail(f"remove of the popup's job: {removed}")

            # The popup's switch off: the same click is the browser's own download.
            driver.find_element(By.ID, "enabled").click()
            wait(driver, "the switch stored off", lambda d: in_extension(
                d, "return (await chrome.storage.local.get('enabled')).enabled;") is False)
            driver.set_window_size(1280, 900)
            driver.get(origin + "/page.html")
            wait(driver, "the page's link", lambda d: d.find_elements(By.ID, "file"))
            driver.find_element(By.ID, "file").click()
            wait(driver, "the browser's own download with the switch off", lambda d: files_in(downloads) == ["report.bin"])
            again = in_extension(driver, "return (await chrome.storage.local.get('lastResult')).lastResult || null;")
            if again != result:
                fail(f"with the switch off the extension still answered: {again}")
            print("ok: with the popup's switch off, the browser downloaded the file itself")
        else:
            if result["ok"]:
                fail(f"the extension says dld took it, with dld stopped: {result}")
            wait(driver, "the browser's own download of report.bin", lambda d: files_in(downloads) == ["report.bin"], timeout=30)
            items = in_extension(driver, "return (await chrome.downloads.search({})).map(i => i.state);")
            if items != ["complete"]:
                fail(f"the browser's downloads: {items}")
            print(f"ok: with dld stopped the browser downloaded the file itself: {files_in(downloads)}")
            driver.set_window_size(420, 640)
            driver.get(base + "/popup.html")
            wait(driver, "the popup saying dld cannot be reached", lambda d: "cannot be reached" in d.find_element(By.ID, "message").text)
            driver.save_screenshot(os.path.join(shots, "popup-unreachable.png"))
            print(f"ok: screenshot {shots}/popup-unreachable.png")

        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"
                  and "/files/report.bin" not in entry["message"] and "favicon" not in entry["message"]]
        if mode == "with-dld" and errors:
            fail(f"console errors: {errors}")
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
