"""The one SSH session pool that every part of svconsole shares.

Each node gets one persistent SSH connection for the whole process, opened lazily under that
node's lock and reused for every command as a new channel on its transport. What to connect to is
each node's :class:`~console.ssh.sshconfig.Endpoint` (cluster.yaml, then the user's ssh config:
HostName, User, Port, IdentityFile, ProxyJump chains, ...). Connections are built as
``fabric.Connection`` objects (fabric's own ssh_config reading off; each jump host one shared
connection, a gateway for the next hop), with svconsole's own host-key policy
(:mod:`console.ssh.hostkeys`, under the name OpenSSH uses) instead of fabric's AutoAddPolicy.
Commands run on channels the pool drives itself (``Connection.run`` keeps all output in memory).

Nothing here raises for a remote or connection failure: :meth:`Pool.run` returns a
:class:`Result` whose ``error`` says what went wrong, a :class:`Stream` ends with ``error`` set.
Every network step has a deadline (connect, banner, auth, channel open, reads) and no pool-wide
lock is held during network I/O, so a hung node never blocks the others.

Local nodes (``Node.local``) run the same API through ``bash -c`` subprocesses.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import select
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from enum import Enum
from types import TracebackType

import fabric
import paramiko

from console.cluster.model import Cluster, Node
from console.ssh.hostkeys import (
    AcceptedKey,
    HostKeyCheck,
    HostKeyRevoked,
    HostKeyUnknown,
    KnownHosts,
    changed_reason,
    host_id,
)
from console.ssh.sshconfig import Endpoint, Resolver
from console.subscribers import Subscribers

log = logging.getLogger(__name__)
# paramiko logs every failed handshake with a traceback; without this, Python's last-resort
# handler would print them on stderr of a CLI or TUI that configured no logging.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

READ_SIZE = 65536
MAX_LINE = 1 << 20
"""A streamed line longer than this (bytes) is cut there; the rest up to the newline is dropped."""
MAX_RESULT = 16 << 20
"""``Result.stdout``/``stderr`` keep at most this many bytes each (the rest is counted, not kept)."""
POLL = 0.5
"""Longest single wait in a read loop: bounds how late a deadline or a cancel is noticed."""
RETRY_DOWN_AFTER = 5.0
"""A node found not answering (channel open or handshake timed out) is marked down: calls fail at
once, except one call at most every this many seconds (or ``connect_timeout`` if shorter), which
tries again; the health probe always tries. A hung node so costs one timeout, not one per call."""
REDACTED = "********"


class NodeState(str, Enum):
    """Connection state of a node, as subscribers see it."""

    UNKNOWN = "unknown"
    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"
    AUTH_FAILED = "auth_failed"
    HOSTKEY_UNKNOWN = "hostkey_unknown"
    HOSTKEY_CHANGED = "hostkey_changed"

    @property
    def label(self) -> str:
        """Words for operators: up, unreachable, auth failed, unknown host key, ..."""
        return _LABELS[self]


_LABELS = {
    NodeState.UNKNOWN: "not checked",
    NodeState.CONNECTING: "connecting",
    NodeState.UP: "up",
    NodeState.DOWN: "unreachable",
    NodeState.AUTH_FAILED: "auth failed",
    NodeState.HOSTKEY_UNKNOWN: "unknown host key",
    NodeState.HOSTKEY_CHANGED: "host key changed",
}


@dataclass(frozen=True)
class NodeStatus:
    """A node's connection state; ``since`` is when the state last changed, ``rtt`` in seconds."""

    node: str
    state: NodeState
    reason: str = ""
    since: float = field(default_factory=time.time)
    rtt: float | None = None


@dataclass
class Result:
    """Outcome of one command on one node. ``error`` is set when the command could not run to
    its end (connection refused, auth failed, host key, timeout, ...); ``exit`` is its exit code."""

    node: str
    exit: int | None
    stdout: str
    stderr: str
    seconds: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit == 0 and self.error is None


@dataclass(frozen=True)
class Line:
    """One line of a streamed command's output (without its newline); ``fd`` is "out" or "err"."""

    node: str
    fd: str
    text: str


class RemoteError(Exception):
    """Raised by :meth:`Pool.put` (the one call that raises) when the file could not be written."""


class _Failure(Exception):
    """Internal: the command could not start or finish; ``state`` for connection failures."""

    def __init__(self, message: str, state: NodeState | None = None) -> None:
        super().__init__(message)
        self.state = state


class _Timeout(_Failure):
    pass


def _remaining(deadline: float | None) -> float | None:
    """Seconds left to ``deadline`` (a monotonic time); None means no deadline."""
    return None if deadline is None else deadline - time.monotonic()


def _check(deadline: float | None, what: str) -> float | None:
    left = _remaining(deadline)
    if left is not None and left <= 0:
        raise _Timeout(f"timed out {what}")
    return left


def _bounded(limit: float, deadline: float | None) -> float:
    left = _remaining(deadline)
    return limit if left is None else max(0.001, min(limit, left))


# --------------------------------------------------------------------------- running processes


class _Process:
    """A started command, SSH channel or local subprocess: raw chunks out, stdin in."""

    node: str
    deadline: float | None = None  # monotonic time; bounds writes to stdin too

    def chunks(self, deadline: float | None) -> Iterator[tuple[str, bytes]]:
        """Yield ("out"|"err", data) until the command's output ends; raise _Timeout at deadline."""
        raise NotImplementedError

    def wait_exit(self, deadline: float | None) -> int | None:
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def close_stdin(self) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        """Stop the command now (any thread): close the channel / kill the process group."""
        raise NotImplementedError

    def close(self) -> None:
        """Release everything (idempotent)."""
        raise NotImplementedError


