#!/usr/bin/env python3
"""A Jepsen-style partition harness for a fleet of dld workers (issue #36, `make fleet-chaos`).

Three real `dld` daemons share one job table in a throwaway PostgreSQL and one download
folder. Each runs in a network namespace of its own; PostgreSQL and the origin have theirs; a
bridge in a namespace of its own joins them (10.77.0.0/24, which exists only inside these
namespaces: nothing of this reaches the machine's own network). Random commands go to random
workers over their Unix sockets while faults chosen by a seed hit the fleet; at the end every
fault is healed, every job is resumed, and the history is checked.

Topology (namespaces, all `dlc-*`):
    dlc-hub     the bridge dlcbr0
    dlc-pg      PostgreSQL on 10.77.0.2:5432 (the harness itself uses its Unix socket)
    dlc-origin  the origin on 10.77.0.3:8080 (this script, `origin` subcommand)
    dlc-w1..w3  the workers, 10.77.0.11..13 (their control sockets are files: the harness
                reaches them whatever the network does)
    dlc-dup     10.77.0.21: a second daemon started with w1's worker id (a fault)

Faults (one every few seconds, on targets not already under a fault):
    pg_partition  a worker's traffic to and from PostgreSQL dropped (nftables in its namespace;
                  silent drops, so connections go half-open), the origin still reachable;
                  healed after 1.5 leases
    isolate       all of a worker's traffic on the bridge dropped, for 1.5 leases
    sigstop       SIGSTOP of a worker for 1.5 leases, then SIGCONT
    kill_listen   pg_terminate_backend of the worker's backend whose last query was LISTEN
    clock_step    (only when FLEET_CHAOS_FAULTS names it: see DEFAULT_FAULT_KINDS)
                  the worker's wall clock stepped by +-10 leases for 3 leases (libfaketime,
                  preloaded into every worker, re-reads its FAKETIME file each second;
                  DONT_FAKE_MONOTONIC=1 leaves CLOCK_MONOTONIC and CLOCK_BOOTTIME alone,
                  as a real step would; `stats.lease.clock_skew` shows the step)
    pg_restart    `pg_ctl stop -m immediate`, down 1-4 s, started again on the same data
    duplicate     a second dld with w1's worker id (its own state folder and socket): it must
                  exit refused, or be fenced (stats.lease.fenced), within 10 s
    version_bump  the origin's version of a file being downloaded goes up (new ETag, new
                  bytes); requests in flight go on with the version they started with

Recording: every command (time sent, time answered, worker, params, outcome: ok, error, or
unknown when it timed out or the connection failed); the origin's log of every request (client
address, so worker; path; Range; If-Range; version; start; end; the intervals in which the
peer's TCP acknowledged more bytes, read with TCP_INFO; bytes); an AFTER INSERT/UPDATE/DELETE trigger on
`jobs` writing each change of state, worker, url, options or a fall of `received` into `audit`
(with `clock_timestamp()`, the server's clock, the same as the harness's: one machine).

Checker rules (each breach is a violation; command windows are [sent, answered], an unknown
outcome's window never ends, since it may still take effect):
    completed_twice      a job enters `completed` more than once (audit).
    left_final           a job leaves `completed` or `canceled` other than by being deleted.
    bad_file             a job that ends `completed` has no file, or a file whose 4 KiB blocks
                         are not all of one version of its own path, at consecutive offsets,
                         of the origin's size (a version bump after the file was complete
                         legitimately leaves the older version).
    canceled_file        a job that ends `canceled` has a file at its path, or a partial file
                         (`<path>.part`: cancel deletes it; a stale writer may make it again).
    two_streams          the origin streamed one path to two different workers at once for more
                         than FENCE_MARGIN (0.5 s: the time for a stopped transfer's socket to
                         close and the origin to notice) in all. A request streams while the
                         peer's TCP acknowledges more bytes (TCP_INFO, sampled at each write, at
                         least 8 times a second): bytes buffered towards an isolated
                         or stopped worker do not count, and a stopped worker that reads on
                         after its SIGCONT does.
    unexplained_pause    the job entered `paused` with no pause command (ok or unknown) sent
                         before it and not answered before the job last left `paused`.
    unexplained_resume   the job left `paused` for queued/running/waiting/completed with no
                         resume command sent before and not answered before it entered
                         `paused`: an answered pause undone (a stale row written back).
    unexplained_cancel   the job entered `canceled` without a cancel (or remove: its owner
                         cancels, then deletes) command sent before.
    unexplained_delete   the job's row was deleted without a remove command sent before.
    lost_enqueue         an enqueue answered with an id whose row never existed, or vanished
                         without a remove.
    lost_pause           a pause answered ok, but at its answer the job was neither paused,
                         canceled nor deleted, and no resume overlapped it. A pause sent to
                         its owner (the answer's `requested`, the job running at the answer)
                         is pending instead: it is lost when the job never gets to paused,
                         canceled, deleted, completed or failed after it, and no resume was
                         sent after it.
    lost_cancel          a cancel answered ok, but the job did not end canceled or deleted (a
                         pending one may also meet a completion first).
    lost_remove          a remove answered ok, but the row was still there at its answer, or
                         came back later; a pending one: the row was never deleted after it,
                         nor completed first.
    lost_resume          a resume answered ok, but at its answer the job was still paused and
                         no pause overlapped it.
    undone_setting       after a set_speed (or change) answered ok, the row's max_speed (or
                         url) differs from what it set, with no later set_speed (change)
                         sent: a stale row written over it.
    stream_after_stop    the origin streamed a job's path, for more than FENCE_MARGIN in all,
                         after a pause (until the next resume sent), a cancel or a remove was
                         answered, plus one lease (a worker cut off from the table may stream
                         until it fences itself at 80 % of a lease; none of those bytes are
                         recorded). A command its owner carried out (`requested`) counts from
                         its answer too.
    unfinished           a job is not completed, canceled, failed or deleted once everything
                         healed and the bounded wait ran out.
    duplicate_worker     the second daemon with w1's id was neither refused nor fenced, and
                         w1 was not fenced either (the second may take the worker lock first
                         while w1 is cut off from the server: then w1 must be fenced).

Run as root (namespaces, nftables): `make fleet-chaos` (FLEET_CHAOS_SEEDS seeds of
FLEET_CHAOS_SECONDS), `make fleet-chaos FLEET_CHAOS_SHORT=1` (one seed, about a minute),
`make fleet-chaos FLEET_CHAOS_SEED=N` to replay seed N (the same commands and faults in the
same order; thread timing still differs); FLEET_CHAOS_FAULTS=kind,kind limits the faults drawn
(the seed then draws another sequence). Each run writes history.json and summary.txt in its
folder (.build/fleet-chaos/seed-N-TIME/); the exit status is 1 on any violation.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pwd
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

PREFIX = "dlc"
BRIDGE = "dlcbr0"
NET = "10.77.0"
PG_IP = f"{NET}.2"
ORIGIN_IP = f"{NET}.3"
ORIGIN_PORT = 8080
WORKER_IPS = {"w1": f"{NET}.11", "w2": f"{NET}.12", "w3": f"{NET}.13", "dup": f"{NET}.21"}
BLOCK = 4096
LEASE = 6
FENCE_MARGIN = 0.5
GAP = 0.5
FAKETIME_LIB = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))), None)
STOPPED_STATES = {"completed", "canceled", "failed"}
FAULT_KINDS = ["pg_partition", "isolate", "sigstop", "kill_listen", "clock_step", "pg_restart", "duplicate", "version_bump"]
# Drawn unless FLEET_CHAOS_FAULTS names them: libfaketime 0.9.10 (Debian's) also moves the
# timeouts of waits on other clocks by the fake offset (upstream PR #503), so a step back of
# the wall clock stalled the worker's monotonic timers (its fence, its checkpoints) for the
# step's length, which no real step of the wall clock does: violations seen under it say more
# about the tool than about dld.
DEFAULT_FAULT_KINDS = [kind for kind in FAULT_KINDS if kind != "clock_step"]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(args: list[str], check: bool = True, timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def ns_exec(ns: str) -> list[str]:
    return ["ip", "netns", "exec", f"{PREFIX}-{ns}"]


# MARK: The origin


def block(path: str, version: int, index: int) -> bytes:
    """Block `index` of version `version` of `path`: a header line naming all three, then the
    header repeated, 4096 bytes in all, so any block of a file says where it came from."""
    header = f"DLCHAOS {path} v={version} off={index * BLOCK:012d}\n".encode()
    return (header * (BLOCK // len(header) + 1))[:BLOCK]


BLOCK_HEADER = re.compile(rb"DLCHAOS (\S+) v=(\d+) off=(\d+)\n")


def size_of(path: str) -> int | None:
    """Paths are /f/<name>-<size>.bin: the size is in the name, so the origin needs no list."""
    match = re.fullmatch(r"/f/[\w.]+-(\d+)\.bin", path)
    return int(match.group(1)) if match else None


def tcp_bytes_acked(sock: socket.socket) -> int:
    """tcpi_bytes_acked of Linux's struct tcp_info (offset 120): bytes the peer's TCP received."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("Q", info, 120)[0] if len(info) >= 128 else 0


