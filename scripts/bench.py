#!/usr/bin/env python3
"""dld benchmarks: figures, never assertions (see docs/benchmarks.md).

Parts, selected by name on the command line (`scripts/bench.sh small scale`; all by default):

idle        How often an idle dld wakes up: context switches of each of its threads over 30 s,
            with an empty queue and again after one download; target <= 1/s in all. See
            bench_idle.py.
throughput  One file from a loopback origin (nginx when installed, else dld-origin), with
            `curl -o` and with dld; wall times, their ratio, and dld's peak RSS (VmHWM).
crash       The same size from dld-origin throttled to BENCH_CRASH_RATE bytes/s (default
            100 MB/s, so that the download lasts long enough to be killed), with dld SIGKILLed
            every BENCH_KILL_EVERY seconds (default 2) and restarted until the job completes;
            the number of kills, bytes fetched over the file size, and the time against an
            uninterrupted run.
small       --files N (default 2000) files of 16 KiB: dld per job, dld as one group, aria2c
            -j16, curl --parallel, wget (the tools that are installed); see bench_many.py.
scale       --jobs N (default 100000) jobs in one daemon: enqueue, list, status latency,
            start-up, resume/pause/cancel all, SIGTERM, RSS; see bench_many.py.
speed       A BENCH_SPEED_SECONDS (default 30) download from nginx (else dld-origin) with dld's
            max_speed = BENCH_SPEED_LIMIT bytes/s (default 10000000): the rate achieved over the
            whole run and over every 10 s window, against the limit; curl --limit-rate and
            aria2c --max-download-limit (when installed) side by side; dld's peak RSS.
postgres    the scale steps (--jobs N) with the job table in SQLite and in PostgreSQL, side by
            side (a PostgreSQL server is started on a Unix socket; skipped if not installed).
kill        The kill cycle (issue 9): BENCH_KILL_MIB (default 64) MiB from dld-origin at
            BENCH_KILL_RATE (default 8000000) bytes/s per connection, dld SIGKILLed
            BENCH_KILL_AFTER (default 0.9) s after each of BENCH_KILL_CYCLES (10) starts, then
            run to completion: the bytes the origin served over the file size (target ≤ 1.2×)
            and the file's SHA-256 against the origin's bytes; once as one stream (`segments:
            1`), once with the default segments.
segments    Segmented downloads. BENCH_SEG_MIB (default 200) MiB from nginx with `limit_rate
            40m` (each connection throttled to 40 MB/s): dld with its defaults, dld with
            segments=1, `aria2c -x4 -s4` and `curl -o`, side by side with ratios; then
            BENCH_SIZE_MIB (1024) MiB unthrottled: dld with its defaults against `curl -o`, with
            dld's peak RSS. Needs nginx (the test origin's throttle is per response too, but
            nginx is what the figures are compared on).
wire        Bytes on the wire: the bytes dld-origin served for one download (default segments)
            over the file's size, for 5 MiB, 64 MiB and 1 GiB (BENCH_WIRE_MIB, comma-separated,
            changes the sizes), then 5 and 64 MiB whose first answer is a 503 or a 429 with
            Retry-After (the download waits and starts again). Figures, not asserted; the
            end-to-end tests (WireBytesTests) hold them to 1.05 × and 1.1 ×.

Run through `make bench`, which builds release binaries first. BENCH_SIZE_MIB (default 1024)
and BENCH_RUNS (default 3, the best run of each is reported) change the work of the first two;
BENCH_STEP_TIMEOUT (default 400 s) bounds every step of the last two.
wan         Over a link with round trips (a relay that delays every byte 20 ms each way):
            many small files over https (HTTP/2) and plain http, and one 200 MiB file; dld
            with its defaults beside curl --parallel and aria2c; see bench_wan.py.
cpu         Wall time beside CPU time: 1 GiB from nginx by curl -o and dld (one stream and
            defaults), with each tool's CPU and the machine's, and SHA-256's cost per GiB;
            2000 x 16 KiB into a fresh ext4, dld's CPU per file (and, with perf as root, its
            SQLite steps, task switches, tasks and context switches per file); see bench_cpu.py.
web         The dashboard with 100 000 jobs: time to first render in headless chromium, and
            the daemon's extra memory with the HTTP listener on; see bench_web.py.
"""
import argparse, json, os, shutil, signal, subprocess, sys, tempfile, time

