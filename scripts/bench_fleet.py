"""The `fleet` part of `make bench`: several dld workers sharing one job table in PostgreSQL.

1. Throughput by worker count: the same jobs from an origin that throttles each connection
   (dld-origin's `rate=`), done by 1, 2 and 3 workers, each run on a fresh database, side by
   side. Each worker has the same `max_active`, so more workers mean more connections.
2. Claims at scale: FLEET_JOBS queued jobs in one table, the claim statement's plan and cost on
   it (`EXPLAIN ANALYZE`, rolled back), then three workers claim and complete them all.

Everything runs on this one machine (the workers, PostgreSQL and the origin share its cores),
so the figures show the claim path's cost and the scaling of a throttled origin, not what
several machines would reach.
"""

import os
import time

from benchlib import Daemon, psql, with_postgres_and_origin

THROTTLED_JOBS = int(os.environ.get("BENCH_FLEET_THROTTLED", "2000"))
THROTTLED_SIZE = 8192
THROTTLED_RATE = 160 * 1024  # bytes per second and connection: about 50 ms a file
WORKER_SLOTS = 6  # max_active of each worker (dld's default max_per_host)
FLEET_JOBS = int(os.environ.get("BENCH_FLEET_JOBS", "100000"))
RUN_TIMEOUT = float(os.environ.get("BENCH_STEP_TIMEOUT", "600"))

# The claim as PostgresJobStore.claim sends it (limit 6, no host excluded).
CLAIM_SQL = """
WITH picked AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE state = 'queued' AND group_id IS NULL AND host <> ALL('{}'::text[])
    ORDER BY priority DESC, id LIMIT 6
    FOR UPDATE SKIP LOCKED)
UPDATE jobs SET state = 'running', attempts = attempts + 1, updated_at = 0, worker = 'bench/explain', lease_until = 0
WHERE state = 'queued' AND id IN (SELECT id FROM picked)
RETURNING id
"""


def start_workers(work, url, shared, count, slots):
    workers = []
    for n in range(count):
        sub = os.path.join(work, f"w{n}")
        os.makedirs(os.path.join(sub, "cfg", "dld"))
        with open(os.path.join(sub, "cfg", "dld", "config.toml"), "w") as f:
            f.write(f'database = "{url}"\nworker_name = "bench{n}"\nmax_active = {slots}\n'
                    f'allowed_roots = ["{shared}"]\n')
        daemon = Daemon(sub, os.path.join(sub, "state"), os.path.join(sub, "dl"))
        daemon.start()
        workers.append(daemon)
    return workers


def enqueue(daemon, urls, shared):
    client = daemon.client(timeout=120)
    try:
        for first in range(0, len(urls), 5000):
            jobs = [{"url": u, "dir": shared, "name": f"f{first + i}.bin", "paused": True}
                    for i, u in enumerate(urls[first:first + 5000])]
            client.call("enqueue", {"jobs": jobs})
    finally:
        client.close()


def wait_all_completed(daemon, total):
    """Seconds until `stats` counts every job completed (polled every 50 ms), or None."""
    client = daemon.client(timeout=60)
    started = time.monotonic()
    try:
        while time.monotonic() - started < RUN_TIMEOUT:
            counts = client.call("stats")["counts"]
            if counts["completed"] == total:
                return time.monotonic() - started
            if counts["failed"] or counts["canceled"]:
                raise RuntimeError(f"jobs failed: {counts}")
            time.sleep(0.05)
        return None
    finally:
        client.close()


def check_files(shared, total, size):
    names = os.listdir(shared)
    wrong = [n for n in names if os.path.getsize(os.path.join(shared, n)) != size]
    if len(names) != total or wrong:
        return f"{len(names)} files, {len(wrong)} of the wrong size"
    return None


def run_fleet(work, url, database, count, urls, size, slots):
    """Enqueues `urls` paused through the first worker, resumes them all, and times until
    every job is completed. Returns (seconds, error)."""
    psql(url, f"CREATE DATABASE {database}", database="postgres")
    db_url = url.replace("@/bench?", f"@/{database}?")
    shared = os.path.join(work, "shared")
    os.makedirs(shared)
    workers = start_workers(work, db_url, shared, count, slots)
    try:
        enqueue(workers[0], urls, shared)
        client = workers[-1].client(timeout=120)
        client.call("resume", {"all": True})
        client.close()
        seconds = wait_all_completed(workers[0], len(urls))
        if seconds is None:
            return None, f"not done within {RUN_TIMEOUT:.0f} s"
        return seconds, check_files(shared, len(urls), size)
    finally:
        for daemon in workers:
            daemon.terminate(timeout=60)


