#!/usr/bin/python3
"""Drives dld's dashboard in a real browser (Debian's chromium, chromium-driver and Selenium).

    /usr/bin/python3 scripts/browser_test.py LOGIN_URL ORIGIN SCREENSHOT_DIR

LOGIN_URL is what `dlctl web` prints; ORIGIN serves the test origin's routes (`/bytes/N?rate=R`,
`/status/404`). Each step prints a line; the first that fails prints why and exits 1. Run by
the end-to-end test `DashboardTests`, against a real dld.
"""
import os
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
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


def row(driver, name):
    """The table row whose name cell is `name`, or None."""
    for tr in driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr"):
        if tr.find_element(By.CSS_SELECTOR, "td.name").text == name:
            return tr
    return None


def state_of(driver, name):
    tr = row(driver, name)
    return tr.find_element(By.CSS_SELECTOR, "td.state").text.split("\n")[0] if tr else None


def wait(driver, what, check, timeout=60):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: check(d))
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
    login, origin, shots = sys.argv[1], sys.argv[2].rstrip("/"), sys.argv[3]
    os.makedirs(shots, exist_ok=True)
    driver = browser()
    try:
        driver.get(login)
        wait(driver, "the page to load after login", lambda d: d.current_url.rstrip("/").endswith(login.split("/login")[0].split("//")[1]))
        wait(driver, "the summary from stats", lambda d: "jobs" in d.find_element(By.ID, "summary").text)
        print("ok: logged in with the token URL; the page shows the daemon's counts")

        add(driver, f"{origin}/bytes/3000000?rate=1500000")
        wait(driver, "the new job's row", lambda d: row(d, "3000000") is not None)
        wait(driver, "a progress bar moving from /ws events",
             lambda d: row(d, "3000000") is not None and 0 < float(
                 row(d, "3000000").find_element(By.TAG_NAME, "progress").get_attribute("value") or 0) < 1, timeout=30)
        wait(driver, "the job completed", lambda d: state_of(d, "3000000") == "completed")
        value = row(driver, "3000000").find_element(By.TAG_NAME, "progress").get_attribute("value")
        if float(value) != 1:
            raise SystemExit(f"FAILED: a completed job's bar is at {value}, not 100 %")
        print("ok: added a URL through the page; its progress bar moved and reached 100 %")

        add(driver, f"{origin}/bytes/4000000?rate=200000")
        wait(driver, "the slow job running", lambda d: state_of(d, "4000000") == "running")
        row(driver, "4000000").find_element(By.CSS_SELECTOR, "button[aria-label^='Pause job']").click()
        wait(driver, "the job paused from the page", lambda d: state_of(d, "4000000") == "paused")
        row(driver, "4000000").find_element(By.CSS_SELECTOR, "button[aria-label^='Resume job']").click()
        wait(driver, "the job resumed from the page", lambda d: state_of(d, "4000000") in ("queued", "running", "completed"))
        print("ok: paused and resumed a job from the page")

        add(driver, f"{origin}/status/404")
        wait(driver, "the failed job's reason", lambda d: row(d, "404") is not None and "http_status" in row(d, "404").text)
        print(f"ok: a failed job shows why: {row(driver, '404').find_element(By.CSS_SELECTOR, 'td.state').text!r}")

        for scheme in ("light", "dark"):
            driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": scheme}]})
            time.sleep(0.3)
            path = os.path.join(shots, f"dashboard-{scheme}.png")
            driver.save_screenshot(path)
            print(f"ok: screenshot {path}")

        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        if errors:
            raise SystemExit(f"FAILED: the browser's console has errors: {errors}")
        print("ok: no errors in the browser's console (the Content-Security-Policy let everything the page needs through)")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