# The helpers live beside this script; no __pycache__ is left in the source tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import BIN, Client, peak_rss_kib, start_nginx, write_file  # noqa: E402
import bench_cpu  # noqa: E402
import bench_fleet  # noqa: E402
import bench_idle  # noqa: E402
import bench_many  # noqa: E402
import bench_wan  # noqa: E402
import bench_web  # noqa: E402

SIZE = int(os.environ.get("BENCH_SIZE_MIB", "1024")) << 20
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
CRASH_RATE = int(os.environ.get("BENCH_CRASH_RATE", "100000000"))
KILL_EVERY = float(os.environ.get("BENCH_KILL_EVERY", "2"))
SPEED_LIMIT = int(os.environ.get("BENCH_SPEED_LIMIT", "10000000"))
SPEED_SECONDS = float(os.environ.get("BENCH_SPEED_SECONDS", "30"))
SEG_SIZE = int(os.environ.get("BENCH_SEG_MIB", "200")) << 20
KILL_SIZE = int(os.environ.get("BENCH_KILL_MIB", "64")) << 20
KILL_RATE = int(os.environ.get("BENCH_KILL_RATE", "8000000"))
KILL_AFTER = float(os.environ.get("BENCH_KILL_AFTER", "0.9"))
KILL_CYCLES = int(os.environ.get("BENCH_KILL_CYCLES", "10"))
WIRE_SIZES = [int(m) << 20 for m in os.environ.get("BENCH_WIRE_MIB", "5,64,1024").split(",") if m.strip()]
PARTS = ("idle", "throughput", "crash", "speed", "small", "scale", "postgres", "fleet", "segments", "kill", "wire", "wan", "cpu", "web")


def wait_for_socket(path, proc, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("dld exited at start")
        try:
            return Client(path)
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("dld did not start")


def start_origin(work, size=None):
    """nginx serving a file when nginx is installed, else the test origin streaming one."""
    size = size or SIZE
    if shutil.which("nginx"):
        docroot = os.path.join(work, "www")
        os.makedirs(docroot)
        write_file(os.path.join(docroot, "file.bin"), size)
        proc, base = start_nginx(work, docroot)
        return proc, f"{base}/file.bin", "nginx"
    proc = subprocess.Popen([os.path.join(BIN, "dld-origin")], stdout=subprocess.PIPE, text=True)
    base = proc.stdout.readline().strip()
    return proc, f"{base}/bytes/{size}", "dld-origin"


def run_curl(url, out):
    start = time.monotonic()
    subprocess.run(["curl", "-s", "-o", out, url], check=True)
    return time.monotonic() - start


def start_dld(work, state):
    dl = os.path.join(work, "dl")
    os.makedirs(dl, exist_ok=True)
    sock = os.path.join(work, "s.sock")
    env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(work, "cfg"))
    proc = subprocess.Popen([os.path.join(BIN, "dld"), "--socket", sock, "--state-dir", state, "--download-dir", dl,
                             "--log-level", "error"], env=env)
    return proc, wait_for_socket(sock, proc), dl


FINISHED = ("completed", "failed", "canceled")


def kill_and_restart(daemon, work, state):
    """SIGKILL, then a new dld on the same state: (process, client, download folder)."""
    daemon.kill()
    daemon.wait()
    return start_dld(work, state)


def origin_served(base):
    import urllib.request
    with urllib.request.urlopen(base + "/_stats") as response:
        return json.loads(response.read())["bytes_served"]


