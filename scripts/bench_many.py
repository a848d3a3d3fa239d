"""The many-jobs parts of `make bench` (issue 8): "small" and "scale". See docs/benchmarks.md.

small  N files of 16 KiB (default 2000) from one loopback origin, fetched by dld (one job per
       file, default config), by dld as ONE group, and by aria2c -j16, curl --parallel and
       wget when they are installed; wall times side by side, every file checked byte for byte.
scale  N jobs (default 100 000) in one fresh daemon: enqueue them paused, list them, status
       latency while 16 transfers run, start-up with N rows, resume/pause/cancel with `all`,
       SIGTERM; time of each step, RSS after each, peak RSS. Every step has a deadline
       (BENCH_STEP_TIMEOUT, default 400 s); a step that times out or crashes dld is recorded as
       such and the next one starts with a fresh dld on the same state folder.

Imported by scripts/bench.py (the one entry point, `make bench`).
"""
import hashlib, os, shutil, statistics, subprocess, tempfile, time, urllib.request

from benchlib import (BIN, STEP_TIMEOUT, ConnectionClosed, Daemon, RpcError, exit_text, proc_status_kib, start_dld_origin, with_postgres_and_origin,
                      start_nginx, stop)

SMALL_SIZE = 16 << 10

# Jobs per `enqueue` call in the scale part: the issue's own measure (20 calls of 5000). Each job
# is about 80 bytes of JSON; protocol 2 allows 10 000 jobs and 4 MiB per call.
ENQUEUE_CHUNK = int(os.environ.get("BENCH_ENQUEUE_CHUNK", "5000"))
# `list` page size asked for: the protocol's maximum. Since protocol 2 a page holds at most
# PAGE_HOLDS jobs whatever the limit, and `next_after_id` goes on from there.
LIST_PAGE = 10_000
PAGE_HOLDS = 1000
# The transfers that run while `status` latency is measured: slow enough (16 × 1 MB/s) to stay
# running through 1000 calls, small enough that the disk-space check never refuses them.
SLOW_TRANSFERS = 16
SLOW_RATE = 1_000_000
SLOW_SIZE = 256 << 20
STATUS_CALLS = 1000


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def verify(folder, expected):
    """None when every expected file is in `folder` with the expected SHA-256, else what is wrong."""
    missing, wrong = 0, 0
    for name, digest in expected.items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            missing += 1
        elif sha256_file(path) != digest:
            wrong += 1
    if missing or wrong:
        return f"{missing} missing, {wrong} with wrong bytes (of {len(expected)})"
    return None


# MARK: - small

def small_origin(work, files):
    """Returns (origin process, origin name, [(url, name)], {name: sha256})."""
    names = [f"f{i:05d}.bin" for i in range(files)]
    docroot = os.path.join(work, "www")
    os.makedirs(docroot)
    digests = {}
    for name in names:
        data = os.urandom(SMALL_SIZE)
        with open(os.path.join(docroot, name), "wb") as f:
            f.write(data)
        os.chmod(os.path.join(docroot, name), 0o644)
        digests[name] = hashlib.sha256(data).hexdigest()
    started = start_nginx(work, docroot)
    if started:
        proc, base = started
        return proc, "nginx", [(f"{base}/{n}", n) for n in names], digests
    # Without nginx: dld-origin serves the same deterministic 16 KiB at /bytes/16384 for every
    # file. `name=` makes it send that name in Content-Disposition (for wget); the other tools
    # are given the name explicitly. The reference bytes are fetched once with urllib.
    print("  (nginx is not installed: using dld-origin, which serves identical bytes for every file)")
    proc, base = start_dld_origin()
    with urllib.request.urlopen(f"{base}/bytes/{SMALL_SIZE}", timeout=30) as response:
        digest = hashlib.sha256(response.read()).hexdigest()
    return proc, "dld-origin", [(f"{base}/bytes/{SMALL_SIZE}?name={n}", n) for n in names], {n: digest for n in names}


def write_lists(work, entries):
    """The same downloads in each tool's input format."""
    paths = {k: os.path.join(work, k) for k in ("aria2.list", "wget.list", "curl.cfg")}
    with open(paths["aria2.list"], "w") as f:
        # aria2's format, which dlctl -i reads too: a URL line, then indented options.
        f.writelines(f"{url}\n  out={name}\n" for url, name in entries)
    with open(paths["wget.list"], "w") as f:
        f.writelines(f"{url}\n" for url, _ in entries)
    return paths


