#!/usr/bin/python3
"""Drives webui-aria2 (Tests/Fixtures/webui-aria2, unchanged) against dld in a real browser:
Debian's chromium, chromium-driver and Selenium, as a user of aria2 would.

    /usr/bin/python3 scripts/aria2_webui_test.py PAGE ARIA2_PORT SECRET ORIGIN SOCKET SHOTS

PAGE is the front-end's index.html, served from another port than dld's; ARIA2_PORT is dld's
`aria2_listen` port and SECRET its `aria2_secret`, typed into the page's Settings > Connection
Settings; ORIGIN serves the test origin's `/bytes/N?rate=R`. SOCKET is dld's own socket: after
each step the script asks dld itself (`status`, `list`) whether the page's click did what the
page shows. Screenshots go to SHOTS. Each step prints a line; the first that fails prints why
and exits 1. Prints `finished: GID` for the download that finished (its file is compared with
the origin's bytes by the caller). Run by the end-to-end test `Aria2WebUITests`.
"""
import json
import os
import socket
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import (ElementClickInterceptedException, ElementNotInteractableException,
                                        NoAlertPresentException, StaleElementReferenceException, TimeoutException)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def fail(message):
    raise SystemExit(f"FAILED: {message}")


class Dld:
    """dld's own protocol on its socket: one JSON-RPC line, one reply line."""

    def __init__(self, path):
        self.path = path
        self.next = 0

    def call(self, method, params=None):
        self.next += 1
        request = {"jsonrpc": "2.0", "id": self.next, "method": method, "params": params or {}}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(10)
            connection.connect(self.path)
            connection.sendall((json.dumps(request) + "\n").encode())
            data = b""
            while not data.endswith(b"\n"):
                chunk = connection.recv(65536)
                if not chunk:
                    break
                data += chunk
        return json.loads(data)

    def state(self, gid):
        """dld's state of the job whose aria2 GID is `gid` (16 hex digits), or its error code."""
        reply = self.call("status", {"id": int(gid, 16)})
        if "error" in reply:
            return reply["error"].get("data", {}).get("code", "error")
        return reply["result"]["state"]

    def ids(self):
        return sorted(job["id"] for job in self.call("list", {"limit": 100})["result"]["jobs"])


# The downloads as the page shows them, read in one step (Angular replaces rows as it
# updates). `progress`: the bar's width in %, `status`: the page's status label.
ROWS = """
return [...document.querySelectorAll('div.download[data-gid]')].map(d => ({
  gid: d.dataset.gid, name: d.querySelector('.title').textContent.trim(),
  status: (d.querySelector("span[title='Download status']") || {textContent: ''}).textContent.trim(),
  progress: parseFloat((d.querySelector('.progress-bar') || {style: {width: ''}}).style.width) || 0}));
"""


def rows(driver):
    return driver.execute_script(ROWS)


def row(driver, name):
    return next((r for r in rows(driver) if r["name"] == name), None)


def status_of(driver, name):
    found = row(driver, name)
    return found["status"] if found else None


def wait(driver, what, check, timeout=30):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1,
                             ignored_exceptions=[StaleElementReferenceException]).until(lambda d: check(d))
    except TimeoutException:
        fail(f"{what} within {timeout} s; the page says: {driver.find_element(By.TAG_NAME, 'body').text[:1500]!r}; "
             f"rows: {rows(driver)}")


def click(driver, css, within=None):
    """Clicks the element `css` (in the download row of name `within`), found again if the
    page replaced it meanwhile."""
    for _ in range(100):
        try:
            scope = driver
            if within is not None:
                scope = next(d for d in driver.find_elements(By.CSS_SELECTOR, "div.download[data-gid]")
                             if d.find_element(By.CSS_SELECTOR, ".title").text.strip() == within)
            scope.find_element(By.CSS_SELECTOR, css).click()
            return
        except (StaleElementReferenceException, ElementClickInterceptedException, ElementNotInteractableException,
                StopIteration):
            time.sleep(0.1)
    fail(f"could not click {css!r}" + (f" in the row of {within}" if within else ""))


