"""The `web` part of `make bench` (issue 29): the dashboard with a big queue. See
docs/benchmarks.md.

1. A fresh dld with BENCH_WEB_JOBS (100 000) paused jobs, enqueued over the socket in calls of
   10 000. The dashboard is opened in headless chromium (Selenium, Debian's /usr/bin/python3)
   through its login URL; the time to first render is from the request of the page to the
   first job row in its table (the page asks for one page of jobs and the counts, never for
   all the jobs). Best and median of BENCH_WEB_RUNS (3) loads.
2. The daemon's extra memory with the listener on: the same queue in two daemons, one with
   `--http-listen ""` (off) and one with the default, after the page was loaded from the
   second one; VmRSS of each. Targets: ≤ 1 s and ≤ 8 MiB.

Figures only; nothing is asserted. Imported by scripts/bench.py.
"""
import os, shutil, statistics, subprocess, tempfile, time

from benchlib import Daemon, proc_status_kib

JOBS = int(os.environ.get("BENCH_WEB_JOBS", "100000"))
RUNS = int(os.environ.get("BENCH_WEB_RUNS", "3"))
CHUNK = 10_000

# Run by Debian's python3, which has Selenium: the time from the request to the first row, in s.
FIRST_RENDER = r"""
import sys, time
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
    options.add_argument(flag)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
try:
    driver.get(sys.argv[1])  # logs in: the cookie is set, the page is loaded once
    for _ in range(int(sys.argv[2])):
        start = time.monotonic()
        driver.get(sys.argv[1].split("/login")[0] + "/")
        WebDriverWait(driver, 30, poll_frequency=0.005).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#jobs tbody tr"))
        print(f"{time.monotonic() - start:.3f}", flush=True)
finally:
    driver.quit()
"""


def fill(daemon, n):
    client = daemon.client(timeout=120)
    try:
        for start in range(0, n, CHUNK):
            jobs = [{"url": f"http://127.0.0.1:9/job/{i}", "paused": True} for i in range(start, min(n, start + CHUNK))]
            client.call("enqueue", {"jobs": jobs}, timeout=120)
    finally:
        client.close()


def login_url(daemon):
    with open(os.path.join(daemon.state, "http-url")) as f:
        url = f.read().strip()
    with open(os.path.join(daemon.state, "http-token")) as f:
        token = f.read().strip()
    return f"{url.rstrip('/')}/login?token={token}"


def part_web():
    if not os.path.exists("/usr/bin/chromedriver"):
        print("web: needs Debian's chromium, chromium-driver and python3-selenium (scripts/deps.sh installs them)")
        return
    print(f"web: the dashboard with {JOBS} jobs (paused), first render in headless chromium, and the listener's memory")
    work = tempfile.mkdtemp(prefix="dld-bench-web-")
    daemons = []
    times = []
    try:
        rss = {}
        for label, extra in (("listener off", ["--http-listen", ""]), ("listener on", [])):
            base = os.path.join(work, label.replace(" ", "-"))
            os.makedirs(base)
            daemon = Daemon(base, os.path.join(base, "state"), os.path.join(base, "dl"), extra=extra)
            daemon.start()
            daemons.append(daemon)
            fill(daemon, JOBS)
            if extra:
                rss[label] = proc_status_kib(daemon.proc.pid, "VmRSS") / 1024
                continue
            done = subprocess.run(["/usr/bin/python3", "-c", FIRST_RENDER, login_url(daemon), str(RUNS)],
                                  capture_output=True, text=True, timeout=300)
            times = [float(line) for line in done.stdout.split()]
            if done.returncode != 0 or not times:
                print(f"  the browser failed: {done.stderr.strip()[-2000:]}")
            else:
                print(f"  first render with {JOBS} jobs: best {min(times):.3f} s, median {statistics.median(times):.3f} s "
                      f"(runs {', '.join(f'{t:.3f}' for t in times)}; target ≤ 1 s)")
            rss[label] = proc_status_kib(daemon.proc.pid, "VmRSS") / 1024
        extra_mib = rss["listener on"] - rss["listener off"]
        print(f"  VmRSS with {JOBS} jobs: listener off {rss['listener off']:.1f} MiB, on (after the page) "
              f"{rss['listener on']:.1f} MiB: {extra_mib:+.1f} MiB (target ≤ 8 MiB)")
    finally:
        for daemon in daemons:
            daemon.terminate(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
