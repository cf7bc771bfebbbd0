#!/usr/bin/env python3
"""Follows README.md top to bottom as a new user would, on a terminal.

Every command of the README's code blocks runs in order in one bash session
(so `export` and a controller started with `&` carry over), under a
pseudo-terminal (so progress bars show as they do for a person). The script
records when each byte of output arrives and reports, per command, its exit
code, its wall time and its longest silence. It fails when a command fails
or when a command is silent for longer than --max-silence seconds (5 by
default: "no silent wait over 5 s").

Skipped: `scripts/test.sh` (the whole suite), the multi-machine example
(it needs the addresses 10.0.0.1 and 10.0.0.2) and what needs root (`sudo`:
the network-namespace cluster). Run from the repository
root after `scripts/quickstart.sh` has built the binary, e.g. as on an AVX2
machine:

  MULTISLICE_MAX_ISA=avx2 scripts/readme_walkthrough.py --json out.json
"""
import argparse
import json
import os
import pty
import re
import select
import subprocess
import sys
import time

SKIP = (
    re.compile(r"^scripts/test\.sh"),
    re.compile(r"10\.0\.0\."),
    re.compile(r"^# on 10\."),
    re.compile(r"^sudo "),
)
MARK = "__README_STEP__"


def readme_commands(path):
    """The commands of the README's fenced blocks, continuations joined."""
    commands, block, inside = [], [], False
    for line in open(path, encoding="utf-8"):
        if line.lstrip().startswith("```"):
            if inside:
                commands.extend(join_continuations(block))
            block, inside = [], not inside
            continue
        if inside:
            block.append(line.strip())
    return [c for c in commands if c and not any(s.search(c) for s in SKIP)]


def join_continuations(lines):
    out, current = [], ""
    for line in lines:
        code = re.sub(r"\s+#.*$", "", line) if not line.startswith("#") else ""
        if not code.strip() and not current:
            continue
        current += code.rstrip("\\").rstrip() + " " if code.endswith("\\") \
            else code
        if not code.endswith("\\"):
            out.append(current.strip())
            current = ""
    return [c for c in out if looks_like_a_command(c)]


def looks_like_a_command(c):
    return re.match(r"^(build/bin/|scripts/|export |[A-Z_]+=)", c) is not None


def script_of(commands):
    lines = ["set -u", "cd " + os.getcwd()]
    for i, c in enumerate(commands):
        lines.append(f"echo '{MARK} start {i}'")
        lines.append(c)
        lines.append(f"echo \"{MARK} end {i} $?\"")
    lines.append("kill %1 2>/dev/null; wait")
    return "\n".join(lines) + "\n"


def run(script, max_silence):
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp("bash", ["bash", "-c", script])
    steps, current, last, buffer = {}, None, time.monotonic(), b""
    while True:
        ready, _, _ = select.select([fd], [], [], 1.0)
        now = time.monotonic()
        if not ready:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        if current is not None and not steps[current].get("done"):
            steps[current]["silence"] = max(steps[current]["silence"],
                                            now - last)
        last = now
        buffer = (buffer + data)[-4096:]
        for m in re.finditer(rf"{MARK} (start|end) (\d+)(?: (\d+))?", data
                             .decode("utf-8", "replace")):
            i = int(m.group(2))
            if m.group(1) == "start":
                current = i
                steps[i] = {"start": now, "silence": 0.0}
            else:
                steps[i].update(done=True, rc=int(m.group(3)),
                                seconds=now - steps[i]["start"])
    os.waitpid(pid, 0)
    return steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readme", default="README.md")
    parser.add_argument("--max-silence", type=float, default=5.0)
    parser.add_argument("--json", help="write the per-command report here")
    parser.add_argument("--list", action="store_true",
                        help="print the commands and exit")
    args = parser.parse_args()
    commands = readme_commands(args.readme)
    if args.list:
        print("\n".join(commands))
        return 0
    steps = run(script_of(commands), args.max_silence)
    report, failed = [], 0
    for i, c in enumerate(commands):
        s = steps.get(i, {})
        ok = s.get("rc") == 0 and s.get("silence", 0) <= args.max_silence
        failed += not ok
        report.append({"command": c, "rc": s.get("rc"),
                       "seconds": round(s.get("seconds", 0), 1),
                       "longest_silence_s": round(s.get("silence", 0), 1),
                       "ok": ok})
    for r in report:
        print(f"{'ok  ' if r['ok'] else 'FAIL'} rc={r['rc']} "
              f"{r['seconds']:7.1f} s  silent <= {r['longest_silence_s']:4.1f}"
              f" s  {r['command'][:90]}")
    print(f"{len(report) - failed} passed, {failed} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"isa_cap": os.environ.get("MULTISLICE_MAX_ISA", ""),
                       "commands": report}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
