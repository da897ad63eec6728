#!/usr/bin/env python3
"""svconsole's node side of a training run: inspect, start detached, status, stop, follow, scan.

svconsole sends this file over SSH as the program on stdin and names the operation and its
arguments (base64 JSON) on the command line::

    python3 - inspect <base64-json>

Replies are lines that start with ``@svc``; whatever else the remote shell prints (a ``.bashrc``
banner) is ignored by the console. Only the standard library is used, so any Python runs it; the
training interpreter runs it when versions of the training stack are asked for.

Operations:

``inspect``
    What pre-flight and the launch plan need, in one round trip: the training stack's versions,
    where ``funasr/bin/train_ds.py`` and ``torchrun`` are for this interpreter, the GPUs, whether
    the master port is free, whether output_dir is writable, the head of the data lists, the NCCL
    environment file, and the svconsole runs alive on this node.
``start``
    Start the training command detached: a supervisor process forks, calls ``setsid`` (a new
    session and process group, no terminal) and ignores SIGHUP (as nohup does), starts the
    command with its output appended to the log, writes a pid file, waits, and records the exit
    code in an exit file. It outlives the SSH connection and the console. The training processes
    carry ``SVCONSOLE_RUN_ID``, ``SVCONSOLE_NODE`` and ``SVCONSOLE_RECORD`` in their environment
    (the SSH session's ``SSH_*`` variables are removed), so any console can find them in ``/proc``.
``status``
    Supervisor alive, the run's processes alive, the exit file, the log size.
``stop``
    SIGTERM to the supervisor's process group and to every process of the run (torchrun starts
    each rank in a session of its own), SIGKILL to whatever is left after the grace period, then
    check that none is left.
``follow``
    Stream the log from a byte offset: ``@svcL <end offset> <line>`` for every complete line,
    ``@svcH <size>`` as a heartbeat when nothing is written, and ``@svcE <reason>`` once the run on
    this node has ended and every byte was sent.
``scan``
    The runs alive on this node (their processes' environment), with their record paths.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import posixpath
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

PREFIX = "@svc"
RUN_VAR, NODE_VAR, RECORD_VAR = "SVCONSOLE_RUN_ID", "SVCONSOLE_NODE", "SVCONSOLE_RECORD"
PACKAGES = ("torch", "deepspeed", "funasr")
MAX_CHUNK = 512 * 1024
"""A log line longer than this (bytes) is sent in pieces of this size."""
RUN_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{4,16}")
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


class BadArgs(ValueError):
    """Arguments this script refuses to act on (see :func:`check_args`)."""


def _clean(path: object) -> bool:
    return (isinstance(path, str) and path.startswith("/") and path != "/"
            and not path.startswith("//") and posixpath.normpath(path) == path
            and not any(ord(c) < 32 for c in path))


def check_args(op: str, args: dict) -> None:
    """What a run's arguments must look like before a pid is signalled, a file written or a
    log read: the run id and node name as svconsole makes them, clean absolute paths, the exit
    and pid files ``.../svconsole/<run>/<node>.exit|.pid``, the log ``.../logs/<node>.log``
    (the console checks the same of every record; this is the node's own guard)."""
    if op not in ("start", "status", "stop", "follow"):
        return
    run_id, node = args.get("run_id"), args.get("node")
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise BadArgs(f"run id {run_id!r:.60} is not a run id")
    if not isinstance(node, str) or not NODE_NAME.fullmatch(node):
        raise BadArgs(f"node {node!r:.60} is not a node name")
    suffixes = {"exit_file": f"/svconsole/{run_id}/{node}.exit", "log": f"/logs/{node}.log"}
    if op == "start":
        suffixes["pid_file"] = f"/svconsole/{run_id}/{node}.pid"
        if not _clean(args.get("record")) or not args["record"].endswith("/svconsole-run.json"):
            raise BadArgs(f"record {args.get('record')!r:.80} is not a run record's path")
    for key, suffix in suffixes.items():
        value = args.get(key)
        if not _clean(value) or not value.endswith(suffix):
            raise BadArgs(f"{key} {value!r:.80} is not a clean absolute path ending {suffix}")
    for key in ("pid", "start_ticks"):
        value = args.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < (2 if key == "pid" else 0)):
            raise BadArgs(f"{key} {value!r:.40} is not a process of a run")


