"""Stacks of a run's ranks on every node, and which ranks hold the others up.

A hung multi-node run prints nothing. :func:`take_stacks` asks every node of the run at once
(``scripts/rank_stacks.py`` over the pool) for the Python stack of each rank process, from py-spy
(native frames too where it gives them), the process's state from ``/proc`` (R, S, D, T, wchan),
its CPU time over a one-second window and the age of the rank's last step line in the node's log.
The training never stops for it (see the node script).

:func:`analyse` groups the ranks by their innermost Python frames. The largest group, preferring
one in a collective (all_reduce, barrier, broadcast, all_gather, reduce_scatter, in torch's c10d,
gloo, NCCL or DeepSpeed's comm wrappers), is what the run waits in; the ranks outside it are the
suspects, each with why: stopped (state T), in uninterruptible I/O (D), waiting on torch's
extension build lock (a killed build's, left behind), in the DataLoader, in ``torch.save``,
elsewhere; a rank with no process, or on a node that could not be asked, is a suspect too. A rank in state T is a suspect wherever its stack is.

:class:`StacksReport` is the answer, as JSON (``svconsole stacks --json``) and text, and the
Stacks view of the TUI shows the same.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from console.ssh.pool import Pool
from console.ssh.remote import script_text
from console.training.evidence import add_kernel_evidence
from console.training.metrics import MetricsStore, RunStall
from console.training.runs import PREFIX, RunRecord, check_own, node_command, node_python

log = logging.getLogger(__name__)

NODE_SCRIPT = "rank_stacks.py"
KEY_FRAMES = 3
"""Innermost Python frames that make a group's key."""
PYSPY_MISSING = ("py-spy is not installed for the training Python ({python}): run the setup "
                 "step 'py-spy' (svconsole setup --step py-spy) or 'pip install py-spy' there")

#: Frame names of collectives and point-to-point waits (torch c10d, DeepSpeed comm, ZeRO).
_COLLECTIVE_NAME = re.compile(
    r"^(?:all_reduce\w*|allreduce\w*|all_gather\w*|allgather\w*|_all_gather_base|"
    r"reduce_scatter\w*|_reduce_scatter_base|barrier|monitored_barrier|broadcast\w*|"
    r"all_to_all\w*|reduce|gather|scatter|recv|send|wait|synchronize|inference_all_reduce)$")
#: Where such a frame must live to count (a user function called ``reduce`` does not).
_COLLECTIVE_FILE = re.compile(r"torch/distributed/|deepspeed/comm/|c10d|gloo|nccl|"
                              r"deepspeed/runtime/(?:zero|comm)/|\bdistributed_c10d\.py")
#: Native frames of a collective (py-spy ``--native``).
_COLLECTIVE_NATIVE = re.compile(r"gloo::|nccl|c10d::|ProcessGroup")


@dataclass(frozen=True)
class Frame:
    """One stack frame, innermost first in :attr:`RankStack.frames`. ``native`` for a C/C++
    frame from py-spy's ``--native``."""

    name: str
    file: str
    line: int
    native: bool = False

    def __str__(self) -> str:
        return f"{self.name} ({self.file}:{self.line})" if not self.native else \
            f"{self.name} [{self.file}]"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "file": self.file, "line": self.line, "native": self.native}