def crash_cycle(work):
    proc = subprocess.Popen([os.path.join(BIN, "dld-origin")], stdout=subprocess.PIPE, text=True)
    base = proc.stdout.readline().strip()
    url = f"{base}/bytes/{SIZE}?rate={CRASH_RATE}"
    try:
        plain, _, path = run_dld(work, url, "plain.bin")
        os.unlink(path)
        before = origin_served(base)
        state = os.path.join(work, "state-crash")
        daemon, client, dl = start_dld(work, state)
        start = time.monotonic()
        job = client.call("enqueue", {"url": url, "name": "crash.bin"})["job"]
        kills = 0
        while True:
            born = time.monotonic()
            while time.monotonic() - born < KILL_EVERY:
                job = client.call("status", {"id": job["id"]})
                if job["state"] in ("completed", "failed", "canceled"):
                    break
                time.sleep(0.01)
            if job["state"] in FINISHED:
                break
            kills += 1
            daemon, client, dl = kill_and_restart(daemon, work, state)
        elapsed = time.monotonic() - start
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        if job["state"] != "completed":
            sys.exit(f"bench: crash-cycle download {job['state']}: {job['error']}")
        if os.path.getsize(os.path.join(dl, "crash.bin")) != SIZE:
            sys.exit("bench: crash-cycle file has the wrong size")
        fetched = origin_served(base) - before
        print(f"crash cycle: {SIZE >> 20} MiB at {CRASH_RATE / 1e6:.0f} MB/s, SIGKILL every {KILL_EVERY:g} s until done")
        print(f"  kills            {kills}")
        print(f"  fetched / size   {fetched / SIZE:.3f}")
        print(f"  time             {elapsed:.2f} s vs {plain:.2f} s uninterrupted ({elapsed / plain:.2f}x)")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def origin_sha256(size):
    """The SHA-256 of dld-origin's first `size` bytes (its deterministic pattern), read from a
    local origin with curl into the hash, so that nothing is assumed about the pattern."""
    import hashlib
    proc = subprocess.Popen([os.path.join(BIN, "dld-origin")], stdout=subprocess.PIPE, text=True)
    base = proc.stdout.readline().strip()
    try:
        digest = hashlib.sha256()
        with subprocess.Popen(["curl", "-s", f"{base}/bytes/{size}"], stdout=subprocess.PIPE) as curl:
            while True:
                block = curl.stdout.read(1 << 20)
                if not block:
                    break
                digest.update(block)
        return digest.hexdigest()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def kill_cycle(work):
    """The kill cycle: SIGKILL `KILL_AFTER` s after each of `KILL_CYCLES` starts, then let the
    job finish; bytes served over the file size, and the file checked by its SHA-256."""
    expected = origin_sha256(KILL_SIZE)
    print(f"the kill cycle: {KILL_SIZE >> 20} MiB at {KILL_RATE / 1e6:g} MB/s a connection, dld SIGKILLed "
          f"{KILL_AFTER:g} s after each of {KILL_CYCLES} starts, then run to completion (target ≤ 1.2×)")
    for label, params in (("one stream (segments: 1)", {"segments": 1}), ("segments (default 4)", {})):
        proc = subprocess.Popen([os.path.join(BIN, "dld-origin")], stdout=subprocess.PIPE, text=True)
        base = proc.stdout.readline().strip()
        url = f"{base}/bytes/{KILL_SIZE}?rate={KILL_RATE}"
        name = "kill-%d.bin" % len(params)
        state = os.path.join(work, "state-" + name)
        try:
            before = origin_served(base)
            start = time.monotonic()
            daemon, client, dl = start_dld(work, state)
            job = client.call("enqueue", {"url": url, "name": name, **params})["job"]
            kills = 0
            for _ in range(KILL_CYCLES):
                time.sleep(KILL_AFTER)
                job = client.call("status", {"id": job["id"]})
                if job["state"] in FINISHED:
                    break
                kills += 1
                daemon, client, dl = kill_and_restart(daemon, work, state)
            while job["state"] not in ("completed", "failed", "canceled"):
                time.sleep(0.02)
                job = client.call("status", {"id": job["id"]})
            elapsed = time.monotonic() - start
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
            if job["state"] != "completed":
                sys.exit(f"bench: kill-cycle download {job['state']}: {job['error']}")
            path = os.path.join(dl, name)
            exact = sha256_file(path) == expected and os.path.getsize(path) == KILL_SIZE
            fetched = origin_served(base) - before
            print(f"  {label:26} {kills} kills, fetched / size **{fetched / KILL_SIZE:.2f}×**, "
                  f"file {'exact' if exact else 'WRONG'} (SHA-256), {elapsed:.1f} s")
            if not exact:
                sys.exit("bench: the kill-cycle file differs from the origin's bytes")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)