def reply(payload: object) -> None:
    sys.stdout.write(f"{PREFIX}J {json.dumps(payload)}\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- processes


def start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks (tells a reused pid apart); None if it is gone or
    a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    if fields[0] in "ZXx":
        return None
    return int(fields[19])


def alive(pid: int | None, ticks: int | None) -> bool:
    """Is ``pid`` still the process that started at ``ticks``?"""
    if not pid:
        return False
    now = start_ticks(pid)
    return now is not None and (ticks is None or now == ticks)


def run_processes(run_id: str | None, node: str) -> dict[int, str]:
    """Live processes of this node tagged with a run (all runs when ``run_id`` is None):
    pid -> run id. Loopback nodes share one /proc, hence the node name check."""
    found: dict[int, str] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        tags = dict(v.split(b"=", 1) for v in env if v.startswith((b"SVCONSOLE_RUN_ID=",
                                                                     b"SVCONSOLE_NODE=",
                                                                     b"SVCONSOLE_RECORD=")))
        rid = tags.get(RUN_VAR.encode(), b"").decode()
        if rid and tags.get(NODE_VAR.encode(), b"").decode() == node \
                and (run_id is None or rid == run_id) and start_ticks(int(entry)) is not None:
            found[int(entry)] = rid
    return found


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(")") + 2:].split()[1])


def is_supervisor(args: dict) -> bool:
    """Is ``args["pid"]`` really this run's supervisor on this node (not merely a live pid a
    record names)? It must be alive with the recorded start time, lead its own session and
    process group, and be ``python - start PAYLOAD`` whose payload names this run, node and
    record; or, where the payload is not on its command line, be the parent of a process whose
    environment carries this run's and node's tags."""
    pid, ticks = args.get("pid"), args.get("start_ticks")
    if not isinstance(pid, int) or pid <= 1 or ticks is None or not alive(pid, ticks):
        return False
    try:
        if os.getpgid(pid) != pid or os.getsid(pid) != pid:
            return False
    except OSError:
        return False
    argv = _cmdline(pid)
    if b"start" not in argv[1:] or b"-" not in argv[1:]:
        return False
    payload = argv[argv.index(b"start") + 1:]
    try:
        said = json.loads(base64.b64decode(payload[0], validate=True)) if payload else None
    except (ValueError, TypeError):
        said = None
    if isinstance(said, dict) and "run_id" in said:
        return said.get("run_id") == args["run_id"] and said.get("node") == args["node"] \
            and (args.get("record") is None or said.get("record") == args["record"])
    return any(_ppid(child) == pid for child in run_processes(args["run_id"], args["node"]))


def record_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for var in f.read().split(b"\0"):
                if var.startswith(b"SVCONSOLE_RECORD="):
                    return var.split(b"=", 1)[1].decode()
    except OSError:
        pass
    return None


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path: str, data: dict) -> None:
    """Write ``path`` atomically through a temp file created anew (never through a link)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------- inspect


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _train_ds() -> tuple[str | None, str | None]:
    """funasr/bin/train_ds.py of this interpreter, found without importing funasr."""
    from importlib.util import find_spec

    try:
        spec = find_spec("funasr")
    except (ImportError, ValueError) as exc:
        return None, str(exc)
    if spec is None or not spec.submodule_search_locations:
        return None, f"funasr is not installed for {sys.executable}"
    for base in spec.submodule_search_locations:
        path = os.path.join(base, "bin", "train_ds.py")
        if os.path.isfile(path):
            return path, None
    return None, f"funasr at {list(spec.submodule_search_locations)} has no bin/train_ds.py"


def _gpus() -> list[int] | None:
    """GPU indices from nvidia-smi; None when there is no nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [int(x) for x in out.split() if x.strip().isdigit()]


