"""The `wan` part of `make bench` (issue 26): downloads over a link with round trips.

Loopback has no round trips, so it hides what costs most on real networks: waiting for
answers. This part puts a relay of our own between every tool and nginx that delays every byte
BENCH_WAN_DELAY_MS (default 20) milliseconds each way, so a round trip costs twice that; the
kernel here has no netem. The relay also charges the TCP handshake it cannot delay (it accepts
at once on loopback): a connection's first bytes wait one more round trip, so a new connection
costs what it costs on a real link. Each direction keeps at most BENCH_WAN_WINDOW bytes (default
4 MiB) in flight, as a TCP window would.

nginx serves the same folder twice through the relay: https with HTTP/2 (ALPN), and plain http
(HTTP/1.1 only). Side by side in one run, every file checked by SHA-256:

- many small files (BENCH_WAN_FILES, default 1000, × 16 KiB) over https: dld with its defaults,
  curl --parallel --parallel-max 16, aria2c -j16;
- half as many over plain http: dld with its defaults, aria2c with its defaults, curl
  --parallel --parallel-max 6 (the six connections dld is polite with), then dld with
  `max_per_host = 16`, curl --parallel-max 16 and aria2c -j16;
- one BENCH_WAN_BIG_MIB (default 200) MiB file over https: dld, curl -o, aria2c -x4 -s4.

nginx's log counts the connections and TLS handshakes each tool used (reused sessions apart).
Run alone: `python3 scripts/bench.py wan`, or `make bench PARTS=wan`.
"""
import asyncio, collections, hashlib, os, shutil, socket, subprocess, sys, tempfile, time

from bench_many import run_timed as run
from benchlib import BIN, STEP_TIMEOUT, Daemon, exit_text, free_port, stop

DELAY = float(os.environ.get("BENCH_WAN_DELAY_MS", "20")) / 1000
WINDOW = int(os.environ.get("BENCH_WAN_WINDOW", str(4 << 20)))
FILES = int(os.environ.get("BENCH_WAN_FILES", "1000"))
BIG_MIB = int(os.environ.get("BENCH_WAN_BIG_MIB", "200"))
SMALL = 16 << 10


# MARK: - the relay (run as its own process: `bench_wan.py relay LISTEN_PORT TARGET_PORT`)

async def pump(reader, writer, delay, opens_at):
    """Copies reader to writer, each chunk delivered `delay` after it arrived, and not before
    `opens_at` (the handshake's round trip); at most WINDOW bytes held."""
    loop = asyncio.get_running_loop()
    queue = collections.deque()
    held = 0
    more = asyncio.Event()
    room = asyncio.Event()
    room.set()

    async def read():
        nonlocal held
        try:
            while True:
                await room.wait()
                data = await reader.read(256 << 10)
                queue.append((max(loop.time(), opens_at) + delay, data))
                held += len(data)
                if held >= WINDOW:
                    room.clear()
                more.set()
                if not data:
                    return
        except (ConnectionError, OSError):
            queue.append((loop.time(), b""))
            more.set()

    async def write():
        nonlocal held
        try:
            while True:
                while not queue:
                    more.clear()
                    await more.wait()
                at, data = queue.popleft()
                wait = at - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
                held -= len(data)
                if held < WINDOW:
                    room.set()
        except (ConnectionError, OSError):
            pass

    reading = asyncio.create_task(read())
    await write()
    reading.cancel()


async def relay(listen_port, target_port):
    async def handle(client_reader, client_writer):
        loop = asyncio.get_running_loop()
        opens_at = loop.time() + 2 * DELAY
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client_writer.close()
            return
        for w in (client_writer, up_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(pump(client_reader, up_writer, DELAY, opens_at),
                             pump(up_reader, client_writer, DELAY, 0), return_exceptions=True)
        for w in (client_writer, up_writer):
            w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def start_relay(target_port):
    port = free_port()
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "relay", str(port), str(target_port)],
                            stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError("the relay did not start")
    return proc, port


# MARK: - nginx with https (HTTP/2) and http

