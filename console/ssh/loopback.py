"""A real cluster of OpenSSH ``sshd`` processes on loopback addresses.

Node *i* (0-based) is a real ``sshd`` listening on ``127.0.1.(i+1)`` with its own ed25519 host
key. One generated client key logs in to every node; ``known_hosts`` lists every node's key, and a
ready ``cluster.yaml`` points svconsole at them. It runs as root or as an ordinary user (sshd then
lets only that user log in). Used by every SSH test (the ``loopback`` fixture in
``tests/conftest.py``) and by people who want to try svconsole without a cluster::

    scripts/loopback-cluster up 4 ./.lb --banner 2
    svconsole --config ./.lb/cluster.yaml
    scripts/loopback-cluster down ./.lb

Faults are real too: :meth:`LoopbackCluster.kill` SIGKILLs a node's listener and its sessions,
:meth:`~LoopbackCluster.hang` SIGSTOPs them (connections stay open, nothing answers),
:meth:`~LoopbackCluster.change_host_key` restarts a node with a key that ``known_hosts`` does not
know. Nodes listed in ``banner_nodes`` print noise on stdout and stderr for every command, like a
``.bashrc`` that echoes a welcome text.

Layout of the directory::

    DIR/cluster.yaml  DIR/known_hosts  DIR/id_ed25519(.pub)  DIR/authorized_keys  DIR/state.json
    DIR/shared/                        (the cluster's shared_dir)
    DIR/node<i>/sshd_config  ssh_host_ed25519_key(.pub)  sshd.log  sshd.pid  banner.sh
    DIR/node<i>/authorized_keys        (optional: keys only that node accepts, read at each login)

Every node forwards TCP (``AllowTcpForwarding yes``), so any of them can be a jump host (a
bastion, or a second hop behind one) for the others.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DEFAULT_DIR = Path(".lb")
BANNER_TEXT = "Welcome to {name} (banner noise)"
STATE_FILE = "state.json"
NodeState = Literal["up", "hung", "killed", "down"]


class LoopbackError(RuntimeError):
    """The loopback cluster could not be set up or controlled; the message says what to do."""


class PortInUse(LoopbackError):
    """sshd could not bind its address (another program holds the port)."""


@dataclass(frozen=True)
class LoopbackNode:
    """One sshd of the cluster and the files that belong to it."""

    index: int
    name: str
    address: str
    port: int
    directory: Path
    banner: bool

    @property
    def host_key(self) -> Path:
        return self.directory / "ssh_host_ed25519_key"

    @property
    def original_host_key(self) -> Path:
        """Where :meth:`LoopbackCluster.change_host_key` keeps the first key (for ``reset``)."""
        return self.directory / "ssh_host_ed25519_key.orig"

    @property
    def config(self) -> Path:
        return self.directory / "sshd_config"

    @property
    def log(self) -> Path:
        return self.directory / "sshd.log"

    @property
    def pid_file(self) -> Path:
        return self.directory / "sshd.pid"

    @property
    def banner_script(self) -> Path:
        return self.directory / "banner.sh"

    @property
    def banner_text(self) -> str:
        return BANNER_TEXT.format(name=self.name)


# ---------------------------------------------------------------------------------------------
# Processes, found by walking /proc


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time in clock ticks) of a process, or None if it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def _alive(pid: int, start_time: int) -> bool:
    """True while ``pid`` is the same process (same start time) and not a zombie."""
    st = _stat(pid)
    return st is not None and st[2] == start_time and st[0] not in "ZXx"


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` in the process tree (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                children.setdefault(st[1], []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _freeze_tree(root: int) -> list[int]:
    """SIGSTOP ``root`` and all its descendants, so that none can fork any more; return them all.

    Rescans until two scans in a row find nothing new (a fork in flight shows up in the next)."""
    _signal(root, signal.SIGSTOP)
    frozen = [root]
    quiet = 0
    while quiet < 2:
        new = [p for p in _descendants(root) if p not in frozen]
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        frozen.extend(new)
        quiet = 0 if new else quiet + 1
    return frozen


def _session_orphans(address: str, port: int) -> list[int]:
    """Session processes of a node whose sshd is gone (their ``SSH_CONNECTION`` names the node)."""
    suffix = f" {address} {port}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        for var in env.split(b"\0"):
            if var.startswith(b"SSH_CONNECTION=") and var.endswith(suffix):
                found.append(int(entry))
                break
    return found


# ---------------------------------------------------------------------------------------------
# The installed OpenSSH


def find_sshd() -> str | None:
    """Absolute path of the sshd binary (sshd refuses to re-exec itself from a relative path)."""
    if os.access("/usr/sbin/sshd", os.X_OK):
        return "/usr/sbin/sshd"
    found = shutil.which("sshd", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    return os.path.abspath(found) if found else None


def openssh_version(sshd: str) -> tuple[int, int]:
    """(major, minor) of the installed OpenSSH, from ``sshd -V`` (older ones print it in usage)."""
    out = subprocess.run([sshd, "-V"], capture_output=True, text=True, timeout=10)
    match = re.search(r"OpenSSH_(\d+)\.(\d+)", out.stdout + out.stderr)
    if not match:
        raise LoopbackError(f"cannot tell the OpenSSH version of {sshd}: {out.stderr.strip()!r}")
    return int(match.group(1)), int(match.group(2))


def check_login_allowed(user: str, shadow: Path = Path("/etc/shadow")) -> None:
    """Fail clearly when sshd (with ``UsePAM no``) would refuse ``user`` as a locked account.

    A password field that starts with ``!`` (``passwd -l``, or an account created without a
    password on some systems) locks the account for sshd. ``/etc/shadow`` is only readable by root;
    an ordinary user is not checked here."""
    try:
        lines = shadow.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        fields = line.split(":")
        if fields[0] == user and len(fields) > 1 and fields[1].startswith("!"):
            raise LoopbackError(
                f"account {user!r} is locked (its password field in {shadow} starts with '!'), "
                f"and sshd without PAM refuses locked accounts even for key logins. Unlock it "
                f"without giving it a password: usermod -p '*' {user}"
            )


def _sftp_server() -> str:
    for path in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server",
                 "/usr/libexec/sftp-server", "/usr/lib/ssh/sftp-server"):
        if os.access(path, os.X_OK):
            return path
    return "internal-sftp"


def _port_free(address: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def free_port(addresses: Sequence[str], *, avoid: Iterable[int] = ()) -> int:
    """A port that is free on every address, below the kernel's ephemeral range (outgoing
    connections never take it meanwhile) and away from 2222, the default of ``up``."""
    avoid = set(avoid) | {2222}
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(20000, 32000)
        if port not in avoid and all(_port_free(a, port) for a in addresses):
            return port
    raise LoopbackError("no free port found between 20000 and 32000 on the loopback addresses")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write a file atomically (temp file + rename): another process may read it at any time."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


def _keygen(path: Path, comment: str) -> None:
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True, timeout=30)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "(no log)"
    return "\n".join("    " + t for t in text) or "    (empty log)"


def _answers_ssh(address: str, port: int, timeout: float) -> bool:
    """True if something at address:port sends an SSH identification line within ``timeout``."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# The cluster