class OriginControl:
    """The harness's settings for the origin, in a JSON file it rewrites: per-path versions
    and the per-connection rate. Read again when its mtime changes (looked at twice a second)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.mtime = 0.0
        self.looked = 0.0
        self.data: dict[str, Any] = {"versions": {}, "rate": 131072}

    def get(self) -> dict[str, Any]:
        with self.lock:
            now = time.monotonic()
            if now - self.looked > 0.5:
                self.looked = now
                try:
                    mtime = self.path.stat().st_mtime
                    if mtime != self.mtime:
                        self.data = json.loads(self.path.read_text())
                        self.mtime = mtime
                except (OSError, ValueError):
                    pass
            return self.data


def serve_origin(folder: Path) -> None:
    control = OriginControl(folder / "origin-control.json")
    log_lock = threading.Lock()
    log_file = open(folder / "origin.jsonl", "a", buffering=1)
    active: dict[int, dict[str, Any]] = {}

    def record(entry: dict[str, Any]) -> None:
        with log_lock:
            log_file.write(json.dumps(entry) + "\n")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self.answer(body=False)

        def do_GET(self) -> None:
            self.answer(body=True)

        def answer(self, body: bool) -> None:
            path, _, query = self.path.partition("?")
            size = size_of(path)
            settings = control.get()
            version = int(settings["versions"].get(path, 1))
            if size is None:
                self.send_error(404)
                return
            etag = f'"v{version}-{zlib.crc32(path.encode()):08x}"'
            start, end, status = 0, size, 200
            wanted = self.headers.get("Range")
            if_range = self.headers.get("If-Range")
            if wanted and (if_range is None or if_range == etag):
                match = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted.strip())
                if match:
                    start = int(match.group(1))
                    end = min(size, int(match.group(2)) + 1) if match.group(2) else size
                    if start >= size or start >= end:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    status = 206
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", etag)
            self.send_header("Content-Length", str(end - start))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            self.end_headers()
            if not body:
                return
            entry: dict[str, Any] = {
                "client": self.client_address[0], "path": path, "query": query, "range": wanted, "if_range": if_range,
                "version": version, "status": status, "from": start, "to": end, "start": time.time(), "sent": 0,
            }
            entry["progress_at"] = entry["start"]
            # When the peer's TCP acknowledged more bytes, as intervals: a pause of more than
            # GAP splits them (a stopped or cut-off worker takes nothing, whatever was sent).
            entry["active"] = [[entry["start"], entry["start"]]]
            key = id(entry)
            active[key] = entry
            acked = tcp_bytes_acked(self.connection)
            offset = start
            try:
                while offset < end:
                    rate = int(control.get().get("rate", 0))
                    chunk = 16384 if rate == 0 else max(1024, min(16384, rate // 8))
                    index, within = divmod(offset, BLOCK)
                    data = block(path, version, index)[within:]
                    data = data[: min(len(data), chunk, end - offset)]
                    began = time.monotonic()
                    self.wfile.write(data)
                    offset += len(data)
                    entry["sent"] = offset - start
                    now_acked = tcp_bytes_acked(self.connection)
                    if now_acked > acked:
                        acked = now_acked
                        now = time.time()
                        if now - entry["progress_at"] > GAP:
                            entry["active"].append([now, now])
                        entry["active"][-1][1] = now
                        entry["progress_at"] = now
                    if rate:
                        time.sleep(max(0.0, len(data) / rate - (time.monotonic() - began)))
                entry["outcome"] = "done"
            except OSError as error:
                entry["outcome"] = f"aborted: {error.__class__.__name__}"
                self.close_connection = True
            entry["end"] = time.time()
            active.pop(key, None)
            record(entry)

    def stop(signum: int, frame: Any) -> None:
        for entry in list(active.values()):
            entry["end"] = time.time()
            entry["outcome"] = "cut at exit"
            record(entry)
        log_file.flush()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer((ORIGIN_IP, ORIGIN_PORT), Handler)
    server.serve_forever()


# MARK: The network


def cleanup_network() -> None:
    """Removes what a run leaves (also one that crashed): the processes in our namespaces,
    which are ours alone, then the namespaces with their veths and the bridge."""
    listed = run(["ip", "netns", "list"], check=False).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(PREFIX + "-"):
            continue
        pids = run(["ip", "netns", "pids", name], check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGCONT)
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        run(["ip", "netns", "del", name], check=False)


def setup_network() -> None:
    cleanup_network()
    run(["ip", "netns", "add", f"{PREFIX}-hub"])
    hub = ns_exec("hub")
    run(hub + ["ip", "link", "add", BRIDGE, "type", "bridge"])
    run(hub + ["ip", "link", "set", BRIDGE, "up"])
    run(hub + ["ip", "link", "set", "lo", "up"])
    members = {"pg": PG_IP, "origin": ORIGIN_IP, **WORKER_IPS}
    for name, address in members.items():
        ns = f"{PREFIX}-{name}"
        run(["ip", "netns", "add", ns])
        # The veth is made inside the hub, then one end moved: the root namespace never holds it.
        outer, inner = f"v{name}h", f"v{name}"
        run(hub + ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
        run(hub + ["ip", "link", "set", inner, "netns", ns])
        run(hub + ["ip", "link", "set", outer, "master", BRIDGE, "up"])
        run(ns_exec(name) + ["ip", "link", "set", "lo", "up"])
        run(ns_exec(name) + ["ip", "addr", "add", f"{address}/24", "dev", inner])
        run(ns_exec(name) + ["ip", "link", "set", inner, "up"])


def nft_drop(ns: str, peer: str) -> None:
    """Drops, silently, every packet between namespace `ns` and `peer` (an address or subnet)."""
    rules = (
        "table inet chaos {\n"
        f" chain o {{ type filter hook output priority 0; ip daddr {peer} drop; }}\n"
        f" chain i {{ type filter hook input priority 0; ip saddr {peer} drop; }}\n"
        "}\n"
    )
    run(ns_exec(ns) + ["nft", "-f", "-"], input=rules)


def nft_heal(ns: str) -> None:
    run(ns_exec(ns) + ["nft", "delete", "table", "inet", "chaos"], check=False)


# MARK: PostgreSQL


class Postgres:
    """PostgreSQL in namespace dlc-pg, listening on PG_IP for the workers and on a Unix socket
    for the harness; run as the `postgres` user (it refuses root)."""

    def __init__(self, run_dir: Path) -> None:
        self.bin = self.find_binaries()
        self.folder = Path(tempfile.mkdtemp(prefix=f"dld-chaos-pg-{os.getpid()}-"))
        self.data = self.folder / "data"
        self.logs = run_dir
        self.user = pwd.getpwnam("postgres")
        os.chown(self.folder, self.user.pw_uid, self.user.pw_gid)
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @staticmethod
    def find_binaries() -> str:
        versions = sorted((int(p.name) for p in Path("/usr/lib/postgresql").glob("*") if p.name.isdigit()), reverse=True)
        for version in versions:
            folder = f"/usr/lib/postgresql/{version}/bin"
            if os.access(folder + "/initdb", os.X_OK):
                return folder
        raise RuntimeError("PostgreSQL is not installed (run `make deps` as root)")

    @staticmethod
    def remove_leftovers() -> None:
        for folder in Path(tempfile.gettempdir()).glob("dld-chaos-pg-*"):
            owner = folder.name.split("-")[3]
            if owner.isdigit() and Path(f"/proc/{owner}").exists():
                continue
            shutil.rmtree(folder, ignore_errors=True)

    def as_postgres(self) -> list[str]:
        return ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}", "--clear-groups"]

    def init(self) -> None:
        run(self.as_postgres() + [self.bin + "/initdb", "-D", str(self.data), "-U", "dld", "--auth=trust", "-E", "UTF8", "--no-locale"],
            cwd=self.folder)
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {NET}.0/24 trust\n")

    def start(self) -> None:
        self.starts += 1
        log_file = open(self.logs / f"postgres-{self.starts}.log", "wb")
        args = ns_exec("pg") + self.as_postgres() + [
            self.bin + "/postgres", "-D", str(self.data), "-c", f"listen_addresses={PG_IP}",
            "-c", f"unix_socket_directories={self.folder}", "-c", "max_connections=200", "-c", "fsync=off",
        ]
        self.process = subprocess.Popen(args, stdout=log_file, stderr=log_file, cwd=self.folder, env={"LC_ALL": "C", "PATH": os.environ["PATH"]})
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                lines = (self.data / "postmaster.pid").read_text().split("\n")
                if len(lines) > 7 and lines[7].strip() == "ready":
                    return
            except OSError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited at start; see {log_file.name}")
            time.sleep(0.05)
        raise RuntimeError("postgres did not start within 60 s")

    def stop_immediate(self) -> None:
        run(self.as_postgres() + [self.bin + "/pg_ctl", "-D", str(self.data), "stop", "-m", "immediate", "-w"], check=False)
        if self.process:
            self.process.wait(timeout=30)

    def psql(self, sql: str, database: str = "chaos", timeout: float = 30) -> str:
        result = run([self.bin + "/psql", "-h", str(self.folder), "-U", "dld", "-d", database, "-X", "-q", "-A", "-t",
                      "-v", "ON_ERROR_STOP=1", "-c", sql], timeout=timeout, env={"PATH": os.environ["PATH"], "LC_ALL": "C"})
        return result.stdout.strip()

    def destroy(self) -> None:
        if self.process and self.process.poll() is None:
            self.stop_immediate()
        shutil.rmtree(self.folder, ignore_errors=True)


AUDIT_SQL = """
CREATE TABLE audit (
    seq bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp(), op text NOT NULL, id bigint NOT NULL,
    old_state text, new_state text, old_worker text, new_worker text, old_received bigint, received bigint,
    url text, options text, lease_until double precision);