def run_dld(work, url, name, extra=(), params=None):
    """Starts a fresh dld, downloads url once, returns (seconds, peak RSS KiB, path)."""
    state = os.path.join(work, "state-" + name)
    dl = os.path.join(work, "dl")
    os.makedirs(dl, exist_ok=True)
    sock = os.path.join(work, "s.sock")
    env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(work, "cfg"))
    proc = subprocess.Popen([os.path.join(BIN, "dld"), "--socket", sock, "--state-dir", state, "--download-dir", dl,
                             "--log-level", "warning", *extra], env=env)
    try:
        client = wait_for_socket(sock, proc)
        start = time.monotonic()
        job = client.call("enqueue", {"url": url, "name": name, **(params or {})})["job"]
        while True:
            job = client.call("status", {"id": job["id"]})
            if job["state"] in ("completed", "failed", "canceled"):
                break
            time.sleep(0.005)
        elapsed = time.monotonic() - start
        if job["state"] != "completed":
            raise RuntimeError(f"download {job['state']}: {job['error']}")
        return elapsed, peak_rss_kib(proc.pid), os.path.join(dl, name)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def throughput(work):
    origin, url, origin_name = start_origin(work)
    try:
        print(f"throughput: {SIZE >> 20} MiB from {origin_name} on loopback, best of {RUNS}")
        curl_times, dld_times, rss = [], [], 0
        for i in range(RUNS):
            out = os.path.join(work, "curl.bin")
            curl_times.append(run_curl(url, out))
            os.unlink(out)
            seconds, peak, path = run_dld(work, url, f"dld-{i}.bin")
            dld_times.append(seconds)
            rss = max(rss, peak)
            if os.path.getsize(path) != SIZE:
                sys.exit(f"bench: dld wrote {os.path.getsize(path)} bytes, expected {SIZE}")
            os.unlink(path)
        c, d = min(curl_times), min(dld_times)
        print(f"  curl -o      {c:7.3f} s   {SIZE / c / 1e6:8.1f} MB/s   (runs: {', '.join(f'{t:.3f}' for t in curl_times)})")
        print(f"  dld          {d:7.3f} s   {SIZE / d / 1e6:8.1f} MB/s   (runs: {', '.join(f'{t:.3f}' for t in dld_times)})")
        print(f"  ratio dld/curl  {d / c:.2f}   (target ≤ 1.5)")
        print(f"  dld peak RSS    {rss / 1024:.1f} MiB   (target ≤ 64 MiB)")
    finally:
        origin.send_signal(signal.SIGTERM)
        origin.wait(timeout=10)


def speed(work):
    """A download held to max_speed for SPEED_SECONDS: its rate over the run and each 10 s window."""
    limit, seconds = SPEED_LIMIT, SPEED_SECONDS
    size = (int(limit * seconds * 1.5) >> 20 << 20) + (64 << 20)
    origin, url, origin_name = start_origin(work, size)
    try:
        print(f"speed: max_speed = {limit} B/s ({limit / 1e6:.1f} MB/s) for {seconds:g} s, from {origin_name} on loopback")
        config = os.path.join(work, "speed.toml")
        with open(config, "w") as f:
            f.write(f"max_speed = {limit}\n")
        state = os.path.join(work, "state-speed")
        dl = os.path.join(work, "dl")
        os.makedirs(dl, exist_ok=True)
        sock = os.path.join(work, "s.sock")
        env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(work, "cfg"))
        proc = subprocess.Popen([os.path.join(BIN, "dld"), "--socket", sock, "--state-dir", state, "--download-dir", dl,
                                 "--log-level", "warning", "--config", config], env=env)
        samples = []  # (seconds since the first byte, bytes received)
        try:
            client = wait_for_socket(sock, proc)
            job = client.call("enqueue", {"url": url, "name": "speed.bin"})["job"]
            start = None
            while True:
                job = client.call("status", {"id": job["id"]})
                now = time.monotonic()
                if job["state"] != "running" and job["state"] != "queued":
                    sys.exit(f"bench: speed download ended early: {job['state']} {job['error']}")
                if job["received"] > 0 and start is None:
                    start = now
                    samples.append((0.0, job["received"]))
                elif start is not None:
                    samples.append((now - start, job["received"]))
                    if now - start >= seconds:
                        break
                time.sleep(0.05)
            rss = peak_rss_kib(proc.pid)
            client.call("cancel", {"id": job["id"]})
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)

        def at(t):
            """Bytes received at t seconds (the last sample at or before it)."""
            return max((b for s, b in samples if s <= t), default=0)

        total = (samples[-1][1] - samples[0][1]) / samples[-1][0]
        print(f"  dld, whole run   {total / 1e6:8.3f} MB/s   {100 * (total / limit - 1):+6.2f} % vs the limit")
        windows = [(t, (at(t + 10) - at(t)) / 10) for t in range(0, int(seconds) - 9)]
        for t in range(0, int(seconds) - 9, 10):
            rate = (at(t + 10) - at(t)) / 10
            print(f"  dld, {t:3d}-{t + 10:3d} s   {rate / 1e6:8.3f} MB/s   {100 * (rate / limit - 1):+6.2f} %")
        worst = max(windows, key=lambda w: abs(w[1] / limit - 1))
        print(f"  dld, worst 10 s window (1 s steps): {worst[0]}-{worst[0] + 10} s, {100 * (worst[1] / limit - 1):+.2f} %   (target within ±5 %)")
        print(f"  dld peak RSS     {rss / 1024:.1f} MiB")
        out = os.path.join(work, "curl.bin")
        subprocess.run(["curl", "-s", "--limit-rate", str(limit), "--max-time", str(seconds), "-o", out, url])
        got = os.path.getsize(out) if os.path.exists(out) else 0
        print(f"  curl --limit-rate, whole run   {got / seconds / 1e6:8.3f} MB/s   {100 * (got / seconds / limit - 1):+6.2f} %")
        if os.path.exists(out):
            os.unlink(out)
        if shutil.which("aria2c"):
            subprocess.run(["timeout", "-s", "INT", str(seconds), "aria2c", "-q", "--max-download-limit", str(limit),
                            "--file-allocation=none", "--allow-overwrite=true", "-d", work, "-o", "aria.bin", url])
            got = os.path.getsize(os.path.join(work, "aria.bin")) if os.path.exists(os.path.join(work, "aria.bin")) else 0
            print(f"  aria2c --max-download-limit    {got / seconds / 1e6:8.3f} MB/s   {100 * (got / seconds / limit - 1):+6.2f} %")
    finally:
        origin.send_signal(signal.SIGTERM)
        origin.wait(timeout=10)