def _port_free(port: int) -> str | None:
    """None when ``port`` can be bound on every interface (as torchrun's store does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as exc:
            return f"port {port} is in use ({exc.strerror})"
    return None


def _writable(directory: str) -> str | None:
    try:
        os.makedirs(os.path.join(directory, "logs"), exist_ok=True)
        probe = os.path.join(directory, f".svconsole-write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as exc:
        return f"{directory}: {exc.strerror or exc}"
    return None


def _head(path: str, lines: int) -> dict:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = [line.rstrip("\n") for _, line in zip(range(lines), f, strict=False)]
    except OSError as exc:
        return {"ok": False, "error": f"{path}: {exc.strerror or exc}"}
    return {"ok": True, "head": head}


def _env_file(path: str) -> dict:
    """KEY=VALUE lines (``export`` allowed, ``#`` comments); quotes around a value removed."""
    if not os.path.exists(path):
        return {"exists": False}
    values, bad = {}, []
    try:
        with open(path) as f:
            for number, raw in enumerate(f, 1):
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                line = line.removeprefix("export ").strip()
                key, sep, value = line.partition("=")
                if not sep or not key.replace("_", "").isalnum():
                    bad.append(f"{path}:{number}: not KEY=VALUE: {raw.strip()}")
                    continue
                values[key] = value.strip().strip("'\"")
    except OSError as exc:
        return {"exists": True, "error": f"{path}: {exc.strerror or exc}"}
    return {"exists": True, "values": values, "errors": bad}


BUILDERS = frozenset({"ninja", "cc1plus", "c++", "g++", "gcc", "cc", "nvcc", "cicc", "ptxas",
                      "ld"})
"""Processes that show a torch C++/CUDA extension build is under way on this node."""


def _extension_roots(explicit: str | None) -> list[str]:
    """Where torch builds JIT extensions (DeepSpeed's ops): TORCH_EXTENSIONS_DIR as the launch
    sets it (or as this node's environment has it), else torch's default under the cache dir,
    ``~/.cache/torch_extensions/py311_cpu``-like (every such folder)."""
    chosen = explicit or os.environ.get("TORCH_EXTENSIONS_DIR")
    if chosen:
        return [os.path.expanduser(chosen)]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    base = os.path.join(cache, "torch_extensions")
    try:
        return [os.path.join(base, d) for d in sorted(os.listdir(base))
                if os.path.isdir(os.path.join(base, d))]
    except OSError:
        return []


def _building() -> list[str]:
    """The build tools running on this node (``ninja (pid 123)``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name in BUILDERS:
            found.append(f"{name} (pid {entry})")
    return found


def _extension_locks(explicit: str | None) -> dict:
    """torch's JIT build locks (``<root>/<extension>/lock``, made with O_EXCL and removed when
    the build ends: a build killed midway leaves it, and every later process that loads the
    extension waits on it for ever). Each with its age; and the build tools running now."""
    locks = []
    for root in _extension_roots(explicit):
        try:
            names = sorted(os.listdir(root))
        except OSError:
            continue
        for name in names:
            path = os.path.join(root, name, "lock")
            with contextlib.suppress(OSError):
                locks.append({"path": path, "age_s": round(time.time() - os.stat(path).st_mtime)})
    return {"locks": locks, "building": _building() if locks else []}


def _checkpoint(directory: str) -> dict | None:
    """FunASR's ``model.pt`` in output_dir (None: none), with the epoch and step of the newest
    ``model.pt.ep{E}`` / ``model.pt.ep{E}.{step}`` beside it (model.pt is a copy of it)."""
    path = os.path.join(directory, "model.pt")
    try:
        saved = os.stat(path).st_mtime
        names = os.listdir(directory)
    except OSError:
        return None
    newest = None
    for name in names:
        m = re.fullmatch(r"model\.pt\.ep(\d+)(?:\.(\d+))?", name)
        if m is None:
            continue
        with contextlib.suppress(OSError):
            when = os.stat(os.path.join(directory, name)).st_mtime
            if newest is None or when > newest[0]:
                newest = (when, name, int(m[1]), int(m[2]) if m[2] else None)
    return {"path": path, "saved": saved, "name": newest[1] if newest else None,
            "epoch": newest[2] if newest else None, "step": newest[3] if newest else None,
            "incomplete": _incomplete(path, os.path.join(directory, newest[1]) if newest
                                      else None)}


def _incomplete(path: str, copy_of: str | None) -> list[str]:
    """Files of a DeepSpeed ``model.pt`` directory that a cut-short save or copy left behind:
    empty, or of another size than the same file in the newest ``model.pt.ep*`` (FunASR
    saves that, then copies it to model.pt; a stop during the copy leaves model.pt broken, and
    the resume fails with ``EOFError: Ran out of input``)."""
    if not os.path.isdir(path):
        return []
    out = []
    for name in sorted(os.listdir(path)):
        with contextlib.suppress(OSError):
            size = os.stat(os.path.join(path, name)).st_size
            other = None
            if copy_of is not None and os.path.isdir(copy_of):
                with contextlib.suppress(OSError):
                    other = os.stat(os.path.join(copy_of, name)).st_size
            if size == 0 or (other is not None and other != size):
                out.append(f"{name} is {size} bytes" + (f", {os.path.basename(copy_of)}'s "
                                                        f"{other}" if other is not None else ""))
    return out


def inspect(args: dict) -> dict:
    train_ds, train_ds_error = _train_ds()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = {
        "python": sys.executable,
        "versions": _versions(),
        "train_ds": train_ds,
        "train_ds_error": train_ds_error,
        "torchrun": torchrun if os.access(torchrun, os.X_OK) else None,
        "gpus": _gpus(),
        "cpus": len(os.sched_getaffinity(0)),
        "output_dir_error": _writable(args["output_dir"]) if args.get("output_dir") else None,
        "checkpoint": _checkpoint(args["output_dir"]) if args.get("output_dir") else None,
        # the address the console connected from, as this node routes to it
        "ssh_client": (os.environ.get("SSH_CONNECTION") or "").split(" ")[0] or None,
        "data": {p: _head(p, args.get("head_lines", 20)) for p in args.get("data", [])},
        "port_error": _port_free(args["port"]) if args.get("port") else None,
        "env_file": _env_file(args["env_file"]) if args.get("env_file") else None,
        "runs": scan(args),
        "extension_locks": _extension_locks(args.get("extensions_dir")),
    }
    return out


# ---------------------------------------------------------------- start


def _training_env(args: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSH_")}
    env.update(args.get("env") or {})
    env.update({RUN_VAR: args["run_id"], NODE_VAR: args["node"], RECORD_VAR: args["record"]})
    return env


def _supervise(args: dict, report: int) -> None:
    """The detached supervisor (session leader): run the command, record its exit."""
    stop = {"signal": None}

    def on_term(signum: int, _frame: object) -> None:
        stop["signal"] = signum  # the command gets the same signal through the process group

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log = open(args["log"], "ab")
    offset = log.seek(0, os.SEEK_END)
    try:
        child = subprocess.Popen(args["argv"], cwd=args["cwd"], env=_training_env(args),
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    except OSError as exc:
        os.write(report, json.dumps({"error": f"cannot start {args['argv'][0]}: "
                                               f"{exc.strerror or exc}"}).encode())
        os._exit(1)
    me = os.getpid()
    info = {"run_id": args["run_id"], "node": args["node"], "pid": me, "pgid": os.getpgid(me),
            "start_ticks": start_ticks(me), "child": child.pid, "log_offset": offset,
            "started": time.time(), "host": socket.gethostname()}
    write_json(args["pid_file"], info)
    os.write(report, json.dumps(info).encode())
    os.close(report)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    write_json(args["exit_file"], {"code": code, "stop_signal": stop["signal"],
                                   "ended": time.time()})
    log.close()


def _secret_env(args: dict) -> dict:
    """The values of the run's secret variables (``args["secret_env"]`` names them), from the
    file the console wrote beside the pid file (mode 0600), read once and removed: they are
    never on this process's command line, which every user of the node can read."""
    names = args.get("secret_env") or []
    if not names:
        return {}
    path = args["pid_file"][: -len(".pid")] + ".secrets"
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    missing = [n for n in names if not isinstance(values, dict) or n not in values]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}")
    return {n: str(values[n]) for n in names}


