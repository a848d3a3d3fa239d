#!/usr/bin/python3
"""Drives dld's dashboard in a real browser (Debian's chromium, chromium-driver and Selenium).

    /usr/bin/python3 scripts/browser_test.py LOGIN_URL ORIGIN SCREENSHOT_DIR DOWNLOAD_DIR

LOGIN_URL is what `dlctl web` prints; ORIGIN serves the test origin's routes (`/bytes/N?rate=R`,
`/status/404`). Each step prints a line; the first that fails prints why and exits 1. Run by
the end-to-end test `DashboardTests`, against a real dld.
"""
import os
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


# The table as the page shows it, read in one step: the page replaces its rows as events
# come, so elements found one by one may be gone by the next look.
ROWS = """
return [...document.querySelectorAll('#jobs tbody tr')].map(tr => ({
  id: tr.dataset.id, name: tr.querySelector('td.name').textContent,
  state: tr.querySelector('td.state').firstChild.textContent, text: tr.querySelector('td.state').textContent,
  progress: tr.querySelector('progress').hasAttribute('value') ? tr.querySelector('progress').value : null}));
"""


def row(driver, name):
    """The row whose name is `name`: {id, name, state, text, progress}, or None."""
    return next((r for r in driver.execute_script(ROWS) if r["name"] == name), None)


def state_of(driver, name):
    found = row(driver, name)
    return found["state"] if found else None


def press(driver, label):
    """Clicks the button of that label, found again if the page replaced it meanwhile."""
    for _ in range(50):
        try:
            driver.find_element(By.CSS_SELECTOR, f"button[aria-label='{label}']").click()
            return
        except StaleElementReferenceException:
            time.sleep(0.05)
    raise SystemExit(f"FAILED: the button {label!r} kept being replaced")


def wait(driver, what, check, timeout=60):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException]).until(
            lambda d: check(d))
    except TimeoutException:
        raise SystemExit(f"FAILED: {what} within {timeout} s; page says: {driver.find_element(By.TAG_NAME, 'body').text[:2000]}")


def add(driver, url, paused=False):
    box = driver.find_element(By.ID, "add-urls")
    box.clear()
    box.send_keys(url)
    checkbox = driver.find_element(By.ID, "add-paused")
    if checkbox.is_selected() != paused:
        checkbox.click()
    driver.find_element(By.CSS_SELECTOR, "#add-form button[type=submit]").click()


def main():
    login, origin, shots, downloads = sys.argv[1], sys.argv[2].rstrip("/"), sys.argv[3], sys.argv[4]
    os.makedirs(shots, exist_ok=True)
    driver = browser()
    try:
        driver.get(login)
        wait(driver, "the page to load after login", lambda d: d.current_url.rstrip("/").endswith(login.split("/login")[0].split("//")[1]))
        wait(driver, "the summary from stats", lambda d: "jobs" in d.find_element(By.ID, "summary").text)
        print("ok: logged in with the token URL; the page shows the daemon's counts")

        add(driver, f"{origin}/bytes/3000000?rate=1000000")
        wait(driver, "the new job running", lambda d: state_of(d, "3000000") == "running")
        first = row(driver, "3000000")["progress"] or 0
        # No state changes between running and completed: only /ws progress events move the bar.
        wait(driver, "the progress bar moving with /ws progress events while the job runs",
             lambda d: (r := row(d, "3000000")) is not None and r["state"] == "running" and (r["progress"] or 0) > first + 0.05,
             timeout=30)
        wait(driver, "the job completed", lambda d: state_of(d, "3000000") == "completed")
        value = row(driver, "3000000")["progress"]
        if value != 1:
            raise SystemExit(f"FAILED: a completed job's bar is at {value}, not 100 %")
        print("ok: added a URL through the page; its progress bar moved and reached 100 %")

        add(driver, f"{origin}/bytes/4000000?rate=200000")
        wait(driver, "the slow job running", lambda d: state_of(d, "4000000") == "running")
        slow = row(driver, "4000000")["id"]
        press(driver, f"Pause job {slow}")
        wait(driver, "the job paused from the page", lambda d: state_of(d, "4000000") == "paused")
        press(driver, f"Resume job {slow}")
        wait(driver, "the job resumed from the page", lambda d: state_of(d, "4000000") in ("queued", "running", "completed"))
        print("ok: paused and resumed a job from the page")

        add(driver, f"{origin}/status/404")
        wait(driver, "the failed job's reason", lambda d: row(d, "404") is not None and "http_status" in row(d, "404")["text"])
        print(f"ok: a failed job shows why: {row(driver, '404')['text']!r}")

        urls = driver.find_element(By.ID, "add-urls")
        urls.clear()
        urls.send_keys(f"{origin}/bytes/1000\n{origin}/bytes/2000")
        driver.find_element(By.ID, "add-dir").send_keys(os.path.join(downloads, "lesson-1"))
        driver.find_element(By.ID, "add-group").send_keys("lesson-1")
        driver.find_element(By.CSS_SELECTOR, "#add-form button[type=submit]").click()
        wait(driver, "the group added", lambda d: "2 files" in d.find_element(By.ID, "message").text)
        driver.find_element(By.ID, "group-filter").send_keys("lesson-1\n")
        wait(driver, "the group's line", lambda d: "completed, 2 of 2 files" in d.find_element(By.ID, "group-info").text)
        for field in ("add-dir", "add-group"):
            driver.find_element(By.ID, field).clear()
        print(f"ok: a group added through the page; its line says {driver.find_element(By.ID, 'group-info').text!r}")

        for scheme in ("light", "dark"):
            driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": scheme}]})
            time.sleep(0.3)
            path = os.path.join(shots, f"dashboard-{scheme}.png")
            driver.save_screenshot(path)
            print(f"ok: screenshot {path}")
        # Phone width: one column, each job a card.
        driver.set_window_size(390, 844)
        time.sleep(0.3)
        driver.execute_script("document.getElementById('jobs').scrollIntoView()")
        path = os.path.join(shots, "dashboard-phone.png")
        driver.save_screenshot(path)
        print(f"ok: screenshot {path}")
        # Nothing may be wider than the phone: the page must not scroll sideways.
        wide = driver.execute_script(
            "const w = document.documentElement.clientWidth;"
            "return [document.documentElement.scrollWidth, w, Array.from(document.querySelectorAll('body *'))"
            ".filter(e => e.getBoundingClientRect().right > w + 0.5 && !e.closest('.visually-hidden'))"
            ".slice(0, 5).map(e => e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))];")
        if wide[0] > wide[1]:
            raise SystemExit(f"FAILED: at phone width the page is {wide[0]} px wide in a {wide[1]} px window; too wide: {wide[2]}")
        print(f"ok: at phone width nothing is wider than the window ({wide[1]} px)")

        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        if errors:
            raise SystemExit(f"FAILED: the browser's console has errors: {errors}")
        print("ok: no errors in the browser's console (the Content-Security-Policy let everything the page needs through)")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