def fill(driver, css, value):
    """Types `value` into the field `css`, once it takes input (a dialog fades in first)."""
    for _ in range(100):
        try:
            field = driver.find_element(By.CSS_SELECTOR, css)
            field.clear()
            field.send_keys(value)
            return
        except (StaleElementReferenceException, ElementNotInteractableException):
            time.sleep(0.1)
    fail(f"could not type into {css!r}")


def menu(driver, title, item):
    """Opens the navigation bar's menu `title` and clicks its entry `item` (an ng-click)."""
    for toggle in driver.find_elements(By.CSS_SELECTOR, ".main-navbar a.dropdown-toggle"):
        if toggle.text.strip() == title:
            toggle.click()
            click(driver, f"a[ng-click=\"{item}\"]")
            return
    fail(f"no menu {title!r} in the navigation bar")


def accept_confirm(driver):
    """The page asks `confirm()` before removing a download: answer OK."""
    alert = wait(driver, "the page's confirm() before removing", lambda d: switch_to_alert(d), timeout=10)
    text = alert.text
    alert.accept()
    return text


def switch_to_alert(driver):
    try:
        return driver.switch_to.alert
    except NoAlertPresentException:
        return False


WATCH_ALERTS = """
window.raised = [];
new MutationObserver(changes => changes.forEach(change => change.addedNodes.forEach(node => {
  if (node.nodeType === 1 && node.classList.contains('alert')) {
    window.raised.push({kind: node.className, text: node.textContent.trim()});
  }
}))).observe(document.querySelector('.alerts'), {childList: true});
"""


def raised_errors(driver):
    """The alerts raised since WATCH_ALERTS that are errors or say the connection failed."""
    return [a["text"] for a in driver.execute_script("return window.raised")
            if "alert-danger" in a["kind"] or "Authentication failed" in a["text"] or "Could not connect" in a["text"]]


def websockets(driver, url):
    """The WebSockets the page opened to `url`, from the browser's network log: the status
    of each handshake's answer (101: upgraded), in order."""
    created, status = [], {}
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message.get("method") == "Network.webSocketCreated" and params.get("url") == url:
            created.append(params["requestId"])
        elif message.get("method") == "Network.webSocketHandshakeResponseReceived":
            status[params["requestId"]] = params["response"]["status"]
    return [status.get(request) for request in created]


def alerts(driver):
    return [a.text for a in driver.find_elements(By.CSS_SELECTOR, ".alerts .alert")]


def shot(driver, shots, name):
    path = os.path.join(shots, f"{name}.png")
    driver.save_screenshot(path)
    print(f"ok: screenshot {path}")