def start(args: dict) -> dict:
    for key in ("log", "pid_file", "exit_file"):
        os.makedirs(os.path.dirname(args[key]), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args["exit_file"])
    if not os.path.isdir(args["cwd"]):
        return {"error": f"working directory {args['cwd']} does not exist"}
    try:
        args = dict(args, env={**(args.get("env") or {}), **_secret_env(args)})
    except (OSError, ValueError) as exc:
        return {"error": f"the secret variables did not arrive: {exc}"}
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the supervisor
        os.close(read_end)
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            _supervise(args, write_end)
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    if not data:
        return {"error": "the supervisor died before starting the command"}
    return json.loads(data)


# ---------------------------------------------------------------- status, stop, scan


def status(args: dict) -> dict:
    try:
        size = os.path.getsize(args["log"])
    except OSError:
        size = None
    return {"alive": is_supervisor(args),
            "processes": sorted(run_processes(args["run_id"], args["node"])),
            "exit": read_json(args["exit_file"]), "log_size": size}


def _signal_all(pgid: int | None, pids: list[int], sig: int) -> None:
    if pgid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _left(args: dict) -> list[int]:
    left = set(run_processes(args["run_id"], args["node"]))
    if is_supervisor(args):
        left.add(args["pid"])
    return sorted(left)