@dataclass
class RankStack:
    """One rank process as seen on its node. ``frames``: its main thread, innermost first.
    ``cpu_s``: CPU seconds it used over ``window_s``. ``last_log_age_s``: seconds since its last
    step line (by the line's time stamp). ``error``: why there is no stack."""

    node: str
    rank: int | None
    local_rank: int | None
    pid: int | None
    state: str
    wchan: str | None = None
    cpu_s: float | None = None
    window_s: float | None = None
    frames: list[Frame] = field(default_factory=list)
    threads: int = 0
    last_log_age_s: float | None = None
    last_line: str | None = None
    error: str | None = None
    dump_mode: str | None = None
    world_size: int | None = None

    @property
    def python_frames(self) -> list[Frame]:
        return [f for f in self.frames if not f.native]

    @property
    def where(self) -> str:
        """Its innermost Python frame, in words."""
        py = self.python_frames
        return str(py[0]) if py else (str(self.frames[0]) if self.frames else "unknown")

    def key(self) -> tuple[tuple[str, str, int], ...]:
        return tuple((f.name, f.file, f.line) for f in self.python_frames[:KEY_FRAMES])

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "local_rank": self.local_rank,
                "pid": self.pid, "state": self.state, "wchan": self.wchan, "cpu_s": self.cpu_s,
                "window_s": self.window_s, "frames": [f.to_dict() for f in self.frames],
                "threads": self.threads, "last_log_age_s": self.last_log_age_s,
                "last_line": self.last_line, "error": self.error, "dump_mode": self.dump_mode}


@dataclass
class Group:
    """Ranks whose innermost Python frames are the same. ``collective``: the collective they
    are in (``all_reduce``), if any. ``waited_s``: the longest time since a step line among its
    ranks (how long they have waited)."""

    ranks: list[int | None]
    nodes: list[str]
    frames: list[Frame]
    collective: str | None
    key: tuple[tuple[str, str, int], ...] = ()
    majority: bool = False
    waited_s: float | None = None

    @property
    def label(self) -> str:
        return self.collective or (str(self.frames[0]) if self.frames else "no stack")

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "nodes": self.nodes, "collective": self.collective,
                "majority": self.majority, "waited_s": self.waited_s, "label": self.label,
                "frames": [f.to_dict() for f in self.frames]}


@dataclass(frozen=True)
class Suspect:
    """A rank the others wait for, and why."""

    node: str | None
    rank: int | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "why": self.why}


@dataclass
class StacksReport:
    """``svconsole stacks``' answer. ``notes``: what could not be seen, and why (a node that
    could not be asked, py-spy missing, ptrace rights), with what to change."""

    run: str
    taken_at: float
    ranks: list[RankStack]
    groups: list[Group]
    suspects: list[Suspect]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def suspect(self, rank: int | None) -> Suspect | None:
        return next((s for s in self.suspects if s.rank == rank), None)

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "taken_at": self.taken_at, "seconds": round(self.seconds, 3),
                "ranks": [r.to_dict() for r in self.ranks],
                "groups": [g.to_dict() for g in self.groups],
                "suspects": [s.to_dict() for s in self.suspects], "notes": self.notes}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def text(self, *, frames: int = 6) -> str:
        """The report for a terminal: suspects, groups with their first frames, notes."""
        out = [f"run {self.run}: {len(self.ranks)} ranks in {self.seconds:.1f} s"]
        if self.suspects:
            out.append("suspects:")
            out += [f"  {s.why}" for s in self.suspects]
        else:
            out.append("suspects: none")
        for g in self.groups:
            head = "majority" if g.majority else "group"
            waited = f", last step line {g.waited_s:.0f} s ago" if g.waited_s is not None else ""
            out.append(f"{head}: ranks {_ranks_text(g.ranks)} on {', '.join(g.nodes)} in "
                       f"{g.label}{waited}")
            out += [f"    {f}" for f in g.frames[:frames]]
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def _ranks_text(ranks: Sequence[int | None]) -> str:
    return ", ".join("?" if r is None else str(r) for r in ranks)


# ---------------------------------------------------------------- collecting


def _frames(threads: Sequence[Mapping[str, Any]]) -> tuple[list[Frame], int]:
    """The main thread's frames (innermost first) from py-spy's JSON, and the thread count.
    The main thread is ``MainThread``, else the thread whose outermost frame is a module."""
    if not threads:
        return [], 0
    main = next((t for t in threads if t.get("thread_name") == "MainThread"), None)
    if main is None:
        main = next((t for t in threads if t.get("frames")
                     and t["frames"][-1].get("name") == "<module>"), threads[0])
    frames = []
    for f in main.get("frames") or []:
        file = str(f.get("filename") or "")
        native = not (file.endswith(".py") or file.startswith("<"))
        shown = str(f.get("short_filename") or file) if native else file
        frames.append(Frame(str(f.get("name") or "?"), shown, int(f.get("line") or 0), native))
    return frames, len(threads)


