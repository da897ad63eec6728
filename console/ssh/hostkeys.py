"""SSH host-key checking for svconsole's connections.

svconsole keeps its own ``known_hosts`` file (``ssh.known_hosts`` in cluster.yaml, created with
mode 0600) and also trusts the system ones (``~/.ssh/known_hosts``, ``/etc/ssh/ssh_known_hosts``,
or the files an ssh_config's ``UserKnownHostsFile``/``GlobalKnownHostsFile`` name), which it only
reads. Hosts are looked up and recorded under the name OpenSSH uses (:func:`known_hosts_name`:
``HostKeyAlias``, else the HostName, as ``[host]:port`` for a port other than 22), and the files
are read as OpenSSH reads them: comma-separated patterns with ``*``/``?`` and ``!`` negation,
hashed names, ``@revoked`` keys (refused, with the file and line that revokes them) and
``@cert-authority`` lines (CA keys for host certificates: never taken for a host's own key;
svconsole does not accept host certificates). For every connection:

- a key that matches a known one is accepted;
- a key that differs from the known key of the same type is always refused
  (paramiko raises ``BadHostKeyException``; :func:`changed_reason` words it with both
  fingerprints);
- a host with no known key of the offered type is, under ``accept-new``, accepted and appended to
  svconsole's file in hashed form (``|1|salt|hash``, as ``ssh-keygen -H`` writes it), and the
  fingerprint is reported; under ``strict`` it is refused with :class:`HostKeyUnknown`.

paramiko's and fabric's ``AutoAddPolicy`` (accept anything, save nothing) is never used.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import paramiko

log = logging.getLogger(__name__)

SYSTEM_KNOWN_HOSTS: tuple[str, ...] = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")

Policy = Literal["accept-new", "strict"]


def fingerprint(key: paramiko.PKey) -> str:
    """The key's fingerprint as OpenSSH prints it: ``SHA256:`` + unpadded base64 of the digest."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def host_id(host: str, port: int) -> str:
    """The name a host is filed under in known_hosts: ``host`` on port 22, else ``[host]:port``."""
    return host if port == 22 else f"[{host}]:{port}"


def known_hosts_name(host: str, port: int, alias: str | None = None) -> str:
    """The name OpenSSH looks a host up under: its ``HostKeyAlias`` as written (no port), else
    :func:`host_id` of the address it connects to (the HostName, not the Host alias)."""
    return alias if alias else host_id(host, port)


@dataclass(frozen=True)
class Entry:
    """One key line of a known_hosts file."""

    path: Path
    line: int
    marker: str | None
    """``@revoked``, ``@cert-authority`` or None."""
    patterns: str
    key: paramiko.PKey

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def matches(self, name: str) -> bool:
        """Whether this line is about ``name`` (a :func:`known_hosts_name`), as OpenSSH decides:
        a hashed name, or patterns of which one matches and no negated one does."""
        if self.patterns.startswith("|1|"):
            return _hashed_match(self.patterns, name)
        found = False
        for pattern in self.patterns.split(","):
            negated = pattern.startswith("!")
            if _glob(pattern[1:] if negated else pattern).fullmatch(name.lower()):
                if negated:
                    return False
                found = True
        return found

    def same_key(self, key: paramiko.PKey) -> bool:
        return self.key.get_name() == key.get_name() and self.key.asbytes() == key.asbytes()


def _glob(pattern: str) -> re.Pattern[str]:
    """OpenSSH's host pattern (``*`` and ``?`` only; brackets are literal), case-insensitive."""
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.compile("".join(parts))


def _hashed_match(field: str, name: str) -> bool:
    try:
        _, _, salt, digest = field.split("|", 3)
        mac = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
        return hmac.compare_digest(mac, base64.b64decode(digest))
    except (ValueError, binascii.Error):
        return False


_parsed: dict[Path, tuple[tuple[int, int, int], list[Entry]]] = {}
_parsed_lock = threading.Lock()