def timed(argv):
    start = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - start


def sha256_file(path):
    import hashlib
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def best_of(label, runs, size, ref=None):
    best = min(runs)
    ratio = f"   {best / ref:5.2f}x" if ref else ""
    print(f"  {label:<22} {best:7.3f} s {size / best / 1e6:8.1f} MB/s{ratio}   (runs: {', '.join(f'{t:.3f}' for t in runs)})")
    return best


def segments(work):
    """Segmented downloads against one throttled connection, aria2c and curl."""
    if not shutil.which("nginx"):
        print("segments: nginx is not installed; skipped")
        return
    docroot = os.path.join(work, "www")
    os.makedirs(docroot)
    write_file(os.path.join(docroot, "seg.bin"), SEG_SIZE)
    expected = sha256_file(os.path.join(docroot, "seg.bin"))
    dl = os.path.join(work, "dl")
    os.makedirs(dl, exist_ok=True)

    def dld_run(url, name, params=None):
        seconds, peak, path = run_dld(work, url, name, params=params)
        if sha256_file(path) != expected_for[url]:
            sys.exit(f"bench: dld's {name} differs from the served file")
        os.unlink(path)
        return seconds, peak

    def tool_run(argv, out):
        seconds = timed(argv)
        if sha256_file(out) != expected_for[url]:
            sys.exit(f"bench: {argv[0]}'s file differs from the served file")
        os.unlink(out)
        return seconds

    proc, base = start_nginx(work, docroot, "limit_rate 40m;")
    url = f"{base}/seg.bin"
    expected_for = {url: expected}
    try:
        print(f"segments: {SEG_SIZE >> 20} MiB from nginx with limit_rate 40m (per connection), best of {RUNS}")
        default, one, aria, curl = [], [], [], []
        for i in range(RUNS):
            default.append(dld_run(url, f"seg-{i}.bin")[0])
            one.append(dld_run(url, f"one-{i}.bin", {"segments": 1})[0])
            out = os.path.join(dl, "aria.bin")
            if shutil.which("aria2c"):
                aria.append(tool_run(["aria2c", "-q", "-x4", "-s4", "--allow-overwrite=true", "--file-allocation=none",
                                      "-d", dl, "-o", "aria.bin", url], out))
            out = os.path.join(dl, "curl.bin")
            curl.append(tool_run(["curl", "-s", "-o", out, url], out))
        d = best_of("dld (defaults)", default, SEG_SIZE)
        o = best_of("dld segments=1", one, SEG_SIZE, d)
        a = best_of("aria2c -x4 -s4", aria, SEG_SIZE, d) if aria else None
        best_of("curl -o", curl, SEG_SIZE, d)
        print(f"  dld (defaults) / aria2c -x4 -s4   {d / a:.2f}   (target ≤ 1.0)" if a else "  aria2c is not installed")
        print(f"  dld segments=1 / dld (defaults)   {o / d:.2f}   (target ≥ 3.5)")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)

    os.unlink(os.path.join(docroot, "seg.bin"))
    write_file(os.path.join(docroot, "big.bin"), SIZE)
    proc, base = start_nginx(work, docroot)
    url = f"{base}/big.bin"
    expected_for[url] = sha256_file(os.path.join(docroot, "big.bin"))
    try:
        print(f"  {SIZE >> 20} MiB from nginx, no limit, best of {RUNS}")
        dld_times, one_times, curl_times, rss = [], [], [], 0
        for i in range(RUNS):
            out = os.path.join(dl, "curl.bin")
            curl_times.append(tool_run(["curl", "-s", "-o", out, url], out))
            seconds, peak = dld_run(url, f"big-{i}.bin")
            dld_times.append(seconds)
            rss = max(rss, peak)
            # One connection, as curl: what the single stream itself costs (SHA-256 and the
            # final sync included).
            one_times.append(dld_run(url, f"big-one-{i}.bin", {"segments": 1})[0])
        c = best_of("curl -o", curl_times, SIZE)
        d = best_of("dld (defaults)", dld_times, SIZE, c)
        o = best_of("dld segments=1", one_times, SIZE, c)
        print(f"  dld / curl -o   {d / c:.2f}   (target ≤ 1.0)")
        print(f"  dld segments=1 / curl -o   {o / c:.2f}   (target ≤ 1.0)")
        print(f"  dld peak RSS    {rss / 1024:.1f} MiB   (target ≤ 64 MiB)")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def wire(work):
    """Bytes served over the file's size for one download with dld's defaults."""
    proc = subprocess.Popen([os.path.join(BIN, "dld-origin")], stdout=subprocess.PIPE, text=True)
    base = proc.stdout.readline().strip()
    try:
        print("wire: bytes dld-origin served for one download (default segments) / file size")
        cases = [(f"{size >> 20} MiB", f"{base}/bytes/{size}", size) for size in WIRE_SIZES]
        for size in (s for s in WIRE_SIZES if s <= 64 << 20):
            for status in ("503", "429"):
                cases.append((f"{size >> 20} MiB, first answer {status} + Retry-After",
                              f"{base}/fail_first/1/bytes/{size}?fail_status={status}", size))
        for n, (label, url, size) in enumerate(cases):
            before = origin_served(base)
            run_dld(work, url, f"wire-{n}.bin")
            served = origin_served(base) - before
            print(f"  {label:<40} {served / size:.4f}   ({served} bytes for {size})")
            os.unlink(os.path.join(work, "dl", f"wire-{n}.bin"))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def main():
    parser = argparse.ArgumentParser(description="dld benchmarks (figures, never assertions)")
    parser.add_argument("parts", nargs="*", metavar="PART",
                        help=f"parts to run, of: {', '.join(PARTS)} (default: all)")
    parser.add_argument("--files", type=int, default=int(os.environ.get("BENCH_SMALL_FILES", "2000")),
                        help="files of the small part (default 2000)")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("BENCH_SCALE_JOBS", "100000")),
                        help="jobs of the scale part (default 100000)")
    args = parser.parse_args()
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part {', '.join(unknown)}; parts: {', '.join(PARTS)}")
    parts = args.parts or list(PARTS)
    for tool in ("dld", "dlctl", "dld-origin"):
        if not os.path.exists(os.path.join(BIN, tool)):
            sys.exit(f"bench: {BIN}/{tool} is missing; run `make bench` (it builds release binaries)")
    for i, part in enumerate(p for p in PARTS if p in parts):
        if i:
            print()
        started = time.monotonic()
        if part in ("throughput", "crash", "speed", "segments", "kill", "wire"):
            work = tempfile.mkdtemp(prefix="dld-bench-")
            try:
                {"throughput": throughput, "crash": crash_cycle, "speed": speed, "segments": segments,
                 "kill": kill_cycle, "wire": wire}[part](work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        elif part == "small":
            bench_many.part_small(args.files)
        elif part == "scale":
            bench_many.part_scale(args.jobs)
        elif part == "postgres":
            bench_many.part_postgres(args.jobs)
        elif part == "wan":
            bench_wan.part_wan()
        elif part == "idle":
            bench_idle.part_idle()
        elif part == "cpu":
            bench_cpu.part_cpu(BIN)
        elif part == "web":
            bench_web.part_web()
        else:
            bench_fleet.part_fleet()
        print(f"  ({part}: {time.monotonic() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
