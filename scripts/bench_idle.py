"""The `idle` part of `make bench` (issue 27): how often an idle dld wakes up. See
docs/benchmarks.md.

A fresh dld with its defaults (only paths given as flags, an empty queue), left alone for
BENCH_IDLE_SETTLE seconds (5) after its socket answered, then sampled for BENCH_IDLE_SECONDS
(30); then once more after one download (1 MiB from dld-origin) has completed, so that the
loops that run with transfers are seen to go back to sleep. A sample counts the voluntary plus
involuntary context switches of each of dld's threads, read from /proc/PID/task/TID/status
once a second. A thread that exits meanwhile counts with its last reading; one born meanwhile
counts from zero. Printed per thread name (several threads share a name: NIO's event loops,
dispatch's workers) and in all, per second. Target: at most 1 a second in all.

Reading /proc does not wake the process it reads. Imported by scripts/bench.py.
"""
import os, shutil, tempfile, time

from benchlib import Daemon, start_dld_origin, stop

SETTLE = float(os.environ.get("BENCH_IDLE_SETTLE", "5"))
SECONDS = float(os.environ.get("BENCH_IDLE_SECONDS", "30"))
TARGET = 1.0


def thread_switches(pid):
    """{tid: (name, voluntary + nonvoluntary switches)} of every thread of `pid` now."""
    found = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        name, total = "?", 0
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Name:"):
                        name = line.split(None, 1)[1].strip() if len(line.split(None, 1)) > 1 else "?"
                    elif line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                        total += int(line.split()[1])
        except (OSError, ValueError):
            continue  # the thread ended between the listing and the read
        found[int(tid)] = (name, total)
    return found


def sample(pid, seconds):
    """Switches of each thread over `seconds`: {tid: (name, count)}."""
    first = thread_switches(pid)
    last = dict(first)
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(1.0, left))
        for tid, entry in thread_switches(pid).items():
            last[tid] = entry
    counts = {}
    for tid, (name, total) in last.items():
        before = first.get(tid, (name, 0))[1]
        counts[tid] = (name, total - before)
    return counts


def report(counts, seconds):
    """Prints wake-ups a second by thread name and in all; returns the total a second."""
    by_name = {}
    for name, count in counts.values():
        threads, switches = by_name.get(name, (0, 0))
        by_name[name] = (threads + 1, switches + count)
    total = sum(count for _, count in counts.values()) / seconds
    print(f"  {'thread name':<24} {'threads':>7} {'wake-ups/s':>11}")
    for name, (threads, switches) in sorted(by_name.items(), key=lambda item: (-item[1][1], item[0])):
        print(f"  {name:<24} {threads:>7} {switches / seconds:>11.2f}")
    verdict = "within" if total <= TARGET else "over"
    print(f"  {'all':<24} {len(counts):>7} {total:>11.2f}   ({verdict} the target of {TARGET:g}/s)")
    return total


def measure(daemon, title):
    print(f"  {title}:")
    time.sleep(SETTLE)
    counts = sample(daemon.proc.pid, SECONDS)
    if not daemon.alive():
        print("  dld exited during the sample")
        return None
    return report(counts, SECONDS)


def download_one(daemon, base):
    """One 1 MiB download from dld-origin, waited for: the loops that run with transfers ran."""
    client = daemon.client()
    try:
        job = client.call("enqueue", {"url": f"{base}/bytes/{1 << 20}", "name": "one.bin"})["job"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = client.call("status", {"id": job["id"]})["state"]
            if state in ("completed", "failed", "canceled"):
                return state
            time.sleep(0.1)
        return "not finished after 60 s"
    finally:
        client.close()


def part_idle():
    print(f"idle: a fresh dld with its defaults, {SETTLE:g} s to settle, then {SECONDS:g} s of context switches "
          f"(/proc/PID/task/*/status); target <= {TARGET:g}/s")
    work = tempfile.mkdtemp(prefix="dld-bench-idle-")
    daemon = Daemon(work, os.path.join(work, "state"), os.path.join(work, "dl"))
    origin = None
    try:
        daemon.start()
        # The sampler thread of `Daemon` reads VmHWM of the process; it does not wake dld.
        if measure(daemon, "an empty queue") is None:
            return
        origin, base = start_dld_origin()
        state = download_one(daemon, base)
        stop(origin)
        origin = None
        if measure(daemon, f"after one download ({state}), nothing queued") is None:
            return
        status, _ = daemon.terminate()
        print(f"  SIGTERM: {status}")
    finally:
        stop(origin)
        daemon.kill()
        shutil.rmtree(work, ignore_errors=True)