def write_curl_config(path, entries, folder):
    with open(path, "w") as f:
        f.writelines(f'url = "{url}"\noutput = "{os.path.join(folder, name)}"\n' for url, name in entries)


def run_timed(argv, timeout):
    """(seconds, None) or (seconds, what went wrong); stdout is dropped, stderr kept for errors."""
    start = time.monotonic()
    try:
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.monotonic() - start, f"timed out after {timeout:.0f} s"
    elapsed = time.monotonic() - start
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return elapsed, f"{exit_text(done.returncode)}: {tail[0][:160]}"
    return elapsed, None


def small_dld(work, run, list_path, expected, group):
    """One fresh dld with its default config (flags only for paths), then dlctl enqueue --wait."""
    base = os.path.join(work, f"dld-{run}")
    os.makedirs(base)
    dl = os.path.join(base, "dl")
    daemon = Daemon(base, os.path.join(base, "state"), dl)
    try:
        daemon.start()
        argv = [os.path.join(BIN, "dlctl"), "enqueue", "--socket", daemon.sock, "-i", list_path, "--wait"]
        if group:
            # A group's folder need not exist: it appears whole once every member is verified.
            target = os.path.join(dl, "group")
            argv += ["--group", "small", "-d", target]
        else:
            target = dl
            argv += ["-d", dl]
        seconds, error = run_timed(argv, STEP_TIMEOUT)
        if error is None:
            error = verify(target, expected)
        if not daemon.alive():
            error = f"dld {exit_text(daemon.proc.returncode)}" + (f"; {error}" if error else "")
        return seconds, error, daemon.peak_mib()
    finally:
        daemon.terminate(timeout=60)


# Rounds of the small-files part, each running every tool once, the order rotated from round to
# round, and the median of each tool counts. Every tool's files stay until the part ends (about
# 32 MiB a run): creating files on this VM's ext4 (no journal) is slow for some 30 s after many
# were deleted, as the kernel skips recently freed inodes, so deleting one tool's files before
# the next ran made whoever came later pay for them (seen: 2.3 s first, 4.3 s third).
SMALL_ROUNDS = int(os.environ.get("BENCH_SMALL_ROUNDS", "3"))


# Where the small-files part writes. On this VM's ext4 (no journal), creating files is slow for
# minutes after thousands were deleted (the kernel skips recently freed inodes), so a run that
# followed another run, or a test suite, measured the disk's memory of it: curl's 2000 files
# took anywhere from 0.11 to 1.8 s. As root, the part makes a fresh ext4 (with a journal, as
# most users' filesystems have) in a sparse image, mounts it on a loop device, writes every
# tool's files there, and removes it at the end: the same empty filesystem for every run.
# BENCH_SMALL_FS=tmp keeps the old way (a folder under $TMPDIR); so does a machine where the
# image cannot be made or mounted, with a note.
SMALL_FS = os.environ.get("BENCH_SMALL_FS", "fresh")