class _ChannelProcess(_Process):
    def __init__(self, node: str, channel: paramiko.Channel, release: Callable[[], None]) -> None:
        self.node = node
        self.channel = channel
        self._release: Callable[[], None] | None = release

    def chunks(self, deadline: float | None) -> Iterator[tuple[str, bytes]]:
        ch = self.channel
        while True:
            if ch.recv_ready():
                yield "out", ch.recv(READ_SIZE)
                continue
            if ch.recv_stderr_ready():
                yield "err", ch.recv_stderr(READ_SIZE)
                continue
            if ch.eof_received or ch.closed:
                # paramiko buffers a channel's data before it sets the EOF flag, so the last
                # bytes may have arrived between the checks above and this one: drain them
                while ch.recv_ready():
                    yield "out", ch.recv(READ_SIZE)
                while ch.recv_stderr_ready():
                    yield "err", ch.recv_stderr(READ_SIZE)
                return
            left = _check(deadline, "waiting for output")
            wait = POLL if left is None else min(POLL, left)
            try:
                select.select([ch], [], [], wait)
            except (OSError, ValueError):  # the channel was closed by cancel() meanwhile
                return

    def wait_exit(self, deadline: float | None) -> int | None:
        ch = self.channel
        while not ch.status_event.wait(_bounded(POLL, deadline)):
            _check(deadline, "waiting for the exit status")
        if ch.closed and ch.exit_status == -1:
            return None  # closed without an exit status (killed by a signal, or cancelled)
        return ch.exit_status

    def write(self, data: bytes) -> None:
        left = _remaining(self.deadline)
        self.channel.settimeout(None if left is None else max(0.001, left))
        self.channel.sendall(data)

    def close_stdin(self) -> None:
        self.channel.shutdown_write()

    def kill(self) -> None:
        self._close_channel()

    def close(self) -> None:
        self._close_channel()
        if self._release is not None:
            self._release()
            self._release = None

    def _close_channel(self) -> None:
        """Close the channel; where its connection is already gone (paramiko then raises
        EOFError or OSError sending the close), there is nothing left to close."""
        with contextlib.suppress(EOFError, OSError, paramiko.SSHException):
            self.channel.close()


