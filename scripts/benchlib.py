"""Shared pieces of dld's benchmark scripts (scripts/bench.py and scripts/bench_many.py).

Python 3.11 standard library only. Everything talks to the real release binaries in
.build/release over loopback and Unix sockets; every wait here has a deadline.
"""
import json, os, shutil, signal, socket, subprocess, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# DLD_BIN_DIR runs the scripts on another build's binaries (a debug build, for figures that do
# not depend on speed, such as `bench.py wire`).
BIN = os.environ.get("DLD_BIN_DIR") or os.path.join(ROOT, ".build", "release")

# Upper bound of any one measured step (an enqueue of every job, a `resume all`, a tool's whole
# download, ...). The current dld can take minutes for some bulk commands; a step that runs over
# is recorded as "timed out" and the run goes on, so the whole bench stays bounded.
STEP_TIMEOUT = float(os.environ.get("BENCH_STEP_TIMEOUT", "400"))


class RpcError(Exception):
    """dld answered with a JSON-RPC error object."""

    def __init__(self, error):
        self.error = error
        data = error.get("data") or {}
        super().__init__(f"{data.get('code', error.get('code'))}: {error.get('message')}")


class ConnectionClosed(Exception):
    """dld closed the connection before answering (it may have crashed)."""


class Client:
    """A JSON-RPC client on dld's socket (one connection, one line per message).

    Replies can be tens of MB (`resume` with `all` lists every job it changed), so the buffer
    is a bytearray (amortized appends) and only newly received bytes are searched for the
    newline. `last_reply_at` is the monotonic time at which the reply's last byte arrived, so
    that a benchmark can leave out the time Python spends parsing a large reply.
    """

    def __init__(self, path, timeout=10.0):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self.buf = bytearray()
        self.next_id = 1
        self.last_reply_at = 0.0
        self.last_reply_bytes = 0

    def close(self):
        self.sock.close()

    def call(self, method, params=None, timeout=None):
        """Sends one request and returns its result; raises RpcError, ConnectionClosed, or
        TimeoutError when no full reply came within `timeout` seconds (default: STEP_TIMEOUT)."""
        req = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params:
            req["params"] = params
        self.next_id += 1
        deadline = time.monotonic() + (STEP_TIMEOUT if timeout is None else timeout)
        try:
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            self.sock.sendall(json.dumps(req, separators=(",", ":")).encode() + b"\n")
            searched = 0
            while (end := self.buf.find(b"\n", searched)) < 0:
                searched = len(self.buf)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{method}: no reply in time")
                self.sock.settimeout(left)
                data = self.sock.recv(1 << 20)
                if not data:
                    raise ConnectionClosed(f"{method}: dld closed the connection")
                self.buf += data
        except socket.timeout as e:
            raise TimeoutError(f"{method}: no reply in time") from e
        except (BrokenPipeError, ConnectionResetError) as e:
            raise ConnectionClosed(f"{method}: {e}") from e
        self.last_reply_at = time.monotonic()
        self.last_reply_bytes = end + 1
        line = bytes(self.buf[:end])
        del self.buf[:end + 1]
        resp = json.loads(line)
        if "error" in resp:
            raise RpcError(resp["error"])
        return resp["result"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def proc_status_kib(pid, key):
    """A `VmHWM:`/`VmRSS:` figure of /proc/PID/status in KiB, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_kib(pid):
    return proc_status_kib(pid, "VmHWM") or 0


def exit_text(code):
    """Popen's returncode as people read it: 0, "exit 1", "crashed (SIGSEGV, exit 139)"."""
    if code is None:
        return "running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"crashed ({name}, exit {128 - code})" if -code != signal.SIGKILL else f"killed ({name}, exit {128 - code})"
    return "exit 0" if code == 0 else f"exit {code}"


class Daemon:
    """One dld process on its own socket, state and download folders, started with flags only.

    XDG_CONFIG_HOME points into the work folder, so that no config file of the user changes
    the defaults being measured. A sampler thread reads VmHWM every 0.1 s, so the peak RSS is
    known even when the process crashes before it can be read at the end.
    """

    def __init__(self, work, state, dl, extra=(), log_level="error"):
        self.work, self.state, self.dl, self.extra = work, state, dl, list(extra)
        self.sock = os.path.join(work, "dld.sock")
        self.log_level = log_level
        self.proc = None
        self.peak_kib = 0  # the largest VmHWM of every process this object started
        self.spawned_at = 0.0

    def spawn(self):
        os.makedirs(self.dl, exist_ok=True)
        env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(self.work, "cfg"))
        env.pop("DLD_SOCKET", None)
        log = open(os.path.join(self.work, "dld.log"), "ab")
        self.spawned_at = time.monotonic()
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "dld"), "--socket", self.sock, "--state-dir", self.state, "--download-dir", self.dl,
             "--log-level", self.log_level, *self.extra], env=env, stdout=log, stderr=log)
        log.close()
        proc = self.proc
        threading.Thread(target=self._sample, args=(proc,), daemon=True).start()

    def _sample(self, proc):
        while proc.poll() is None:
            hwm = proc_status_kib(proc.pid, "VmHWM")
            if hwm:
                self.peak_kib = max(self.peak_kib, hwm)
            time.sleep(0.1)

    def start(self, timeout=None):
        """Spawns dld and returns seconds from spawning until the socket answers `version`."""
        self.spawn()
        return self.wait_ready(timeout)

    def wait_ready(self, timeout=None):
        deadline = self.spawned_at + (STEP_TIMEOUT if timeout is None else timeout)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ConnectionClosed(f"dld exited at start: {exit_text(self.proc.returncode)} (log: {self.work}/dld.log)")
            try:
                c = Client(self.sock, timeout=max(0.01, deadline - time.monotonic()))
            except OSError:
                time.sleep(0.005)
                continue
            try:
                c.call("version", timeout=max(0.01, deadline - time.monotonic()))
                return time.monotonic() - self.spawned_at
            except ConnectionClosed:
                time.sleep(0.005)
            finally:
                c.close()
        raise TimeoutError("dld did not answer `version` in time")

    def client(self, timeout=10.0):
        return Client(self.sock, timeout=timeout)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def rss_mib(self):
        kib = proc_status_kib(self.proc.pid, "VmRSS") if self.proc else None
        return None if kib is None else kib / 1024

    def peak_mib(self):
        if self.alive():
            self.peak_kib = max(self.peak_kib, peak_rss_kib(self.proc.pid))
        return self.peak_kib / 1024

    def terminate(self, timeout=None):
        """SIGTERM; returns (exit text, seconds to exit). SIGKILLs after `timeout`."""
        if not self.alive():
            return exit_text(self.proc.returncode if self.proc else None), 0.0
        self.peak_mib()
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STEP_TIMEOUT if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return f"no exit within {time.monotonic() - start:.0f} s (SIGKILLed)", time.monotonic() - start
        return exit_text(self.proc.returncode), time.monotonic() - start

    def kill(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait()


def start_dld_origin(host="127.0.0.1"):
    """The project's test origin (Sources/dld-origin); returns (process, base URL)."""
    proc = subprocess.Popen([os.path.join(BIN, "dld-origin"), "--host", host], stdout=subprocess.PIPE, text=True)
    base = proc.stdout.readline().strip()
    if not base.startswith("http://"):
        proc.kill()
        raise RuntimeError("dld-origin did not print its URL")
    return proc, base


def write_file(path, size):
    """`size` bytes (whole MiB) of random data at `path`, readable by others (nginx's workers
    drop to an unprivileged user)."""
    with open(path, "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(size >> 20):
            f.write(chunk)
    os.chmod(path, 0o644)


def start_nginx(work, docroot, server_extra=""):
    """nginx serving `docroot` on a free loopback port, or None when nginx is not installed.
    `server_extra` goes into the server block (`limit_rate 40m;`: each connection throttled).

    nginx's workers drop to an unprivileged user when run as root: every folder on the way to
    the files must be searchable and the files readable by others."""
    nginx = shutil.which("nginx")
    if not nginx:
        return None
    os.chmod(work, 0o755)
    os.chmod(docroot, 0o755)
    conf = os.path.join(work, "nginx.conf")
    port = free_port()
    with open(conf, "w") as f:
        f.write(f"""daemon off; worker_processes 1; pid {work}/nginx.pid; error_log {work}/nginx.err;
events {{}}
http {{ access_log off; sendfile on; server {{ listen 127.0.0.1:{port}; root {docroot}; {server_extra} }} }}
""")
    proc = subprocess.Popen([nginx, "-c", conf, "-p", work], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Bounded wait until nginx listens.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"nginx did not start (see {work}/nginx.err)")


def postgres_bindir():
    """The folder of PostgreSQL's programs (initdb, postgres, psql), or None."""
    import glob
    initdb = shutil.which("initdb")
    if initdb:
        return os.path.dirname(os.path.realpath(initdb))
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def psql(url, sql, database=None):
    """Runs `sql` with psql on the server of a `start_postgres` connection string; returns its
    unaligned, tuples-only output."""
    folder = url.split("host=")[1].split("&")[0]
    db = database or url.split("@/")[1].split("?")[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    done = subprocess.run([os.path.join(postgres_bindir(), "psql"), "-h", folder, "-U", "dld", "-d", db, "-X", "-q", "-A", "-t",
                           "-v", "ON_ERROR_STOP=1", "-c", sql], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"psql: {done.stderr.strip()}")
    return done.stdout


def with_postgres_and_origin(part, prefix, body):
    """Runs body(work, url, origin_base) with a throwaway PostgreSQL and dld-origin, both
    stopped and the work folder removed afterwards; without PostgreSQL the part is skipped
    with a note."""
    work = tempfile.mkdtemp(prefix=prefix)
    origin = pg = None
    try:
        started = start_postgres(work)
        if not started:
            print(f"{part}: PostgreSQL is not installed (apt-get install postgresql); part skipped")
            return
        pg, url = started
        origin, base = start_dld_origin()
        body(work, url, base)
    finally:
        stop(origin)
        stop(pg)
        shutil.rmtree(work, ignore_errors=True)


def start_postgres(work):
    """A throwaway PostgreSQL on a Unix socket in `work` (as the tests start one), or None when
    PostgreSQL is not installed. Returns (process, connection string). Run as root, the server
    runs as the `postgres` user (it refuses root)."""
    import pwd
    bindir = postgres_bindir()
    if not bindir:
        return None
    folder = os.path.join(work, "pg")
    os.makedirs(folder)
    prefix = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chmod(work, 0o755)
        os.chown(folder, user.pw_uid, user.pw_gid)
        prefix = ["/usr/bin/setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    subprocess.run(prefix + [f"{bindir}/initdb", "-D", f"{folder}/data", "-U", "dld", "--auth=trust", "-E", "UTF8",
                             "--no-locale"], cwd=folder, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = open(os.path.join(folder, "postgres.log"), "ab")
    proc = subprocess.Popen(prefix + [f"{bindir}/postgres", "-D", f"{folder}/data", "-c", "listen_addresses=",
                                      "-c", f"unix_socket_directories={folder}"], cwd=folder, env=env, stdout=log, stderr=log)
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = subprocess.run([f"{bindir}/createdb", "-h", folder, "-U", "dld", "bench"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if done.returncode == 0:
            return proc, f"postgresql://dld@/bench?host={folder}"
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    stop(proc)
    raise RuntimeError(f"PostgreSQL did not start (see {folder}/postgres.log)")


def stop(proc):
    """Stops a helper process (origin, nginx) that this script started."""
    if proc and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