class LoopbackCluster:
    """N real sshd processes on 127.0.1.1 .. 127.0.1.N, controlled from Python or from
    ``scripts/loopback-cluster`` (another process finds them through ``DIR/state.json``).
    One object is driven from one thread at a time.

    ``base_port``: the port every node listens on (the addresses differ); ``None`` picks a free
    one. ``user``: who may log in (default: the current user; only root may name another).
    ``banner_nodes``: indices of nodes whose shell prints noise on every command (stdout and
    stderr, before the command's own output). ``guard``: also start a small watchdog process
    that stops the cluster when this process dies, even by SIGKILL (used by the test fixtures,
    so that a killed test run leaves no sshd behind). ``user_rc``: let the login user's own
    ``~/.bashrc`` run for every command. Off by default: the nodes are this machine, whose
    developer shell setup (a ``pyenv init`` costs ~0.3 s a command here) is not the cluster's;
    ``banner_nodes`` model a noisy remote shell instead."""

    GUARD_MODULE = "console.ssh.loopback"
    """The module whose ``guard`` command is the watchdog (a subclass names its own)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        n: int,
        base_port: int | None = 2222,
        user: str | None = None,
        banner_nodes: Iterable[int] = (),
        *,
        guard: bool = False,
        start_timeout: float = 20.0,
        user_rc: bool = False,
    ) -> None:
        if not 1 <= n <= 254:
            raise LoopbackError(f"a loopback cluster has 1 to 254 nodes, not {n}")
        self.directory = Path(directory).resolve()
        if re.search(r"[\s\"'#\\]", str(self.directory)):
            raise LoopbackError(f"{self.directory}: choose a directory whose path has no spaces, "
                                f"quotes, '#' or backslashes (it goes into sshd_config unquoted)")
        self.n = n
        self.port = base_port
        self._auto_port = base_port is None
        self.user = user or pwd.getpwuid(os.getuid()).pw_name
        self.banner_nodes = tuple(sorted(set(banner_nodes)))
        bad = [i for i in self.banner_nodes if not 0 <= i < n]
        if bad:
            raise LoopbackError(f"banner_nodes {bad} are not node indices 0..{n - 1}")
        self.start_timeout = start_timeout
        self.guard = guard
        self.user_rc = user_rc
        self._guard: tuple[int, int] | None = None  # the watchdog (pid, start time)
        self._guard_proc: subprocess.Popen[bytes] | None = None
        self.master_port: int | None = None
        self._sshd: str | None = None
        self._penalties = False  # OpenSSH >= 9.8 knows (and needs) PerSourcePenalties no
        self._pids: dict[int, tuple[int, int]] = {}  # index -> (pid, start time)
        self._states: dict[int, NodeState] = {i: "down" for i in range(n)}
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # sshd we started: reaped by us

    # -- names and paths ----------------------------------------------------------------------

    @property
    def nodes(self) -> list[str]:
        """Node names, ``node0`` .. ``node{n-1}``."""
        return [f"node{i}" for i in range(self.n)]

    def node(self, which: int | str) -> LoopbackNode:
        """The node by index or by name."""
        i = self.nodes.index(which) if isinstance(which, str) else which
        if not 0 <= i < self.n:
            raise LoopbackError(f"no node {which!r} in a cluster of {self.n}")
        return LoopbackNode(i, f"node{i}", f"127.0.1.{i + 1}", self.port or 0,
                            self.directory / f"node{i}", i in self.banner_nodes)

    @property
    def cluster_yaml(self) -> Path:
        return self.directory / "cluster.yaml"

    @property
    def known_hosts(self) -> Path:
        return self.directory / "known_hosts"

    @property
    def identity_file(self) -> Path:
        return self.directory / "id_ed25519"

    @property
    def shared_dir(self) -> Path:
        return self.directory / "shared"

    @property
    def state_file(self) -> Path:
        return self.directory / STATE_FILE

    def state(self, i: int) -> NodeState:
        """What the harness last did to node ``i``: up, hung, killed or down."""
        return self._states[i]

    def ssh_options(self, *, connect_timeout: float = 5) -> list[str]:
        """Options of the system ``ssh``/``sftp``/``scp`` clients for this cluster: its key and
        known_hosts, strict host key checking, no prompts, no user or system ssh_config."""
        return ["-F", "none", "-i", str(self.identity_file),
                "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=yes", "-o", f"ConnectTimeout={connect_timeout:g}"]

    def ssh_argv(self, i: int, command: str, *, connect_timeout: float = 5) -> list[str]:
        """argv of the system ``ssh`` client running ``command`` on node ``i`` (see
        :meth:`ssh_options`)."""
        node = self.node(i)
        return ["ssh", *self.ssh_options(connect_timeout=connect_timeout),
                "-p", str(node.port), "-l", self.user, node.address, command]

    # -- setting up ---------------------------------------------------------------------------

    def _prepare(self) -> None:
        """Create keys (kept if present), configs, known_hosts and cluster.yaml."""
        self._sshd = self._sshd or find_sshd()
        if self._sshd is None:
            raise LoopbackError("no sshd binary: install OpenSSH's server "
                                "(apt-get install openssh-server)")
        if os.getuid() != 0 and self.user != pwd.getpwuid(os.getuid()).pw_name:
            raise LoopbackError(f"as an ordinary user, sshd can only log in that user itself, "
                                f"not {self.user!r}: run as root or leave user unset")
        try:
            pwd.getpwnam(self.user)
        except KeyError:
            raise LoopbackError(f"no such user {self.user!r}") from None
        check_login_allowed(self.user)
        self._penalties = openssh_version(self._sshd) >= (9, 8)
        if os.getuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        self.directory.mkdir(parents=True, exist_ok=True)
        self.shared_dir.mkdir(exist_ok=True)
        if not self.identity_file.exists():
            _keygen(self.identity_file, f"svconsole-loopback@{self.directory}")
        _write(self.directory / "authorized_keys",
               self.identity_file.with_name("id_ed25519.pub").read_text())
        if self.port is None:
            self.port = free_port([self.node(i).address for i in range(self.n)])
        if self.master_port is None:
            self.master_port = free_port(["127.0.1.1"], avoid=[self.port])
        for i in range(self.n):
            node = self.node(i)
            node.directory.mkdir(exist_ok=True)
            if not node.host_key.exists():
                _keygen(node.host_key, f"{node.name}-hostkey")
            self._write_node_files(node)
        self._write_known_hosts()
        self._write_cluster_yaml()

    def _write_node_files(self, node: LoopbackNode) -> None:
        assert self._sshd is not None
        lines = [
            f"# sshd of {node.name} in the svconsole loopback cluster {self.directory}",
            f"ListenAddress {node.address}:{node.port}",
            f"HostKey {node.host_key}",
            f"PidFile {node.pid_file}",
            f"AuthorizedKeysFile {self.directory / 'authorized_keys'} "
            f"{node.directory / 'authorized_keys'}",
            "AllowTcpForwarding yes",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "MaxSessions 64",
            "MaxStartups 100:30:200",
            "AcceptEnv LANG LC_*",
            # A login shell whose .bashrc runs `pyenv init` takes pyenv's rehash lock; a session
            # killed meanwhile (the tests kill sessions on purpose) leaves the lock behind and
            # every later shell waits 60 s for it. Real nodes rarely see such kills; here, wait 2 s.
            "SetEnv PYENV_REHASH_TIMEOUT=2" + ("" if self.user_rc else
                # bash started by sshd reads ~/.bashrc only while SHLVL < 2 (Debian's
                # SSH_SOURCE_BASHRC): SHLVL=1 becomes 2 in that shell, so it skips it.
                " SHLVL=1"),
            f"AllowUsers {self.user}",
            "LogLevel VERBOSE",
        ]
        if self.user == "root":
            lines.append("PermitRootLogin prohibit-password")
        if self._penalties:
            lines.append("PerSourcePenalties no")  # tests fail connections on purpose, often
        if node.banner:
            lines += self._banner_config(node)
        else:
            lines.append("Subsystem sftp internal-sftp")
        _write(node.config, "\n".join(lines) + "\n")

    def _banner_config(self, node: LoopbackNode) -> list[str]:
        """sshd_config lines and the wrapper that make every command on ``node`` print noise.

        sshd's ``ForceCommand`` runs the wrapper instead of the client's command (which it gets in
        ``SSH_ORIGINAL_COMMAND``); the wrapper prints the banner on stdout and stderr, then runs
        the command with the user's login shell, exactly as sshd would have. For the client this
        is the same as a ``.bashrc`` that echoes, for any login shell. (sshd's ``SetEnv BASH_ENV``
        does not work: Debian's bash, run by sshd, sources ~/.bashrc instead of $BASH_ENV, and
        every bash the command starts would print the banner again.) The sftp subsystem (an
        external sftp-server, since internal-sftp cannot be wrapped) is passed through quietly."""
        sftp = _sftp_server()
        echo = f"echo '{node.banner_text}'\necho '{node.banner_text}' >&2\n"
        _write(node.banner_script,
               f"#!/bin/sh\n# sshd ForceCommand of {node.name}: login noise, then the command\n"
               f'if [ "$SSH_ORIGINAL_COMMAND" = "{sftp}" ]; then exec {sftp}; fi\n'
               f"{echo}"
               'if [ -z "$SSH_ORIGINAL_COMMAND" ]; then exec "$SHELL" -l; fi\n'
               'exec "$SHELL" -c "$SSH_ORIGINAL_COMMAND"\n', mode=0o755)
        return [f"ForceCommand {node.banner_script}", f"Subsystem sftp {sftp}"]

    def _write_known_hosts(self) -> None:
        """known_hosts with every node's first key (a key changed by change_host_key stays
        unknown, even if up() runs again)."""
        lines = []
        for i in range(self.n):
            node = self.node(i)
            first = node.original_host_key if node.original_host_key.exists() else node.host_key
            key = " ".join(first.with_name(first.name + ".pub").read_text().split()[:2])
            host = node.address if node.port == 22 else f"[{node.address}]:{node.port}"
            lines.append(f"{host} {key}")
        _write(self.known_hosts, "\n".join(lines) + "\n")

    def _write_cluster_yaml(self) -> None:
        kept = ""  # the cluster's identity (console.cluster.identity) survives a rewrite
        with contextlib.suppress(OSError):
            found = re.search(r"^  id: (\S+)$", self.cluster_yaml.read_text(), re.MULTILINE)
            kept = f"  id: {found.group(1)}\n" if found else ""
        nodes = []
        for i in range(self.n):
            node = self.node(i)
            nodes.append(f"  - name: {node.name}\n    host: {node.address}\n"
                         f"    role: {'head' if i == 0 else 'worker'}\n")
        text = (
            "# svconsole loopback cluster: real sshd processes on this machine.\n"
            f"# Start: scripts/loopback-cluster up {self.n} {self.directory}\n"
            f"# Stop:  scripts/loopback-cluster down {self.directory}\n"
            "cluster:\n"
            "  name: loopback\n"
            f"  shared_dir: {self.shared_dir}\n"
            "  master: node0\n"
            f"  master_port: {self.master_port}\n"
            f"  python: {json.dumps(sys.executable)}\n"
            f"{kept}"
            "ssh:\n"
            f"  user: {self.user}\n"
            f"  port: {self.port}\n"
            f"  identity_file: {self.identity_file}\n"
            f"  known_hosts: {self.known_hosts}\n"
            "  host_key_policy: strict\n"
            "  connect_timeout: 5\n"
            "  use_ssh_config: false  # this cluster is all here: no ~/.ssh/config Host block\n"
            "nodes:\n" + "".join(nodes)
        )
        _write(self.cluster_yaml, text)

    # -- state shared with other processes ----------------------------------------------------

    def _save(self) -> None:
        state = {
            "n": self.n, "port": self.port, "auto_port": self._auto_port, "user": self.user,
            "banner_nodes": list(self.banner_nodes), "user_rc": self.user_rc,
            "master_port": self.master_port, "sshd": self._sshd,
            "guard": list(self._guard) if self._guard else None,
            "nodes": [{"name": f"node{i}", "state": self._states[i],
                       "pid": self._pids.get(i, (None, None))[0],
                       "start_time": self._pids.get(i, (None, None))[1]} for i in range(self.n)],
        }
        _write(self.state_file, json.dumps(state, indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> LoopbackCluster:
        """The cluster that ``up`` started in ``directory`` (possibly from another process)."""
        path = Path(directory) / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise LoopbackError(f"{path}: no loopback cluster state here ({exc})") from None
        cluster = cls(directory, state["n"], None if state["auto_port"] else state["port"],
                      state["user"], state["banner_nodes"], user_rc=state.get("user_rc", False))
        cluster.port, cluster.master_port = state["port"], state["master_port"]
        cluster._sshd = state["sshd"]
        if state.get("guard") and cluster._is_guard(*state["guard"]):
            cluster._guard = tuple(state["guard"])
        for i, entry in enumerate(state["nodes"]):
            cluster._states[i] = entry["state"]
            if entry["pid"] and cluster._is_listener(i, entry["pid"], entry["start_time"]):
                cluster._pids[i] = (entry["pid"], entry["start_time"])
        return cluster

    def _is_listener(self, i: int, pid: int, start_time: int) -> bool:
        """Is ``pid`` still node i's sshd (same process, started with our config)?"""
        # sshd rewrites its argv into one string ("sshd: /usr/sbin/sshd -D -f CONFIG ...")
        cmdline = " ".join(_cmdline(pid)) + " "
        return _alive(pid, start_time) and f" -f {self.node(i).config} " in cmdline

    def _is_guard(self, pid: int, start_time: int) -> bool:
        cmdline = " ".join(_cmdline(pid)) + " "
        return _alive(pid, start_time) and f" {self.GUARD_MODULE} guard {self.directory} " in cmdline

    def _start_guard(self) -> None:
        if self._guard and self._is_guard(*self._guard):
            return
        owner = os.getpid()
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH")) if p))
        with open(self.directory / "guard.log", "ab") as log:
            self._guard_proc = subprocess.Popen(
                [sys.executable, "-m", self.GUARD_MODULE, "guard", str(self.directory),
                 str(owner), str(_stat(owner)[2])],  # type: ignore[index]
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                start_new_session=True)
        st = _stat(self._guard_proc.pid)
        self._guard = (self._guard_proc.pid, st[2] if st else 0)

    def _stop_guard(self) -> None:
        if self._guard and self._guard[0] != os.getpid() and self._is_guard(*self._guard):
            _signal(self._guard[0], signal.SIGKILL)
        if self._guard_proc is not None:
            self._guard_proc.wait(timeout=10)
            self._guard_proc = None
        self._guard = None

    def _listener(self, i: int) -> int | None:
        entry = self._pids.get(i)
        if entry and self._is_listener(i, *entry):
            return entry[0]
        self._pids.pop(i, None)
        return None

    # -- starting and stopping ----------------------------------------------------------------

    def up(self) -> LoopbackCluster:
        """Start every node that is not running and wait until each answers SSH. Keys already in
        the directory are kept; a cluster that another process left running there is stopped
        first.

        Raises :class:`LoopbackError` with the sshd log tail if a node does not come up."""
        if not self._pids and self.state_file.exists():
            with contextlib.suppress(LoopbackError, KeyError, TypeError):
                LoopbackCluster.load(self.directory).down()
        for attempt in range(5):
            self._prepare()
            try:
                if self.guard:
                    self._start_guard()
                self._start([i for i in range(self.n) if self._listener(i) is None])
                return self
            except PortInUse:
                if not self._auto_port or attempt == 4:
                    raise
                self.down()
                self.port = None  # somebody took it between the check and sshd's bind
        return self

    def _start(self, indices: list[int]) -> None:
        assert self._sshd is not None
        for i in indices:
            node = self.node(i)
            with open(node.log, "ab") as log:  # config errors come on stderr, before -E
                proc = subprocess.Popen(
                    [self._sshd, "-D", "-f", str(node.config), "-E", str(node.log)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                    start_new_session=True,  # a Ctrl-C in the caller's terminal does not reach it
                )
            st = _stat(proc.pid)
            self._children[i] = proc
            self._pids[i] = (proc.pid, st[2] if st else 0)
            self._states[i] = "up"
        self._save()
        self._wait_ready(indices)

    def _wait_ready(self, indices: list[int]) -> None:
        pending = list(indices)
        deadline = time.monotonic() + self.start_timeout
        while pending:
            for i in list(pending):
                node = self.node(i)
                proc = self._children.get(i)
                if proc is not None and proc.poll() is not None:
                    self._children.pop(i)
                    self._pids.pop(i, None)
                    self._states[i] = "down"
                    self._save()
                    log = _tail(node.log)
                    kind = PortInUse if "Address already in use" in log else LoopbackError
                    raise kind(f"sshd of {node.name} exited with code {proc.returncode} "
                               f"({node.config}); its log {node.log}:\n{log}")
                if _answers_ssh(node.address, node.port, 0.5):
                    pending.remove(i)
            if pending and time.monotonic() > deadline:
                node = self.node(pending[0])
                raise LoopbackError(
                    f"{node.name} ({node.address}:{node.port}) did not answer SSH within "
                    f"{self.start_timeout:g} s; sshd log {node.log}:\n{_tail(node.log)}")
            if pending:
                time.sleep(0.02)

    def _stop_tree(self, i: int) -> None:
        """SIGKILL node i's listener and every session process below it; wait until gone."""
        node = self.node(i)
        proc = self._children.pop(i, None)
        pid = self._listener(i)
        if pid is None and proc is not None and proc.poll() is None:
            pid = proc.pid  # our own child: ours even if /proc was not readable in time
        victims = _freeze_tree(pid) if pid is not None else []
        victims += _session_orphans(node.address, node.port)
        for p in victims:
            _signal(p, signal.SIGKILL)
        if proc is not None:
            proc.wait(timeout=10)  # reap it (it was SIGKILLed above, or had exited)
        if pid is not None and i in self._pids:
            start = self._pids[i][1]
            deadline = time.monotonic() + 10
            while _alive(pid, start) and time.monotonic() < deadline:
                time.sleep(0.01)
        self._pids.pop(i, None)

    def down(self) -> None:
        """Stop every sshd of the cluster and all its sessions. Keeps the directory (logs, keys,
        cluster.yaml) for inspection. Safe to call twice."""
        for i in range(self.n):
            self._stop_tree(i)
            self._states[i] = "down"
        self._stop_guard()
        if self.state_file.parent.exists():
            self._save()

    def kill(self, i: int) -> None:
        """SIGKILL node i's sshd and its sessions: open connections drop, new ones are refused."""
        self._stop_tree(i)
        self._states[i] = "killed"
        self._save()

    def hang(self, i: int) -> None:
        """SIGSTOP node i's sshd and its sessions: connections stay open but nothing answers, and
        new connections are accepted by the kernel but never greeted."""
        pid = self._listener(i)
        if pid is None:
            raise LoopbackError(f"node{i} is not running ({self._states[i]}): cannot hang it")
        _freeze_tree(pid)
        self._states[i] = "hung"
        self._save()

    def resume(self, i: int) -> None:
        """SIGCONT a hung node; returns when it answers SSH again."""
        pid = self._listener(i)
        if pid is None:
            raise LoopbackError(f"node{i} is not running ({self._states[i]}): restart it instead")
        for p in [pid, *_descendants(pid)]:
            _signal(p, signal.SIGCONT)
        self._states[i] = "up"
        self._save()
        self._wait_ready([i])

    def restart(self, i: int) -> None:
        """Stop node i if it runs (hung or not) and start it again with its current host key."""
        if self._sshd is None:
            self._prepare()
        self._stop_tree(i)
        self._start([i])

    def change_host_key(self, i: int) -> None:
        """Give node i a new host key and restart it. known_hosts is NOT updated, so a strict
        client must refuse the node. The first key is kept for :meth:`reset`."""
        node = self.node(i)
        if not node.original_host_key.exists():
            shutil.copy2(node.host_key, node.original_host_key)
            shutil.copy2(node.host_key.with_name(node.host_key.name + ".pub"),
                         node.original_host_key.with_name(node.original_host_key.name + ".pub"))
        _keygen(node.host_key, f"{node.name}-hostkey-changed")
        self.restart(i)

    def reset(self, i: int) -> None:
        """Bring node i back to its first, healthy state: original host key, running, answering.
        Tests that break a node of a shared cluster call this afterwards."""
        node = self.node(i)
        orig = node.original_host_key
        if orig.exists():
            os.replace(orig, node.host_key)
            os.replace(orig.with_name(orig.name + ".pub"),
                       node.host_key.with_name(node.host_key.name + ".pub"))
            self.restart(i)
        elif self._states[i] != "up" or self._listener(i) is None:
            self.restart(i)

    def heal(self) -> None:
        """:meth:`reset` every node that is not in its first, healthy state (cheap otherwise)."""
        for i in range(self.n):
            self.reset(i)

    # -- looking --------------------------------------------------------------------------------

    def status(self) -> list[dict[str, object]]:
        """One entry per node: name, address, port, harness state, pid, and whether it answers."""
        out = []
        for i in range(self.n):
            node = self.node(i)
            pid = self._listener(i)
            st = _stat(pid) if pid else None
            out.append({
                "name": node.name, "address": node.address, "port": node.port,
                "state": self._states[i], "pid": pid, "stopped": bool(st and st[0] == "T"),
                "answers": bool(pid and _answers_ssh(node.address, node.port, 0.5)),
                "sessions": len(_descendants(pid)) if pid else 0,
            })
        return out

    def __enter__(self) -> LoopbackCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


# ---------------------------------------------------------------------------------------------
# Command line: scripts/loopback-cluster


def _indices(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of node indices: {text!r}") from None


def _guard(directory: Path, owner: int, owner_start_time: int) -> int:
    """The watchdog behind ``guard=True``: wait until the owner process is gone, then stop the
    cluster. The owner's own ``down()`` ends the watchdog first."""
    while _alive(owner, owner_start_time):
        time.sleep(0.5)
    LoopbackCluster.load(directory).down()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="loopback-cluster",
        description="A real cluster of sshd processes on 127.0.1.1 .. 127.0.1.N to try svconsole.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_up = sub.add_parser("up", help="start N nodes (again) in DIR")
    p_up.add_argument("n", type=int)
    p_up.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    p_up.add_argument("--port", type=int, default=2222, help="port of every node (0: a free one)")
    p_up.add_argument("--banner", type=_indices, default=[],
                      help="indices of nodes whose shell prints noise, e.g. 1,3")
    p_up.add_argument("--user", help="the user that logs in (only root may choose)")
    p_up.add_argument("--user-rc", action="store_true",
                      help="run the login user's ~/.bashrc for every command (off: a plain shell)")
    for name, helptext in (("down", "stop every node (keeps DIR)"), ("status", "show the nodes")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    for name, helptext in (("kill", "SIGKILL a node and its sessions"),
                           ("hang", "SIGSTOP a node and its sessions"),
                           ("resume", "SIGCONT a hung node"),
                           ("restart", "start a node again"),
                           ("change-host-key", "new host key, known_hosts left as it is"),
                           ("reset", "original key, running")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("dir", type=Path)
        p.add_argument("node", type=int, help="node index (0-based)")
    p_guard = sub.add_parser("guard")  # the watchdog of guard=True; not listed in --help
    p_guard.add_argument("dir", type=Path)
    p_guard.add_argument("owner", type=int)
    p_guard.add_argument("owner_start_time", type=int)
    args = parser.parse_args(argv)
    if args.command == "guard":
        return _guard(args.dir, args.owner, args.owner_start_time)
    try:
        if args.command == "up":
            cluster = LoopbackCluster(args.dir, args.n, args.port or None, args.user, args.banner,
                                      user_rc=args.user_rc)
            cluster.up()
            print(cluster.cluster_yaml)
            print(f"{args.n} nodes up on 127.0.1.1..127.0.1.{args.n} port {cluster.port} "
                  f"(user {cluster.user}).\n"
                  f"  svconsole --config {cluster.cluster_yaml}\n"
                  f"  {' '.join(cluster.ssh_argv(0, 'hostname'))}\n"
                  f"  scripts/loopback-cluster down {cluster.directory}", file=sys.stderr)
            return 0
        cluster = LoopbackCluster.load(args.dir)
        if args.command == "down":
            cluster.down()
        elif args.command == "status":
            for entry in cluster.status():
                print("{name:8} {address}:{port:<6} {state:7} pid={pid} answers={answers} "
                      "sessions={sessions}".format(**entry))
        else:
            getattr(cluster, args.command.replace("-", "_"))(args.node)
        return 0
    except LoopbackError as exc:
        print(f"loopback-cluster: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