class _LocalProcess(_Process):
    def __init__(self, node: str, command: str) -> None:
        self.node = node
        self.proc = subprocess.Popen(
            ["bash", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def chunks(self, deadline: float | None) -> Iterator[tuple[str, bytes]]:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        names = {self.proc.stdout.fileno(): "out", self.proc.stderr.fileno(): "err"}
        open_fds = list(names)
        while open_fds:
            left = _check(deadline, "waiting for output")
            ready, _, _ = select.select(open_fds, [], [], POLL if left is None else min(POLL, left))
            for fd in ready:
                data = os.read(fd, READ_SIZE)
                if data:
                    yield names[fd], data
                else:
                    open_fds.remove(fd)

    def wait_exit(self, deadline: float | None) -> int | None:
        try:
            code = self.proc.wait(timeout=_remaining(deadline))
        except subprocess.TimeoutExpired:
            raise _Timeout("timed out waiting for the exit status") from None
        return code if code >= 0 else None

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        self.kill()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                try:
                    pipe.close()
                except BrokenPipeError:
                    pass
        self.proc.wait()


class _LineSplitter:
    """Splits a byte stream into text lines. At most MAX_LINE bytes of a line are kept: a longer
    line is cut there (and marked) when its end arrives."""

    def __init__(self) -> None:
        self.partial = bytearray()
        self.cut = False

    def feed(self, data: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            stop = len(data) if end < 0 else end
            room = MAX_LINE - len(self.partial)
            if stop - start > room:
                self.cut = True
            self.partial += data[start : start + max(0, min(room, stop - start))]
            if end < 0:
                return lines
            lines.append(self._take())
            start = end + 1

    def flush(self) -> list[str]:
        return [self._take()] if self.partial or self.cut else []

    def _take(self) -> str:
        text = self.partial.decode("utf-8", errors="replace").removesuffix("\r")
        if self.cut:
            text += " [line cut at 1 MiB]"
        self.partial.clear()
        self.cut = False
        return text


class Stream:
    """A command whose output lines are yielded as they arrive.

    Use it as an iterator (once) and, better, as a context manager. ``cancel()`` from any thread
    closes the channel and ends the iteration. After the end, ``exit`` holds the exit code and
    ``error`` what went wrong (None when the command ran to its end). Only a partial line is ever
    buffered, so memory stays bounded whatever the output size.
    """

    def __init__(
        self,
        node: str,
        process: _Process | None,
        *,
        error: str | None = None,
        deadline: float | None = None,
        secret: Callable[[str], str] = str,
    ) -> None:
        self.node = node
        self.exit: int | None = None
        self.error = error
        self._process = process
        self._deadline = deadline
        self._cancelled = threading.Event()
        self._lines: Iterator[Line] | None = None
        self._redact = secret

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def __iter__(self) -> Iterator[Line]:
        """The lines; iterating again continues where the last iteration stopped."""
        if self._lines is None:
            self._lines = self._generate()
        return self._lines

    def _generate(self) -> Iterator[Line]:
        process = self._process
        if process is None:
            return
        splitters = {"out": _LineSplitter(), "err": _LineSplitter()}
        try:
            for fd, data in process.chunks(self._deadline):
                if self.cancelled:
                    break
                for text in splitters[fd].feed(data):
                    yield Line(self.node, fd, self._redact(text))
            if not self.cancelled:
                for fd, splitter in splitters.items():
                    for text in splitter.flush():
                        yield Line(self.node, fd, self._redact(text))
                self.exit = process.wait_exit(self._deadline)
        except _Failure as exc:
            self.error = str(exc)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.error = f"connection lost: {exc or type(exc).__name__}"
        finally:
            if self.cancelled:
                self.error = "cancelled"
            process.close()

    def cancel(self) -> None:
        """Stop the command (from any thread); the iteration ends soon after."""
        self._cancelled.set()
        if self._process is not None:
            self._process.kill()

    def write(self, data: bytes | str) -> None:
        """Send data to the command's stdin."""
        if self._process is None:
            raise RuntimeError(f"{self.node}: not running ({self.error})")
        self._process.write(data.encode() if isinstance(data, str) else data)

    def close_stdin(self) -> None:
        """Send EOF on stdin (a long-lived agent should exit when it sees it)."""
        if self._process is not None:
            self._process.close_stdin()

    def close(self) -> None:
        """Stop the command if it still runs and release its channel."""
        if self._process is not None:
            self._process.kill()
            self._process.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# --------------------------------------------------------------------------- connections


class _Connection(fabric.Connection):
    """fabric's Connection, with a deadline on the gateway's direct-tcpip channel (fabric opens it
    with paramiko's default of one hour) and no implicit opening of the gateway (the pool opens
    the one shared gateway connection itself, under its lock). The deadline is the connect
    timeout, kept in ``connect_kwargs["timeout"]``."""

    def open_gateway(self) -> paramiko.Channel:
        gateway = self.gateway
        if not isinstance(gateway, fabric.Connection) or not gateway.is_connected:
            raise _Failure("jump host is not connected", NodeState.DOWN)
        return gateway.transport.open_channel(
            kind="direct-tcpip",
            dest_addr=(self.host, int(self.port)),
            src_addr=("", 0),
            timeout=self.connect_kwargs.get("timeout"),
        )


@dataclass
class _Peer:
    """One SSH endpoint (a node, or an outside jump host) and its persistent connection."""

    node: Node
    endpoint: Endpoint | None  # None for a local node
    sessions: threading.BoundedSemaphore
    lock: threading.Lock = field(default_factory=threading.Lock)
    conn: fabric.Connection | None = None
    gateway: _Peer | None = None
    count: int = 0
    status: NodeStatus | None = None
    failures: int = 0
    next_retry: float = 0.0
    probing: bool = False
    down: tuple[float, str] | None = None  # (monotonic time, why) it stopped answering
    retry_at: float = 0.0  # while down: when the next call may try the node again
    state_lock: threading.RLock = field(default_factory=threading.RLock)  # status + down
    sudo_mode: str | None = None  # one of SUDO_MODES, learnt once per connection
    sudo_lock: threading.Lock = field(default_factory=threading.Lock)
    sudo_good: bytes | None = None  # digest of the password sudo accepted here (memory only)
    sudo_refused: dict[bytes, str] = field(default_factory=dict)  # digest -> why sudo said no

    def transport(self) -> paramiko.Transport | None:
        conn = self.conn
        transport = conn.transport if conn is not None else None
        return transport if transport is not None and transport.is_active() else None


SUDO_PROBE = (
    'if [ "$(id -u)" = 0 ]; then echo SVSUDO root; '
    "elif ! command -v sudo >/dev/null 2>&1; then echo SVSUDO missing; "
    "elif sudo -n true 2>/dev/null; then echo SVSUDO nopass; else echo SVSUDO password; fi"
)
"""How root commands run on a node, printed as one tagged line (``SVSUDO <mode>``) after whatever
the login shell prints first: read it with :func:`parse_sudo_probe`, the one parser."""

SUDO_MODES = ("root", "nopass", "password", "missing")
"""root: the SSH user is root; nopass: ``sudo -n`` works; password: sudo wants a password (or the
user may not use sudo at all: only sudo, given a password, can tell); missing: no sudo there."""

SUDO_CHECK = "sudo -S -k -p '' bash -c true"
"""Tries a sudo password once (``-k``: never a cached ticket), with nothing else on stdin, so a
wrong one costs one attempt and the next line of a command's input is never taken for another."""


def parse_sudo_probe(text: str) -> str | None:
    """The mode in :data:`SUDO_PROBE`'s output (its last ``SVSUDO`` line: a login banner may print
    anything, even words like "password", before it); None when there is no such line."""
    found = None
    for line in text.splitlines():
        tag, _, mode = line.strip().partition(" ")
        if tag == "SVSUDO" and mode in SUDO_MODES:
            found = mode
    return found


def sudo_refusal(node: str, output: str) -> str:
    """Why sudo said no, for the operator (from sudo's own words in ``output``)."""
    lines = [t.strip() for t in output.splitlines() if t.strip()]
    said = next((t for t in reversed(lines) if "sudo" in t.lower() or "sorry" in t.lower()),
                lines[-1] if lines else "no output")
    if "incorrect password" in output or "Sorry, try again" in output:
        return (f"sudo on {node}: wrong password ({said}); it is not tried again: "
                f"give the right one")
    if "not in the sudoers" in output or "may not run sudo" in output \
            or "not allowed to" in output:
        return f"sudo on {node}: the SSH user may not use sudo there ({said})"
    return f"sudo on {node} refused the password ({said})"


class Pool:
    """One persistent connection per node, commands as channels, health with backoff.

    ``sudo_password`` is called when a ``sudo=True`` command needs a password; the value is kept
    only for the time of the call, written to sudo's stdin, and replaced by ``********`` wherever
    it would otherwise show (output, errors).
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        sudo_password: Callable[[], str | None] | None = None,
        sessions_per_node: int = 8,
    ) -> None:
        self.cluster = cluster
        ssh = cluster.ssh
        # relative to cluster.yaml's directory, wherever svconsole was started
        self.known_hosts = KnownHosts(cluster.local_path(ssh.known_hosts), ssh.host_key_policy)
        self.resolver = Resolver(cluster)
        self._sudo_password = sudo_password
        self._sudo_salt = secrets.token_bytes(16)  # passwords are compared as salted digests
        self._lock = threading.Lock()  # guards the subscriber list and executors only
        self._subscribers: Subscribers[NodeStatus] = Subscribers("node status")
        self._executor: ThreadPoolExecutor | None = None
        self._health_thread: threading.Thread | None = None
        self._health_stop = threading.Event()
        self._closed = False
        self._sessions = sessions_per_node
        self._peers: dict[str, _Peer] = {}
        self._hops: dict[tuple[object, ...], _Peer] = {}
        for node in cluster.nodes:
            endpoint = None if node.local else self._own_path(self.resolver.node(node))
            self._peers[node.name] = self._make_peer(node, endpoint)
        for peer in list(self._peers.values()):
            if peer.endpoint is not None:
                gateway = self._gateway(peer.endpoint.jumps)
                peer.gateway = gateway if gateway is not peer else None

    def set_sudo_password(self, provider: Callable[[], str | None] | None) -> None:
        """Who answers sudo's password from now on (the TUI lends a modal's in-memory secret;
        the CLI a terminal prompt). ``None``: sudo commands that need a password fail."""
        self._sudo_password = provider

    def _make_peer(self, node: Node, endpoint: Endpoint | None) -> _Peer:
        peer = _Peer(node=node, endpoint=endpoint,
                     sessions=threading.BoundedSemaphore(self._sessions))
        peer.status = NodeStatus(node.name, NodeState.UP if node.local else NodeState.UNKNOWN)
        return peer

    @staticmethod
    def _own_path(endpoint: Endpoint) -> Endpoint:
        """A node that is itself a hop on its path (``jump_host`` names a cluster node) is
        reached directly, or through the hops before it."""
        for i, hop in enumerate(endpoint.jumps):
            if hop.name == endpoint.name or (hop.host, hop.port) == (endpoint.host, endpoint.port):
                return replace(endpoint, jumps=endpoint.jumps[:i])
        return endpoint

    def _gateway(self, jumps: tuple[Endpoint, ...]) -> _Peer | None:
        """The peer of the last hop of ``jumps`` (made once, shared by every node behind it);
        a hop that is a cluster node, reached the same way, is that node's own connection."""
        if not jumps:
            return None
        hop = jumps[-1]
        nodes = set(self.cluster.names())
        for peer in self._peers.values():
            ep = peer.endpoint
            if ep is None or peer.node.name not in nodes:
                continue  # only cluster nodes here: hops are matched by their key below
            if (peer.node.name == hop.name or (
                    (ep.host, ep.port, ep.user) == (hop.host, hop.port, hop.user)
                    and [j.key for j in ep.jumps] == [j.key for j in hop.jumps])):
                return peer
        peer = self._hops.get(hop.key)
        if peer is None:
            peer = self._make_peer(Node(name=hop.name, host=hop.host, port=hop.port,
                                        user=hop.user), hop)
            self._hops[hop.key] = peer
            self._peers.setdefault(hop.name, peer)
            peer.gateway = self._gateway(hop.jumps)
        return peer

    def endpoint(self, node: str) -> Endpoint | None:
        """The node's effective connection (user@host:port via jumps, and where each value came
        from); None for the local node or a name the pool does not know. No I/O."""
        peer = self._peers.get(node)
        return None if peer is None else peer.endpoint

    def _where(self, peer: _Peer) -> str:
        ep = peer.endpoint
        if ep is None:
            return peer.node.host
        return f"[{ep.host}]:{ep.port}" if ":" in ep.host else f"{ep.host}:{ep.port}"

    def _timeout(self, peer: _Peer) -> float:
        ep = peer.endpoint
        return ep.connect_timeout if ep is not None else self.cluster.ssh.connect_timeout

    def _all_peers(self) -> list[_Peer]:
        """Nodes and jump hosts, each once, the farthest behind jump hosts first."""
        peers = {id(p): p for p in (*self._peers.values(), *self._hops.values())}.values()

        def depth(peer: _Peer) -> int:
            return len(peer.endpoint.jumps) if peer.endpoint is not None else 0

        return sorted(peers, key=depth, reverse=True)

    # ----------------------------------------------------------------- status and subscribers

    def status(self, node: str) -> NodeStatus:
        status = self._peer(node).status
        assert status is not None
        return status

    def statuses(self) -> dict[str, NodeStatus]:
        return {name: self.status(name) for name in self.cluster.names()}

    def subscribe(self, callback: Callable[[NodeStatus], None]) -> Callable[[], None]:
        """Call ``callback(NodeStatus)`` (on a pool thread) on every status change; returns the
        function that unsubscribes."""
        return self._subscribers.subscribe(callback)

    def connection_count(self, node: str) -> int:
        """How many TCP connections the pool ever opened (tried) to ``node``."""
        return self._peer(node).count

    def _peer(self, node: str) -> _Peer:
        try:
            return self._peers[node]
        except KeyError:
            raise KeyError(f"no node named {node!r} in cluster {self.cluster.name}") from None

    def _set_status(
        self, peer: _Peer, state: NodeState, reason: str = "", rtt: float | None = None
    ) -> None:
        # Under the peer's lock from the change to its publication, so that subscribers see a
        # node's changes in the order they were made (the last one they see is the current one).
        with peer.state_lock:
            old = peer.status
            if old is not None and old.state == state and old.reason == reason and rtt is None:
                return
            if old is not None and old.state == state:
                new = replace(old, reason=reason, rtt=rtt if rtt is not None else old.rtt)
            else:
                new = NodeStatus(peer.node.name, state, reason, time.time(), rtt)
            peer.status = new
            self._subscribers.publish(new)

    def _mark_down(self, peer: _Peer, reason: str) -> None:
        """The node stopped answering: later calls fail fast (see :data:`RETRY_DOWN_AFTER`)."""
        with peer.state_lock:
            if peer.down is None:
                peer.down = (time.monotonic(), reason)
            peer.retry_at = time.monotonic() + self._retry_interval(peer)
            self._set_status(peer, NodeState.DOWN, reason)

    def _mark_answering(self, peer: _Peer) -> None:
        with peer.state_lock:
            peer.down = None

    def _retry_interval(self, peer: _Peer) -> float:
        return min(RETRY_DOWN_AFTER, max(0.5, self._timeout(peer)))

    def _fail_fast(self, peer: _Peer) -> None:
        """Raise at once for a node marked down, unless this call is the one that tries again."""
        with peer.state_lock:
            if peer.down is None:
                return
            now = time.monotonic()
            if now >= peer.retry_at:
                peer.retry_at = now + self._retry_interval(peer)
                return
            since, reason = peer.down
        raise _Failure(f"{peer.node.name} down since {now - since:.0f} s: {reason}",
                       NodeState.DOWN)

    # ----------------------------------------------------------------- connecting

    def _connect(self, peer: _Peer, deadline: float | None, *, probe: bool = False
                 ) -> paramiko.Transport:
        """The peer's live transport, opening it if needed (under the peer's lock). A node marked
        down fails at once (see :meth:`_fail_fast`) unless ``probe`` (the health probe)."""
        if self._closed:
            raise _Failure("the pool is closed")
        if not probe:
            self._fail_fast(peer)
        transport = peer.transport()
        if transport is not None:
            return transport
        wait = _remaining(deadline)
        if not peer.lock.acquire(timeout=-1 if wait is None else max(0.0, wait)):
            raise _Timeout("timed out waiting for the connection to open", NodeState.CONNECTING)
        try:
            transport = peer.transport()
            if transport is not None:
                return transport
            return self._open(peer, deadline, probe)
        finally:
            peer.lock.release()

    def _open(self, peer: _Peer, deadline: float | None, probe: bool = False) -> paramiko.Transport:
        """Open a new connection to ``peer``; called with ``peer.lock`` held."""
        ep = peer.endpoint
        assert ep is not None
        self._drop(peer)
        if ep.error is not None:
            self._set_status(peer, NodeState.DOWN, ep.error)
            raise _Failure(ep.error, NodeState.DOWN)
        gateway = None
        if peer.gateway is not None:
            try:
                self._connect(peer.gateway, deadline, probe=probe)
            except _Failure as exc:
                hop = peer.gateway
                label = (hop.status.state if hop.status is not None else NodeState.DOWN).label
                reason = f"jump host {hop.node.name} {label}: {exc}"
                self._set_status(peer, NodeState.DOWN, reason)
                raise _Failure(reason, NodeState.DOWN) from None
            gateway = peer.gateway.conn
        self._set_status(peer, NodeState.CONNECTING)
        limit = _bounded(ep.connect_timeout, deadline)
        connect_kwargs: dict[str, object] = {
            "timeout": limit,
            "banner_timeout": limit,
            "auth_timeout": limit,
            "channel_timeout": limit,
            "allow_agent": bool(os.environ.get("SSH_AUTH_SOCK")) and not ep.identities_only,
            "look_for_keys": not ep.identity_files,
        }
        if ep.identity_files:
            connect_kwargs["key_filename"] = list(ep.identity_files)
        conn = _Connection(
            ep.host,
            user=ep.user,
            port=ep.port,
            connect_kwargs=connect_kwargs,
            gateway=gateway,
            # only svconsole's reading of the ssh config applies (in ``ep``), not fabric's own
            config=fabric.Config(ssh_config=paramiko.SSHConfig(), lazy=True),
        )
        # fabric int()s connect_timeout (0.5 s would mean no timeout at all): the float goes in
        # connect_kwargs["timeout"].
        conn.connect_timeout = None
        accepted: list[AcceptedKey] = []
        check = self.known_hosts.prepare(
            conn.client, ep.host_key_name, connect_as=host_id(ep.host, ep.port),
            on_accept=accepted.append, policy=ep.policy, read_only=ep.known_hosts)
        peer.count += 1
        try:
            conn.open()
        except Exception as exc:
            conn.client.close()  # fabric's close() skips a half-open client and leaks its socket
            state, reason = _describe(exc, peer, self._where(peer), limit, check)
            if _timed_out(exc) and limit >= ep.connect_timeout:
                self._mark_down(peer, reason)
            else:
                self._set_status(peer, state, reason)
            raise _Failure(reason, state) from None
        self._mark_answering(peer)
        peer.conn = conn
        transport = conn.transport
        transport.set_keepalive(ep.keepalive or 30)
        if isinstance(transport.sock, socket.socket):
            # Small SSH packets back to back (channel open, exec, close) otherwise wait ~40 ms
            # for delayed ACKs (Nagle): a 10x slower round trip per command.
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._set_status(peer, NodeState.UP, "; ".join(str(a) for a in accepted))
        return transport

    def _drop(self, peer: _Peer, only: fabric.Connection | None = None) -> None:
        """Forget the peer's connection (closing it; with ``only``, just if it is still that one);
        the next command reconnects."""
        conn = peer.conn
        if conn is None or (only is not None and conn is not only):
            return
        peer.conn = None
        peer.sudo_mode = None
        try:
            conn.client.close()
        except Exception as exc:  # closing a dead connection may complain; it is gone anyway
            log.debug("closing %s: %s", peer.node.name, exc)

    def fabric_connection(self, node: str) -> fabric.Connection:
        """The node's open ``fabric.Connection`` (the pool's own, host keys checked), for code that
        wants fabric's API (``put``, ``sudo``...). Raises ``RemoteError`` if it cannot connect."""
        peer = self._peer(node)
        if peer.node.local:
            raise RemoteError(f"{node} is the local node: it has no SSH connection")
        try:
            self._connect(peer, time.monotonic() + self._timeout(peer))
        except _Failure as exc:
            raise RemoteError(f"{node}: {exc}") from None
        assert peer.conn is not None
        return peer.conn

    # ----------------------------------------------------------------- starting commands

    def _start(self, peer: _Peer, command: str, deadline: float | None) -> _Process:
        if peer.node.local:
            return _LocalProcess(peer.node.name, command)
        if not peer.sessions.acquire(timeout=-1 if deadline is None else max(0.0, _remaining(deadline) or 0.0)):
            raise _Timeout(f"timed out waiting for a free session on {peer.node.name}")
        try:
            channel = self._open_channel(peer, deadline)
            channel.exec_command(command)
        except BaseException:
            peer.sessions.release()
            raise
        return _ChannelProcess(peer.node.name, channel, peer.sessions.release)

    def _open_channel(self, peer: _Peer, deadline: float | None) -> paramiko.Channel:
        """A new session channel; a connection found dead is reopened once."""
        for attempt in (1, 2):
            transport = self._connect(peer, deadline)
            limit = _bounded(self._timeout(peer), deadline)
            try:
                channel = transport.open_session(timeout=limit)
            except paramiko.ChannelException as exc:
                raise _Failure(f"channel refused by the server: {exc}") from None
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if transport.is_active():
                    if limit >= self._timeout(peer):  # not just a short deadline
                        self._mark_down(peer, "channel open timed out")
                    raise _Timeout(f"timed out opening a channel ({exc})") from None
                self._set_status(peer, NodeState.DOWN, "connection lost")
                if attempt == 2:
                    raise _Failure(f"connection lost: {exc}", NodeState.DOWN) from None
                continue
            if peer.down is not None:
                self._mark_answering(peer)
                self._set_status(peer, NodeState.UP)
            return channel
        raise AssertionError("unreachable")

    def _command(self, peer: _Peer, cmd: str, env: dict[str, str] | None, sudo: bool,
                 deadline: float | None, *, ask: bool = True) -> tuple[str, str | None]:
        """The command line to send, and sudo's password when it needs one (asked only then)."""
        prefix = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
        if not sudo:
            return prefix + cmd, None
        mode = self._sudo_mode(peer, deadline)
        inner = shlex.quote(prefix + cmd)
        if mode == "root":
            return f"bash -c {inner}", None
        if mode == "nopass":
            return f"sudo -n bash -c {inner}", None
        if mode == "missing":
            raise _Failure(f"{peer.node.name}: the SSH user is not root and sudo is not "
                           f"installed there: root commands cannot run")
        if not ask:
            raise _Failure(f"sudo on {peer.node.name} needs a password (not asked: unattended)")
        password = self._sudo_password() if self._sudo_password is not None else None
        if not password:
            raise _Failure(f"sudo on {peer.node.name} needs a password and none was given")
        self._check_sudo_password(peer, password, deadline)
        return f"sudo -S -k -p '' bash -c {inner}", password

    def _sudo_mode(self, peer: _Peer, deadline: float | None) -> str:
        if peer.sudo_mode is None:
            result = self._execute(peer, SUDO_PROBE, deadline=deadline)
            if result.error is not None:
                raise _Failure(result.error)
            mode = parse_sudo_probe(result.stdout)
            if mode is None:
                raise _Failure(f"{peer.node.name}: the sudo probe printed no answer "
                               f"(exit {result.exit}): {result.stderr.strip()[-200:]}")
            peer.sudo_mode = mode
        return peer.sudo_mode

    def _check_sudo_password(self, peer: _Peer, password: str, deadline: float | None) -> None:
        """Try ``password`` with sudo once per node; a refused one is never sent again (many
        nodes lock an account after a few wrong attempts), a new one is tried once."""
        digest = hashlib.sha256(self._sudo_salt + password.encode()).digest()
        with peer.sudo_lock:
            if peer.sudo_good == digest:
                return
            if digest in peer.sudo_refused:
                raise _Failure(peer.sudo_refused[digest])
            result = self._execute(peer, SUDO_CHECK, deadline=deadline,
                                   stdin=(password + "\n").encode(),
                                   redact=lambda text: text.replace(password, REDACTED))
            if result.error is not None:
                raise _Failure(result.error)
            if result.exit == 0:
                peer.sudo_good = digest
                return
            why = sudo_refusal(peer.node.name, result.stdout + result.stderr)
            peer.sudo_refused[digest] = why
            raise _Failure(why)

    def sudo_refused(self, node: str) -> str | None:
        """Why sudo on ``node`` refused the password the ``sudo_password`` callable gives now
        (None: not refused there, not tried yet, or no password), so that a screen can ask for
        another instead of reusing it. Asks nothing of the node."""
        password = self._sudo_password() if self._sudo_password is not None else None
        if not password:
            return None
        digest = hashlib.sha256(self._sudo_salt + password.encode()).digest()
        return self._peer(node).sudo_refused.get(digest)

    def sudo_mode(self, node: str, *, timeout: float = 30.0) -> str:
        """How root commands run on ``node`` (one of :data:`SUDO_MODES`), asked once per
        connection with :data:`SUDO_PROBE`. Raises :class:`RemoteError` when it cannot tell."""
        peer = self._peer(node)
        try:
            return self._sudo_mode(peer, time.monotonic() + timeout)
        except _Failure as exc:
            raise RemoteError(f"{node}: {exc}") from None

    # ----------------------------------------------------------------- public commands

    def run(
        self,
        node: str,
        cmd: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: dict[str, str] | None = None,
        sudo: bool = False,
        ask: bool = True,
    ) -> Result:
        """Run ``cmd`` on ``node`` (through the user's shell) and collect its output.
        ``sudo``: as root (``ask=False``: only where that needs no password; a watch that runs
        unattended must never put a password question to the operator).

        ``timeout`` covers connecting and running; at the deadline the channel is closed (a remote
        process that ignores the closed channel may go on running). Never raises for remote or
        connection failures: see ``Result.error``.
        """
        peer = self._peer(node)
        deadline = None if timeout is None else time.monotonic() + timeout
        data = (stdin.encode() if isinstance(stdin, str) else stdin) or b""
        try:
            command, password = self._command(peer, cmd, env, sudo, deadline, ask=ask)
        except _Failure as exc:
            return Result(node, None, "", "", 0.0, str(exc))
        if password is None:
            return self._execute(peer, command, deadline=deadline, stdin=data, timeout=timeout)
        return self._execute(peer, command, deadline=deadline, timeout=timeout,
                             stdin=(password + "\n").encode() + data,
                             redact=lambda text: text.replace(password, REDACTED))

    def _execute(
        self,
        peer: _Peer,
        command: str,
        *,
        deadline: float | None,
        stdin: bytes = b"",
        redact: Callable[[str], str] = str,
        timeout: float | None = None,
    ) -> Result:
        started = time.monotonic()
        out, err = bytearray(), bytearray()
        code: int | None = None
        error: str | None = None
        process: _Process | None = None
        try:
            process = self._start(peer, command, deadline)
            process.deadline = deadline
            try:
                if stdin:
                    process.write(stdin)
                process.close_stdin()
            except OSError:
                pass  # the command ended or closed its stdin: its output and exit still count
            for fd, data in process.chunks(deadline):
                buffer = out if fd == "out" else err
                buffer += data[: max(0, MAX_RESULT - len(buffer))]
            code = process.wait_exit(deadline)
            if code is None:
                error = "command killed by a signal or its channel closed"
        except _Timeout as exc:
            error = f"timeout after {timeout:g}s ({exc})" if timeout is not None else str(exc)
        except _Failure as exc:
            error = str(exc)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            error = f"connection lost: {exc or type(exc).__name__}"
        finally:
            if process is not None:
                process.close()
        return Result(
            peer.node.name,
            code,
            redact(out.decode("utf-8", errors="replace")),
            redact(err.decode("utf-8", errors="replace")),
            time.monotonic() - started,
            None if error is None else redact(error),
        )

    def stream(
        self,
        node: str,
        cmd: str,
        *,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        sudo: bool = False,
    ) -> Stream:
        """Start ``cmd`` on ``node`` and return a :class:`Stream` of its lines as they arrive.

        ``stdin`` (if given) is written and stdin is then closed; without it stdin stays open for
        ``Stream.write``/``close_stdin``. A connection failure gives a Stream that yields nothing
        and has ``error`` set. ``sudo``: as root, as :meth:`run` does it (the password, when
        sudo wants one, goes first on stdin and never shows in the lines).
        """
        peer = self._peer(node)
        deadline = None if timeout is None else time.monotonic() + timeout
        connect_deadline = time.monotonic() + self._timeout(peer)
        if deadline is not None:
            connect_deadline = min(connect_deadline, deadline)
        password = None
        try:
            if sudo:
                cmd, password = self._command(peer, cmd, None, True, connect_deadline)
            process = self._start(peer, cmd, connect_deadline)
        except _Failure as exc:
            return Stream(node, None, error=str(exc))
        process.deadline = deadline
        try:
            if password is not None:
                process.write((password + "\n").encode())
            if stdin is not None:
                process.write(stdin.encode() if isinstance(stdin, str) else stdin)
                process.close_stdin()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            process.close()
            return Stream(node, None, error=f"cannot write stdin: {exc}")
        if password is None:
            return Stream(node, process, deadline=deadline)
        return Stream(node, process, deadline=deadline,
                      secret=lambda text: text.replace(password, REDACTED))

    def _names(self, nodes: Iterable[str] | None) -> list[str]:
        names = list(nodes) if nodes is not None else self.cluster.names()
        for name in names:
            self._peer(name)
        return names

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                workers = max(1, self.cluster.ssh.max_parallel)
                self._executor = ThreadPoolExecutor(workers, thread_name_prefix="svconsole-pool")
            return self._executor

    def iter_run_all(
        self,
        cmd: str,
        *,
        nodes: Iterable[str] | None = None,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: dict[str, str] | None = None,
        sudo: bool = False,
    ) -> Iterator[Result]:
        """Run ``cmd`` on the nodes (all by default), at most ``ssh.max_parallel`` at a time,
        yielding each Result as it completes."""
        executor = self._pool()
        futures = [
            executor.submit(self.run, name, cmd, timeout=timeout, stdin=stdin, env=env, sudo=sudo)
            for name in self._names(nodes)
        ]
        for future in as_completed(futures):
            yield future.result()

    def run_all(
        self,
        cmd: str,
        *,
        nodes: Iterable[str] | None = None,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: dict[str, str] | None = None,
        sudo: bool = False,
    ) -> dict[str, Result]:
        """Like :meth:`iter_run_all`, collected by node name (in cluster order)."""
        names = self._names(nodes)
        results = {r.node: r for r in self.iter_run_all(
            cmd, nodes=names, timeout=timeout, stdin=stdin, env=env, sudo=sudo)}
        return {name: results[name] for name in names}

    def put(self, node: str, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        """Write ``data`` to ``remote_path`` on ``node`` atomically: a new temp file with a random
        name in the target directory, then a rename over the target. Raises :class:`RemoteError`
        on failure.

        The temp file is created by the shell's ``>`` under ``set -C`` (noclobber), which opens
        with O_CREAT|O_EXCL: it is never an existing file, and never a symlink someone planted
        (O_EXCL does not follow one: the same guarantee as O_NOFOLLOW), mode 0600 until the data
        is in. ``mv -T`` renames over the target itself, so a symlink there is replaced, not
        followed, and a directory there is an error instead of a destination."""
        directory, _, name = remote_path.rpartition("/")
        directory = directory or ("/" if remote_path.startswith("/") else ".")
        path = shlex.quote(remote_path)
        tmp = shlex.quote(f"{directory}/.{name}.svconsole-{secrets.token_hex(8)}")
        cmd = (f"mkdir -p -- {shlex.quote(directory)} && (set -C; umask 077; cat > {tmp}) "
               f"&& chmod {mode:o} {tmp} && mv -fT -- {tmp} {path} || {{ rm -f -- {tmp}; exit 1; }}")
        result = self.run(node, cmd, stdin=data, timeout=max(60.0, len(data) / 1e6))
        if not result.ok:
            raise RemoteError(f"{node}: cannot write {remote_path}: "
                              f"{result.error or result.stderr.strip() or f'exit {result.exit}'}")

    # ----------------------------------------------------------------- health

    def ping(self, node: str, deadline: float = 5.0) -> NodeStatus:
        """Liveness probe: connect if needed, then one round trip (open and close a session
        channel) within ``deadline`` seconds. A connection that does not answer is dropped."""
        peer = self._peer(node)
        if peer.node.local:
            self._set_status(peer, NodeState.UP, rtt=0.0)
            return self.status(node)
        until = time.monotonic() + deadline
        try:
            transport = self._connect(peer, until, probe=True)
            conn = peer.conn
        except _Failure as exc:
            if exc.state is not None and exc.state != NodeState.CONNECTING:
                return self.status(node)  # _open published the failure
            self._set_status(peer, NodeState.DOWN, str(exc))
            return self.status(node)
        started = time.monotonic()
        try:
            channel = transport.open_session(timeout=_bounded(deadline, until))
            channel.close()
        except paramiko.ChannelException:
            pass  # refused (e.g. MaxSessions reached): the server answered, so it is alive
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if transport.is_active():
                reason = f"no reply within {deadline:g}s"
            else:
                reason = f"connection lost ({exc or type(exc).__name__})"
            self._drop(peer, only=conn)
            self._mark_down(peer, reason)
            return self.status(node)
        self._mark_answering(peer)
        self._set_status(peer, NodeState.UP, "", rtt=time.monotonic() - started)
        return self.status(node)

    def ping_all(self, deadline: float = 5.0, nodes: Iterable[str] | None = None) -> dict[str, NodeStatus]:
        """Ping the nodes in parallel; each answer within ``deadline``."""
        executor = self._pool()
        names = self._names(nodes)
        futures = {name: executor.submit(self.ping, name, deadline) for name in names}
        return {name: futures[name].result() for name in names}

    def start_health(self, interval: float = 5.0, *, backoff_cap: float = 60.0) -> None:
        """Start a background thread that pings every node each ``interval`` seconds, publishes
        status changes, drops dead connections and reconnects with exponential backoff (from
        ``interval``, doubling, at most ``backoff_cap`` seconds between tries)."""
        with self._lock:
            if self._health_thread is not None:
                return
            self._health_stop.clear()
            thread = threading.Thread(
                target=self._health_loop, args=(interval, backoff_cap),
                name="svconsole-health", daemon=True,
            )
            self._health_thread = thread
        thread.start()

    def _health_loop(self, interval: float, cap: float) -> None:
        names = self.cluster.names()
        workers = min(self.cluster.ssh.max_parallel, max(1, len(names)))
        with ThreadPoolExecutor(workers, thread_name_prefix="svconsole-ping") as probes:
            while not self._health_stop.is_set():
                now = time.monotonic()
                for name in names:
                    peer = self._peers[name]
                    if peer.probing or now < peer.next_retry:
                        continue
                    peer.probing = True
                    probes.submit(self._health_probe, peer, interval, cap)
                self._health_stop.wait(interval)

    def _health_probe(self, peer: _Peer, interval: float, cap: float) -> None:
        try:
            deadline = min(max(interval, 1.0), self._timeout(peer))
            status = self.ping(peer.node.name, deadline)
            if status.state == NodeState.UP:
                peer.failures, peer.next_retry = 0, 0.0
            else:
                peer.failures += 1
                delay = min(cap, interval * 2 ** (peer.failures - 1))
                peer.next_retry = time.monotonic() + delay
        except Exception:
            log.exception("health probe of %s failed", peer.node.name)
        finally:
            peer.probing = False

    def close(self) -> None:
        """Stop the health thread, close every connection and the worker threads."""
        self._closed = True
        self._health_stop.set()
        with self._lock:
            thread, self._health_thread = self._health_thread, None
            executor, self._executor = self._executor, None
        if thread is not None:
            thread.join(timeout=self.cluster.ssh.connect_timeout + 1)
        for peer in self._all_peers():  # nodes behind jump hosts first, then the gateways
            self._drop(peer)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _timed_out(exc: BaseException) -> bool:
    """A connect that got no answer in time (TCP connect or SSH handshake): the node may hang."""
    return isinstance(exc, (socket.timeout, TimeoutError)) or (
        isinstance(exc, paramiko.SSHException)
        and ("banner" in str(exc) or "No existing session" in str(exc)))


def _describe(exc: BaseException, peer: _Peer, where: str, limit: float,
              check: HostKeyCheck) -> tuple[NodeState, str]:
    """Map a connect failure to a state and a reason an operator can act on."""
    if isinstance(exc, _Failure):
        return exc.state or NodeState.DOWN, str(exc)
    if isinstance(exc, paramiko.BadHostKeyException):
        revoked = check.revoked_by(exc.key)
        if revoked is not None:
            return NodeState.HOSTKEY_CHANGED, str(HostKeyRevoked(check.name, exc.key, revoked))
        return NodeState.HOSTKEY_CHANGED, changed_reason(check.name, exc.key, exc.expected_key)
    if isinstance(exc, HostKeyRevoked):
        return NodeState.HOSTKEY_CHANGED, str(exc)
    if isinstance(exc, HostKeyUnknown):
        return NodeState.HOSTKEY_UNKNOWN, str(exc)
    if isinstance(exc, paramiko.AuthenticationException):
        user = peer.endpoint.user if peer.endpoint is not None else "(local user)"
        return NodeState.AUTH_FAILED, f"authentication failed for {user}@{where}: {exc}"
    if isinstance(exc, FileNotFoundError):
        return NodeState.AUTH_FAILED, f"identity file not found: {exc.filename}"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        refused = all(getattr(e, "errno", None) == 111 for e in exc.errors.values())
        return NodeState.DOWN, f"connection refused by {where}" if refused else f"cannot connect to {where}: {exc}"
    if isinstance(exc, ConnectionRefusedError):
        return NodeState.DOWN, f"connection refused by {where}"
    if isinstance(exc, socket.gaierror):
        host = peer.endpoint.host if peer.endpoint is not None else peer.node.host
        return NodeState.DOWN, f"unknown host {host}: {exc.strerror}"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return NodeState.DOWN, f"connect to {where} timed out"
    if isinstance(exc, paramiko.SSHException) and (
        "banner" in str(exc) or "No existing session" in str(exc)
    ):  # paramiko's words for a handshake that did not finish in time
        return NodeState.DOWN, f"no SSH handshake with {where} within {limit:.3g}s (hung?)"
    if isinstance(exc, (paramiko.SSHException, EOFError)):
        return NodeState.DOWN, f"SSH handshake with {where} failed: {exc or type(exc).__name__}"
    if isinstance(exc, OSError):
        return NodeState.DOWN, f"cannot connect to {where}: {exc.strerror or exc}"
    return NodeState.DOWN, f"cannot connect to {where}: {type(exc).__name__}: {exc}"
