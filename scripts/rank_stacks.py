#!/usr/bin/env python3
"""svconsole's node side of ``svconsole stacks``: the stack and state of every rank of a run.

svconsole sends this file over SSH as the program on stdin, with its arguments as base64 JSON::

    python3 - dump <base64-json>

and reads one reply line that starts with ``@svcJ``. Only the standard library is used.

``dump`` finds the run's rank processes on this node (the processes whose environment carries
the run's ``SVCONSOLE_RUN_ID`` and this node's ``SVCONSOLE_NODE``, and torchrun's ``RANK``;
a process whose parent is the same rank, a DataLoader worker or a compiler, is not a rank), reads
each one's state from ``/proc`` (R, S, D, T, its wchan), dumps its Python stack with py-spy, all
ranks at once, and measures its CPU time over a window (one second by default) that overlaps the
dumps. The training never stops for it: a stopped process (state T) is read with py-spy's
``--nonblocking`` (attaching to it would fail and could resume it); the others are attached only
for the dump itself (``--native`` needs that), or read non-blocking when native frames are not
asked for. It also reads the tail of the node's log for each rank's last step line and its age.

When py-spy is missing or may not attach (ptrace), the reply says why and what to change
(``kernel.yama.ptrace_scope``, CAP_SYS_PTRACE); the states from /proc come back all the same.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time

PREFIX = "@svc"
TAIL_BYTES = 512 * 1024
"""How much of the end of the log is read for the ranks' last step lines."""
STEP_LINE = re.compile(r"\b(?:train|val), rank: (\d+),")
STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:,(\d+))?\]")
TICKS = os.sysconf("SC_CLK_TCK")


def reply(payload: object) -> None:
    sys.stdout.write(f"{PREFIX}J {json.dumps(payload)}\n")
    sys.stdout.flush()


