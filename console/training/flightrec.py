"""PyTorch's flight recorder for a run: where the dumps go, collecting them, reading them.

On GPU runs the launch sets, for every rank, ``TORCH_FR_BUFFER_SIZE`` (and the older name
``TORCH_NCCL_TRACE_BUFFER_SIZE``) so that ProcessGroupNCCL records its last collectives,
``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` so that its watchdog dumps them when a collective times out, and
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` to ``<output_dir>/svconsole/<run>/nccl_trace_rank_``: each
rank writes ``nccl_trace_rank_<rank>`` there (:func:`recorder_env`).

When a run reports a watchdog timeout, :func:`collect` reads the dumps from every node (they are
on the run's shared directory, but a node whose output_dir is not shared has its own), and
:func:`analyse` says per process group which rank is behind (its last collective's sequence number
below the others'), which ranks wrote no dump, and which collective each rank was in; where the
console's torch has ``torch.distributed.flight_recorder``, its own analysis (``fr_trace``) runs too
and its report is attached. A dump is a pickle written by torch; it is read with an unpickler
that builds plain data only (dicts, lists, strings, numbers), so a dump can never run code here.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import pickle
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from console.ssh.pool import Pool
from console.training.faults import Fault, Finding, Severity
from console.training.runs import RunRecord
from console.training.stacks import placement

TRACE_PREFIX = "nccl_trace_rank_"
BUFFER_ENTRIES = 2000
"""Collectives each rank keeps in its recorder (torch's default is 0: off)."""
MAX_DUMP_BYTES = 64 * 1024 * 1024

FLIGHT_RECORDER = Fault(
    id="flight-recorder", title="NCCL flight recorder: the collectives each rank was in",
    severity=Severity.INFO, detector="flight_recorder",
    advice="The rank behind is the one the others waited for: look at its node and its stack "
           "(svconsole stacks RUN while it hangs). Ranks in different collectives at the same "
           "sequence number mean a desync (ranks took different code paths, e.g. an uneven "
           "last batch).",
    source="torch.distributed.flight_recorder")


def dump_prefix(output_dir: str, run_id: str) -> str:
    """The path prefix each rank's dump gets (the rank is appended by torch): in the run's own
    directory of output_dir, beside its pid files, which the launch creates."""
    return f"{output_dir.rstrip('/')}/svconsole/{run_id}/{TRACE_PREFIX}"


def recorder_env(output_dir: str, run_id: str, *, entries: int = BUFFER_ENTRIES
                 ) -> dict[str, str]:
    """The environment that turns the recorder on and makes the watchdog dump on timeout."""
    return {"TORCH_FR_BUFFER_SIZE": str(entries), "TORCH_NCCL_TRACE_BUFFER_SIZE": str(entries),
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dump_prefix(output_dir, run_id)}


class _PlainData(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings, numbers and None; refuses any class or function."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight recorder dump names {module}.{name}: refused")


def read_dump(data: bytes) -> dict[str, Any]:
    """A dump's content (ValueError when it is not a flight recorder dump)."""
    try:
        value = _PlainData(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError) as exc:
        raise ValueError(f"not a flight recorder dump: {exc}") from None
    if not isinstance(value, dict) or "entries" not in value:
        raise ValueError("not a flight recorder dump: no entries")
    return value


@dataclass
class FlightDumps:
    """The dumps of a run by rank (raw bytes and content), where each came from, and what could
    not be read."""

    raw: dict[int, bytes] = field(default_factory=dict)
    dumps: dict[int, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[int, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def collect(pool: Pool, record: RunRecord, *, timeout: float = 60.0) -> FlightDumps:
    """Read every node's dumps of the run (in parallel); a rank's dump seen on several nodes (the
    shared directory) counts once."""
    prefix = dump_prefix(record.output_dir, record.id)
    directory, base = prefix.rsplit("/", 1)
    cmd = (f"cd {shlex.quote(directory)} 2>/dev/null || exit 0; for f in {base}*; do "
           f"[ -f \"$f\" ] || continue; s=$(stat -c %s -- \"$f\"); "
           f"if [ \"$s\" -gt {MAX_DUMP_BYTES} ]; then echo \"TOOBIG $f $s\"; continue; fi; "
           "printf 'DUMP %s ' \"$f\"; base64 -w0 -- \"$f\"; echo; done")
    out = FlightDumps()
    results = pool.run_all(cmd, nodes=[n.node for n in record.nodes], timeout=timeout)
    for node, result in results.items():
        if not result.ok:
            out.errors.append(f"{node}: {result.error or result.stderr.strip() or 'failed'}")
            continue
        for line in result.stdout.splitlines():
            words = line.split(" ", 2)
            if words[0] == "TOOBIG":
                out.errors.append(f"{node}: {words[1]} is {words[2]} bytes: not read")
                continue
            if words[0] != "DUMP" or len(words) != 3:
                continue
            name, data = words[1], words[2]
            try:
                rank = int(name[len(base):])
            except ValueError:
                continue
            if rank in out.raw:
                continue
            try:
                raw = base64.b64decode(data)
                out.dumps[rank] = read_dump(raw)
            except ValueError as exc:
                out.errors.append(f"{node}: {name}: {exc}")
                continue
            out.raw[rank], out.nodes[rank] = raw, node
    planned = placement(record)  # a shared output_dir shows every rank's dump on every node
    out.nodes.update({r: planned[r] for r in out.nodes if r in planned})
    return out


@dataclass(frozen=True)
class RankInGroup:
    """Where one rank stood in one process group: its last collective."""

    rank: int
    seq: int
    name: str
    state: str


def _last_by_group(dump: Mapping[str, Any]) -> dict[str, RankInGroup | tuple]:
    out: dict[str, Any] = {}
    for e in dump.get("entries") or []:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        group = e.get("process_group")
        key = group[1] if isinstance(group, (list, tuple)) and len(group) > 1 else str(group)
        seq = e.get("collective_seq_id")
        if isinstance(seq, int) and (key not in out or seq >= out[key][0]):
            out[key] = (seq, str(e.get("profiling_name") or "?"), str(e.get("state") or "?"))
    return out


def analyse(dumps: FlightDumps, world_size: int | None = None) -> list[str]:
    """What the dumps say, one line each: ranks without a dump, and per process group the ranks
    behind (lowest last sequence number) and the collective each stood in."""
    lines = []
    if world_size is not None:
        missing = [r for r in range(world_size) if r not in dumps.dumps]
        if missing:
            lines.append(f"no dump from rank(s) {', '.join(map(str, missing))} (the process "
                         "died, or its watchdog did not fire)")
    groups: dict[str, dict[int, tuple[int, str, str]]] = {}
    for rank, dump in sorted(dumps.dumps.items()):
        for key, last in _last_by_group(dump).items():
            groups.setdefault(key, {})[rank] = last
    for key, by_rank in sorted(groups.items()):
        seqs = {seq for seq, _, _ in by_rank.values()}
        where = "; ".join(f"rank {r}: #{s} {n} ({st})" for r, (s, n, st) in sorted(by_rank.items()))
        if len(seqs) > 1:
            low = min(seqs)
            behind = sorted(r for r, (s, _, _) in by_rank.items() if s == low)
            on = ", ".join(f"rank {r}" + (f" on {dumps.nodes[r]}" if r in dumps.nodes else "")
                           for r in behind)
            lines.append(f"process group {key}: {on} behind at collective #{low}, the others "
                         f"at #{max(seqs)}: {where}")
        else:
            names = {n for _, n, _ in by_rank.values()}
            what = "the same collective" if len(names) == 1 else "DIFFERENT collectives (desync)"
            lines.append(f"process group {key}: every rank at #{seqs.pop()}, {what}: {where}")
    lines += dumps.errors
    return lines


def _named_groups(dump: dict[str, Any]) -> dict[str, Any]:
    """The dump with its process groups named as its entries name them, where the recorder
    left the names empty (gloo writes ``pg_config`` as ``{'': ...}``, which torch's own
    analysis cannot match); the dump itself when nothing is missing."""
    config = dump.get("pg_config")
    if not isinstance(config, dict) or list(config) != [""]:
        return dump
    group = next((e.get("process_group") for e in dump.get("entries") or []
                  if isinstance(e, dict) and isinstance(e.get("process_group"), (list, tuple))),
                 None)
    if not group or len(group) < 2:
        return dump
    return {**dump, "pg_config": {group[0]: {**config[""], "name": group[0], "desc": group[1]}}}


def fr_trace_report(dumps: FlightDumps, *, timeout: float = 120.0) -> str | None:
    """torch's own analysis (``python -m torch.distributed.flight_recorder.fr_trace``, run by
    the console's Python on a copy of the dumps) as it prints it; None when the console's torch
    has no flight recorder analysis."""
    if importlib.util.find_spec("torch") is None or \
            importlib.util.find_spec("torch.distributed.flight_recorder.fr_trace") is None:
        return None
    repaired = False
    with tempfile.TemporaryDirectory(prefix="svconsole-fr-") as tmp:
        for rank, dump in dumps.dumps.items():
            fixed = _named_groups(dump)
            repaired |= fixed is not dump
            (Path(tmp) / f"{TRACE_PREFIX}{rank}").write_bytes(pickle.dumps(fixed))
        try:
            done = subprocess.run(
                [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", tmp,
                 "--prefix", TRACE_PREFIX, "--allow-incomplete-ranks"],
                capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"fr_trace failed: {exc}"
    text = (done.stdout + done.stderr).replace(
        "tabulate is not installed. Proceeding without it.", "").strip()
    if done.returncode != 0:
        said = text.splitlines()
        text = f"fr_trace failed (exit {done.returncode}): {said[-1] if said else ''}"
    note = " (group names taken from the entries: gloo's recorder leaves them empty)" \
        if repaired else ""
    return (text or "no output") + note


def finding(record: RunRecord, dumps: FlightDumps) -> Finding:
    """The flight recorder's finding for the run: the analysis lines as evidence, torch's
    own report (when available) in the detail."""
    world = sum(n.get("nproc", 0) for n in (record.plan or {}).get("nodes", [])
                if isinstance(n, dict)) or None
    lines = analyse(dumps, world)
    if not dumps.dumps:
        return Finding(FLIGHT_RECORDER, tuple(lines) or ("no dump found",), None, None, None,
                       f"no flight recorder dump under {dump_prefix(record.output_dir, record.id)}*"
                       " (CPU/gloo runs write none; NCCL writes them on a watchdog timeout)")
    report = fr_trace_report(dumps)
    detail = f"{len(dumps.dumps)} dump(s) read"
    if report is not None:
        detail += "; torch fr_trace: " + report[-4000:]
    return Finding(FLIGHT_RECORDER, tuple(lines), None, None, None, detail)


__all__ = ["BUFFER_ENTRIES", "FLIGHT_RECORDER", "FlightDumps", "TRACE_PREFIX", "analyse",
           "collect", "dump_prefix", "finding", "fr_trace_report", "read_dump", "recorder_env"]