def main():
    page, port, secret, origin, socket_path, shots = sys.argv[1:7]
    origin = origin.rstrip("/")
    os.makedirs(shots, exist_ok=True)
    dld = Dld(socket_path)
    driver = browser()
    try:
        driver.get(page)
        wait(driver, "webui-aria2 to load", lambda d: d.execute_script("return !!window.angular"))

        # Settings > Connection Settings, filled as for aria2: host, port, secret token.
        menu(driver, "Settings", "changeCSettings()")
        wait(driver, "the Connection Settings dialog", lambda d: d.find_elements(By.CSS_SELECTOR, ".modal input[ng-model='connection.conf.host']"))
        for model, value in (("host", "127.0.0.1"), ("port", port), ("path", "/jsonrpc"), ("auth.token", secret)):
            fill(driver, f".modal input[ng-model='connection.conf.{model}']", value)
        shot(driver, shots, "1-connection-settings")
        click(driver, ".modal-footer .btn-primary")
        wait(driver, "the page to say it connected with the secret",
             lambda d: any("Successfully connected to Aria2 through its remote RPC" in a for a in alerts(d)))
        # While the dialog is typed in, webui-aria2 already polls the host and port being typed
        # with the token it had before (none): one "Authentication failed" may come then, as
        # with aria2. From here on every alert the page raises is recorded, and none may be an
        # error (a refused call, a failed connection, an error a call answered).
        driver.execute_script(WATCH_ALERTS)
        print(f"ok: connected through Settings > Connection Settings (127.0.0.1:{port}, /jsonrpc, secret)")
        # Before it was configured the page tried aria2's default port and its own: those
        # failures are expected. From here on the console must stay clean.
        driver.get_log("browser")

        # Add > By URIs: three downloads, one a line, as the dialog says.
        # The big one takes 10 s in one stream; the slow one (8 MB, fetched in up to 4 ranges
        # at 50 kB/s each) is still active when it is removed.
        big, slow, small = "2000000", "8000000", "150000"
        urls = [f"{origin}/bytes/{big}?rate=200000", f"{origin}/bytes/{slow}?rate=50000", f"{origin}/bytes/{small}"]
        menu(driver, "Add", "addUris()")
        fill(driver, ".modal textarea[ng-model='getUris.uris']", "\n".join(urls))
        click(driver, ".modal-footer .btn-primary")
        wait(driver, "the three downloads listed", lambda d: all(row(d, name) for name in (big, slow, small)))
        gids = {name: row(driver, name)["gid"] for name in (big, slow, small)}
        print(f"ok: added three URIs through the page; listed as {gids}")
        for name, gid in gids.items():
            if len(gid) != 16:
                fail(f"{name}'s GID {gid!r} is not 16 hex digits")

        wait(driver, "the big download active", lambda d: status_of(d, big) == "Active")
        first = row(driver, big)["progress"]
        wait(driver, "the big download's bar moving while it is active",
             lambda d: (r := row(d, big)) is not None and r["status"] == "Active" and r["progress"] > first + 5)
        if dld.state(gids[big]) != "running":
            fail(f"the page shows {big} active, dld says {dld.state(gids[big])}")
        print(f"ok: the big download is active and its bar moves ({first:.0f} % → {row(driver, big)['progress']:.0f} %); dld says running")
        # A click on the row opens its details (tellStatus's fields as the page shows them).
        click(driver, ".title", within=big)
        details = wait(driver, "the big download's details", lambda d: d.execute_script(
            "const r = [...document.querySelectorAll('div.download[data-gid]')].find(d => d.dataset.gid === arguments[0]);"
            "const g = r && r.querySelector('.download-gid'), f = r && r.querySelector('.download-files');"
            "return g && g.offsetParent && f ? {gid: g.textContent.trim(), files: f.textContent.trim()} : null;", gids[big]))
        if details["gid"] != gids[big] or not details["files"].startswith(big + " ("):
            fail(f"the details of {big} say {details}")
        print(f"ok: its details show its GID and its file {details['files']!r}")
        shot(driver, shots, "2-active")

        click(driver, "button[ng-click='pause(download)']", within=big)
        wait(driver, "the big download paused from the page", lambda d: status_of(d, big) == "Paused")
        if dld.state(gids[big]) != "paused":
            fail(f"the page shows {big} paused, dld says {dld.state(gids[big])}")
        paused_at = row(driver, big)["progress"]
        print(f"ok: paused from the page at {paused_at:.0f} %; dld says paused")
        shot(driver, shots, "3-paused")
        time.sleep(1.5)
        if (r := row(driver, big))["status"] != "Paused" or r["progress"] != paused_at:
            fail(f"a paused download moved: {r}")

        click(driver, "button[ng-click='resume(download)']", within=big)
        wait(driver, "the big download resumed from the page", lambda d: status_of(d, big) in ("Active", "Waiting", "Complete"))
        if dld.state(gids[big]) not in ("running", "queued", "completed"):
            fail(f"the page resumed {big}, dld says {dld.state(gids[big])}")
        print("ok: resumed from the page; dld says it runs again")

        wait(driver, "the small download complete", lambda d: status_of(d, small) == "Complete")
        wait(driver, "the big download complete", lambda d: status_of(d, big) == "Complete", timeout=40)
        if (r := row(driver, big))["progress"] != 100:
            fail(f"a complete download's bar is at {r['progress']} %")
        for name in (big, small):
            if dld.state(gids[name]) != "completed":
                fail(f"the page shows {name} complete, dld says {dld.state(gids[name])}")
        print(f"finished: {gids[big]}")
        print("ok: both finished downloads show Complete at 100 %; dld says completed")

        # Remove the active one: aria2's `remove`, dld's `cancel`; it stays as Removed.
        if status_of(driver, slow) != "Active":
            fail(f"the slow download is {status_of(driver, slow)!r}, not Active")
        click(driver, "button[ng-click='remove(download)']", within=slow)
        asked = accept_confirm(driver)
        wait(driver, "the removed download listed as Removed", lambda d: status_of(d, slow) == "Removed")
        if dld.state(gids[slow]) != "canceled":
            fail(f"the page shows {slow} removed, dld says {dld.state(gids[slow])}")
        print(f"ok: removed the active download after the page asked {asked!r}; it shows Removed, dld says canceled")

        # Restart a finished one: the page reads its options (getOption) and URIs (getFiles),
        # removes its result and adds its URI again with those options; its file is there, so
        # it is added under a free name (aria2's auto-file-renaming), not refused.
        again = f"{small} (2)"
        click(driver, "button[ng-click='restart(download)']", within=small)
        wait(driver, "the restarted download listed under a free name", lambda d: row(d, again) is not None)
        wait(driver, "the restarted download complete", lambda d: status_of(d, again) == "Complete")
        wait(driver, "the restarted download's old result gone", lambda d: row(d, small) is None)
        restarted = row(driver, again)["gid"]
        if dld.state(gids[small]) != "job_not_found" or dld.state(restarted) != "completed":
            fail(f"restarted: dld says {dld.state(gids[small])} for the old GID, {dld.state(restarted)} for the new")
        print(f"ok: restarted a finished download from the page; it finished again as {again!r}; dld agrees")
        print(f"restarted: {restarted}")

        # Remove a finished one: aria2's `removeDownloadResult`, dld's `remove`.
        click(driver, "button[ng-click='remove(download)']", within=again)
        accept_confirm(driver)
        wait(driver, "the removed result gone from the page", lambda d: row(d, again) is None)
        time.sleep(1.5)  # two refreshes: the page's list comes from dld again
        if row(driver, again) is not None or dld.state(restarted) != "job_not_found":
            fail(f"the removed result: page {row(driver, again)}, dld {dld.state(restarted)}")
        print("ok: removed a finished download's result; gone from the page and from dld")
        shot(driver, shots, "4-finished")

        # Manage > Purge Completed: aria2's `purgeDownloadResult`.
        menu(driver, "Manage", "purgeDownloadResult()")
        wait(driver, "the page empty after Purge Completed", lambda d: not rows(d))
        wait(driver, "the page's empty message", lambda d: "Currently no download in line to display" in d.find_element(By.TAG_NAME, "body").text)
        time.sleep(1.5)
        if rows(driver):
            fail(f"purged downloads came back: {rows(driver)}")
        left = dld.ids()
        if left:
            fail(f"after Purge Completed dld still lists {left}")
        print("ok: Purge Completed emptied the page and dld's list")
        shot(driver, shots, "5-purged")

        # webui-aria2 talks to aria2 over a WebSocket of /jsonrpc when it can (else POST).
        upgrades = websockets(driver, f"ws://127.0.0.1:{port}/jsonrpc")
        if 101 not in upgrades:
            fail(f"the page did not talk to dld over a WebSocket of /jsonrpc: handshakes {upgrades}")
        print(f"ok: the page talked to dld over a WebSocket of /jsonrpc (handshakes answered {upgrades})")
        if raised := raised_errors(driver):
            fail(f"the page raised errors after it connected: {raised}")
        print("ok: the page raised no error alert after it connected (no call refused, none answered with an error)")
        errors = [e["message"] for e in driver.get_log("browser")
                  if e["level"] == "SEVERE" and "fonts.googleapis.com" not in e["message"] and "favicon.ico" not in e["message"]]
        if errors:
            fail(f"the browser's console has errors since the page connected: {errors}")
        print("ok: no errors in the browser's console since the page connected (the Google font and the favicon "
              "it links are not vendored)")
    except SystemExit:
        # What the page showed when a step failed.
        driver.save_screenshot(os.path.join(shots, "failed.png"))
        raise
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
