"""The `cpu` part of `make bench` (issues 26 and 27): where a download's CPU goes, beside its
wall time. See docs/benchmarks.md.

1. One 1 GiB file from nginx on loopback, BENCH_CPU_RUNS (3) times: `curl -o`, dld with one
   stream (`segments = 1`) and dld with its defaults, in turn. For each: the wall time, the
   tool's own CPU (user + system, from `/usr/bin/time` for curl and `/proc/PID/stat` for the
   daemon) and the whole machine's CPU over the same interval (`/proc/stat`, which counts
   nginx and everything else). On a machine with N cores, a download cannot take less wall
   time than the machine's CPU / N: that is the floor the ratio to curl meets.
2. `openssl speed -evp sha256` at 16 KiB blocks: what the SHA-256 every job records costs
   per GiB on this machine's cores.
3. 2000 × 16 KiB from nginx into a fresh ext4 (as the `small` part makes one), BENCH_CPU_RUNS
   times with a fresh dld each: wall time and dld's CPU per file; and, where `perf` can put
   uprobes (root), what dld did per file: `sqlite3_step` calls, `swift_task_switch` (thread
   hops of Swift tasks), `swift_task_create`, and context switches. Counts move far less
   than times on a busy machine, so they compare builds where times cannot.

Figures only; nothing is asserted. Imported by scripts/bench.py.
"""
import os, shutil, signal, subprocess, tempfile, time

import bench_many
from benchlib import Daemon, start_nginx, write_file

RUNS = int(os.environ.get("BENCH_CPU_RUNS", "3"))
SIZE = int(os.environ.get("BENCH_SIZE_MIB", "1024")) << 20
TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid):
    """User + system seconds of `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_cpu():
    """Busy seconds of every core so far (all but idle and iowait)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICK


def dld_download(work, url, name, params):
    """(wall, dld's CPU, machine CPU) of one download by a fresh dld."""
    base = tempfile.mkdtemp(prefix="cpu-", dir=work)
    daemon = Daemon(base, os.path.join(base, "state"), os.path.join(base, "dl"))
    daemon.start()
    try:
        client = daemon.client()
        time.sleep(0.3)
        own, machine, start = process_cpu(daemon.proc.pid), machine_cpu(), time.monotonic()
        job = client.call("enqueue", {"url": url, "name": name, **params})["job"]
        while (state := client.call("status", {"id": job["id"]})["state"]) not in ("completed", "failed", "canceled"):
            time.sleep(0.005)
        wall = time.monotonic() - start
        result = (wall, process_cpu(daemon.proc.pid) - own, machine_cpu() - machine)
        if state != "completed":
            raise RuntimeError(f"dld's download {state}")
        return result
    finally:
        daemon.terminate(timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def curl_download(url, out):
    machine, start = machine_cpu(), time.monotonic()
    done = subprocess.run(["/usr/bin/time", "-f", "%U %S", "curl", "-s", "-o", out, url],
                          capture_output=True, text=True, check=True)
    wall = time.monotonic() - start
    user, system = map(float, done.stderr.split()[-2:])
    os.unlink(out)
    return wall, user + system, machine_cpu() - machine


def sha256_rate():
    """SHA-256 bytes a second on one core (16 KiB blocks), or None without openssl."""
    if not shutil.which("openssl"):
        return None
    done = subprocess.run(["openssl", "speed", "-seconds", "1", "-bytes", "16384", "-evp", "sha256"],
                          capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("sha256"):
            return float(line.split()[-1].rstrip("k")) * 1000
    return None


def one_big_file(work):
    docroot = os.path.join(work, "www")
    os.makedirs(docroot)
    write_file(os.path.join(docroot, "big.bin"), SIZE)
    started = start_nginx(work, docroot)
    if not started:
        print("  nginx is not installed: the 1 GiB figures are skipped")
        return
    proc, base = started
    url = f"{base}/big.bin"
    tools = [("curl -o", lambda i: curl_download(url, os.path.join(work, "curl.bin"))),
             ("dld segments=1", lambda i: dld_download(work, url, f"one-{i}.bin", {"segments": 1})),
             ("dld (defaults)", lambda i: dld_download(work, url, f"big-{i}.bin", {}))]
    rows = {name: [] for name, _ in tools}
    try:
        print(f"  {SIZE >> 20} MiB from nginx on loopback, {RUNS} rounds, tools in turn ({os.cpu_count()} cores)")
        for i in range(RUNS):
            for name, run in tools:
                rows[name].append(run(i))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    print(f"  {'tool':18s} {'wall s':>8s} {'own CPU s':>10s} {'machine CPU s':>14s} {'floor s':>8s}   (best wall of the rounds; floor = machine CPU / cores)")
    best = {}
    for name, results in rows.items():
        wall, own, machine = min(results)
        best[name] = wall
        print(f"  {name:18s} {wall:8.3f} {own:10.2f} {machine:14.2f} {machine / (os.cpu_count() or 1):8.2f}")
    for name in ("dld segments=1", "dld (defaults)"):
        print(f"  {name} / curl -o   {best[name] / best['curl -o']:.2f}")
    rate = sha256_rate()
    if rate:
        print(f"  SHA-256 on one core: {rate / 1e9:.2f} GB/s, {SIZE / rate:.2f} s of CPU for {SIZE >> 20} MiB")


PROBES = {
    "probe_libsqlite3:sqlite3_step": ("/lib/x86_64-linux-gnu/libsqlite3.so.0", "sqlite3_step"),
    "probe_libswift_Concurrency:swift_task_switch": ("libswift_Concurrency.so", "swift_task_switch"),
    "probe_libswift_Concurrency:swift_task_create": ("libswift_Concurrency.so", "swift_task_create"),
}


def probes_ready(dld):
    """Adds the uprobes `counting` reads, once; False where perf or root is missing."""
    if os.geteuid() != 0 or shutil.which("perf") is None:
        return False
    have = subprocess.run(["perf", "probe", "-l"], capture_output=True, text=True).stdout
    libs = subprocess.run(["ldd", dld], capture_output=True, text=True).stdout.split("\n")
    for event, (library, function) in PROBES.items():
        if event.split(":")[1] in have:
            continue
        path = next((line.split("=>")[1].split()[0] for line in libs if library.split("/")[-1].split(".so")[0] + ".so" in line
                     and "=>" in line), library)
        if subprocess.run(["perf", "probe", "-x", path, function], capture_output=True).returncode != 0:
            return False
    return True


def counting(pid, out):
    """`perf stat` of the probes and context switches on `pid`, written to `out` when stopped."""
    return subprocess.Popen(["perf", "stat", "-x,", "-o", out, "-e", ",".join(list(PROBES) + ["context-switches"]),
                             "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def counted(perf, out, files):
    perf.send_signal(signal.SIGINT)
    perf.wait(timeout=30)
    names = {"sqlite3_step": "steps", "swift_task_switch": "task switches", "swift_task_create": "tasks",
             "context-switches": "context switches"}
    figures = []
    for line in open(out):
        parts = line.strip().split(",")
        if len(parts) > 2 and parts[0][:1].isdigit():
            figures.append(f"{float(parts[0]) / files:.1f} {names.get(parts[2].split(':')[-1], parts[2])}")
    return ", ".join(figures) + " a file"


def small_files(bin_dir, files=2000):
    point, cleanup, why = bench_many.fresh_filesystem(files, RUNS)
    work = tempfile.mkdtemp(prefix="dld-bench-cpu-", dir=point) if point else tempfile.mkdtemp(prefix="dld-bench-cpu-")
    for path in ([os.path.dirname(point), point] if point else []) + [work]:
        os.chmod(path, 0o755)
    try:
        proc, origin, entries, _ = bench_many.small_origin(work, files)
        lists = bench_many.write_lists(work, entries)
        probes = probes_ready(os.path.join(bin_dir, "dld"))
        try:
            print(f"  {files} × 16 KiB from {origin}" + (f" into a fresh ext4" if point else f" ({why})"))
            for i in range(RUNS):
                base = tempfile.mkdtemp(prefix="cpu-small-")
                dl = os.path.join(work, f"dl{i}")
                daemon = Daemon(base, os.path.join(base, "state"), dl)
                daemon.start()
                try:
                    perf = counting(daemon.proc.pid, os.path.join(base, "perf.txt")) if probes else None
                    time.sleep(0.3 if perf else 0)
                    own, start = process_cpu(daemon.proc.pid), time.monotonic()
                    done = subprocess.run([os.path.join(bin_dir, "dlctl"), "enqueue", "--socket", daemon.sock,
                                           "-i", lists["aria2.list"], "--wait", "-d", dl], stdout=subprocess.DEVNULL)
                    wall = time.monotonic() - start
                    cpu = process_cpu(daemon.proc.pid) - own
                    status = "ok" if done.returncode == 0 else f"dlctl exited {done.returncode}"
                    print(f"  … run {i + 1}: {wall:.3f} s, dld CPU {cpu:.2f} s, {cpu / files * 1000:.3f} ms a file  {status}")
                    if perf:
                        print(f"    {counted(perf, os.path.join(base, 'perf.txt'), files)}")
                finally:
                    daemon.terminate(timeout=60)
                    shutil.rmtree(base, ignore_errors=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if cleanup:
            cleanup()


def part_cpu(bin_dir):
    print("cpu: wall time beside CPU time (figures only)")
    work = tempfile.mkdtemp(prefix="dld-bench-cpu-")
    os.chmod(work, 0o755)
    try:
        one_big_file(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    small_files(bin_dir)