def proc_stat(pid: int) -> tuple[str, int, float] | None:
    """(state letter, parent pid, user + system CPU seconds) of ``pid``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


HIDDEN: list[int] = []
"""Processes whose environment this account may not read (their ranks cannot be found)."""


def environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read().split(b"\0")
    except PermissionError:
        HIDDEN.append(pid)
        return {}
    except OSError:
        return {}
    wanted = (b"SVCONSOLE_RUN_ID=", b"SVCONSOLE_NODE=", b"RANK=", b"LOCAL_RANK=",
              b"WORLD_SIZE=", b"LOCAL_WORLD_SIZE=")
    return dict(v.decode(errors="replace").split("=", 1) for v in raw if v.startswith(wanted))


def wchan(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/wchan") as f:
            value = f.read().strip()
    except OSError:
        return None
    return value if value and value != "0" else None


def rank_processes(run_id: str, node: str) -> list[dict]:
    """The run's rank processes on this node: pid, rank, local_rank, world_size."""
    tagged: dict[int, dict[str, str]] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        env = environ(int(entry))
        if env.get("SVCONSOLE_RUN_ID") == run_id and env.get("SVCONSOLE_NODE") == node \
                and "RANK" in env:
            tagged[int(entry)] = env
    out = []
    for pid, env in sorted(tagged.items()):
        stat = proc_stat(pid)
        if stat is None or stat[0] in "ZXx":
            continue
        parent = tagged.get(stat[1])
        if parent is not None and parent.get("RANK") == env.get("RANK"):
            continue  # a child of the rank (DataLoader worker, compiler): not a rank itself
        out.append({"pid": pid, "rank": _int(env.get("RANK")),
                    "local_rank": _int(env.get("LOCAL_RANK")),
                    "world_size": _int(env.get("WORLD_SIZE"))})
    return out


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def find_pyspy() -> str | None:
    """py-spy beside this interpreter (the training venv's bin), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("py-spy")


def ptrace_advice() -> str | None:
    """Why py-spy may not attach to the ranks from this account, and what to change; None when
    nothing stands in the way (root, or ``kernel.yama.ptrace_scope`` 0)."""
    if os.geteuid() == 0:
        return None
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read().strip())
    except (OSError, ValueError):
        return None  # no Yama: same-user ptrace is allowed
    if scope == 0:
        return None
    if scope == 1:
        return ("kernel.yama.ptrace_scope is 1: py-spy may only attach to its own children. "
                "Run 'sudo sysctl -w kernel.yama.ptrace_scope=0' (persist it with "
                "'echo kernel.yama.ptrace_scope=0 | sudo tee /etc/sysctl.d/10-ptrace.conf'), "
                "or grant py-spy the capability: 'sudo setcap cap_sys_ptrace+ep PYSPY'")
    if scope == 2:
        return ("kernel.yama.ptrace_scope is 2: only CAP_SYS_PTRACE may attach. Grant it to "
                "py-spy: 'sudo setcap cap_sys_ptrace+ep PYSPY', or run svconsole's SSH user as "
                "root")
    return ("kernel.yama.ptrace_scope is 3: ptrace is disabled until reboot; set "
            "kernel.yama.ptrace_scope=0 in /etc/sysctl.d/10-ptrace.conf and reboot the node")


def last_lines(log: str | None, offset: int, now: float) -> dict[str, dict]:
    """Each rank's last step line in the tail of the log since ``offset``, with its age in
    seconds by the line's own time stamp (by this node's clock and time zone)."""
    if not log:
        return {}
    try:
        with open(log, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(offset, size - TAIL_BYTES, 0)
            f.seek(start)
            data = f.read()
    except OSError:
        return {}
    out: dict[str, dict] = {}
    for raw in data.decode("utf-8", "replace").splitlines():
        m = STEP_LINE.search(raw)
        if not m:
            continue
        age = None
        stamp = STAMP.search(raw, 0, m.start())
        if stamp:
            try:
                t = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S"))
                age = round(now - t - int((stamp.group(2) or "0").ljust(3, "0")[:3]) / 1000, 3)
            except (ValueError, OverflowError):
                age = None
        out[m.group(1)] = {"text": raw[-2000:], "age_s": age}
    return out


def dump(args: dict) -> dict:
    run_id, node = args["run_id"], args["node"]
    window = float(args.get("window_s", 1.0))
    native = bool(args.get("native", True))
    timeout = float(args.get("timeout_s", 10.0))
    started = time.monotonic()
    now = time.time()
    ranks = rank_processes(run_id, node)
    pyspy = find_pyspy()
    advice = ptrace_advice()
    before: dict[int, tuple[str, int, float] | None] = {}
    for r in ranks:
        before[r["pid"]] = proc_stat(r["pid"])
        r["wchan"] = wchan(r["pid"])
    spies: dict[int, subprocess.Popen] = {}
    for r in ranks:
        stat = before[r["pid"]]
        if pyspy is None or stat is None:
            continue
        stopped = stat[0] in "Tt"
        cmd = [pyspy, "dump", "--pid", str(r["pid"]), "--json"]
        if stopped or not native:
            cmd.append("--nonblocking")
        else:
            cmd.append("--native")
        r["dump_mode"] = "nonblocking" if "--nonblocking" in cmd else "native"
        spies[r["pid"]] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           stdin=subprocess.DEVNULL)
    for r in ranks:
        proc = spies.get(r["pid"])
        if proc is None:
            continue
        try:
            out, err = proc.communicate(timeout=max(timeout - (time.monotonic() - started), 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            r["error"] = f"py-spy did not answer within {timeout:g} s"
            continue
        if proc.returncode == 0:
            try:
                r["threads"] = json.loads(out)
            except ValueError:
                r["error"] = "py-spy printed no JSON"
            continue
        said = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
        cause = [ln.strip() for ln in said
                 if not ln.startswith(" ") and "Stack backtrace" not in ln]
        text = "; ".join(cause[:4]) or f"py-spy exited {proc.returncode}"
        if "ermission" in text or "EPERM" in text or "Operation not permitted" in text:
            text += ". " + (advice or "py-spy needs ptrace rights over the rank: run it as the "
                            "rank's user or as root, or grant CAP_SYS_PTRACE").replace(
                                "PYSPY", pyspy or "py-spy")
        r["error"] = text
    rest = window - (time.monotonic() - started)
    if rest > 0:
        time.sleep(rest)
    span = time.monotonic() - started
    for r in ranks:
        first, last = before[r["pid"]], proc_stat(r["pid"])
        r["state"] = first[0] if first else "gone"
        r["state_after"] = last[0] if last else "gone"
        r["cpu_total_s"] = last[2] if last else (first[2] if first else None)
        r["cpu_s"] = round(last[2] - first[2], 3) if first and last else None
        r["window_s"] = round(span, 3)
    return {"node": node, "now": now, "pyspy": pyspy, "python": sys.executable,
            "ptrace": advice.replace("PYSPY", pyspy or "py-spy") if advice else None,
            "ranks": ranks, "user": _user(), "hidden": len(HIDDEN),
            "last_lines": last_lines(args.get("log"), int(args.get("log_offset") or 0), now),
            "seconds": round(time.monotonic() - started, 3)}


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return str(os.geteuid())


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] != "dump":
        sys.stderr.write("usage: rank_stacks.py dump BASE64-JSON\n")
        return 2
    reply(dump(json.loads(base64.b64decode(argv[2]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
