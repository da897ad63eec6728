"""Evidence from a node beyond the training log: the kernel's word on a rank killed by SIGKILL.

A worker that dies by SIGKILL (torchrun's ``exitcode: -9``) is almost always the kernel's OOM
killer, but the log cannot say so: only the node's kernel log can (``Out of memory: Killed process
4242 (python)``, ``oom-kill:constraint=...``). :func:`oom_evidence` reads it over the pool, with
``dmesg`` first, then ``journalctl -k``, and with sudo when the plain reads are refused
(``kernel.dmesg_restrict``); when nothing can be read, the evidence says why. :func:`with_kernel_evidence`
attaches the lines to the fault's finding.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from console.ssh.pool import Pool
from console.training.faults import Finding

if TYPE_CHECKING:
    from console.training.metrics import MetricsStore

#: The fault whose node's kernel log is read for its oom-kill lines.
OOM_FAULT = "host-oom-kill"

#: What the kernel writes when its OOM killer (or a cgroup's) kills a process.
OOM_PATTERN = (r"Out of memory: Kill|oom-kill:|invoked oom-killer|Memory cgroup out of memory|"
               r"oom_reaper: reaped process|Killed process \d+")

#: Kernel-log lines kept (the newest).
MAX_LINES = 20

_READERS = (("dmesg", "dmesg -T 2>&1 || dmesg 2>&1"),
            ("journalctl -k", "journalctl -k -b --no-pager -o short-iso 2>&1"))
_REFUSED = re.compile(r"Operation not permitted|Permission denied|read kernel buffer failed|"
                      r"not seeing messages from other users|No journal files|"
                      r"command not found|No such file", re.IGNORECASE)


@dataclass(frozen=True)
class KernelEvidence:
    """What a node's kernel log says about OOM kills. ``source``: the reader that worked
    (``dmesg``, ``journalctl -k``, with `` (sudo)`` when it took sudo), ``None`` when none did;
    ``lines``: its OOM lines (newest last), those naming ``pid`` first; ``error``: why nothing
    could be read (each reader's answer)."""

    node: str
    source: str | None
    lines: tuple[str, ...] = ()
    error: str | None = None
    pid: int | None = None

    @property
    def readable(self) -> bool:
        return self.source is not None

    def summary(self) -> str:
        if self.source is None:
            return f"kernel log of {self.node} not readable: {self.error}"
        if not self.lines:
            return f"kernel log of {self.node} ({self.source}): no oom-kill lines"
        count = f"{len(self.lines)} oom-kill line(s)"
        own = [line for line in self.lines if _names(line, self.pid)] \
            if self.pid is not None else []
        if own:
            said = next((m[0] for line in own if (m := _KILLED.search(line))), None)
            what = said or f"the kernel's OOM killer killed pid {self.pid}"
            return f"kernel log of {self.node} ({self.source}): {what} ({count})"
        return f"kernel log of {self.node} ({self.source}): {count}"


#: The kernel's line that names the process its OOM killer killed.
_KILLED = re.compile(r"(?:Memory cgroup o|O)ut of memory: Kill(?:ed)? process \d+ \([^)]*\)")


def _names(line: str, pid: int) -> bool:
    """``line`` is the kernel's about ``pid`` (``Killed process PID``, ``pid=PID``)."""
    return re.search(rf"(?:process |pid=){pid}\b", line) is not None


def _script(reader: str) -> str:
    """Read with ``reader``; print ``SVKLOG ok`` then the OOM lines, or ``SVKLOG refused``
    then what the reader said."""
    return (f"out=$({reader}); rc=$?; "
            f"if [ $rc -ne 0 ] || printf '%s' \"$out\" | head -n 3 | grep -Eqi "
            f"{shlex.quote(_REFUSED.pattern)}; then echo 'SVKLOG refused'; "
            "printf '%s\\n' \"$out\" | head -n 3; "
            f"else echo 'SVKLOG ok'; printf '%s\\n' \"$out\" | grep -E "
            f"{shlex.quote(OOM_PATTERN)} | tail -n {MAX_LINES * 5}; fi")


def oom_evidence(pool: Pool, node: str, *, pid: int | None = None, timeout: float = 30.0,
                 sudo: bool = True, ask: bool = True,
                 readers: tuple[tuple[str, str], ...] = _READERS) -> KernelEvidence:
    """The OOM lines of ``node``'s kernel log (``pid``: the killed worker's, whose lines come
    first). Plain ``dmesg``, then ``journalctl -k``; then both with sudo (``sudo``: allowed to
    try it; the pool asks for a password if sudo needs one, unless ``ask`` is False: then only
    root and passwordless sudo). Never raises: what went wrong is in ``error``. ``readers``:
    (name, shell command) pairs tried in order."""
    answers: list[str] = []
    for use_sudo in (False, True) if sudo else (False,):
        for name, reader in readers:
            result = pool.run(node, _script(reader), timeout=timeout, sudo=use_sudo, ask=ask)
            label = f"{name} (sudo)" if use_sudo else name
            if result.error is not None:
                answers.append(f"{label}: {result.error}")
                continue
            _, marker, body = result.stdout.partition("SVKLOG ")
            state, _, body = body.partition("\n")
            if not marker or state.strip() != "ok":
                said = body.strip().splitlines()[0] if body.strip() else f"exit {result.exit}"
                answers.append(f"{label}: {said}")
                continue
            return KernelEvidence(node, label, _ordered(body.splitlines(), pid), pid=pid)
    return KernelEvidence(node, None, error="; ".join(answers), pid=pid)


def _ordered(lines: list[str], pid: int | None) -> tuple[str, ...]:
    """The newest :data:`MAX_LINES` lines; with ``pid``, the lines naming it first."""
    lines = [line.rstrip() for line in lines if line.strip()]
    if pid is None:
        return tuple(lines[-MAX_LINES:])
    own = [line for line in lines if _names(line, pid)][-MAX_LINES:]
    rest = [line for line in lines if not _names(line, pid)]
    room = MAX_LINES - len(own)
    return tuple(own + (rest[len(rest) - room:] if room > 0 else []))


def with_kernel_evidence(finding: Finding, evidence: KernelEvidence) -> Finding:
    """``finding`` with the kernel's lines added to its evidence and what was read (or why
    nothing could be) in its detail."""
    detail = f"{finding.detail}; {evidence.summary()}" if finding.detail else evidence.summary()
    return replace(finding, evidence=(*finding.evidence, *evidence.lines), detail=detail)


def add_kernel_evidence(pool: Pool, store: MetricsStore, checked: set[tuple[str, int | None]]
                        ) -> int:
    """For each host-oom-kill finding of ``store`` not in ``checked`` (node, rank), read its
    node's kernel log (:func:`oom_evidence`, with sudo only where it needs no password) and add
    its oom-kill lines to the finding; ``checked`` gets the pair. The number of kernel logs
    read. For the run's watch (each new finding once) and for a finished run's metrics."""
    read = 0
    for f in store.findings():
        if f.id != OOM_FAULT or f.node is None or (f.node, f.rank) in checked:
            continue
        checked.add((f.node, f.rank))
        evidence = oom_evidence(pool, f.node, pid=killed_pid(f), ask=False)
        store.amend(f.id, f.node, f.rank, lambda g, e=evidence: with_kernel_evidence(g, e))
        read += 1
    return read


def killed_pid(finding: Finding) -> int | None:
    """The pid of the worker a SIGKILL finding is about, from its evidence."""
    for line in finding.evidence:
        m = re.search(r"\(pid: (\d+)\)|received by PID (\d+)", line)
        if m:
            return int(m.group(1) or m.group(2))
    return None