def read_entries(path: Path) -> list[Entry]:
    """The key lines of one known_hosts file ([] if it does not exist). Lines that cannot be read
    (a key type paramiko does not know, a broken key) are skipped with a debug log, as ssh does.
    A file is parsed again only when it changed (inode, size or mtime): a fan-out to 128 nodes
    reads a big known_hosts once, not once per connection."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.warning("cannot read known_hosts %s: %s", path, exc)
        return []
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    with _parsed_lock:
        cached = _parsed.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    entries = _parse_entries(path)
    with _parsed_lock:
        _parsed[path] = (stamp, entries)
    return entries


def _parse_entries(path: Path) -> list[Entry]:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        log.warning("cannot read known_hosts %s: %s", path, exc)
        return []
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = None
        if fields[0].startswith("@"):
            marker, fields = fields[0], fields[1:]
            if marker not in ("@revoked", "@cert-authority"):
                log.debug("%s:%d: unknown marker %s, line skipped", path, number, marker)
                continue
        if len(fields) < 3:
            continue
        try:
            key = paramiko.PKey.from_type_string(fields[1], base64.b64decode(fields[2]))
        except (paramiko.SSHException, ValueError, binascii.Error, TypeError) as exc:
            log.debug("%s:%d: key not readable (%s), line skipped", path, number, exc)
            continue
        entries.append(Entry(path, number, marker, fields[0], key))
    return entries


def changed_reason(name: str, offered: paramiko.PKey, expected: paramiko.PKey) -> str:
    """Human text for a changed host key, with both fingerprints."""
    return (
        f"host key for {name} changed: expected {expected.get_name()} {fingerprint(expected)}, "
        f"offered {offered.get_name()} {fingerprint(offered)} (possible man-in-the-middle; "
        "remove the old entry from known_hosts if the change is expected)"
    )


class HostKeyRevoked(paramiko.SSHException):
    """The host offered a key that a known_hosts line marks ``@revoked``: refused, whatever the
    policy and whatever other line lists it as good."""

    def __init__(self, name: str, key: paramiko.PKey, where: str) -> None:
        self.name = name
        self.where = where
        super().__init__(
            f"host key for {name} is revoked: {key.get_name()} {fingerprint(key)} is marked "
            f"@revoked in {where}; refused"
        )


class HostKeyUnknown(paramiko.SSHException):
    """The host offered a key that no known_hosts file lists, and the policy is ``strict``."""

    def __init__(self, name: str, key: paramiko.PKey) -> None:
        self.name = name
        self.fingerprint = fingerprint(key)
        super().__init__(
            f"unknown host key for {name}: {key.get_name()} {self.fingerprint} "
            "(host_key_policy is strict; add it to known_hosts to trust it)"
        )


@dataclass(frozen=True)
class AcceptedKey:
    """A new host key that was accepted under ``accept-new`` and recorded."""

    name: str
    key_type: str
    fingerprint: str
    path: Path

    def __str__(self) -> str:
        return f"new host key for {self.name} accepted: {self.key_type} {self.fingerprint} (recorded in {self.path})"


@dataclass(frozen=True)
class HostKeyCheck:
    """What :meth:`KnownHosts.prepare` armed a connection with: the name and the revoked keys."""

    name: str
    revoked: tuple[Entry, ...]

    def revoked_by(self, key: paramiko.PKey) -> str | None:
        """The ``file:line`` that revokes ``key`` for this host, or None."""
        return next((e.where for e in self.revoked if e.same_key(key)), None)


def stricter(a: Policy, b: Policy) -> Policy:
    """The stricter of two policies (an ssh_config can make a host stricter, never laxer)."""
    return "strict" if "strict" in (a, b) else "accept-new"


class KnownHosts:
    """svconsole's own known_hosts file plus the read-only system ones, with one policy."""

    def __init__(
        self,
        own_path: str | os.PathLike[str],
        policy: Policy = "accept-new",
        system_paths: Iterable[str | os.PathLike[str]] = SYSTEM_KNOWN_HOSTS,
    ) -> None:
        if policy not in ("accept-new", "strict"):
            raise ValueError(f"host_key_policy must be accept-new or strict, not {policy!r}")
        self.path = Path(os.path.expanduser(os.fspath(own_path)))
        self.policy: Policy = policy
        self.system_paths = tuple(Path(os.path.expanduser(os.fspath(p))) for p in system_paths)
        self._write_lock = threading.Lock()

    def entries(self, read_only: Iterable[Path] | None = None) -> list[Entry]:
        """Every key line of the read-only files (``read_only``, default the system ones), then
        of svconsole's own."""
        paths = self.system_paths if read_only is None else tuple(read_only)
        return [e for path in (*paths, self.path) for e in read_entries(path)]

    def known(self, name: str, read_only: Iterable[Path] | None = None) -> dict[str, paramiko.PKey]:
        """Good keys of ``name`` (a :func:`known_hosts_name`) by key type; a revoked key is never
        one, and svconsole's own file wins over the system ones."""
        return _good_keys([e for e in self.entries(read_only) if e.matches(name)])

    def prepare(
        self,
        client: paramiko.SSHClient,
        name: str,
        *,
        connect_as: str | None = None,
        on_accept: Callable[[AcceptedKey], None] | None = None,
        policy: Policy | None = None,
        read_only: Iterable[Path] | None = None,
    ) -> HostKeyCheck:
        """Arm ``client`` for a connection to the host known as ``name``: load its good keys (so
        paramiko prefers their types and refuses a changed key) under ``connect_as``, the name
        paramiko itself looks up (:func:`host_id` of the address it connects to), and install
        ``policy`` (default this store's) for a host with no known key."""
        entries = [e for e in self.entries(read_only) if e.matches(name)]
        revoked = tuple(e for e in entries if e.marker == "@revoked")
        table = client.get_host_keys()
        for kind, key in _good_keys(entries).items():
            table.add(connect_as or name, kind, key)
        check = HostKeyCheck(name, revoked)
        client.set_missing_host_key_policy(_Policy(self, check, policy or self.policy, on_accept))
        return check

    def record(self, name: str, key: paramiko.PKey) -> AcceptedKey:
        """Append ``key`` for ``name`` (a :func:`host_id`) to svconsole's file, hostname hashed."""
        line = f"{paramiko.HostKeys.hash_host(name)} {key.get_name()} {key.get_base64()}\n"
        with self._write_lock:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            # One O_APPEND write of one line, as ssh itself does: concurrent writers (another
            # svconsole, ssh) never lose each other's lines, which a rename would risk.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode("ascii"))
                os.fsync(fd)
            finally:
                os.close(fd)
        accepted = AcceptedKey(name, key.get_name(), fingerprint(key), self.path)
        log.warning("%s", accepted)
        return accepted


def _good_keys(entries: list[Entry]) -> dict[str, paramiko.PKey]:
    """Of one host's lines, the good keys by type (a later file wins; revoked keys never count)."""
    revoked = [e for e in entries if e.marker == "@revoked"]
    keys: dict[str, paramiko.PKey] = {}
    for entry in entries:
        if entry.marker is None and not any(r.same_key(entry.key) for r in revoked):
            keys[entry.key.get_name()] = entry.key
    return keys


class _Policy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only for a host with no known good key. ``hostname`` is paramiko's
    name for it; the key is checked and recorded under the OpenSSH name in ``check``."""

    def __init__(self, store: KnownHosts, check: HostKeyCheck, policy: Policy,
                 on_accept: Callable[[AcceptedKey], None] | None) -> None:
        self.store = store
        self.check = check
        self.policy = policy
        self.on_accept = on_accept

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        name = self.check.name
        where = self.check.revoked_by(key)
        if where is not None:
            raise HostKeyRevoked(name, key, where)
        if self.policy == "strict":
            raise HostKeyUnknown(name, key)
        accepted = self.store.record(name, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.on_accept is not None:
            self.on_accept(accepted)