def make_certificate(work):
    key, cert = os.path.join(work, "key.pem"), os.path.join(work, "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.chmod(key, 0o644)
    return key, cert


def start_nginx_tls(work, docroot, key, cert):
    """nginx serving docroot over https (HTTP/2 offered) and plain http; returns (proc, https
    port, http port, log path). Its log has a line per request: connection, requests on it,
    whether the TLS session was reused."""
    os.chmod(work, 0o755)
    os.chmod(docroot, 0o755)
    https_port, http_port = free_port(), free_port()
    log = os.path.join(work, "nginx-access.log")
    conf = os.path.join(work, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""daemon off; worker_processes 1; pid {work}/nginx.pid; error_log {work}/nginx.err;
events {{ worker_connections 4096; }}
http {{
  log_format conns '$connection $connection_requests $ssl_session_reused $server_protocol';
  sendfile on; keepalive_requests 100000; http2_max_concurrent_streams 128;
  server {{ listen 127.0.0.1:{https_port} ssl http2; ssl_certificate {cert}; ssl_certificate_key {key};
           root {docroot}; access_log {log} conns; }}
  server {{ listen 127.0.0.1:{http_port}; root {docroot}; access_log {log} conns; }}
}}
""")
    proc = subprocess.Popen(["nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", https_port), timeout=1).close()
            return proc, https_port, http_port, log
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"nginx did not start (see {work}/nginx.err)")


def log_counts(log, since):
    """(connections, TLS handshakes, protocols) of the log lines after byte `since`."""
    conns, handshakes, protocols = set(), set(), collections.Counter()
    with open(log) as f:
        f.seek(since)
        for line in f:
            parts = line.split()
            if len(parts) < 4:
                continue
            conns.add(parts[0])
            protocols[parts[3]] += 1
            if parts[2] == "." and parts[1] == "1":
                handshakes.add(parts[0])
    return len(conns), len(handshakes), dict(protocols)


# MARK: - the tools

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(folder, expected):
    bad = [n for n, d in expected.items() if not os.path.isfile(os.path.join(folder, n)) or sha256(os.path.join(folder, n)) != d]
    return f"{len(bad)} of {len(expected)} files missing or wrong" if bad else None


def dld_run(work, label, entries, expected, cert, config=""):
    """A fresh dld (its defaults, plus `config` lines and trust in the test certificate), then
    `dlctl enqueue -i --wait`. Returns (seconds, error, peak RSS MiB)."""
    base = tempfile.mkdtemp(prefix="dld-", dir=work)
    cfg = os.path.join(base, "cfg", "dld")
    os.makedirs(cfg)
    with open(os.path.join(cfg, "config.toml"), "w") as f:
        f.write(f'ca_file = "{cert}"\n{config}')
    listing = os.path.join(base, "list")
    with open(listing, "w") as f:
        f.writelines(f"{url}\n  out={name}\n" for url, name in entries)
    dl = os.path.join(base, "dl")
    daemon = Daemon(base, os.path.join(base, "state"), dl)
    try:
        daemon.start()
        seconds, error = run([os.path.join(BIN, "dlctl"), "enqueue", "--socket", daemon.sock, "-i", listing, "--wait", "-d", dl], STEP_TIMEOUT)
        error = error or verify(dl, expected)
        if not daemon.alive():
            error = f"dld {exit_text(daemon.proc.returncode)}" + (f"; {error}" if error else "")
        return seconds, error, daemon.peak_mib()
    finally:
        daemon.terminate(timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def tool_run(work, argv_for, expected):
    out = tempfile.mkdtemp(prefix="out-", dir=work)
    try:
        seconds, error = run(argv_for(out), STEP_TIMEOUT)
        return seconds, error or verify(out, expected), None
    finally:
        shutil.rmtree(out, ignore_errors=True)


def curl_argv(entries, cert, parallel, work):
    def argv(out):
        cfg = os.path.join(work, "curl.cfg")
        with open(cfg, "w") as f:
            f.writelines(f'url = "{u}"\noutput = "{os.path.join(out, n)}"\n' for u, n in entries)
        return ["curl", "-s", "-S", "--fail", "--cacert", cert, "--parallel", "--parallel-max", str(parallel), "-K", cfg]
    return argv


def aria2_argv(entries, cert, extra, work):
    def argv(out):
        listing = os.path.join(work, "aria2.list")
        with open(listing, "w") as f:
            f.writelines(f"{u}\n  out={n}\n" for u, n in entries)
        return ["aria2c", *extra, "-i", listing, "-d", out, "-q", "--ca-certificate", cert, "--allow-overwrite=true",
                "--auto-file-renaming=false", "--file-allocation=none"]
    return argv


def compare(title, runners, log):
    """Runs each (label, runner) once, prints its time, connections and handshakes; returns
    {label: seconds} of the runs that succeeded."""
    print(f"  {title}")
    times = {}
    for label, go in runners:
        since = os.path.getsize(log)
        seconds, error, peak = go()
        conns, handshakes, protocols = log_counts(log, since)
        proto = ", ".join(f"{k} {v}" for k, v in sorted(protocols.items()))
        extra = f", peak RSS {peak:.1f} MiB" if peak else ""
        print(f"    {label:42} {seconds:7.2f} s  {error or 'ok'}  ({conns} connections, {handshakes} full TLS handshakes; {proto}{extra})",
              flush=True)
        if not error:
            times[label] = seconds
    return times


def ratio(times, a, b, target):
    if a in times and b in times:
        print(f"    {a} ÷ {b}: {times[a] / times[b]:.2f}   (target ≤ {target})")
    else:
        print(f"    {a} ÷ {b}: —   (a run failed or a tool is missing)")


def part_wan():
    missing = [t for t in ("nginx", "openssl", "curl", "aria2c") if not shutil.which(t)]
    if missing:
        print(f"wan: {', '.join(missing)} not installed (scripts/bench-deps.sh installs them as root); part skipped")
        return
    work = tempfile.mkdtemp(prefix="dld-bench-wan-")
    procs = []
    try:
        docroot = os.path.join(work, "www")
        os.makedirs(docroot)
        expected = {}
        for i in range(FILES):
            name = f"f{i:05d}.bin"
            data = hashlib.sha256(name.encode()).digest() * (SMALL // 32)
            with open(os.path.join(docroot, name), "wb") as f:
                f.write(data)
            expected[name] = hashlib.sha256(data).hexdigest()
        big = os.path.join(docroot, "big.bin")
        with open(big, "wb") as f:
            block = os.urandom(1 << 20)
            for _ in range(BIG_MIB):
                f.write(block)
        big_expected = {"big.bin": sha256(big)}
        for path in [docroot] + [os.path.join(docroot, n) for n in os.listdir(docroot)]:
            os.chmod(path, 0o755 if os.path.isdir(path) else 0o644)
        key, cert = make_certificate(work)
        nginx, https_port, http_port, log = start_nginx_tls(work, docroot, key, cert)
        procs.append(nginx)
        relay_tls, wan_tls = start_relay(https_port)
        relay_plain, wan_plain = start_relay(http_port)
        procs += [relay_tls, relay_plain]
        print(f"wan: nginx behind a relay that delays every byte {DELAY * 1000:.0f} ms each way "
              f"(round trip {2 * DELAY * 1000:.0f} ms, a new connection one more); every file checked by SHA-256")

        names = sorted(expected)
        tls_entries = [(f"https://127.0.0.1:{wan_tls}/{n}", n) for n in names]
        half = names[: max(1, FILES // 2)]
        plain_entries = [(f"http://127.0.0.1:{wan_plain}/{n}", n) for n in half]
        plain_expected = {n: expected[n] for n in half}

        t = compare(f"{FILES} × 16 KiB over https (nginx offers HTTP/2)", [
            ("dld (defaults)", lambda: dld_run(work, "h2", tls_entries, expected, cert)),
            ("curl --parallel --parallel-max 16", lambda: tool_run(work, curl_argv(tls_entries, cert, 16, work), expected)),
            ("aria2c -j16", lambda: tool_run(work, aria2_argv(tls_entries, cert, ["-j16"], work), expected)),
        ], log)
        ratio(t, "dld (defaults)", "curl --parallel --parallel-max 16", 1.0)
        ratio(t, "dld (defaults)", "aria2c -j16", 0.5)

        t = compare(f"{len(half)} × 16 KiB over plain http (HTTP/1.1)", [
            ("dld (defaults)", lambda: dld_run(work, "h1", plain_entries, plain_expected, cert)),
            ("aria2c (defaults, -j5)", lambda: tool_run(work, aria2_argv(plain_entries, cert, [], work), plain_expected)),
            ("curl --parallel --parallel-max 6", lambda: tool_run(work, curl_argv(plain_entries, cert, 6, work), plain_expected)),
            ("dld max_per_host = 16", lambda: dld_run(work, "h1-16", plain_entries, plain_expected, cert, "max_per_host = 16\n")),
            ("curl --parallel --parallel-max 16", lambda: tool_run(work, curl_argv(plain_entries, cert, 16, work), plain_expected)),
            ("aria2c -j16", lambda: tool_run(work, aria2_argv(plain_entries, cert, ["-j16"], work), plain_expected)),
        ], log)
        ratio(t, "dld (defaults)", "aria2c (defaults, -j5)", 1.0)
        ratio(t, "dld (defaults)", "curl --parallel --parallel-max 6", 1.0)
        ratio(t, "dld max_per_host = 16", "curl --parallel --parallel-max 16", 1.0)
        ratio(t, "dld max_per_host = 16", "aria2c -j16", 1.0)

        big_entry = [(f"https://127.0.0.1:{wan_tls}/big.bin", "big.bin")]
        t = compare(f"one {BIG_MIB} MiB file over https", [
            ("dld (defaults)", lambda: dld_run(work, "big", big_entry, big_expected, cert)),
            ("curl -o", lambda: tool_run(work, lambda out: ["curl", "-s", "-S", "--fail", "--cacert", cert, "-o",
                                                              os.path.join(out, "big.bin"), big_entry[0][0]], big_expected)),
            ("aria2c -x4 -s4", lambda: tool_run(work, aria2_argv(big_entry, cert, ["-x4", "-s4"], work), big_expected)),
        ], log)
        ratio(t, "dld (defaults)", "curl -o", 1.0)
        ratio(t, "dld (defaults)", "aria2c -x4 -s4", 1.0)
    finally:
        for proc in procs:
            stop(proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "relay":
        try:
            asyncio.run(relay(int(sys.argv[2]), int(sys.argv[3])))
        except KeyboardInterrupt:
            pass
    else:
        part_wan()