def _wait_gone(args: dict, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := _left(args)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


SAVE_STARTED = b"Save checkpoint: "
SAVE_DONE = b"Checkpoint saved to "
SAVE_TAIL = 1 << 20


def _saving(args: dict) -> bool:
    """Whether this node's ranks are inside FunASR's ``save_checkpoint``: the log (from this
    run's start in it) has a ``Save checkpoint:`` line after its last ``Checkpoint saved to``.
    DeepSpeed's save ends in a barrier, so one rank's "saved" line means every rank's files
    are written."""
    try:
        with open(args["log"], "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(int(args.get("log_offset") or 0), size - SAVE_TAIL)
            f.seek(start)
            tail = f.read()
    except (OSError, KeyError, TypeError, ValueError):
        return False
    began = tail.rfind(SAVE_STARTED)
    return began >= 0 and tail.rfind(SAVE_DONE) < began


SAVE_STALL = 60.0


def _save_progress(args: dict) -> tuple:
    """What a save in progress changes: the log's size and the checkpoint files' sizes and
    times in output_dir (``model.pt*``, one level into DeepSpeed's tag directories)."""
    seen: list = []
    with contextlib.suppress(OSError):
        seen.append(os.stat(args["log"]).st_size)
    out = args.get("output_dir")
    with contextlib.suppress(OSError, TypeError):
        for entry in os.scandir(out):
            if not entry.name.startswith(("model.pt", "latest")):
                continue
            with contextlib.suppress(OSError):
                items = os.scandir(entry.path) if entry.is_dir(follow_symlinks=False) else [entry]
                for item in items:
                    st = item.stat(follow_symlinks=False)
                    seen.append((item.path, st.st_size, st.st_mtime_ns))
    return tuple(seen)


def _wait_saved(args: dict, seconds: float) -> dict | None:
    """Before a stop: wait up to ``seconds`` for a checkpoint save in progress to end (a
    SIGTERM inside it leaves model.pt cut short and the resume fails), and no longer than
    SAVE_STALL seconds once nothing moves (a rank frozen inside the save's barrier). None: no
    save was in progress; else how long it waited and whether the save was still going
    (``cut``, with ``stalled`` when nothing moved)."""
    if seconds <= 0 or not _saving(args):
        return None
    started = time.monotonic()
    deadline = started + seconds
    progress, moved = _save_progress(args), started
    while _saving(args) and _left(args) and time.monotonic() < deadline:
        time.sleep(0.2)
        now = _save_progress(args)
        if now != progress:
            progress, moved = now, time.monotonic()
        elif time.monotonic() - moved > float(args.get("save_stall", SAVE_STALL)):
            break
    cut = _saving(args) and bool(_left(args))
    return {"waited": round(time.monotonic() - started, 2), "cut": cut,
            "stalled": cut and time.monotonic() < deadline}


def stop(args: dict) -> dict:
    pgid = args["pid"] if is_supervisor(args) else None  # never a pid a record merely names
    save = _wait_saved(args, float(args.get("save_wait", 0)))
    first = _left(args)
    _signal_all(pgid, first, signal.SIGTERM)
    left = _wait_gone(args, float(args.get("grace", 20)))
    killed: list[int] = []
    if left:
        killed = left
        _signal_all(pgid, left, signal.SIGKILL)
        left = _wait_gone(args, 10.0)
    if not left and os.path.isdir(os.path.dirname(args["exit_file"])) \
            and not os.path.lexists(args["exit_file"]):
        # the supervisor was killed before it could record the end: record the stop for it
        write_json(args["exit_file"], {"code": -signal.SIGKILL if killed else None,
                                       "stop_signal": signal.SIGKILL if killed else signal.SIGTERM,
                                       "ended": time.time()})
    return {"terminated": first, "killed": killed, "remaining": left, "save": save}


def scan(args: dict) -> list[dict]:
    runs: dict[str, dict] = {}
    for pid, run_id in run_processes(None, args["node"]).items():
        entry = runs.setdefault(run_id, {"run_id": run_id, "pids": [], "record": record_of(pid)})
        entry["pids"].append(pid)
    return sorted(runs.values(), key=lambda r: r["run_id"])


# ---------------------------------------------------------------- follow


def _emit(kind: str, text: str) -> None:
    sys.stdout.buffer.write(f"{PREFIX}{kind} {text}\n".encode())


def _ended(args: dict) -> str | None:
    """Why following may stop: asked to stop at the end of the file (``once``), the exit file
    is there, or the supervisor is gone and no process of the run is left on this node (a
    supervisor killed alone leaves torchrun and its ranks writing the log)."""
    if args.get("once"):
        return "eof"
    if args.get("exit_file") and os.path.exists(args["exit_file"]):
        return "exited"
    if args.get("pid") and not alive(args["pid"], args.get("start_ticks")) \
            and not run_processes(args["run_id"], args["node"]):
        return "gone"
    return None


def _open_log(path: str):
    """The log opened for reading, never through a symlink; None while it cannot be."""
    try:
        return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")
    except OSError:
        return None


class _Lines:
    """Complete lines out of the bytes read, each sent as one ``@svcL <end offset> <line>``
    frame (never with a newline inside; a line longer than MAX_CHUNK goes in pieces)."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        """Where the next unsent byte is in the file."""
        self.partial = b""
        self.tail = b""
        """The last bytes sent (up to 64): still there at ``offset`` unless the file was
        rewritten."""

    @property
    def position(self) -> int:
        return self.offset + len(self.partial)

    def _send(self, data: bytes, consumed: int) -> None:
        self.offset += consumed
        sys.stdout.buffer.write(f"{PREFIX}L {self.offset} ".encode() + data + b"\n")
        self.tail = (self.tail + data + b"\n"[:consumed - len(data)])[-64:]

    def feed(self, chunk: bytes) -> None:
        self.partial += chunk
        while True:
            end = self.partial.find(b"\n", 0, MAX_CHUNK + 1)
            if end < 0 and len(self.partial) <= MAX_CHUNK:
                return
            cut = end if end >= 0 else MAX_CHUNK
            used = cut + (1 if end >= 0 else 0)
            line, self.partial = self.partial[:cut], self.partial[used:]
            self._send(line, used)

    def flush(self) -> None:
        """Send a last line that has no newline."""
        if self.partial:
            line, self.partial = self.partial, b""
            self._send(line, len(line))

    def restart(self, why: str) -> None:
        """The file is not what was read: read it again from 0, and say so."""
        self.offset, self.partial, self.tail = 0, b"", b""
        _emit("T", f"0 {why}")


def _changed(path: str, f, lines: _Lines, ident: tuple[int, int]) -> str | None:
    """Why the open log is no longer the file being followed: ``rotated`` (another file at
    its path), ``truncated`` (shorter than what was read) or ``rewritten`` (the bytes just
    sent are no longer there); None when it is unchanged."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None  # gone for now (being rotated): keep reading the open file
    if (st.st_dev, st.st_ino) != ident:
        return "rotated"
    size = os.fstat(f.fileno()).st_size
    if size < lines.position:
        return f"truncated (size {size} below offset {lines.position})"
    tail = lines.tail
    if tail and os.pread(f.fileno(), len(tail), lines.offset - len(tail)) != tail:
        return "rewritten"
    return None


def follow(args: dict) -> None:
    """Stream the log from ``offset``: complete lines as they are written; ``@svcT <offset>
    <why>`` when the file was truncated, rewritten or rotated (then it is read again from 0);
    once the run has ended here (or at the end of the file, with ``once``) and the file has
    been quiet ``settle`` seconds, the last bytes (a last line without newline too) and
    ``@svcE <why>``."""
    path = args["log"]
    poll, heartbeat = float(args.get("poll", 0.2)), float(args.get("heartbeat", 2.0))
    settle = 0.0 if args.get("once") else float(args.get("settle", 1.5))
    lines = _Lines(int(args.get("offset", 0)))
    _emit("H", str(lines.offset))  # started: the console now expects a line every heartbeat
    sys.stdout.flush()
    quiet_since = time.monotonic()
    f, ident, ending = None, (0, 0), None
    while True:
        if f is None:
            f = _open_log(path)
            if f is not None:
                st = os.fstat(f.fileno())
                ident = (st.st_dev, st.st_ino)
                if st.st_size < lines.position:
                    lines.restart(f"truncated (size {st.st_size} below offset {lines.position})")
                f.seek(lines.position)
        why = _changed(path, f, lines, ident) if f is not None else None
        if why == "rotated":
            while chunk := f.read(MAX_CHUNK):  # the old file to its end first
                lines.feed(chunk)
            lines.flush()  # its last line, complete as far as it goes
            f.close()
            f = None
            lines.restart("rotated (a new file at its path)")
            sys.stdout.flush()
            continue
        if why is not None:
            lines.restart(why)
            f.seek(0)
            sys.stdout.flush()
            continue
        chunk = f.read(MAX_CHUNK) if f is not None else b""
        if chunk:
            lines.feed(chunk)
            sys.stdout.flush()
            quiet_since, ending = time.monotonic(), None
            continue
        if ending is None:
            ending = _ended(args)
            ended_at = time.monotonic()
        if ending is not None and time.monotonic() - ended_at >= settle:
            lines.flush()
            _emit("E", ending)
            sys.stdout.flush()
            return
        if time.monotonic() - quiet_since >= heartbeat:
            _emit("H", str(lines.position))
            sys.stdout.flush()
            quiet_since = time.monotonic()
        time.sleep(poll)


OPERATIONS = {"inspect": inspect, "start": start, "status": status, "stop": stop, "scan": scan}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in (*OPERATIONS, "follow"):
        sys.stderr.write(f"usage: launch_node.py {{{'|'.join(OPERATIONS)}|follow}} BASE64-JSON\n")
        return 2
    args = json.loads(base64.b64decode(argv[1]))
    try:
        check_args(argv[0], args)
    except BadArgs as exc:
        sys.stderr.write(f"launch_node.py {argv[0]}: refused: {exc}\n")
        return 2
    if argv[0] == "follow":
        follow(args)
    else:
        reply(OPERATIONS[argv[0]](args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
