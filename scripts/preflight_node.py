#!/usr/bin/env python3
"""svconsole's node side of the network and storage pre-flight (console/training/preflight.py).

Sent over SSH as one base64 line on stdin (``python3 -c LOADER OP <base64-json>``, see
console/training/preflight.py), so that stdin stays open after it: the console closes it to end a
listener. Replies are ``@svcJ <json>`` lines; anything else (a login banner) is ignored by the
console. Standard library only.

``listen``
    Bind a listener on each port asked for (the master port on the master, port 0 - an
    ephemeral port, as gloo's and NCCL's pairs use - on every node), on every address, as
    torchrun's store does. Reply at once with the ports, which could not be bound, this node's
    facts (hostname and what it resolves to, its addresses and interfaces, the route to the
    master) and, when asked, the stat of output_dir with a token file written there. Then
    answer every connection with the token line until stdin closes (the console is done, or
    gone) or the deadline passes; the ports are closed and the token file removed on exit.
``connect``
    Connect to every target (host, port) in parallel with a deadline and tell apart: ``ok``
    (our token came back), ``foreign`` (something else answered), ``timeout`` (dropped: a
    firewall), ``refused``, ``unreachable`` (no route), ``resolve`` (the name does not resolve).
    Also read the storage token (output_dir is the same storage?) and sample the audio paths of
    the data lists (first, last and 20 random lines) for files that do not exist.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time

PREFIX = "@svc"
SAMPLE = 20
"""Random lines sampled from each data list, besides the first and the last."""


def reply(payload: object) -> None:
    sys.stdout.write(f"{PREFIX}J {json.dumps(payload)}\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- this node's facts


def _ip(*args: str) -> str | None:
    try:
        out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def interfaces() -> dict[str, list[str]]:
    """Interface name -> its addresses (``ip -o addr``; /sys/class/net names when ip is absent)."""
    text = _ip("-o", "addr", "show")
    found: dict[str, list[str]] = {}
    if text is None:
        with contextlib.suppress(OSError):
            found = {name: [] for name in os.listdir("/sys/class/net")}
        return found
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("inet", "inet6"):
            found.setdefault(fields[1].split("@")[0], []).append(fields[3].split("/")[0])
    for line in (_ip("-o", "link", "show") or "").splitlines():
        fields = line.split(":")
        if len(fields) > 1:
            found.setdefault(fields[1].strip().split("@")[0], [])
    return found


def resolve(host: str) -> tuple[list[str], str | None]:
    """The IPv4/IPv6 addresses ``host`` resolves to here, or the resolver's error."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        return [], str(exc)
    return list(dict.fromkeys(i[4][0] for i in infos)), None


def route_to(address: str | None) -> dict:
    """``ip route get ADDRESS``: the interface and source address this node would use."""
    if not address:
        return {"error": "no address to route to"}
    text = _ip("route", "get", address)
    if text is None:
        err = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True,
                             timeout=10).stderr.strip() if _ip("-V") is not None else "no ip command"
        return {"error": err or "ip route get failed"}
    words = text.split()
    out: dict = {"text": text.splitlines()[0].strip(), "local": words[:1] == ["local"]}
    for key in ("dev", "src", "via"):
        if key in words and words.index(key) + 1 < len(words):
            out[key] = words[words.index(key) + 1]
    return out


def facts(master_addr: str | None) -> dict:
    name = socket.gethostname()
    addrs, error = resolve(name)
    master, master_error = resolve(master_addr) if master_addr else ([], None)
    return {"hostname": name, "hostname_resolves": addrs, "hostname_error": error,
            "interfaces": interfaces(), "master_resolves": master, "master_error": master_error,
            "route": route_to(master[0] if master else None)}


def stat_dir(path: str) -> dict:
    try:
        st = os.stat(path)
    except OSError as exc:
        return {"error": f"{path}: {exc.strerror}"}
    try:
        entries = sorted(os.listdir(path))
    except OSError:
        entries = []
    return {"dev": st.st_dev, "ino": st.st_ino, "entries": len(entries),
            "sample": entries[:5], "realpath": os.path.realpath(path)}


# ---------------------------------------------------------------- listen


def bind_any(port: int) -> socket.socket:
    """A socket bound to ``port`` on every address, IPv4 and IPv6 where the node has IPv6 (as
    torchrun's store binds), else IPv4 only."""
    if socket.has_ipv6:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", port))
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", port))
    except OSError:
        sock.close()
        raise
    return sock


def listen(args: dict) -> None:
    token = args["token"]
    deadline = time.monotonic() + float(args.get("deadline", 30))
    parent = os.getppid()
    socks: dict[socket.socket, dict] = {}
    ports, busy = [], {}
    for want in args["ports"]:
        try:
            sock = bind_any(int(want))
        except OSError as exc:
            busy[str(want)] = exc.strerror or str(exc)
            continue
        sock.listen(64)
        port = sock.getsockname()[1]
        ports.append(port)
        socks[sock] = {"port": port, "asked": int(want)}
    token_file = None
    storage = None
    if args.get("output_dir"):
        directory = args["output_dir"]
        try:
            os.makedirs(directory, exist_ok=True)
            token_file = os.path.join(directory, f".svconsole-preflight-{token}")
            with open(token_file, "w") as f:
                f.write(token)
            storage = stat_dir(directory)
        except OSError as exc:
            storage = {"error": f"{directory}: {exc.strerror}"}
            token_file = None
    served: list[dict] = []

    def stop(*_: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGHUP, stop)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        reply({"ports": {str(v["asked"]): v["port"] for v in socks.values()}, "busy": busy,
               "facts": facts(args.get("master_addr")), "storage": storage,
               "token_file": token_file})
        stdin = sys.stdin.fileno()
        while time.monotonic() < deadline and os.getppid() == parent:
            ready, _, _ = select.select([*socks, stdin], [], [], 0.25)
            if stdin in ready:
                if not os.read(stdin, 4096):
                    break  # EOF: the console is done (or gone)
                continue
            for sock in ready:
                conn, peer = sock.accept()
                served.append({"port": socks[sock]["port"], "from": peer[0]})
                with contextlib.suppress(OSError):
                    conn.settimeout(2)
                    conn.sendall(f"svconsole-preflight {token}\n".encode())
                    conn.recv(16)  # the connector closes first: TIME_WAIT stays on its side
                conn.close()
        reply({"served": served})
    finally:
        for sock in socks:
            sock.close()
        if token_file:
            with contextlib.suppress(OSError):
                os.unlink(token_file)