def fresh_filesystem(files, tools):
    """(mount point, cleanup, None) of a new ext4 big enough for every tool's files plus dld's
    low-space floor (1 GiB), or (None, None, why not)."""
    if SMALL_FS != "fresh":
        return None, None, f"BENCH_SMALL_FS={SMALL_FS}"
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4") or not shutil.which("mount"):
        return None, None, "a fresh filesystem needs root, mkfs.ext4 and mount"
    holder = tempfile.mkdtemp(prefix="dld-bench-fs-", dir=os.environ.get("BENCH_FS_IMAGE_DIR", "/var/tmp"))
    image, point = os.path.join(holder, "fs.img"), os.path.join(holder, "mnt")
    os.makedirs(point)
    size = (1 << 30) + 2 * files * SMALL_SIZE * tools * SMALL_ROUNDS + (512 << 20)

    def cleanup():
        subprocess.run(["umount", point], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(holder, ignore_errors=True)
    try:
        with open(image, "wb") as f:
            f.truncate(size)
        # Inode tables and journal written now, so that no background thread zeroes them while
        # the tools run.
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", image],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        subprocess.run(["mount", "-o", "loop", image, point], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except (OSError, subprocess.CalledProcessError) as error:
        cleanup()
        detail = getattr(error, "stderr", b"") or b""
        return None, None, f"could not make a fresh filesystem ({detail.decode(errors='replace').strip()[:120] or error})"
    return point, cleanup, None


def part_small(files):
    work = tempfile.mkdtemp(prefix="dld-bench-small-")
    origin = None
    cleanup_fs = None
    try:
        origin, origin_name, entries, expected = small_origin(work, files)
        lists = write_lists(work, entries)
        print(f"small files: {files} × {SMALL_SIZE >> 10} KiB from {origin_name} on loopback; "
              f"each tool into a fresh folder, every file checked by SHA-256; {SMALL_ROUNDS} rounds, "
              f"the order rotated each round, medians compared")

        def curl_config(out):
            write_curl_config(lists["curl.cfg"], entries, out)
            return lists["curl.cfg"]

        def dld_runner(run, group):
            def go(round_index):
                seconds, error, peak = small_dld(out_root, f"{run}-{round_index}", lists["aria2.list"], expected, group=group)
                return seconds, error, f"peak RSS {peak:.1f} MiB"
            return go

        def tool_runner(program, argv):
            def go(round_index):
                out = os.path.join(out_root, f"out-{program}-{round_index}")
                os.makedirs(out)
                seconds, error = run_timed(argv(out), STEP_TIMEOUT)
                return seconds, error or verify(out, expected), ""
            return go

        # (label, program that must be installed or None, runner)
        runners = [
            ("dld (dlctl enqueue -i --wait)", None, dld_runner("jobs", False)),
            ("dld, one group (--group)", None, dld_runner("group", True)),
            ("aria2c -j16", "aria2c", tool_runner("aria2c", lambda out: [
                "aria2c", "-j16", "-i", lists["aria2.list"], "-d", out, "-q", "--allow-overwrite=true",
                "--auto-file-renaming=false"])),
            ("curl --parallel --parallel-max 16", "curl", tool_runner("curl", lambda out: [
                "curl", "-s", "-S", "--fail", "--parallel", "--parallel-max", "16", "-K", curl_config(out)])),
            # wget names files from the URL; with dld-origin the URL's `name=` comes back as
            # Content-Disposition, which --content-disposition turns into the file name.
            ("wget -i (one at a time)", "wget", tool_runner("wget", lambda out: [
                "wget", "-q", "-i", lists["wget.list"], "-P", out, "--content-disposition"])),
        ]
        for label, program, _ in runners:
            if program and not shutil.which(program):
                print(f"  note: {program} is not installed; skipping `{label}`")
        runners = [r for r in runners if not r[1] or shutil.which(r[1])]
        # Every tool writes under `out_root` (the runners read it when they run): the fresh
        # filesystem, sized for the tools that run, when one could be made.
        out_root, cleanup_fs, why = fresh_filesystem(files, tools=len(runners))
        if out_root is None:
            print(f"  note: the files are written under {work} ({why})")
            out_root = work
        else:
            print(f"  the files are written to a fresh ext4 (with a journal) on a loop device at {out_root}")

        times = {label: [] for label, _, _ in runners}  # seconds of the good runs
        errors = {label: None for label, _, _ in runners}
        notes = {label: [] for label, _, _ in runners}
        for round_index in range(SMALL_ROUNDS):
            shift = round_index % len(runners)
            for label, _, go in runners[shift:] + runners[:shift]:
                seconds, error, note = go(round_index)
                shown = f"{seconds:8.2f} s" if seconds is not None else "       —  "
                print(f"  … round {round_index + 1}: {label:34} {shown}  {error or 'ok'} {note}", flush=True)
                if error:
                    errors[label] = error
                else:
                    times[label].append(seconds)
                if note:
                    notes[label].append(note)

        def median(label):
            good = times.get(label) or []
            return statistics.median(good) if good and errors.get(label) is None else None

        aria, curl = median("aria2c -j16"), median("curl --parallel --parallel-max 16")
        ratio = lambda s, ref: f"{s / ref:10.2f}" if s is not None and ref else f"{'—':>10}"
        print(f"\n  {'tool (median of the rounds)':34} {'seconds':>9} {'÷ aria2c':>10} {'÷ curl':>10}   all rounds")
        for label, _, _ in runners:
            m = median(label)
            shown = f"{m:9.2f}" if m is not None else f"{'—':>9}"
            every = ", ".join(f"{t:.2f}" for t in times[label])
            tail = f"   {errors[label]}" if errors[label] else f"   {every}" + (f" ({notes[label][-1]})" if notes[label] else "")
            print(f"  {label:34} {shown} {ratio(m, aria)} {ratio(m, curl)}{tail}")
        dld = median("dld (dlctl enqueue -i --wait)")
        print("  targets: dld ≤ 0.5 × aria2c -j16; dld ≤ 3 × curl --parallel", end="")
        if dld is not None:
            parts = []
            if aria:
                parts.append(f"dld/aria2c {dld / aria:.2f} ({'met' if dld <= 0.5 * aria else 'not met'})")
            if curl:
                parts.append(f"dld/curl {dld / curl:.2f} ({'met' if dld <= 3 * curl else 'not met'})")
            print(" — " + "; ".join(parts) if parts else "")
        else:
            print(" — dld did not complete")
    finally:
        stop(origin)
        if cleanup_fs:
            cleanup_fs()
        shutil.rmtree(work, ignore_errors=True)


# MARK: - scale

class ScaleRun:
    """One daemon (restarted on the same state folder when a step kills it) and the results."""

    def __init__(self, work, n, base, database=None):
        self.work, self.n, self.base = work, n, base
        self.daemon = Daemon(work, os.path.join(work, "state"), os.path.join(work, "dl"),
                             extra=["--max-active", str(SLOW_TRANSFERS)])
        # The 16 slow transfers all go to one host: let them all run (dld's default is 6).
        os.makedirs(os.path.join(work, "cfg", "dld"), exist_ok=True)
        with open(os.path.join(work, "cfg", "dld", "config.toml"), "w") as f:
            f.write(f"max_per_host = {SLOW_TRANSFERS}\n")
            if database:
                f.write(f'database = "{database}"\n')
        self.rows = []  # (step, result, RSS after in MiB or None)
        self.queue_paused = False  # re-applied after a restart (dld does not keep it)

    def log(self, step, result):
        rss = self.daemon.rss_mib() if self.daemon.alive() else None
        # The peak so far of this dld process, to tell which step set the peak.
        hwm = proc_status_kib(self.daemon.proc.pid, "VmHWM") if rss is not None else None
        self.rows.append((step, result, rss))
        print(f"  … {step:44} {result}" + (f"   [RSS {rss:.1f} MiB" + (f", peak so far {hwm / 1024:.1f} MiB" if hwm else "") + "]"
                                          if rss is not None else ""), flush=True)

    def ensure_running(self):
        """After a crash or a timeout: a fresh dld on the same state folder, or False."""
        if self.daemon.alive():
            return True
        try:
            seconds = self.daemon.start()
            if self.queue_paused:
                c = self.daemon.client()
                c.call("queue", {"paused": True})
                c.close()
            self.log("  (restarted dld)", f"serving after {seconds:.2f} s")
            return True
        except Exception as e:  # recorded, and the remaining steps are skipped
            self.log("  (restart dld)", f"failed: {e}")
            return False

    def step(self, name, fn, needs_daemon=True):
        """Runs fn() -> result text; a timeout, crash or error is recorded as the result.
        Steps that start dld themselves pass needs_daemon=False (one daemon per state folder)."""
        if needs_daemon and not self.ensure_running():
            self.log(name, "skipped (no daemon)")
            return
        start = time.monotonic()
        try:
            result = fn()
        except TimeoutError as e:
            result = f"timed out after {time.monotonic() - start:.0f} s ({e})"
            self.daemon.kill()
        except (ConnectionClosed, OSError) as e:
            # Give a crashing process a moment to be reaped, so the exit status is known.
            try:
                self.daemon.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if self.daemon.alive():
                result = f"connection lost after {time.monotonic() - start:.1f} s: {e}"
                self.daemon.kill()
            else:
                result = f"dld {exit_text(self.daemon.proc.returncode)} after {time.monotonic() - start:.1f} s"
        except RpcError as e:
            result = f"error after {time.monotonic() - start:.1f} s: {e}"
        self.log(name, result)

    # The steps. Each returns its result as text; times are dld's (from sending a request until
    # the last byte of its reply), without the Python client's own JSON work.

    def enqueue_paused(self):
        c = self.daemon.client()
        deadline = time.monotonic() + STEP_TIMEOUT
        url = f"{self.base}/bytes/{SMALL_SIZE}"
        in_calls, created, wall = 0.0, 0, time.monotonic()
        for first in range(0, self.n, ENQUEUE_CHUNK):
            jobs = [{"url": url, "name": f"j{i:06d}.bin", "paused": True} for i in range(first, min(self.n, first + ENQUEUE_CHUNK))]
            sent = time.monotonic()
            result = c.call("enqueue", {"jobs": jobs}, timeout=deadline - sent)
            in_calls += c.last_reply_at - sent
            created += len(result["results"])
        c.close()
        calls = -(-self.n // ENQUEUE_CHUNK)
        return (f"{in_calls:.2f} s ({created} jobs, {calls} calls of ≤ {ENQUEUE_CHUNK}; "
                f"{created / in_calls:.0f} jobs/s; wall {time.monotonic() - wall:.2f} s)")

    def list_all(self):
        c = self.daemon.client()
        deadline = time.monotonic() + STEP_TIMEOUT
        in_calls, seen, after, pages = 0.0, 0, 0, 0
        # Bounded: a few pages more than the table can fill.
        for _ in range(self.n // PAGE_HOLDS + 3):
            sent = time.monotonic()
            result = c.call("list", {"limit": LIST_PAGE, "after_id": after}, timeout=deadline - sent)
            in_calls += c.last_reply_at - sent
            pages += 1
            seen += len(result["jobs"])
            after = result["next_after_id"]
            if after is None:
                break
        c.close()
        return f"{in_calls:.2f} s ({seen} jobs in {pages} pages of ≤ {LIST_PAGE})"

    def status_latency(self):
        c = self.daemon.client()
        jobs = [{"url": f"{self.base}/bytes/{SLOW_SIZE}?rate={SLOW_RATE}", "name": f"slow-{k:02d}.bin"}
                for k in range(SLOW_TRANSFERS)]
        # Protocol 2 answers {id, created, path} a job; protocol 1 answered the whole job.
        ids = [r["id"] if "id" in r else r["job"]["id"] for r in c.call("enqueue", {"jobs": jobs})["results"]]
        # Wait (bounded) until all of them run.
        deadline = time.monotonic() + min(60, STEP_TIMEOUT)
        active = 0
        while time.monotonic() < deadline:
            active = c.call("stats")["active"]
            if active >= SLOW_TRANSFERS:
                break
            time.sleep(0.1)
        latencies = []
        end = time.monotonic() + STEP_TIMEOUT
        for _ in range(STATUS_CALLS):
            sent = time.perf_counter()
            c.call("status", {"id": ids[0]}, timeout=max(0.001, end - time.monotonic()))
            latencies.append((time.perf_counter() - sent) * 1000)
        still = c.call("stats")["active"]
        c.call("cancel", {"ids": ids})
        c.close()
        q = statistics.quantiles(latencies, n=100, method="inclusive")
        return (f"p50 {statistics.median(latencies):.2f} ms, p99 {q[98]:.2f} ms, max {max(latencies):.2f} ms "
                f"({STATUS_CALLS} calls; {active} running at the start, {still} at the end)")

    def sigterm(self):
        text, seconds = self.daemon.terminate()
        return f"{text} after {seconds:.2f} s"

    def restart(self):
        if self.daemon.alive():  # one daemon per state folder
            self.daemon.terminate()
        return f"serving after {self.daemon.start():.2f} s"

    def pause_queue(self):
        c = self.daemon.client()
        c.call("queue", {"paused": True})
        c.close()
        self.queue_paused = True
        return "queue paused (nothing starts, so the bulk commands below measure only themselves)"

    def bulk(self, method):
        def run():
            c = self.daemon.client()
            sent = time.monotonic()
            result = c.call(method, {"all": True})
            seconds = c.last_reply_at - sent
            c.close()
            changed = result["count"] if "count" in result else len(result["jobs"])
            return f"{seconds:.2f} s ({changed} jobs changed, reply {c.last_reply_bytes} B)"
        return run


def dlctl_big_list(work, n, base):
    """`dlctl enqueue -i` of an n-line list against its own fresh daemon. dlctl 0.1.0 sent one
    request line for the whole list and failed over `max_line_bytes`; 0.2.0 splits it. A
    failure is reported as the result."""
    sub = os.path.join(work, "dlctl-i")
    os.makedirs(sub)
    list_path = os.path.join(sub, "list")
    with open(list_path, "w") as f:
        f.writelines(f"{base}/bytes/{SMALL_SIZE}\n  out=k{i:06d}.bin\n" for i in range(n))
    daemon = Daemon(sub, os.path.join(sub, "state"), os.path.join(sub, "dl"))
    try:
        daemon.start()
        seconds, error = run_timed([os.path.join(BIN, "dlctl"), "enqueue", "--socket", daemon.sock, "--paused",
                                    "-i", list_path, "-d", daemon.dl], STEP_TIMEOUT)
        if not daemon.alive():
            error = f"dld {exit_text(daemon.proc.returncode)}" + (f"; {error}" if error else "")
        peak = daemon.peak_mib()
        return f"{seconds:.2f} s, " + (f"failed: {error}" if error else "ok") + f" (dld peak RSS {peak:.1f} MiB)"
    except Exception as e:
        return f"failed: {e}"
    finally:
        daemon.terminate(timeout=60)


def run_scale_steps(run, n):
    """The timed steps of the scale part, in order, on one ScaleRun."""
    run.step("start (empty table)", run.restart, needs_daemon=False)
    run.step(f"enqueue {n} paused", run.enqueue_paused)
    run.step(f"list all (pages of {LIST_PAGE})", run.list_all)
    run.step(f"status ×{STATUS_CALLS}, {SLOW_TRANSFERS} transfers running", run.status_latency)
    run.step("SIGTERM", run.sigterm)
    run.step(f"start with {n} rows (spawn → `version`)", run.restart, needs_daemon=False)
    run.step("queue pause", run.pause_queue)
    run.step("resume all", run.bulk("resume"))
    run.step("pause all", run.bulk("pause"))
    run.step("cancel all", run.bulk("cancel"))
    run.step("SIGTERM", run.sigterm)


def part_scale(n):
    work = tempfile.mkdtemp(prefix="dld-bench-scale-")
    origin = None
    try:
        # dld-origin serves the jobs' URL and the throttled transfers (nginx is not needed).
        origin, base = start_dld_origin()
        print(f"scale: {n} jobs in one fresh dld (--max-active {SLOW_TRANSFERS}), enqueue calls of ≤ {ENQUEUE_CHUNK} jobs, "
              f"each step bounded by {STEP_TIMEOUT:.0f} s (BENCH_STEP_TIMEOUT)")
        run = ScaleRun(work, n, base)
        run_scale_steps(run, n)
        peak = run.daemon.peak_mib()
        run.daemon.kill()
        big = dlctl_big_list(work, n, base)
        run.rows.append((f"dlctl enqueue -i ({n}-line list, own daemon)", big, None))
        print(f"  … {'dlctl enqueue -i of the whole list':44} {big}", flush=True)

        print(f"\n  {'step':48} {'RSS after':>10}  result")
        for step, result, rss in run.rows:
            print(f"  {step:48} {(f'{rss:.1f} MiB' if rss is not None else '—'):>10}  {result}")
        print(f"  dld peak RSS (VmHWM, all steps): {peak:.1f} MiB")
    finally:
        stop(origin)
        shutil.rmtree(work, ignore_errors=True)


# MARK: - postgres

def part_postgres(n):
    """The scale steps on the same build with the job table in SQLite and in PostgreSQL (one
    daemon each, on the same two cores as the server), side by side."""
    with_postgres_and_origin("postgres", "dld-bench-pg-", lambda work, url, base: postgres_steps(work, url, base, n))


def postgres_steps(work, url, base, n):
    print(f"postgres: {n} jobs, the scale steps with the job table in SQLite, then in PostgreSQL "
          f"(a server on a Unix socket on this machine)")
    results = {}
    for label, database in (("SQLite", None), ("PostgreSQL", url)):
        sub = os.path.join(work, label)
        os.makedirs(sub)
        run = ScaleRun(sub, n, base, database=database)
        run_scale_steps(run, n)
        results[label] = (run.rows, run.daemon.peak_mib())
        run.daemon.kill()
    print(f"\n  {'step':48} {'SQLite':>40}   PostgreSQL")
    for (step, a, _), (_, b, _) in zip(results["SQLite"][0], results["PostgreSQL"][0]):
        short = lambda r: r.split(" (")[0][:40]
        print(f"  {step:48} {short(a):>40}   {short(b)}")
    print(f"  {'dld peak RSS':48} {results['SQLite'][1]:>36.1f} MiB   {results['PostgreSQL'][1]:.1f} MiB")

