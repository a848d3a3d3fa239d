#!/usr/bin/env python3
"""Where a small file's cost goes (issue #38): 2000 x 16 KiB from nginx into a fresh ext4 (the
`small`/`cpu` parts' origin), one run of `dlctl enqueue -i LIST --wait`, with dld under perf:

  steps     every `sqlite3_step` call, attributed to the innermost function of dld's own
            modules on its call stack (perf record -g on a uprobe);
  switches  every `swift_task_switch`, attributed to the async function it resumes into (its
            resumeFunction argument, %rdi, symbolized against the binary that holds it: call
            stacks of async code do not name the caller).

Counts per file, most first. Counts, not times: they move far less than times on a busy
machine, so they compare builds. Needs root and perf (uprobes); a debug build names more
functions (less inlining), a release build gives the figures that count.

Usage: scripts/bench_attribution.py BIN_DIR steps|switches [FILES]
"""
import bisect, collections, os, re, shutil, signal, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cpu, bench_many, benchlib  # noqa: E402
from benchlib import Daemon  # noqa: E402

OWN = re.compile(r"\$s\d*(DLEngine|DLStore|DLTransfer|DLDaemon|DLJobTable|DLCore)")


def demangle(names):
    out = subprocess.run(["swift", "demangle", "--simplified"], input="\n".join(names), capture_output=True, text=True)
    lines = out.stdout.split("\n") if out.returncode == 0 else names
    return dict(zip(names, lines))


def switch_probe(dld):
    """A uprobe on swift_task_switch that records its resumeFunction argument."""
    lib = next((l.split("=>")[1].split()[0] for l in subprocess.run(["ldd", dld], capture_output=True, text=True).stdout.split("\n")
                if "libswift_Concurrency" in l and "=>" in l), None)
    if lib is None:
        sys.exit("dld does not link libswift_Concurrency.so")
    if "tsfn" not in subprocess.run(["perf", "probe", "-l"], capture_output=True, text=True).stdout:
        subprocess.run(["perf", "probe", "-x", lib, "tsfn=swift_task_switch fn=%di:x64"], check=True, capture_output=True)
    return "probe_libswift_Concurrency:tsfn"


def symbolizer(maps):
    """addr -> (module, symbol) from a /proc/PID/maps text, with each module's nm table."""
    mods = []
    for line in maps.splitlines():
        parts = line.split()
        if len(parts) >= 6 and "x" in parts[1]:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            mods.append((lo, hi, int(parts[2], 16), parts[5]))
    tables, bases = {}, {}

    def table(path):
        if path not in tables:
            text = subprocess.run(["nm", "--defined-only", path], capture_output=True, text=True).stdout
            if not text.strip():
                text = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True).stdout
            entries = []
            for l in text.splitlines():
                p = l.split(" ", 2)
                if len(p) == 3 and p[1] in "tTwW":
                    entries.append((int(p[0], 16), p[2]))
            tables[path] = sorted(entries)
            loads = [l.split() for l in subprocess.run(["readelf", "-lW", path], capture_output=True, text=True).stdout.splitlines()
                     if l.strip().startswith("LOAD")]
            bases[path] = int(loads[0][2], 16) - int(loads[0][1], 16) if loads else 0
        return tables[path]

    def lookup(addr):
        mod = next((m for m in mods if m[0] <= addr < m[1]), None)
        if not mod:
            return ("?", "?")
        lo, _, off, path = mod
        entries = table(path)
        i = bisect.bisect_right(entries, (addr - lo + off + bases[path], "\uffff")) - 1
        return (os.path.basename(path), entries[i][1] if i >= 0 else "?")
    return lookup


def main():
    if len(sys.argv) < 3 or sys.argv[2] not in ("steps", "switches"):
        sys.exit(__doc__)
    bin_dir, what = sys.argv[1], sys.argv[2]
    # The daemon too (benchlib starts DLD_BIN_DIR's, else .build/release's).
    benchlib.BIN = os.path.abspath(bin_dir)
    files = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    dld = os.path.join(bin_dir, "dld")
    if os.geteuid() != 0 or shutil.which("perf") is None or not bench_cpu.probes_ready(dld):
        sys.exit("needs root and perf with uprobes")
    event = "probe_libsqlite3:sqlite3_step" if what == "steps" else switch_probe(dld)
    point, _, why = bench_many.fresh_filesystem(files, 1)
    work = tempfile.mkdtemp(prefix="dld-attrib-", dir=point) if point else tempfile.mkdtemp(prefix="dld-attrib-")
    for path in ([os.path.dirname(point), point] if point else []) + [work]:
        os.chmod(path, 0o755)
    base = tempfile.mkdtemp(prefix="dld-attrib-run-")
    try:
        proc, origin, entries, _ = bench_many.small_origin(work, files)
        lists = bench_many.write_lists(work, entries)
        dl = os.path.join(work, "dl")
        daemon = Daemon(base, os.path.join(base, "state"), dl)
        daemon.start()
        maps = open(f"/proc/{daemon.proc.pid}/maps").read()
        data = os.path.join(base, "perf.data")
        record = ["perf", "record", "-q", "-e", event, "-o", data, "-p", str(daemon.proc.pid)]
        rec = subprocess.Popen(record[:2] + (["-g"] if what == "steps" else []) + record[2:], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        time.sleep(1)
        start = time.monotonic()
        subprocess.run([os.path.join(bin_dir, "dlctl"), "enqueue", "--socket", daemon.sock, "-i", lists["aria2.list"], "--wait",
                        "-d", dl], stdout=subprocess.DEVNULL, check=True)
        wall = time.monotonic() - start
        rec.send_signal(signal.SIGINT)
        rec.wait()
        daemon.terminate(timeout=60)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        counts = collections.Counter()
        if what == "steps":
            script = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym"], capture_output=True, text=True).stdout
            for sample in script.split("\n\n"):
                frames = [l.strip().split(" ", 1)[-1] for l in sample.strip().split("\n")[1:] if l.strip()]
                own = next((re.sub(r"\+0x[0-9a-f]+$", "", f) for f in frames if OWN.search(f)), None)
                if frames:
                    counts[own or "(no frame of dld's own modules)"] += 1
        else:
            script = subprocess.run(["perf", "script", "-i", data, "-F", "trace"], capture_output=True, text=True).stdout
            lookup = symbolizer(maps)
            for addr in re.findall(r"fn=0x([0-9a-f]+)", script):
                module, symbol = lookup(int(addr, 16))
                counts[f"{module}: {symbol}"] += 1
        names = demangle([k.split(": ", 1)[-1] for k in counts])
        total = sum(counts.values())
        print(f"{files} x 16 KiB from {origin} ({'fresh ext4' if point else why}), {wall:.2f} s; "
              f"{what}: {total / files:.1f} a file")
        for key, n in counts.most_common(40):
            module = key.split(": ", 1)[0] + ": " if ": " in key and what == "switches" else ""
            print(f"{n / files:7.2f}  {module}{names.get(key.split(': ', 1)[-1], key)[:180]}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