# ---------------------------------------------------------------- connect


def probe(target: dict, timeout: float) -> dict:
    out = {"id": target["id"], "host": target["host"], "port": target["port"]}
    addrs, error = resolve(target["host"])
    if error or not addrs:
        return {**out, "result": "resolve", "error": error or "no address"}
    out["resolved"] = addrs[0]
    started = time.monotonic()
    try:
        sock = socket.create_connection((addrs[0], int(target["port"])), timeout=timeout)
    except socket.timeout:  # noqa: UP041 (an alias of TimeoutError only from Python 3.10)
        return {**out, "result": "timeout", "error": f"timed out after {timeout:g} s"}
    except OSError as exc:
        kind = {errno.ECONNREFUSED: "refused", errno.EHOSTUNREACH: "unreachable",
                errno.ENETUNREACH: "unreachable", errno.ETIMEDOUT: "timeout",
                errno.EADDRNOTAVAIL: "unreachable"}.get(exc.errno or 0, "error")
        return {**out, "result": kind, "error": exc.strerror or str(exc),
                "seconds": round(time.monotonic() - started, 2)}
    out["seconds"] = round(time.monotonic() - started, 3)
    out["local"] = sock.getsockname()[0]
    try:
        sock.settimeout(timeout)
        got = b""
        while not got.endswith(b"\n") and len(got) < 256:
            chunk = sock.recv(256)
            if not chunk:
                break
            got += chunk
    except OSError:
        got = b""
    finally:
        sock.close()
    expected = f"svconsole-preflight {target.get('token')}"
    if target.get("token") and got.decode(errors="replace").strip() == expected:
        return {**out, "result": "ok"}
    return {**out, "result": "foreign", "got": got[:80].decode(errors="replace")}


def audio_path(line: str) -> str | None:
    """The audio path of a data list line: SenseVoice jsonl ``source``, or ``key path``."""
    line = line.strip()
    if not line:
        return None
    if line.startswith("{"):
        try:
            row = json.loads(line)
        except ValueError:
            return None
        source = row.get("source") if isinstance(row, dict) else None
        return source if isinstance(source, str) else None
    fields = line.split()
    return fields[1] if len(fields) == 2 else None


def sample_data(path: str, cwd: str | None) -> dict:
    """Check that the audio files of the first, last and SAMPLE random lines exist here."""
    picked: list[tuple[int, str]] = []
    rng = random.Random(path)  # the same lines on every node
    first = last = None
    count = 0
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for count, line in enumerate(f, 1):  # noqa: B007 (count is the number of lines)
                if first is None:
                    first = (count, line)
                last = (count, line)
                if len(picked) < SAMPLE:
                    picked.append((count, line))
                else:
                    j = rng.randrange(count)
                    if j < SAMPLE:
                        picked[j] = (count, line)
    except OSError as exc:
        return {"error": f"{path}: {exc.strerror}"}
    lines = dict(picked)
    for item in (first, last):
        if item:
            lines[item[0]] = item[1]
    missing, checked = [], 0
    for number in sorted(lines):
        audio = audio_path(lines[number])
        if audio is None or "://" in audio:
            continue
        checked += 1
        full = audio if os.path.isabs(audio) or not cwd else os.path.join(cwd, audio)
        if not os.path.isfile(full):
            missing.append({"line": number, "path": audio})
    return {"lines": count, "checked": checked, "missing": missing}


def connect(args: dict) -> None:
    timeout = float(args.get("timeout", 3))
    results: list[dict] = [{}] * len(args.get("targets", []))

    def one(k: int, target: dict) -> None:
        results[k] = probe(target, timeout)

    out: dict = {}
    storage = args.get("storage")  # read before connecting: the master's listener ends (and
    # removes its token) once every node has connected
    if storage:
        seen = stat_dir(storage["dir"])
        try:
            with open(os.path.join(storage["dir"], storage["file"])) as f:
                seen["token"] = f.read()
        except OSError as exc:
            seen["token_error"] = exc.strerror
        out["storage"] = seen
    threads = [threading.Thread(target=one, args=(k, t), daemon=True)
               for k, t in enumerate(args.get("targets", []))]
    for t in threads:
        t.start()
    out["data"] = {p: sample_data(p, args.get("cwd")) for p in args.get("data", [])}
    for t in threads:
        t.join(timeout + 5)
    out["probes"] = results
    reply(out)


def main() -> int:
    op = sys.argv[1]
    args = json.loads(base64.b64decode(sys.argv[2])) if len(sys.argv) > 2 else {}
    {"listen": listen, "connect": connect}[op](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
