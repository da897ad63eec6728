"""SSH host-key checking for svconsole's connections.

svconsole keeps its own ``known_hosts`` file (``ssh.known_hosts`` in cluster.yaml, created with
mode 0600) and also trusts the system ones (``~/.ssh/known_hosts``, ``/etc/ssh/ssh_known_hosts``),
which it only reads. For every connection:

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
import hashlib
import logging
import os
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


def changed_reason(name: str, offered: paramiko.PKey, expected: paramiko.PKey) -> str:
    """Human text for a changed host key, with both fingerprints."""
    return (
        f"host key for {name} changed: expected {expected.get_name()} {fingerprint(expected)}, "
        f"offered {offered.get_name()} {fingerprint(offered)} (possible man-in-the-middle; "
        "remove the old entry from known_hosts if the change is expected)"
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

    def known(self, host: str, port: int) -> dict[str, paramiko.PKey]:
        """Known keys of ``host:port`` by key type; svconsole's own file wins over system files."""
        keys: dict[str, paramiko.PKey] = {}
        name = host_id(host, port)
        for path in (*self.system_paths, self.path):
            table = paramiko.HostKeys()
            try:
                table.load(os.fspath(path))
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("cannot read known_hosts %s: %s", path, exc)
                continue
            found = table.lookup(name)
            if found is not None:
                keys.update({kind: found[kind] for kind in found.keys()})
        return keys

    def prepare(
        self,
        client: paramiko.SSHClient,
        host: str,
        port: int,
        on_accept: Callable[[AcceptedKey], None] | None = None,
    ) -> None:
        """Arm ``client`` for a connection to ``host:port``: load that host's known keys (so paramiko
        prefers their types and refuses a changed key) and install this policy for unknown keys."""
        table = client.get_host_keys()
        name = host_id(host, port)
        for kind, key in self.known(host, port).items():
            table.add(name, kind, key)
        client.set_missing_host_key_policy(_Policy(self, on_accept))

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


class _Policy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only for a host with no known key of the offered type."""

    def __init__(self, store: KnownHosts, on_accept: Callable[[AcceptedKey], None] | None) -> None:
        self.store = store
        self.on_accept = on_accept

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if self.store.policy == "strict":
            raise HostKeyUnknown(hostname, key)
        accepted = self.store.record(hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.on_accept is not None:
            self.on_accept(accepted)