CREATE FUNCTION audit_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO audit (op, id, new_state, new_worker, received, url, options)
        VALUES ('insert', NEW.id, NEW.state, NEW.worker, NEW.received, NEW.url, NEW.options);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO audit (op, id, old_state, old_worker, old_received)
        VALUES ('delete', OLD.id, OLD.state, OLD.worker, OLD.received);
    ELSIF OLD.state IS DISTINCT FROM NEW.state OR OLD.worker IS DISTINCT FROM NEW.worker OR OLD.url IS DISTINCT FROM NEW.url
          OR OLD.options IS DISTINCT FROM NEW.options OR NEW.received < OLD.received THEN
        INSERT INTO audit (op, id, old_state, new_state, old_worker, new_worker, old_received, received, url, options, lease_until)
        VALUES ('update', NEW.id, OLD.state, NEW.state, OLD.worker, NEW.worker, OLD.received, NEW.received, NEW.url, NEW.options,
                NEW.lease_until);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER audit_jobs AFTER INSERT OR UPDATE OR DELETE ON jobs FOR EACH ROW EXECUTE FUNCTION audit_jobs();
"""


# MARK: Workers


class Worker:
    """One dld daemon in its namespace, preloaded with libfaketime (FAKETIME read from a file
    of its own, again every second; the monotonic clock is left alone)."""

    def __init__(self, name: str, worker_name: str, dld: str, run_dir: Path, shared: Path) -> None:
        self.name = name
        self.dld = dld
        self.dir = run_dir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket = self.dir / "dld.sock"
        self.faketime = self.dir / "faketime"
        self.faketime.write_text("+0\n")
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "dld.log"
        # Found through XDG_CONFIG_HOME, not --config: under libfaketime's preload, dld was once
        # seen starting with none of its arguments.
        config = self.dir / "config" / "dld" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)  # a second duplicate reuses the folder
        config.write_text(
            f'database = "postgresql://dld@{PG_IP}:5432/chaos?sslmode=disable"\n'
            f'worker_name = "{worker_name}"\n'
            f"lease = {LEASE}\n"
            "max_active = 3\n"
            f'download_dir = "{shared}"\n'
            f'allowed_roots = ["{shared}"]\n'
            f'socket = "{self.socket}"\n'
            f'state_dir = "{self.dir / "state"}"\n'
            f'cache_dir = "{self.dir / "cache"}"\n'
            'http_listen = ""\n'
            "min_free = 0\n"
            "max_attempts = 1000\n"
            "retry_base = 0.5\n"
            "retry_max_delay = 3\n"
            "read_timeout = 8\n"
            "connect_timeout = 5\n"
            "checkpoint_interval = 1\n"
            "database_pool_size = 4\n"
        )

    def start(self) -> None:
        env = {
            "PATH": os.environ["PATH"], "HOME": str(self.dir), "XDG_CONFIG_HOME": str(self.dir / "config"),
            "XDG_STATE_HOME": str(self.dir / "xdg-state"), "XDG_CACHE_HOME": str(self.dir / "cache"), "LC_ALL": "C",
        }
        preload = [
            "env", f"LD_PRELOAD={FAKETIME_LIB}", f"FAKETIME_TIMESTAMP_FILE={self.faketime}", "FAKETIME_CACHE_DURATION=1",
            "DONT_FAKE_MONOTONIC=1",
        ] if FAKETIME_LIB else []
        log_file = open(self.log_path, "ab")
        self.process = subprocess.Popen(ns_exec(self.name) + preload + [self.dld],
                                        stdout=log_file, stderr=log_file, env=env)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited at start: {self.log_path.read_text()[-2000:]}")
            ok, _ = rpc(self.socket, "version", None, timeout=2)
            if ok == "ok":
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not answer within {timeout} s")

    def signal(self, signum: int) -> None:
        if self.alive():
            assert self.process is not None
            os.kill(self.process.pid, signum)

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.process is not None
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait()


_rpc_ids = iter(range(1, 1 << 62))


def rpc(path: Path, method: str, params: dict[str, Any] | None, timeout: float = 10) -> tuple[str, Any]:
    """One JSON-RPC call on a connection of its own: ("ok", result), ("error", error) or
    ("unknown", reason) when no answer came (the command may or may not take effect)."""
    request: dict[str, Any] = {"jsonrpc": "2.0", "id": next(_rpc_ids), "method": method}
    if params is not None:
        request["params"] = params
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(json.dumps(request).encode() + b"\n")
            buffer = b""
            while not buffer.endswith(b"\n"):
                data = sock.recv(65536)
                if not data:
                    return "unknown", "connection closed"
                buffer += data
    except (OSError, socket.timeout) as error:
        # Not connected at all: the command was never sent.
        if isinstance(error, (FileNotFoundError, ConnectionRefusedError)):
            return "error", f"not sent: {error}"
        return "unknown", f"{error.__class__.__name__}: {error}"
    reply = json.loads(buffer)
    if "error" in reply:
        error = reply["error"]
        if isinstance(error, dict) and "may have been made" in str(error.get("message", "")):
            # A COMMIT whose answer was lost: dld says it may have taken effect.
            return "unknown", error
        return "error", error
    return "ok", reply.get("result")


# MARK: The run


@dataclass
class History:
    seed: int
    commands: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def command(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.commands.append(entry)

    def fault(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.faults.append(entry)
        log(f"fault {entry['kind']} {entry.get('target', '')} {entry.get('note', '')}".rstrip())


class Chaos:
    def __init__(self, seed: int, seconds: float, dld: str, run_dir: Path, fault_kinds: list[str]) -> None:
        self.seed = seed
        self.fault_kinds = fault_kinds
        self.seconds = seconds
        self.dld = dld
        self.run_dir = run_dir
        self.shared = run_dir / "downloads"
        self.shared.mkdir(parents=True)
        self.history = History(seed)
        self.workload_random = random.Random(seed)
        self.fault_random = random.Random(seed * 7919 + 1)
        self.pg = Postgres(run_dir)
        self.workers = {name: Worker(name, name, dld, run_dir, self.shared) for name in ("w1", "w2", "w3")}
        self.origin: subprocess.Popen[bytes] | None = None
        self.control = {"versions": {}, "rate": 131072}
        self.control_lock = threading.Lock()
        self.jobs: dict[int, dict[str, Any]] = {}
        self.next_job = 0
        self.busy: set[str] = set()
        self.busy_lock = threading.Lock()
        self.stop_event = threading.Event()
        self.pending: list[threading.Thread] = []
        self.dup: Worker | None = None

    # The origin's settings

    def write_control(self) -> None:
        path = self.run_dir / "origin-control.json"
        temporary = path.with_suffix(".tmp")
        with self.control_lock:
            temporary.write_text(json.dumps(self.control))
            os.replace(temporary, path)

    # Set-up and tear-down

    def start(self) -> None:
        setup_network()
        Postgres.remove_leftovers()
        self.write_control()
        origin_log = open(self.run_dir / "origin.stderr", "wb")
        self.origin = subprocess.Popen(ns_exec("origin") + [sys.executable, __file__, "origin", "--folder", str(self.run_dir)],
                                       stdout=origin_log, stderr=origin_log)
        self.pg.init()
        self.pg.start()
        self.pg.psql("CREATE DATABASE chaos", database="postgres")
        for worker in self.workers.values():
            worker.start()
        for worker in self.workers.values():
            worker.wait_ready()
        # dld made its schema before its socket answered; the audit comes before any job.
        self.pg.psql(AUDIT_SQL)
        log(f"fleet up: 3 workers, PostgreSQL {PG_IP}, origin {ORIGIN_IP}:{ORIGIN_PORT}, run folder {self.run_dir}")

    def teardown(self) -> None:
        for worker in list(self.workers.values()) + ([self.dup] if self.dup else []):
            worker.stop()
        if self.origin and self.origin.poll() is None:
            self.origin.terminate()
            try:
                self.origin.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.origin.kill()
        self.pg.destroy()
        cleanup_network()

    # The workload

    def command(self, worker: str, method: str, params: dict[str, Any] | None, timeout: float = 15) -> tuple[str, Any]:
        sent = time.time()
        outcome, result = rpc(self.workers[worker].socket, method, params, timeout=timeout)
        entry = {"worker": worker, "method": method, "params": params, "sent": sent, "answered": time.time(), "outcome": outcome}
        if outcome == "ok" and method == "enqueue":
            entry["result"] = {"id": result["job"]["id"]}
        elif outcome == "ok" and method in ("pause", "resume", "cancel", "remove") and isinstance(result, dict):
            # How many jobs changed here, and how many went to the worker that runs them.
            entry["result"] = {"count": result.get("count"), "requested": result.get("requested", 0)}
        elif outcome != "ok":
            entry["result"] = result
        self.history.command(entry)
        return outcome, result

    def enqueue(self, worker: str) -> None:
        with self.control_lock:
            self.next_job += 1
            n = self.next_job
        size = self.workload_random.randrange(1, 7) * 1048576 + self.workload_random.randrange(0, 64) * BLOCK
        path = f"/f/j{n}-{size}.bin"
        params = {"url": f"http://{ORIGIN_IP}:{ORIGIN_PORT}{path}", "dir": str(self.shared), "name": f"j{n}.bin"}
        outcome, result = self.command(worker, "enqueue", params)
        if outcome == "ok":
            with self.control_lock:
                self.jobs[int(result["job"]["id"])] = {"path": path, "size": size}

    def random_command(self) -> None:
        r = self.workload_random
        worker = r.choice(sorted(self.workers))
        with self.control_lock:
            ids = sorted(self.jobs)
        if not ids or r.random() < 0.25:
            self.spawn(lambda: self.enqueue(worker))
            return
        method = r.choices(["pause", "resume", "cancel", "remove", "set_speed", "change", "bulk"], [20, 22, 5, 4, 16, 16, 10])[0]
        job = r.choice(ids[-12:] if r.random() < 0.7 else ids)
        params: dict[str, Any]
        if method == "bulk":
            method = r.choice(["pause", "resume"])
            params = {"ids": sorted(set(r.sample(ids, min(len(ids), r.randrange(2, 5)))))}
        elif method == "set_speed":
            # A job limit stays when the run heals: none so low that a file could not finish in the wait.
            params = {"id": job, "max_speed": r.choice([0, 262144, 1048576])}
        elif method == "change":
            path = self.jobs[job]["path"]
            params = {"id": job, "url": f"http://{ORIGIN_IP}:{ORIGIN_PORT}{path}?c={r.randrange(1000)}"}
        else:
            params = {"id": job}
        self.spawn(lambda: self.command(worker, method, params))

    def spawn(self, body: Callable[[], Any]) -> None:
        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        self.pending = [t for t in self.pending if t.is_alive()] + [thread]

    # Faults

    def claim(self, target: str) -> bool:
        """One fault at a time per target (a worker, "pg", "origin"); faults on different
        targets overlap."""
        with self.busy_lock:
            if target in self.busy:
                return False
            self.busy.add(target)
            return True

    def release(self, target: str) -> None:
        with self.busy_lock:
            self.busy.discard(target)

    def inject(self) -> None:
        r = self.fault_random
        kind = r.choice(self.fault_kinds)
        worker = r.choice(sorted(self.workers))
        # Drawn whether or not they are used, so that the seed's sequence stays the same.
        step = r.choice([-10, 10]) * LEASE
        down = r.uniform(1, 4)
        pick = r.random()
        target = {"pg_restart": "pg", "duplicate": "w1", "version_bump": "origin"}.get(kind, worker)
        if not self.claim(target):
            self.history.fault({"kind": kind, "target": target, "at": time.time(), "note": "skipped: target busy"})
            return
        self.spawn(lambda: self.fault(kind, target, step, down, pick))

    def fault(self, kind: str, target: str, step: int, down: float, pick: float) -> None:
        entry: dict[str, Any] = {"kind": kind, "target": target, "at": time.time()}
        hold = 1.5 * LEASE
        try:
            if kind == "pg_partition":
                self.hold(entry, hold, lambda: nft_drop(target, PG_IP), lambda: nft_heal(target))
            elif kind == "isolate":
                self.hold(entry, hold, lambda: nft_drop(target, f"{NET}.0/24"), lambda: nft_heal(target))
            elif kind == "sigstop":
                worker = self.workers[target]
                self.hold(entry, hold, lambda: worker.signal(signal.SIGSTOP), lambda: worker.signal(signal.SIGCONT))
            elif kind == "clock_step":
                file = self.workers[target].faketime
                entry["step"] = step
                self.hold(entry, 3 * LEASE, lambda: file.write_text(f"{step:+d}\n"), lambda: file.write_text("+0\n"))
            elif kind == "kill_listen":
                ip = WORKER_IPS[target]
                killed = self.pg.psql(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    f"WHERE query ILIKE 'listen%' AND client_addr = '{ip}'")
                entry["note"] = f"{killed} backend(s) ended"
                self.history.fault(entry)
            elif kind == "pg_restart":
                entry["down"] = round(down, 2)
                self.hold(entry, down, self.pg.stop_immediate, self.pg.start)
            elif kind == "duplicate":
                self.duplicate(entry)
            elif kind == "version_bump":
                self.version_bump(entry, pick)
        except Exception as error:  # A fault that could not be done is recorded, not fatal.
            entry["note"] = f"failed: {error}"
            self.history.fault(entry)
        finally:
            self.release(target)

    def hold(self, entry: dict[str, Any], seconds: float, begin: Callable[[], None], end: Callable[[], None]) -> None:
        """A fault that lasts: begun, held `seconds` (less once the run heals), ended."""
        begin()
        self.history.fault(entry)
        self.stop_event.wait(seconds)
        end()
        entry["healed"] = time.time()

    def duplicate(self, entry: dict[str, Any]) -> None:
        """A second daemon with w1's worker id (same host name, same worker_name), in its own
        namespace: refused at start, or fenced, within 10 s; else a violation."""
        self.dup = Worker("dup", "w1", self.dld, self.run_dir, self.shared)
        self.dup.start()
        self.history.fault(entry)
        deadline = time.time() + 10
        while time.time() < deadline and self.dup.alive():
            time.sleep(0.2)
        if not self.dup.alive():
            entry["outcome"] = "refused"
            entry["note"] = self.dup.log_path.read_text()[-300:].strip().splitlines()[-1:] if self.dup.log_path.exists() else ""
        else:
            ok, stats = rpc(self.dup.socket, "stats", None, timeout=5)
            fenced = ok == "ok" and bool((stats.get("lease") or {}).get("fenced"))
            entry["outcome"] = "fenced" if fenced else "running"
            entry["stats"] = stats if ok == "ok" else str(stats)
            if not fenced:
                # It may have taken the worker lock first, while w1 was cut off from the server
                # (a restart): then w1 must be the one fenced, and only one of the two runs.
                ok1, first = rpc(self.workers["w1"].socket, "stats", None, timeout=5)
                if ok1 == "ok" and (first.get("lease") or {}).get("fenced"):
                    entry["outcome"] = "took_over"
                    entry["first_stats"] = first
            self.dup.stop()
        entry["healed"] = time.time()

    def version_bump(self, entry: dict[str, Any], pick: float) -> None:
        rows = self.pg.psql("SELECT id FROM jobs WHERE state = 'running' ORDER BY id").split()
        with self.control_lock:
            known = [int(i) for i in rows if int(i) in self.jobs]
            if not known:
                entry["note"] = "nothing running"
                self.history.fault(entry)
                return
            job = known[int(pick * len(known))]
            path = self.jobs[job]["path"]
            version = int(self.control["versions"].get(path, 1)) + 1
            self.control["versions"][path] = version
            entry.update({"job": job, "path": path, "version": version})
        self.write_control()
        self.history.fault(entry)

    # The run itself

    def heal_all(self) -> None:
        self.stop_event.set()
        # Each fault's thread ends its fault as soon as the event is set; then, to be sure:
        for thread in self.pending:
            thread.join(timeout=30)
        for name in self.workers:
            nft_heal(name)
            self.workers[name].signal(signal.SIGCONT)
            self.workers[name].faketime.write_text("+0\n")
        if self.pg.process is None or self.pg.process.poll() is not None:
            self.pg.start()

    def settle(self, timeout: float) -> None:
        """Lets every job finish: the origin at full speed, every paused or waiting job
        resumed (a command like any other, recorded), then a bounded wait."""
        self.control["rate"] = 0
        self.write_control()
        deadline = time.time() + timeout
        resumed_at = 0.0
        while time.time() < deadline:
            rows = self.pg.psql("SELECT id, state FROM jobs ORDER BY id")
            states = [line.split("|")[1] for line in rows.splitlines() if line]
            if all(s in STOPPED_STATES for s in states):
                break
            if time.time() - resumed_at > 10 and any(s in ("paused", "waiting") for s in states):
                self.command("w2", "resume", {"all": True}, timeout=30)
                resumed_at = time.time()
            time.sleep(0.5)

    def run(self) -> dict[str, Any]:
        self.start()
        began = time.time()
        next_fault = began + self.fault_random.uniform(2, 4)
        while time.time() - began < self.seconds:
            self.random_command()
            if time.time() >= next_fault:
                self.inject()
                next_fault = time.time() + self.fault_random.uniform(2, 5)
            time.sleep(self.workload_random.uniform(0.1, 0.5))
        log("healing every fault")
        self.heal_all()
        log("waiting for every job to finish")
        self.settle(timeout=max(60, self.seconds))
        audit_json = self.pg.psql(
            "SELECT coalesce(json_agg(json_build_object('seq', seq, 'at', extract(epoch FROM at), 'op', op, 'id', id, "
            "'old_state', old_state, 'new_state', new_state, 'old_worker', old_worker, 'new_worker', new_worker, "
            "'old_received', old_received, 'received', received, 'url', url, 'options', options) ORDER BY seq), '[]') FROM audit")
        jobs_json = self.pg.psql("SELECT coalesce(json_agg(json_build_object('id', id, 'state', state, 'path', path, 'size', size, "
                                 "'received', received, 'worker', worker, 'url', url) ORDER BY id), '[]') FROM jobs")
        # Give the workers a moment to link the files of the last completed jobs.
        time.sleep(2)
        for worker in self.workers.values():
            worker.stop()
        self.origin_terminate()
        history = {
            "seed": self.seed, "seconds": self.seconds, "fault_kinds": self.fault_kinds, "lease": LEASE, "fence_margin": FENCE_MARGIN, "started": began,
            "workers": {ip: name for name, ip in WORKER_IPS.items()}, "jobs": {str(k): v for k, v in self.jobs.items()},
            "versions": self.control["versions"], "commands": self.history.commands, "faults": self.history.faults,
            "audit": json.loads(audit_json), "final_rows": json.loads(jobs_json),
            "origin": [json.loads(line) for line in (self.run_dir / "origin.jsonl").read_text().splitlines() if line],
            "worker_logs": {name: log_counts(worker.log_path) for name, worker in self.workers.items()},
        }
        return history

    def origin_terminate(self) -> None:
        if self.origin and self.origin.poll() is None:
            self.origin.terminate()
            self.origin.wait(timeout=10)


def log_counts(path: Path) -> dict[str, int]:
    """How often a worker's log says what the summary shows beside the violations."""
    text = path.read_text(errors="replace") if path.exists() else ""
    marks = {"fenced": "this worker is fenced", "unfenced": "takes jobs again", "listener_reconnected": "listener connected again"}
    return {key: text.count(mark) for key, mark in marks.items()}