def _reply(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(f"{PREFIX}J "):
            return json.loads(line[len(PREFIX) + 2:])
    return None


def ranks_from_reply(node: str, reply: Mapping[str, Any]) -> tuple[list[RankStack], list[str]]:
    """The node script's reply as :class:`RankStack` rows, and the notes it calls for."""
    notes = []
    if not reply.get("pyspy"):
        notes.append(f"{node}: " + PYSPY_MISSING.format(python=reply.get("python") or "?"))
    if reply.get("ptrace"):
        notes.append(f"{node}: {reply['ptrace']}")
    if not reply.get("ranks") and reply.get("hidden"):
        notes.append(f"{node}: no rank found, and {reply['hidden']} processes' environment is "
                     f"not readable by {reply.get('user')}: ranks of another user cannot be "
                     "found; connect as the training user or as root")
    lines = reply.get("last_lines") or {}
    out = []
    for r in reply.get("ranks") or []:
        frames, threads = _frames(r.get("threads") or [])
        last = lines.get(str(r.get("rank"))) or {}
        out.append(RankStack(
            node=node, rank=r.get("rank"), local_rank=r.get("local_rank"), pid=r.get("pid"),
            state=r.get("state") or "?", wchan=r.get("wchan"), cpu_s=r.get("cpu_s"),
            window_s=r.get("window_s"), frames=frames, threads=threads,
            last_log_age_s=last.get("age_s"), last_line=last.get("text"), error=r.get("error"),
            dump_mode=r.get("dump_mode"), world_size=r.get("world_size")))
    return out, notes


def take_stacks(pool: Pool, record: RunRecord, *, window_s: float = 1.0, native: bool = True,
                timeout: float = 30.0, stale_s: float = 10.0) -> StacksReport:
    """Dump every rank of the run on every node at once and analyse the stacks. A node that
    cannot be asked is a note, and its ranks (known from the world size) are suspects. Raises
    :class:`console.training.runs.ForeignRun` for a run of another cluster."""
    check_own(record, pool.cluster)
    started = time.monotonic()
    taken_at = time.time()
    script = script_text(NODE_SCRIPT)

    def one(node: str) -> tuple[str, dict[str, Any] | str]:
        n = record.node(node)
        args = {"run_id": record.id, "node": node, "log": n.log, "log_offset": n.log_offset,
                "window_s": window_s, "native": native, "timeout_s": max(timeout - 5, 2)}
        result = pool.run(node, node_command(pool.cluster, "dump", args), stdin=script,
                          timeout=timeout)
        reply = _reply(result.stdout)
        if reply is not None:
            reply.setdefault("python", pool.cluster.python)
            return node, reply
        said = result.stderr.strip().splitlines()
        return node, result.error or (said[-1] if said else f"no reply (exit {result.exit})")

    names = [n.node for n in record.nodes]
    with ThreadPoolExecutor(max(1, min(64, len(names)))) as executor:
        replies = dict(executor.map(one, names))
    ranks: list[RankStack] = []
    notes: list[str] = []
    unreachable: dict[str, str] = {}
    for node in names:
        reply = replies[node]
        if isinstance(reply, str):
            unreachable[node] = reply
            notes.append(f"{node}: could not be asked: {reply}")
            continue
        got, said = ranks_from_reply(node, reply)
        ranks += got
        notes += said
    ranks.sort(key=lambda r: (r.rank is None, r.rank or 0, r.node))
    groups, suspects = analyse(ranks, world_size=_world_size(record, ranks),
                               unreachable=unreachable, placement=placement(record),
                               stale_s=stale_s)
    if stepping(ranks, stale_s):
        newest = max(r.last_log_age_s or 0.0 for r in ranks)
        notes.append(f"the run is stepping (every rank logged within {newest:.0f} s): stacks "
                     "that differ were caught at different points of a step")
    return StacksReport(record.id, taken_at, ranks, groups, suspects, notes,
                        time.monotonic() - started)


def _world_size(record: RunRecord, ranks: Sequence[RankStack]) -> int | None:
    plan = record.plan or {}
    if isinstance(plan.get("world_size"), int):
        return plan["world_size"]
    planned = [n.get("nproc") for n in plan.get("nodes", []) if isinstance(n, dict)]
    if planned and all(isinstance(p, int) for p in planned):
        return sum(planned)
    sizes = {r.world_size for r in ranks if r.world_size is not None}
    return sizes.pop() if len(sizes) == 1 else None


def placement(record: RunRecord) -> dict[int, str]:
    """Global rank -> node, from the plan (node_rank order, nproc_per_node each)."""
    plan = record.plan or {}
    nodes = sorted((n for n in plan.get("nodes", []) if isinstance(n, dict)
                    and isinstance(n.get("nproc"), int)),
                   key=lambda n: n.get("node_rank", 0))
    out, at = {}, 0
    for n in nodes:
        for _ in range(n["nproc"]):
            out[at] = n.get("node")
            at += 1
    return out


# ---------------------------------------------------------------- analysis


def collective_of(frames: Iterable[Frame]) -> str | None:
    """The collective these frames are in (the Python frame's name, else a native one's)."""
    native = None
    for f in frames:
        if f.native:
            if native is None and _COLLECTIVE_NATIVE.search(f.name):
                native = f.name
        elif _COLLECTIVE_NAME.match(f.name) and _COLLECTIVE_FILE.search(f.file):
            return f.name
    return native


def stepping(ranks: Sequence[RankStack], stale_s: float = 10.0) -> bool:
    """Every rank logged a step line within ``stale_s``: the run is making progress, and stacks
    taken while it runs differ by chance, not because a rank holds the others up."""
    ages = [r.last_log_age_s for r in ranks]
    return bool(ages) and all(a is not None and a < stale_s for a in ages)


def _why(r: RankStack, majority: Group | None, fresh: bool = False) -> str | None:
    """Why this rank holds the others up, or None when nothing says it does."""
    who = f"rank {'?' if r.rank is None else r.rank} on {r.node}"
    age = f" for {r.last_log_age_s:.0f} s" if r.last_log_age_s is not None else ""
    if r.state == "T":
        return f"{who} is stopped (state T){age}"
    if r.state == "D":
        return (f"{who} is in uninterruptible sleep (state D, wchan {r.wchan or '?'}): waiting "
                f"on storage or a device{age}")
    if r.state in ("Z", "X", "gone"):
        return f"{who} has exited (state {r.state})"
    if any(f.name.endswith("wait") and f.file.endswith("file_baton.py") for f in r.python_frames):
        # every rank may wait here, the majority too: no collective is the norm then
        return (f"{who} waits for torch's extension build lock{age} (FileBaton.wait: loading a "
                f"JIT-built C++ op such as DeepSpeed's). A build killed midway leaves "
                f"<TORCH_EXTENSIONS_DIR>/<op>/lock behind, and every rank waits on it for ever: "
                f"if no build runs on {r.node} (ninja, c++), remove that lock file")
    if majority is None or fresh or r.key() == majority.key:
        return None
    if not r.frames:
        return None  # no stack to compare: its state said nothing wrong
    names = [(f.name, f.file) for f in r.python_frames]
    if any(n == "__next__" and "dataloader" in file.lower() for n, file in names):
        where = "DataLoader.__next__"
    elif any(n in ("save", "_save") and file.endswith(("serialization.py", "torch/__init__.py"))
             for n, file in names):
        where = "torch.save"
    elif any(n in ("load", "_load") and file.endswith("serialization.py") for n, file in names):
        where = "torch.load"
    else:
        where = r.where
    others = f", while ranks {_ranks_text(majority.ranks)} wait in {majority.label}" \
        if majority.collective else ""
    return f"{who} is in {where}{age}{others}"


def analyse(ranks: Sequence[RankStack], *, world_size: int | None = None,
            unreachable: Mapping[str, str] | None = None,
            placement: Mapping[int, str] | None = None,
            stale_s: float = 10.0) -> tuple[list[Group], list[Suspect]]:
    """Group the ranks by their innermost Python frames and name the suspects (see the module's
    documentation). ``world_size`` and ``placement`` (rank -> node) name the ranks that have no
    process; ``unreachable`` (node -> why) the nodes that could not be asked. While the run is
    :func:`stepping` (every rank logged within ``stale_s``), a stack outside the majority's is
    no reason by itself: only states (T, D, exited) and missing ranks are."""
    unreachable = dict(unreachable or {})
    by_key: dict[tuple, list[RankStack]] = {}
    for r in ranks:
        if r.frames:
            by_key.setdefault(r.key(), []).append(r)
    groups = []
    for members in by_key.values():
        frames = members[0].frames
        ages = [m.last_log_age_s for m in members if m.last_log_age_s is not None]
        groups.append(Group([m.rank for m in members], sorted({m.node for m in members}),
                            frames, collective_of(frames), members[0].key(),
                            waited_s=max(ages) if ages else None))
    groups.sort(key=lambda g: (-len(g.ranks), g.collective is None, g.ranks[0] or 0))
    majority = None
    if groups:
        top = len(groups[0].ranks)
        tied = [g for g in groups if len(g.ranks) == top]
        majority = next((g for g in tied if g.collective), tied[0])
        if len(groups) > 1 and len(tied) > 1 and not majority.collective:
            majority = None  # equal groups and none in a collective: no side is the norm
        if majority is not None:
            majority.majority = True
            groups.remove(majority)
            groups.insert(0, majority)
    suspects = []
    fresh = stepping(ranks, stale_s)
    for r in ranks:
        why = _why(r, majority, fresh)
        if why is not None:
            suspects.append(Suspect(r.node, r.rank, why))
    seen = {r.rank for r in ranks}
    for node, reason in unreachable.items():
        for rank in sorted(k for k, v in (placement or {}).items() if v == node):
            seen.add(rank)
            suspects.append(Suspect(node, rank, f"rank {rank} on {node}: the node could not be "
                                                f"asked ({reason})"))
    if world_size is not None:
        for rank in range(world_size):
            if rank not in seen:
                node = (placement or {}).get(rank)
                suspects.append(Suspect(node, rank, f"rank {rank}"
                                        + (f" on {node}" if node else "")
                                        + " has no process: it exited or never started"))
    return groups, suspects


# ---------------------------------------------------------------- pre-flight


def pyspy_checks(pool: Pool, nodes: Sequence[str]) -> list[Any]:
    """Pre-flight: py-spy beside the training Python (or on PATH) on each node. A missing one
    does not stop a launch (a warning): ``svconsole stacks`` then shows only the processes'
    states; the setup step ``py-spy`` installs it. Unreachable nodes are left to the other
    checks. Returns ``console.training.launch.Check`` s."""
    from console.training.launch import Check

    python = node_python(pool.cluster)
    cmd = (f"d=$(dirname -- {shlex.quote(python)}); if [ -x \"$d/py-spy\" ]; then "
           "echo \"$d/py-spy\"; else command -v py-spy || echo MISSING; fi")
    out = []
    for node, result in pool.run_all(cmd, nodes=list(nodes), timeout=30).items():
        if not result.ok:
            continue
        said = result.stdout.strip().splitlines()
        where = said[-1] if said else "MISSING"
        if where == "MISSING":
            out.append(Check("py-spy", True, f"py-spy missing for {python}: svconsole stacks "
                             "will show the ranks' states but no stacks; run the setup step "
                             "py-spy (or pip install py-spy there)", node, warning=True))
        else:
            out.append(Check("py-spy", True, f"{where} (svconsole stacks)", node))
    return out


# ---------------------------------------------------------------- stall diagnosis


class StallDiagnosis(NamedTuple):
    """:func:`diagnose_stall`'s answer: the text for the stall finding, the suspect it names
    (the only one, or the first stopped one), and whether it is a cause beyond doubt (a port
    that cannot be reached, a stopped rank) rather than a lead."""

    text: str
    suspect: Suspect | None
    certain: bool


def diagnose_stall(pool: Pool, record: RunRecord) -> StallDiagnosis:
    """What a stalled run's nodes say: the reachability pre-flight (master port, peer ports,
    from every node; ``console.training.preflight.reachability`` where it exists), then the
    stacks."""
    parts, certain = [], False
    try:
        reachability = importlib.import_module("console.training.preflight").reachability
    except (ImportError, AttributeError):
        reachability = None
        parts.append("reachability not checked (this console has no reachability checks)")
    checks = None
    if reachability is not None:
        try:
            checks = reachability(pool, record)
        except Exception as exc:  # noqa: BLE001 - a diagnosis never breaks the follower
            parts.append(f"reachability could not be checked: {exc}")
    if checks is not None:
        failed = [c for c in checks if not c.ok]
        certain = bool(failed)
        parts.append("all reachable: see `svconsole stacks`" if not failed else
                     "not reachable: " + "; ".join(
                         (f"{c.node}: " if c.node else "") + c.message for c in failed))
    suspect = None
    try:
        report = take_stacks(pool, record, native=False)
    except Exception as exc:  # noqa: BLE001
        parts.append(f"stacks could not be taken: {exc}")
    else:
        stopped = [s for s in report.suspects if "(state T)" in s.why]
        certain = certain or bool(stopped)
        suspect = stopped[0] if stopped else (report.suspects[0] if len(report.suspects) == 1
                                              else None)
        if report.suspects:
            parts.append("stacks: " + "; ".join(s.why for s in report.suspects[:4]))
        elif report.groups:
            parts.append(f"stacks: every rank in {report.groups[0].label}, no rank outside it")
        parts += [f"stacks: {n}" for n in report.notes[:2]]
    return StallDiagnosis("; ".join(parts), suspect, certain)


#: A silence this many times as long as when its ranks were last looked at, with nothing
#: certain then, is looked at again.
LOOK_AGAIN = 3.0

#: The fault after which the ranks' flight recorder dumps are collected.
WATCHDOG_FAULT = "nccl-watchdog-timeout"


class StallWatch:
    """Watches a followed run's store for a run stall and diagnoses each one once
    (:func:`diagnose_stall`, on this watch's thread); the result goes into the stall's finding
    (:meth:`MetricsStore.set_stall_diagnosis`). A shorter silence is looked at the same way
    (:meth:`check_early`), and a certain cause makes it a stall at once. Once the run reports a
    watchdog timeout, it collects the flight recorder dumps of every node and attaches their analysis
    (:mod:`console.training.flightrec`) as a finding. A rank killed by SIGKILL gets its node's
    kernel oom-kill lines added to its finding."""

    def __init__(self, pool: Pool, record: RunRecord, store: MetricsStore, *,
                 interval: float = 5.0, on_change: Callable[[], None] | None = None) -> None:
        self.pool, self.record, self.store, self.interval = pool, record, store, interval
        self.on_change = on_change
        """Called after this watch changed a finding from beyond the lines (the run's
        followers tell their subscribers: after the run's end no line would)."""
        self.diagnosed: list[tuple[RunStall, str]] = []
        self.flight_collected = False
        self.storage_checked = False
        self.kernel_checked: set[tuple[str, int | None]] = set()
        """(node, rank) of the host-oom-kill findings whose node's kernel log was read."""
        self.looked_early: dict[float, tuple[float, bool]] = {}
        """Silences looked at before they were stalls: since -> (seconds then, certain)."""
        self._kernel_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> str | None:
        """Diagnose the stall now, if there is one not yet diagnosed; its text. Collect the
        flight recorder's dumps after a watchdog timeout (once). Check once that output_dir is
        one directory on every node (a run forced past that pre-flight check trains on, each
        node writing its own checkpoints: nothing in the logs says so)."""
        self.check_storage()
        self.check_flight_recorder()
        self.check_kernel_evidence()
        stall = self.store.run_stall()
        if stall is None:
            return self.check_early()
        if any(d.since == stall.since for d, _ in self.diagnosed):
            return None
        text, suspect, _ = diagnose_stall(self.pool, self.record)
        self.diagnosed.append((stall, text))
        self.store.set_stall_diagnosis(stall.since, text,
                                       rank=suspect.rank if suspect else None,
                                       node=suspect.node if suspect else None)
        return text

    def check_early(self) -> str | None:
        """A silence that is not yet a stall (:meth:`MetricsStore.suspected_stall`): look at
        the ranks (the same diagnosis), again after :data:`LOOK_AGAIN` times as long while
        nothing is certain; a stopped rank or a port that cannot be reached confirms the stall
        at once. The diagnosis text when this call made one."""
        quiet = self.store.suspected_stall()
        if quiet is None:
            return None
        looked = self.looked_early.get(quiet.since)
        if looked is not None and (looked[1] or quiet.silent_s < looked[0] * LOOK_AGAIN):
            return None
        text, suspect, certain = diagnose_stall(self.pool, self.record)
        self.looked_early[quiet.since] = (quiet.silent_s, certain)
        if certain:
            self.store.confirm_stall(quiet, text, rank=suspect.rank if suspect else None,
                                     node=suspect.node if suspect else None)
            self.diagnosed.append((quiet, text))
            if self.on_change is not None:
                self.on_change()
        return text

    def check_storage(self) -> bool:
        """Once per watch: the shared output_dir check; each node that sees another directory
        becomes a finding naming it. True when this call ran the check."""
        if self.storage_checked or not self.record.plan:
            return False
        from console.training import faults
        from console.training.preflight import shared_storage

        self.storage_checked = True
        for check in shared_storage(self.pool, self.record):
            if not check.ok:
                self.store.attach(f"storage-{check.node}", faults.Finding(
                    faults.fault("output-dir-not-shared"), (check.message,), check.node, None,
                    None, check.message))
        return True

    def check_flight_recorder(self) -> bool:
        """After the run's first watchdog timeout finding, collect and attach the dumps; True
        when this call did."""
        if self.flight_collected or not any(f.id == WATCHDOG_FAULT
                                            for f in self.store.findings()):
            return False
        from console.training import flightrec

        self.flight_collected = True
        dumps = flightrec.collect(self.pool, self.record)
        self.store.attach(flightrec.FLIGHT_RECORDER.id, flightrec.finding(self.record, dumps))
        return True

    def check_kernel_evidence(self) -> int:
        """For each new host-oom-kill finding (a rank killed by SIGKILL, or an allocation
        refused), read its node's kernel log once (:func:`console.training.evidence.oom_evidence`;
        with sudo only where it needs no password: this runs unattended) and add its oom-kill
        lines, those naming the killed pid first, to the finding. The number of kernel logs
        read."""
        with self._kernel_lock:
            read = add_kernel_evidence(self.pool, self.store, self.kernel_checked)
        if read and self.on_change is not None:
            self.on_change()
        return read

    def start(self) -> StallWatch:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"svconsole-stall-{self.record.id}")
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - keep watching
                log.exception("stall diagnosis of run %s failed", self.record.id)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


__all__ = ["Frame", "Group", "LOOK_AGAIN", "RankStack", "StacksReport",
           "StallDiagnosis", "StallWatch", "Suspect", "WATCHDOG_FAULT", "analyse", "collective_of",
           "diagnose_stall", "placement", "pyspy_checks", "ranks_from_reply", "stepping",
           "take_stacks"]
