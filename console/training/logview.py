"""Every node's log of a run in one view, interleaved by time, as ``tail -f`` on every node
would show it, bounded in memory.

:class:`LogView` keeps a ring of the newest lines per node (each line keeps its node, rank,
byte offset and timestamp). :meth:`LogView.lines` interleaves them by time (a line with no
timestamp of its own, a traceback's, takes its predecessor's, so it stays under the line it
belongs to), filtered to one node, one rank or errors; :meth:`LogView.find` searches forwards
or backwards from a position. Lines older than a node's ring are read again from the node on
demand by byte offset (:func:`read_before`).
"""

from __future__ import annotations

import re
import shlex
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from console.atomic import atomic_write
from console.ssh.pool import Pool

#: Lines kept per node.
RING = 5000
#: What counts as an error line for the ``errors`` filter.
ERROR_LINE = re.compile(r"Traceback|Error|ERROR|error:|Exception|FAILED|Killed|exitcode: -?[1-9]"
                        r"|NCCL WARN|RuntimeError|failed", re.ASCII)


@dataclass(frozen=True)
class LogLine:
    node: str
    rank: int | None
    time: float | None
    """The line's own timestamp, or the one before it in the same log."""
    line_no: int
    offset: int
    text: str
    seq: int
    """Arrival order (ties broken by it, so the interleaving is stable)."""

    @property
    def is_error(self) -> bool:
        return bool(ERROR_LINE.search(self.text))

    @property
    def prefix(self) -> str:
        return f"{self.node}/{'-' if self.rank is None else self.rank}"


@dataclass(frozen=True)
class Filter:
    node: str | None = None
    rank: int | None = None
    errors: bool = False

    def keeps(self, line: LogLine) -> bool:
        return ((self.node is None or line.node == self.node)
                and (self.rank is None or line.rank == self.rank)
                and (not self.errors or line.is_error))

    def describe(self) -> str:
        parts = [f"node {self.node}" if self.node else "", f"rank {self.rank}"
                 if self.rank is not None else "", "errors" if self.errors else ""]
        return ", ".join(p for p in parts if p) or "all lines"


class LogView:
    """The interleaved, bounded view (see the module docstring). Thread-safe: a follower's
    thread adds while the screen reads."""

    def __init__(self, ring: int = RING) -> None:
        self.ring = ring
        self._rings: dict[str, deque[LogLine]] = {}
        self._last_time: dict[str, float | None] = {}
        self._last_rank: dict[str, int | None] = {}
        self._dropped: dict[str, int] = {}
        self._seq = 0
        self._lock = threading.Lock()
        self.revision = 0

    def add(self, node: str, text: str, *, line_no: int = 0, offset: int = 0,
            time: float | None = None, rank: int | None = None) -> None:
        with self._lock:
            ring = self._rings.setdefault(node, deque(maxlen=self.ring))
            if len(ring) == ring.maxlen:
                self._dropped[node] = self._dropped.get(node, 0) + 1
            if time is None:
                time = self._last_time.get(node)
            else:
                self._last_time[node] = time
            if rank is None:
                rank = self._last_rank.get(node)
            else:
                self._last_rank[node] = rank
            self._seq += 1
            ring.append(LogLine(node, rank, time, line_no, offset, text.rstrip("\n"),
                                self._seq))
            self.revision += 1

    def add_event(self, node: str, event: object) -> None:
        """Add a parsed line (:class:`console.training.logparse.Event`)."""
        self.add(node, getattr(event, "text", ""), line_no=getattr(event, "line_no", 0),
                 offset=getattr(event, "offset", 0), time=getattr(event, "time", None),
                 rank=getattr(event, "rank", None))

    def add_events(self, pairs: Iterable[tuple[str, object]]) -> None:
        """Add (node, event) pairs, as a follower's update carries them."""
        for node, event in pairs:
            self.add_event(node, event)

    def nodes(self) -> list[str]:
        with self._lock:
            return sorted(self._rings)

    def ranks(self) -> list[int]:
        with self._lock:
            return sorted({line.rank for ring in self._rings.values() for line in ring
                           if line.rank is not None})

    def dropped(self, node: str) -> int:
        """Lines of ``node`` no longer in memory (read them with :func:`read_before`)."""
        with self._lock:
            return self._dropped.get(node, 0)

    def oldest_offset(self, node: str) -> int | None:
        with self._lock:
            ring = self._rings.get(node)
            return ring[0].offset if ring else None

    def lines(self, flt: Filter = Filter()) -> list[LogLine]:
        with self._lock:
            kept = [line for ring in self._rings.values() for line in ring if flt.keeps(line)]
        kept.sort(key=lambda ln: (ln.time if ln.time is not None else float("-inf"), ln.seq))
        return kept

    @staticmethod
    def find(lines: list[LogLine], pattern: str, start: int, *, backwards: bool = False
             ) -> int | None:
        """The index of the next line (after ``start``, or before it) that contains
        ``pattern`` (a case-insensitive regex; plain text if it is not one), wrapping round."""
        try:
            rx = re.compile(pattern, re.IGNORECASE)
        except re.error:
            rx = re.compile(re.escape(pattern), re.IGNORECASE)
        n = len(lines)
        if not n:
            return None
        step = -1 if backwards else 1
        for k in range(1, n + 1):
            i = (start + step * k) % n
            if rx.search(lines[i].text) or rx.search(lines[i].prefix):
                return i
        return None

    @staticmethod
    def save(path: str | Path, lines: Iterable[LogLine], *, timestamps: bool = True) -> int:
        """Write the lines as shown (``node/rank`` prefix) atomically; returns how many."""
        import datetime

        out = []
        for line in lines:
            stamp = ""
            if timestamps and line.time is not None:
                stamp = datetime.datetime.fromtimestamp(line.time).strftime("%H:%M:%S ")
            out.append(f"{stamp}{line.prefix} {line.text}")
        atomic_write(Path(path), "\n".join(out) + ("\n" if out else ""))
        return len(out)


def read_before(pool: Pool, node: str, log: str, offset: int, count: int = 500
                ) -> list[tuple[int, str]]:
    """The ``count`` lines of ``log`` on ``node`` that end before byte ``offset``, as
    (offset of the line, text), oldest first (for scrolling back past the ring)."""
    offset = max(0, int(offset))
    cmd = (f"head -c {offset} -- {shlex.quote(log)} | tail -n {int(count)} | "
           f"LC_ALL=C wc -c -l | tr -s ' ' ' '; echo @; "
           f"head -c {offset} -- {shlex.quote(log)} | tail -n {int(count)}")
    result = pool.run(node, cmd, timeout=60)
    if not result.ok:
        raise OSError(f"{node}: cannot read {log}: "
                      f"{(result.error or result.stderr or 'exit ' + str(result.exit)).strip()}")
    head, _, body = result.stdout.partition("@\n")
    _lines, size = (int(x) for x in head.split())
    start = offset - size
    out = []
    for text in body.split("\n")[:-1] if body.endswith("\n") else body.split("\n"):
        out.append((start, text))
        start += len(text.encode()) + 1
    return out