# MARK: The checker


def max_speed_of(options: str | None) -> int | None:
    try:
        data = json.loads(options or "{}")
    except ValueError:
        return None
    value = data.get("maxSpeed", data.get("max_speed"))
    return int(value) if value else 0


def check(history: dict[str, Any], files: bool = True) -> list[dict[str, Any]]:
    """The rules of the module's docstring, over a history; returns the violations. Without
    `files`, the downloaded files (removed after a run) are not looked at again: the file
    violations recorded in the history stand."""
    violations: list[dict[str, Any]] = []
    lease = history["lease"]

    def violation(kind: str, job: int | None, detail: str) -> None:
        violations.append({"kind": kind, "job": job, "detail": detail})

    commands = history["commands"]
    # Every row ever written, also those of enqueues whose answer was lost: the URL says the file.
    jobs: dict[int, dict[str, Any]] = {}
    for row in history["audit"]:
        if row["op"] == "insert":
            path = "/" + row["url"].split("/", 3)[3].partition("?")[0]
            jobs[row["id"]] = {"path": path, "size": size_of(path)}
    path_to_job = {v["path"]: k for k, v in jobs.items()}
    final_rows = {row["id"]: row for row in history["final_rows"]}
    audit: dict[int, list[dict[str, Any]]] = {}
    for row in history["audit"]:
        audit.setdefault(row["id"], []).append(row)

    def end_of(c: dict[str, Any]) -> float:
        return c["answered"] if c["outcome"] == "ok" else float("inf")

    def targets(c: dict[str, Any], job: int) -> bool:
        p = c["params"] or {}
        return p.get("id") == job or job in (p.get("ids") or []) or p.get("all") is True

    def cmds(job: int, method: str, include_unknown: bool = True) -> list[dict[str, Any]]:
        wanted = ("ok", "unknown") if include_unknown else ("ok",)
        return [c for c in commands if c["method"] == method and c["outcome"] in wanted and targets(c, job)]

    def state_at(job: int, t: float) -> str | None:
        """The row's state after every audited change up to t (None before it existed or once deleted)."""
        state = None
        for row in audit.get(job, []):
            if row["at"] > t:
                break
            state = None if row["op"] == "delete" else row["new_state"]
        return state

    # Audit rules, job by job.
    for job, rows in audit.items():
        completions = [r for r in rows if r["op"] != "delete" and r["new_state"] == "completed" and r["old_state"] != "completed"]
        if len(completions) > 1:
            violation("completed_twice", job, f"entered completed {len(completions)} times, at "
                      + ", ".join(f"{r['at'] - history['started']:.2f}s by {r['new_worker'] or r['old_worker']}" for r in completions))
        entered_paused = 0.0
        left_paused = 0.0
        for r in rows:
            t, rel = r["at"], r["at"] - history["started"]
            old, new = r["old_state"], r["new_state"]
            if r["op"] == "delete":
                if not any(c["sent"] < t for c in cmds(job, "remove")):
                    violation("unexplained_delete", job, f"row deleted at {rel:.2f}s without a remove")
                continue
            if r["op"] == "insert":
                if new == "paused":
                    entered_paused = t
                continue
            if old in ("completed", "canceled") and new != old:
                violation("left_final", job, f"{old} -> {new} at {rel:.2f}s (worker {r['old_worker']} -> {r['new_worker']})")
            if new == "paused" and old != "paused":
                if not any(c["sent"] < t and end_of(c) > left_paused for c in cmds(job, "pause")):
                    violation("unexplained_pause", job, f"{old} -> paused at {rel:.2f}s with no pause command")
                entered_paused = t
            if old == "paused" and new in ("queued", "running", "waiting", "completed"):
                if not any(c["sent"] < t and end_of(c) > entered_paused for c in cmds(job, "resume")):
                    violation("unexplained_resume", job, f"paused -> {new} at {rel:.2f}s (worker {r['new_worker']}) "
                              f"with no resume after it was paused at {entered_paused - history['started']:.2f}s")
                left_paused = t
            if new == "canceled" and old != "canceled":
                if not any(c["sent"] < t for c in cmds(job, "cancel") + cmds(job, "remove")):
                    violation("unexplained_cancel", job, f"{old} -> canceled at {rel:.2f}s with no cancel command")

    # Command rules.
    for c in commands:
        if c["outcome"] != "ok":
            continue
        p = c["params"] or {}
        ids = [p["id"]] if "id" in p else list(p.get("ids") or [])
        t = c["answered"]
        rel = c["sent"] - history["started"]
        if c["method"] == "enqueue":
            job = c["result"]["id"]
            if job not in audit:
                violation("lost_enqueue", job, f"enqueue answered with id {job} at {rel:.2f}s; no such row was ever written")
            elif job not in final_rows and not any(r["op"] == "delete" for r in audit[job]):
                violation("lost_enqueue", job, "the row is gone without a delete")
            continue
        if c["method"] in ("pause", "cancel", "remove") and "all" in p and (c.get("result") or {}).get("requested", 0) > 0:
            ids = [job for job in jobs if state_at(job, t) == "running"]
        for job in ids:
            state = state_at(job, t)
            overlapping = lambda method: any(o is not c and o["sent"] < t and end_of(o) > c["sent"] for o in cmds(job, method))
            # A command for a job that another worker runs goes to that worker (its answer counts
            # it in `requested`): pending at its answer, it must take effect after.
            # Its owner may act before the answer comes back: the job was running at the send, at
            # the answer, or left `running` in between.
            ran = state == "running" or state_at(job, c["sent"]) == "running" or any(
                c["sent"] <= r["at"] <= t and r["old_state"] == "running" for r in audit.get(job, []))
            if (c.get("result") or {}).get("requested", 0) > 0 and ran:
                ends = {"pause": ("paused", "canceled", "completed", "failed"), "cancel": ("canceled", "completed"),
                        "remove": ("completed",)}[c["method"]]
                settled = any(r["at"] > c["sent"] and (r["op"] == "delete" or r["new_state"] in ends) for r in audit.get(job, []))
                withdrawn = c["method"] == "pause" and any(o["sent"] > c["sent"] for o in cmds(job, "resume"))
                if not settled and not withdrawn:
                    violation(f"lost_{c['method']}", job, f"{c['method']} sent at {rel:.2f}s to {c['worker']} went to the job's "
                              f"worker (requested), but it never took effect")
                continue
            if c["method"] == "pause" and state not in ("paused", "canceled", None) and not overlapping("resume"):
                violation("lost_pause", job, f"pause sent at {rel:.2f}s to {c['worker']} answered ok, but the job was {state}")
            if c["method"] == "resume" and state == "paused" and not overlapping("pause"):
                violation("lost_resume", job, f"resume sent at {rel:.2f}s to {c['worker']} answered ok, but the job was still paused")
            if c["method"] == "cancel" and final_rows.get(job, {}).get("state", "canceled") != "canceled":
                violation("lost_cancel", job, f"cancel sent at {rel:.2f}s answered ok, but the job ended {final_rows[job]['state']}")
            if c["method"] == "remove":
                if state is not None:
                    violation("lost_remove", job, f"remove sent at {rel:.2f}s answered ok, but the row was still {state}")
                elif job in final_rows:
                    violation("lost_remove", job, f"remove sent at {rel:.2f}s answered ok, but the row came back")
            if c["method"] in ("set_speed", "change"):
                later = [o for o in cmds(job, c["method"]) if o is not c and end_of(o) > c["sent"]]
                cutoff = min((o["sent"] for o in later), default=float("inf"))
                for r in audit.get(job, []):
                    if r["op"] != "update" or not (t < r["at"] < cutoff):
                        continue
                    if c["method"] == "set_speed" and max_speed_of(r["options"]) != int(p["max_speed"] or 0):
                        violation("undone_setting", job, f"set_speed {p['max_speed']} answered at {t - history['started']:.2f}s; "
                                  f"at {r['at'] - history['started']:.2f}s the row says {max_speed_of(r['options'])} "
                                  f"({r['old_state']}->{r['new_state']}, worker {r['old_worker']}->{r['new_worker']})")
                        break
                    if c["method"] == "change" and r["url"] != p["url"]:
                        violation("undone_setting", job, f"change of the url answered at {t - history['started']:.2f}s; at "
                                  f"{r['at'] - history['started']:.2f}s the row says {r['url']} "
                                  f"({r['old_state']}->{r['new_state']}, worker {r['old_worker']}->{r['new_worker']})")
                        break

    # The origin's view: streams by worker, per path.
    names = history["workers"]
    streams: dict[str, list[dict[str, Any]]] = {}
    for request in history["origin"]:
        request["worker"] = names.get(request["client"], request["client"])
        streams.setdefault(request["path"], []).append(request)
    for path, requests in streams.items():
        job = path_to_job.get(path)
        requests.sort(key=lambda q: q["start"])
        reported: set[tuple[str, str]] = set()
        for i, a in enumerate(requests):
            for b in requests[i + 1:]:
                if b["start"] >= a["progress_at"] + GAP:
                    continue
                overlap = sum(max(0.0, min(x[1], y[1]) - max(x[0], y[0]))
                              for x in a["active"] for y in b["active"])
                pair = tuple(sorted((a["worker"], b["worker"])))
                if a["worker"] != b["worker"] and overlap > FENCE_MARGIN and pair not in reported:
                    reported.add(pair)  # One report per pair of workers and path.
                    violation("two_streams", job, f"{path}: {a['worker']} [{a['start'] - history['started']:.2f}s, "
                              f"{a['progress_at'] - history['started']:.2f}s] and {b['worker']} "
                              f"[{b['start'] - history['started']:.2f}s, {b['progress_at'] - history['started']:.2f}s] "
                              f"streamed to both for {overlap:.2f}s")
        if job is None:
            continue
        stops = []
        for c in commands:
            if c["outcome"] == "ok" and c["method"] in ("pause", "cancel", "remove") and targets(c, job) and not (c["params"] or {}).get("all"):
                resumes = [o["sent"] for o in cmds(job, "resume") if o["sent"] > c["sent"] or end_of(o) > c["sent"]]
                until = float("inf") if c["method"] != "pause" else min(resumes, default=float("inf"))
                if c["method"] == "pause" and any(o["sent"] <= c["sent"] < end_of(o) for o in cmds(job, "resume")):
                    continue
                stops.append((c, c["answered"] + lease, until))
        for c, since, until in stops:
            for q in requests:
                # As for two streams: FENCE_MARGIN for the socket to close (a worker resumed
                # from SIGSTOP read once before its fence stopped the transfer: 0 s of activity).
                after = sum(max(0.0, min(b, until) - max(a, since)) for a, b in q["active"])
                if after > FENCE_MARGIN:
                    violation("stream_after_stop", job, f"{c['method']} answered at {c['answered'] - history['started']:.2f}s, "
                              f"but {q['worker']} streamed {path} until {q['progress_at'] - history['started']:.2f}s")
                    break

    # Final states and files.
    for job, info in jobs.items():
        row = final_rows.get(job)
        if row is None:
            continue
        if row["state"] not in STOPPED_STATES:
            violation("unfinished", job, f"still {row['state']} (worker {row['worker']}, {row['received']}/{row['size']} bytes)")
        elif not files:
            continue
        elif row["state"] == "completed":
            problem = check_file(Path(row["path"]), info["path"], info["size"])
            if problem:
                violation("bad_file", job, f"{row['path']}: {problem}")
        elif row["state"] == "canceled":
            for leftover in (Path(row["path"]), Path(row["path"] + ".part")):
                if leftover.exists():
                    violation("canceled_file", job, f"{leftover} exists")
    if not files:
        violations += [v for v in history.get("violations", []) if v["kind"] in ("bad_file", "canceled_file")]
    for fault in history["faults"]:
        if fault["kind"] == "duplicate" and fault.get("outcome") == "running":
            violation("duplicate_worker", None, f"a second daemon with w1's worker id ran, not fenced, at "
                      f"{fault['at'] - history['started']:.2f}s")
    return violations