def part_fleet():
    with_postgres_and_origin("fleet", "dld-bench-fleet-", fleet_runs)


def fleet_runs(work, url, base):
    print(f"fleet: {THROTTLED_JOBS} files of {THROTTLED_SIZE // 1024} KiB from dld-origin throttled to "
          f"{THROTTLED_RATE // 1024} KiB/s per connection, done by 1, 2 and 3 workers "
          f"(max_active {WORKER_SLOTS} each) sharing one table in PostgreSQL, each run on a fresh database")
    urls = [f"{base}/bytes/{THROTTLED_SIZE}?rate={THROTTLED_RATE}&file={i}" for i in range(THROTTLED_JOBS)]
    rows = []
    for count in (1, 2, 3):
        sub = os.path.join(work, f"throttled-{count}")
        os.makedirs(sub)
        seconds, error = run_fleet(sub, url, f"fleet{count}", count, urls, THROTTLED_SIZE, WORKER_SLOTS)
        result = f"{seconds:.2f} s, {THROTTLED_JOBS / seconds:.0f} files/s" if seconds else "—"
        print(f"  … {count} worker(s)   {result}" + (f"  ERROR {error}" if error else ""), flush=True)
        rows.append((count, seconds, error))
    one = rows[0][1]
    print(f"\n  {'workers':8} {'seconds':>8} {'files/s':>8} {'× 1 worker':>11}")
    for count, seconds, error in rows:
        if seconds:
            print(f"  {count:<8} {seconds:8.2f} {THROTTLED_JOBS / seconds:8.0f} {one / seconds if one else 0:11.2f}"
                  + (f"  ({error})" if error else ""))
        else:
            print(f"  {count:<8} {'—':>8}  ({error})")

    print(f"\n  claims at scale: {FLEET_JOBS} jobs of 1 byte in one table, 3 workers (max_active {WORKER_SLOTS} each)")
    sub = os.path.join(work, "scale")
    os.makedirs(sub)
    database = "fleetscale"
    psql(url, f"CREATE DATABASE {database}", database="postgres")
    db_url = url.replace("@/bench?", f"@/{database}?")
    shared = os.path.join(sub, "shared")
    os.makedirs(shared)
    workers = start_workers(sub, db_url, shared, 3, WORKER_SLOTS)
    try:
        started_at = time.monotonic()
        enqueue(workers[0], [f"{base}/bytes/1?file={i}" for i in range(FLEET_JOBS)], shared)
        print(f"  … enqueue {FLEET_JOBS} paused          {time.monotonic() - started_at:.2f} s")
        # The plan of one claim on the full queue, with the queue paused (the claim's
        # update is rolled back, so the jobs stay as they are).
        client = workers[0].client(timeout=120)
        client.call("queue", {"paused": True})
        for daemon in workers[1:]:
            c = daemon.client(timeout=120)
            c.call("queue", {"paused": True})
            c.close()
        client.call("resume", {"all": True})
        plan = psql(db_url, f"BEGIN; EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {CLAIM_SQL}; ROLLBACK;")
        print("  the claim on " + f"{FLEET_JOBS} queued jobs (EXPLAIN ANALYZE, rolled back):")
        for line in plan.strip().splitlines():
            print("      " + line)
        started_at = time.monotonic()
        for daemon in workers:
            c = daemon.client(timeout=120)
            c.call("queue", {"paused": False})
            c.close()
        client.close()
        seconds = wait_all_completed(workers[0], FLEET_JOBS)
        if seconds is None:
            print(f"  … claim and complete all              not done within {RUN_TIMEOUT:.0f} s")
        else:
            error = check_files(shared, FLEET_JOBS, 1)
            print(f"  … claim and complete all              {seconds:.1f} s, {FLEET_JOBS / seconds:.0f} jobs/s"
                  + (f"  ERROR {error}" if error else ", every file there"))
        peaks = ", ".join(f"{d.peak_mib():.1f}" for d in workers)
        print(f"  workers' peak RSS: {peaks} MiB")
    finally:
        for daemon in workers:
            daemon.terminate(timeout=60)
