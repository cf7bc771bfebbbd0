#!/usr/bin/env python3
"""CPU time of one process over a window of its run, for bench/dcn_netns.sh.

  cpu_sample.py run --out FILE [--interval S] -- COMMAND [ARGS...]
      Runs COMMAND as a child (same process group, same stdin/stdout/stderr),
      passes SIGTERM, SIGINT and SIGHUP on to it, and every S seconds (default
      0.25) appends one JSON line to FILE:
        {"t": wall time (time.time(), the clock of metrics.jsonl's "time"),
         "proc": [utime, stime] of the child in clock ticks (all its threads),
         "threads": {"TID NAME": [utime, stime]},
         "sys": /proc/stat's first line (user nice system idle iowait irq
                softirq steal) in clock ticks, all CPUs,
         "net": [rx_bytes, tx_bytes] over the interfaces of this network
                namespace other than lo (/proc/self/net/dev)}
      Between samples it polls every 20 ms for the child's exit and for the
      first byte on its own stdout (when that is a regular file) and for the
      end of its device threads (a sample is taken at those moments too),
      and ends
      FILE with
        {"exit_t": when the child ended, "first_output_t": when stdout first
         became non-empty (null if never), "device_end_t": when the last of
         its threads named device* (the runtime's device threads) ended (null
         if none was seen), "exit_code": the child's status
         (128 + N for signal N), "ru_utime", "ru_stime": the child's CPU
         seconds from wait4, "maxrss_kib": its peak resident memory,
         "clk_tck": clock ticks per second}.
      Exits with the child's status.

  cpu_sample.py window FILE T0 T1
      Prints one JSON object: the CPU seconds the process used between wall
      times T0 and T1 (linear interpolation between samples, the exit totals
      from wait4 as the last sample), split into user and sys and into the
      threads grouped by name with the digits dropped ("device", "dcn",
      "multislice", ...), the system-wide busy and softirq seconds (all
      CPUs, every process), and the bytes this namespace sent and received.

  cpu_sample.py info FILE
      Prints FILE's last line (exit time, first output, totals) as JSON.

The sampler reads a few small files of /proc per sample: about 1 ms of CPU
per second at the default interval, the same in every run it is used in.
"""
import json
import os
import re
import signal
import stat
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_times(path):
    """(name, utime, stime) from a /proc/.../stat file, or None."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    lpar, rpar = text.find("("), text.rfind(")")
    fields = text[rpar + 2:].split()
    # fields[0] is the state (field 3); utime and stime are fields 14, 15.
    return text[lpar + 1:rpar], int(fields[11]), int(fields[12])


def sample(pid):
    s = {"t": time.time()}
    p = proc_times(f"/proc/{pid}/stat")
    if p is None:
        return None
    s["proc"] = [p[1], p[2]]
    threads = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = []
    for tid in tids:
        t = proc_times(f"/proc/{pid}/task/{tid}/stat")
        if t is not None:
            threads[f"{tid} {t[0]}"] = [t[1], t[2]]
    s["threads"] = threads
    with open("/proc/stat") as f:
        s["sys"] = [int(x) for x in f.readline().split()[1:9]]
    rx = tx = 0
    try:
        with open("/proc/self/net/dev") as f:
            for line in f.readlines()[2:]:
                name, data = line.split(":", 1)
                if name.strip() == "lo":
                    continue
                v = data.split()
                rx += int(v[0])
                tx += int(v[8])
    except OSError:
        pass
    s["net"] = [rx, tx]
    return s


def run(argv):
    out, interval = None, 0.25
    while argv and argv[0] != "--":
        if argv[0] == "--out" and len(argv) > 1:
            out, argv = argv[1], argv[2:]
        elif argv[0] == "--interval" and len(argv) > 1:
            interval, argv = float(argv[1]), argv[2:]
        else:
            sys.exit(f"cpu_sample.py run: unknown argument {argv[0]!r}")
    if out is None or len(argv) < 2:
        sys.exit("usage: cpu_sample.py run --out FILE [--interval S] -- COMMAND [ARGS...]")
    command = argv[1:]
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(command[0], command)
        except OSError as e:
            print(f"cpu_sample.py: cannot run {command[0]}: {e}", file=sys.stderr)
            os._exit(127)
    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        stdout_is_file = stat.S_ISREG(os.fstat(1).st_mode)
    except OSError:
        stdout_is_file = False
    first_output_t = device_end_t = None
    device_tids = []
    next_sample = 0.0
    with open(out, "w") as f:
        while True:
            try:
                done, status, usage = os.wait4(pid, os.WNOHANG)
            except ChildProcessError:
                done, status, usage = pid, 0, None
            except InterruptedError:
                continue
            now = time.time()
            if device_end_t is None and device_tids and not any(
                    os.path.exists(f"/proc/{pid}/task/{tid}") for tid in device_tids):
                device_end_t = now
                output_now = True  # the process's totals right at that moment
            else:
                output_now = False
            if stdout_is_file and first_output_t is None:
                try:
                    if os.fstat(1).st_size > 0:
                        first_output_t = now
                        output_now = True  # sample the threads right here too
                except OSError:
                    stdout_is_file = False
            if done == pid:
                break
            if now >= next_sample or output_now:
                s = sample(pid)
                if s is not None:
                    f.write(json.dumps(s, separators=(",", ":")) + "\n")
                    if device_end_t is None:
                        device_tids = [k.split(" ", 1)[0] for k in s["threads"]
                                       if k.split(" ", 1)[1].startswith("device")]
                next_sample = now + interval
            time.sleep(0.02)
        if os.WIFSIGNALED(status):
            code = 128 + os.WTERMSIG(status)
        else:
            code = os.WEXITSTATUS(status)
        last = {"exit_t": now, "first_output_t": first_output_t,
                "device_end_t": device_end_t,
                "exit_code": code, "clk_tck": CLK_TCK}
        if usage is not None:
            last.update(ru_utime=usage.ru_utime, ru_stime=usage.ru_stime,
                        maxrss_kib=usage.ru_maxrss)
        f.write(json.dumps(last) + "\n")
    sys.exit(code)


def load(path):
    samples, last = [], {}
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "exit_t" in r:
                last = r
            else:
                samples.append(r)
    return samples, last


def interp(points, t):
    """Linear interpolation of [(t, v)] at t, clamped at both ends."""
    if not points:
        return 0.0
    if t <= points[0][0]:
        return points[0][1]
    for (ta, va), (tb, vb) in zip(points, points[1:]):
        if t <= tb:
            return va if tb == ta else va + (vb - va) * (t - ta) / (tb - ta)
    return points[-1][1]


def window_stats(path, t0, t1):
    """The dict `window` prints (see the module's doc)."""
    samples, last = load(path)
    if not samples:
        raise ValueError(f"cpu_sample.py: no samples in {path}")
    tick = float(last.get("clk_tck", CLK_TCK))

    def series(get, exit_value=None):
        pts = [(s["t"], get(s)) for s in samples]
        if exit_value is not None and "exit_t" in last:
            pts.append((last["exit_t"], exit_value))
        return pts

    def delta(pts):
        return interp(pts, t1) - interp(pts, t0)

    ru = "ru_utime" in last
    user = delta(series(lambda s: s["proc"][0] / tick,
                        last.get("ru_utime") if ru else None))
    sys_ = delta(series(lambda s: s["proc"][1] / tick,
                        last.get("ru_stime") if ru else None))
    groups = {}
    names = sorted({k for s in samples for k in s["threads"]})
    for key in names:
        # A thread absent from a sample had not started (0) or has ended
        # (its last value).
        pts, seen = [], 0.0
        for s in samples:
            v = s["threads"].get(key)
            if v is not None:
                seen = (v[0] + v[1]) / tick
            pts.append((s["t"], seen))
        group = re.sub(r"[0-9]+", "", key.split(" ", 1)[1]) or "?"
        groups[group] = groups.get(group, 0.0) + delta(pts)
    busy = delta(series(lambda s: (sum(s["sys"]) - s["sys"][3] - s["sys"][4]) / tick))
    softirq = delta(series(lambda s: s["sys"][6] / tick))
    rx = delta(series(lambda s: s["net"][0]))
    tx = delta(series(lambda s: s["net"][1]))
    covered = samples[0]["t"] <= t0 and t1 <= last.get("exit_t", samples[-1]["t"])
    # Threads are known only up to the last sample (no totals at exit).
    threads_covered = samples[0]["t"] <= t0 and t1 <= samples[-1]["t"] + 0.05
    return {
        "seconds": t1 - t0, "cpu_s": user + sys_, "user_s": user, "sys_s": sys_,
        "threads_s": groups, "system_busy_s": busy, "system_softirq_s": softirq,
        "net_rx_bytes": rx, "net_tx_bytes": tx, "covered": covered,
        "threads_covered": threads_covered,
        "maxrss_kib": last.get("maxrss_kib"), "exit_t": last.get("exit_t"),
        "first_output_t": last.get("first_output_t"),
        "device_end_t": last.get("device_end_t")}


def window(path, t0, t1):
    try:
        print(json.dumps(window_stats(path, t0, t1)))
    except ValueError as e:
        sys.exit(str(e))


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "run":
        run(sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "window":
        window(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
    elif len(sys.argv) == 3 and sys.argv[1] == "info":
        print(json.dumps(load(sys.argv[2])[1]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