def check_file(file: Path, path: str, size: int) -> str | None:
    try:
        data = file.read_bytes()
    except OSError as error:
        return f"cannot read: {error.strerror}"
    if len(data) != size:
        return f"{len(data)} bytes, the origin's are {size}"
    versions: set[int] = set()
    for index in range(0, len(data), BLOCK):
        match = BLOCK_HEADER.match(data, index)
        if not match or match.group(1).decode() != path or int(match.group(3)) != index:
            found = match.group(0).decode().strip() if match else repr(data[index:index + 40])
            return f"block at {index} is not its own: {found}"
        versions.add(int(match.group(2)))
        if data[index:index + BLOCK] != block(path, int(match.group(2)), index // BLOCK)[: len(data) - index]:
            return f"block at {index} is damaged"
    if len(versions) > 1:
        return f"blocks of versions {sorted(versions)} mixed"
    return None


def summary(history: dict[str, Any], violations: list[dict[str, Any]], run_dir: Path) -> str:
    lines = [f"fleet chaos, seed {history['seed']}: {history['seconds']:.0f} s of workload, lease {history['lease']} s", ""]
    outcomes: dict[str, dict[str, int]] = {}
    for c in history["commands"]:
        outcomes.setdefault(c["method"], {}).setdefault(c["outcome"], 0)
        outcomes[c["method"]][c["outcome"]] += 1
    lines.append(f"operations: {len(history['commands'])}")
    for method, counts in sorted(outcomes.items()):
        lines.append(f"  {method:<10} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    kinds: dict[str, int] = {}
    for f in history["faults"]:
        key = f["kind"] + (" (skipped)" if "skipped" in str(f.get("note", "")) else "")
        kinds[key] = kinds.get(key, 0) + 1
    lines.append(f"faults: {sum(kinds.values())}")
    for kind, count in sorted(kinds.items()):
        lines.append(f"  {kind:<22} {count}")
    states: dict[str, int] = {}
    for row in history["final_rows"]:
        states[row["state"]] = states.get(row["state"], 0) + 1
    created = sum(1 for row in history["audit"] if row["op"] == "insert")
    removed = sum(1 for row in history["audit"] if row["op"] == "delete")
    lines.append(f"jobs: {created} created ({len(history['jobs'])} enqueues answered); at the end "
                 + ", ".join(f"{k} {v}" for k, v in sorted(states.items())) + f", removed {removed}")
    lines.append(f"origin requests: {len(history['origin'])}; audit rows: {len(history['audit'])}")
    for name, counts in sorted(history["worker_logs"].items()):
        lines.append(f"  {name} log: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    lines.append("")
    lines.append(f"violations: {len(violations)}")
    for v in violations:
        lines.append(f"  {v['kind']:<18} job {v['job']}: {v['detail']}")
    lines.append("")
    limited = "" if history["fault_kinds"] == DEFAULT_FAULT_KINDS else f" FLEET_CHAOS_FAULTS={','.join(history['fault_kinds'])}"
    lines.append(f"history: {run_dir / 'history.json'}; replay: make fleet-chaos FLEET_CHAOS_SEED={history['seed']}{limited}")
    return "\n".join(lines) + "\n"


def run_seed(seed: int, seconds: float, dld: str, out: Path, fault_kinds: list[str]) -> int:
    run_dir = out / f"seed-{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True)
    os.chmod(run_dir, 0o755)
    log(f"seed {seed}: {seconds:.0f} s, run folder {run_dir}")
    chaos = Chaos(seed, seconds, dld, run_dir, fault_kinds)
    try:
        history = chaos.run()
    finally:
        chaos.teardown()
    violations = check(history)
    history["violations"] = violations
    (run_dir / "history.json").write_text(json.dumps(history, indent=1))
    text = summary(history, violations, run_dir)
    (run_dir / "summary.txt").write_text(text)
    print(text, flush=True)
    # The downloaded files are only needed to check them.
    shutil.rmtree(chaos.shared, ignore_errors=True)
    return len(violations)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    origin = sub.add_parser("origin", help="(internal) serve the origin in its namespace")
    origin.add_argument("--folder", required=True)
    again = sub.add_parser("check", help="check saved histories again (the rules as they are now; files as recorded)")
    again.add_argument("histories", nargs="+")
    parser.add_argument("--dld", default=".build/debug/dld", help="the dld binary")
    parser.add_argument("--out", default=".build/fleet-chaos", help="where run folders go")
    args = parser.parse_args()
    if args.command == "origin":
        serve_origin(Path(args.folder))
        return 0
    if args.command == "check":
        found = 0
        for path in args.histories:
            violations = check(json.loads(Path(path).read_text()), files=False)
            found += len(violations)
            print(f"{path}: {len(violations)} violation(s)")
            for v in violations:
                print(f"  {v['kind']:<18} job {v['job']}: {v['detail']}")
        return 1 if found else 0
    if os.geteuid() != 0:
        print("fleet_chaos.py needs root (network namespaces, nftables)", file=sys.stderr)
        return 2
    # One run at a time on a machine: a second would remove the first one's namespaces.
    lock = open("/run/dld-fleet-chaos.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("another fleet_chaos.py runs on this machine", file=sys.stderr)
        return 2
    dld = os.path.abspath(args.dld)
    if not os.access(dld, os.X_OK):
        print(f"no dld binary at {dld} (swift build first)", file=sys.stderr)
        return 2
    short = os.environ.get("FLEET_CHAOS_SHORT", "") not in ("", "0")
    seconds = 35.0 if short else float(os.environ.get("FLEET_CHAOS_SECONDS") or 120)
    if os.environ.get("FLEET_CHAOS_SEED"):
        seeds = [int(os.environ["FLEET_CHAOS_SEED"])]
    else:
        count = 1 if short else int(os.environ.get("FLEET_CHAOS_SEEDS") or 5)
        first = random.SystemRandom().randrange(1, 1_000_000)
        seeds = [first + n for n in range(count)]
    fault_kinds = [k for k in (os.environ.get("FLEET_CHAOS_FAULTS") or ",".join(DEFAULT_FAULT_KINDS)).split(",") if k]
    if FAKETIME_LIB is None and "clock_step" in fault_kinds:
        log("no libfaketime (Debian's faketime; make deps installs it): clock steps are left out")
        fault_kinds.remove("clock_step")
    if unknown := set(fault_kinds) - set(FAULT_KINDS):
        print(f"unknown fault kinds {sorted(unknown)}; they are {', '.join(FAULT_KINDS)}", file=sys.stderr)
        return 2
    log(f"seeds: {' '.join(map(str, seeds))}; faults: {' '.join(fault_kinds)}")
    out = Path(args.out).absolute()
    failed: list[tuple[int, int]] = []
    for seed in seeds:
        found = run_seed(seed, seconds, dld, out, fault_kinds)
        if found:
            failed.append((seed, found))
    for seed, found in failed:
        print(f"seed {seed}: {found} violation(s)")
    if not failed:
        print(f"no violations in {len(seeds)} seed(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    sys.exit(main())
