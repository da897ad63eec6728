"""Parse FunASR / DeepSpeed / torchrun training logs into typed events.

FunASR does not log JSON: its trainer writes one text line per rank every ``log_interval`` steps,
behind Hydra's ``[asctime][name][LEVEL] - `` prefix (see ``shared/notes/domain.md``)::

    [2026-11-30 00:15:55,439][root][INFO] - train, rank: 0, epoch: 0/3, data_slice: 0/1,
    step_in_slice: 5/30, step_in_epoch: 5, total step: 5, (loss_avg_rank: 151.133), ...,
    (lr: 6.000e-04), [('loss_ctc', 141.118), ...], {'data_load': '0.008', ...},
    GPU, memory: usage: 3.559 GB, peak: 20.901 GB, cache: 24.301 GB, cache_peak: 24.301 GB

:func:`parse_line` turns one line into one :class:`Event` (never raising: what it does not know
becomes :class:`Unparsed`). :class:`LogParser` is the incremental form for followers: it takes
bytes in chunks of any size, keeps a partial last line until its newline arrives, and tracks the
byte offset of the next unread line, so a follower that reconnects at :attr:`LogParser.offset`
neither loses nor repeats a line.

Numbers keep FunASR's pathological values: negative losses, ``nan``, ``inf`` and ``1.139e+14``
are floats like any other; a value that is not a number at all becomes ``None``.
"""

from __future__ import annotations

import ast
import functools
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, ClassVar

# --- prefixes -------------------------------------------------------------------------------

#: torchrun's per-rank prefix (``--tee``/``--local-ranks-filter``): ``[rank0]: `` (the global
#: rank) or, from older torch, ``[default0]:`` (role ``default`` and the *local* rank, which says
#: nothing of the global rank without the node's offset: left to the fault scanner).
_TORCHRUN_PREFIX = re.compile(r"^\[(rank|default)(\d+)\]:\s?")
#: Hydra's logging format: ``[2026-11-30 00:15:55,439][root][INFO] - ``.
_HYDRA_PREFIX = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[([^\]]*)\]\[([A-Z]+)\] - ?")
#: DeepSpeed's logger format: ``[2026-11-30 00:15:52,325] [WARNING] [file.py:122:func] ``.
_DEEPSPEED_PREFIX = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[([A-Z]+)\] (?:\[[^\]]*\] )?")

# --- FunASR lines ---------------------------------------------------------------------------

_STEP_TAG = re.compile(r"^(train|val), ")
#: Terminal colour and cursor codes (colorlog, rich): not part of what a line says.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: The tag anywhere: behind a prefix cut short (a pasted log) or another logger's format.
_STEP_TAG_ANYWHERE = re.compile(r"(?<![\w-])(train|val), rank: -?\d")
#: What is left of a logger prefix before the tag may still name the level: ``INFO] - ``.
_CUT_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\]? -? ?$")
#: The header as FunASR 1.4 writes it; other orders and older variants go through _STEP_FIELD.
_STEP_HEADER = re.compile(
    r"^(?:train|val), rank: (-?\d+), epoch: (-?\d+)/(-?\d+), data_slice: (-?\d+)/(-?\d+), "
    r"step_in_slice: (-?\d+)/(-?\d+), step_in_epoch: (-?\d+), total step: (-?\d+)")
#: FunASR 1.4's step line whole, as its trainer writes it: one match reads every field (the
#: general path reads other orders and older layouts field by field).
_STEP_LINE = re.compile(
    r"(train|val), rank: (-?\d+), epoch: (-?\d+)/(-?\d+), data_slice: (-?\d+)/(-?\d+), "
    r"step_in_slice: (-?\d+)/(-?\d+), step_in_epoch: (-?\d+), total step: (-?\d+), "
    r"\(loss_avg_rank: ([^()]*)\), \(loss_avg_slice: ([^()]*)\), \(ppl_avg_slice: ([^()]*)\), "
    r"\(acc_avg_slice: ([^()]*)\), \(lr: ([^()]*)\), \[\('([^\]]*)\)\], "
    r"\{'data_load': '([^']*)', 'forward_time': '([^']*)', 'backward_time': '([^']*)', "
    r"'optim_time': '([^']*)', 'total_time': '([^']*)'\}, "
    r"GPU, memory: usage: (\S+) GB, peak: (\S+) GB, cache: (\S+) GB, cache_peak: (\S+) GB\s*$")
_STEP_FIELD = re.compile(
    r"(rank|epoch|data_slice|step_in_slice|step_in_epoch|total step): (-?\d+)(?:/(-?\d+))?")
_PAREN_VALUE = re.compile(r"\((\w+): ([^()]*)\)")
_STATS_PAIR = re.compile(r"\('([^']*)', ([^()]*)\)")
_TIMINGS = re.compile(r"\{('[^']*': '[^']*'(?:, '[^']*': '[^']*')*)\}")
_TIMING_PAIR = re.compile(r"'([^']*)': '([^']*)'")
_GPU_MEMORY = re.compile(
    r"usage: (\S+) GB, peak: (\S+) GB, cache: (\S+) GB, cache_peak: (\S+) GB")

_PHASE = re.compile(r"^(Train|Validate) epoch: (-?\d+), rank: (-?\d+)")
_SAVE_START = re.compile(r"^Save checkpoint: (-?\d+), rank: (-?\d+)")
_CHECKPOINT_SAVED = re.compile(r"^Checkpoint saved to (.+?)\s*$")
_BEST = re.compile(r"^Update best (loss|acc): (\S+), (.+?)\s*$")
_NO_IMPROVEMENT = re.compile(r"^No improvement in (loss|acc): (\S+) [<>] (\S+),")
_NO_VAL_IMPROVEMENT = re.compile(r"^No val_loss improvement for (\d+)/(\d+) epochs")
_VAL_RESULT = re.compile(r"^current_val: (\S+), best_val_loss: (\S+)")
_EARLY_STOP = re.compile(r"^Early stopping triggered at epoch (-?\d+)")
_ETA_SLICE = re.compile(
    r"^rank: (-?\d+), time_escaped_epoch: (\S+) hours, estimated to finish (\d+) data_slices, "
    r"remaining: (-?\d+) slices, (\S+) hours, epoch: (-?\d+) epochs, (\S+) hours")
_ETA_EPOCH = re.compile(
    r"^rank: (-?\d+), time_escaped_epoch: (\S+) hours, estimated to finish (\d+) epoch: (\S+) hours")
_HYDRA_ERROR = re.compile(r"^Error executing job with overrides: (.*)$")

# --- DeepSpeed, torchrun, Python --------------------------------------------------------------

_DS_TIMERS = re.compile(r"\[Rank (-?\d+)\] time \(ms\)((?: \| [\w.]+: \S+)+)")
_DS_TIMER_PAIR = re.compile(r"\| ([\w.]+): (\S+)")
_WORKER_EXIT = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (-?\d+) \(pid: (\d+)\)")
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):")
_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+)')
_EXCEPTION = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)): ?(.*)$")


def to_float(text: str | None) -> float | None:
    """``'1.139e+14'``, ``'-3.5'``, ``'nan'``, ``'inf'`` as floats; anything else as ``None``."""
    if text is None:
        return None
    try:
        return float(text.strip().rstrip(","))
    except ValueError:
        return None


def _to_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _parse_time(text: str) -> float | None:
    """A log timestamp ``2026-11-30 00:15:55,439`` (the node's local time, no zone in the log)
    as POSIX seconds."""
    second = _parse_second(text[:19])
    return None if second is None else second + int(text[20:23]) / 1000.0


@functools.lru_cache(maxsize=256)
def _parse_second(text: str) -> float | None:
    """``YYYY-mm-dd HH:MM:SS`` (the prefix regex checked the layout) as POSIX seconds."""
    try:
        return datetime(int(text[0:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]),
                        int(text[14:16]), int(text[17:19])).timestamp()
    except ValueError:
        return None


def json_number(value: Any) -> Any:
    """JSON has no nan/inf: they become ``None`` (``null``); everything else is unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Event:
    """One log line, understood. ``line_no`` counts from 1; ``offset`` is the byte offset of the
    line's start in its file; ``time`` is the line's own timestamp (POSIX seconds, read as this
    machine's local time) or ``None``; ``rank`` comes from the line or torchrun's ``[rankN]:``."""

    kind: ClassVar[str] = "event"
    line_no: int = 0
    offset: int = 0
    text: str = ""
    time: float | None = None
    level: str | None = None
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data: ``kind`` first, then every field; nan/inf as ``None``."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                value = {k: json_number(v) for k, v in value.items()}
            out[f.name] = json_number(value)
        return out


@dataclass(frozen=True, kw_only=True)
class StepEvent(Event):
    """A FunASR per-step line (train or val). Timings are seconds, GPU memory is GB."""

    epoch: int | None = None
    max_epoch: int | None = None
    data_slice: int | None = None
    data_slices: int | None = None
    step_in_slice: int | None = None
    steps_in_slice: int | None = None
    step_in_epoch: int | None = None
    total_step: int | None = None
    loss_avg_rank: float | None = None
    loss_avg_slice: float | None = None
    ppl: float | None = None
    acc: float | None = None
    lr: float | None = None
    stats: dict[str, float | None] = field(default_factory=dict)
    timings: dict[str, float | None] = field(default_factory=dict)
    mem_usage_gb: float | None = None
    mem_peak_gb: float | None = None
    mem_cache_gb: float | None = None
    mem_cache_peak_gb: float | None = None

    @property
    def loss(self) -> float | None:
        """The rank's loss at this step (``loss_avg_rank``)."""
        return self.loss_avg_rank


@dataclass(frozen=True, kw_only=True)
class TrainStep(StepEvent):
    kind: ClassVar[str] = "train"


@dataclass(frozen=True, kw_only=True)
class ValStep(StepEvent):
    """A validation line; FunASR writes ``lr: 0.000e+00`` on these."""

    kind: ClassVar[str] = "val"


@dataclass(frozen=True, kw_only=True)
class Phase(Event):
    """``Train epoch: E``, ``Validate epoch: E`` or ``Save checkpoint: E`` (its start)."""

    kind: ClassVar[str] = "phase"
    phase: str = ""
    epoch: int | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointSaved(Event):
    kind: ClassVar[str] = "checkpoint"
    path: str = ""


@dataclass(frozen=True, kw_only=True)
class BestModel(Event):
    """``Update best loss: 94.4361, .../model.pt.best`` (metric ``loss`` or ``acc``)."""

    kind: ClassVar[str] = "best"
    metric: str = "loss"
    value: float | None = None
    path: str = ""


@dataclass(frozen=True, kw_only=True)
class ValResult(Event):
    """The epoch's validation loss as train_ds.py reports it: ``current_val: X, best_val_loss: Y``
    when it improved, or ``No val_loss improvement for N/P epochs`` (value unknown) when not."""

    kind: ClassVar[str] = "val_result"
    value: float | None = None
    best_before: float | None = None
    improved: bool = True
    epochs_no_improve: int | None = None
    patience: int | None = None


@dataclass(frozen=True, kw_only=True)
class NoImprovement(Event):
    """``No improvement in loss: 94.5 > 94.4, <best checkpoint>`` from the checkpoint saver."""

    kind: ClassVar[str] = "no_improvement"
    metric: str = "loss"
    value: float | None = None
    best: float | None = None


@dataclass(frozen=True, kw_only=True)
class EarlyStop(Event):
    kind: ClassVar[str] = "early_stop"
    epoch: int | None = None


@dataclass(frozen=True, kw_only=True)
class Eta(Event):
    """FunASR's own estimate. ``scope`` is ``slice`` (after each data slice: remaining slices and
    epochs) or ``epoch`` (after each epoch). Hours as FunASR prints them."""

    kind: ClassVar[str] = "eta"
    scope: str = "slice"
    elapsed_hours: float | None = None
    remaining_hours: float | None = None
    data_slices: int | None = None
    slices_remaining: int | None = None
    epochs: int | None = None


@dataclass(frozen=True, kw_only=True)
class HydraError(Event):
    """``Error executing job with overrides: [...]``: the job failed; the cause follows."""

    kind: ClassVar[str] = "hydra_error"
    overrides: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class DeepSpeedTimers(Event):
    """DeepSpeed's ``wall_clock_breakdown`` line: ``[Rank 0] time (ms) | fwd: .. | bwd: ..``.
    ``timers`` maps each name (``fwd``, ``bwd_allreduce``, ``step``, ``fwd_microstep``,
    ``optimizer_step`` ...) to milliseconds."""

    kind: ClassVar[str] = "ds_timers"
    timers: dict[str, float | None] = field(default_factory=dict)

    @property
    def allreduce_ms(self) -> float | None:
        """Gradient synchronisation time of the step (``bwd_allreduce``), if this line has it."""
        return self.timers.get("bwd_allreduce")


@dataclass(frozen=True, kw_only=True)
class WorkerExit(Event):
    """torchrun's ``failed (exitcode: -9) local_rank: 0 (pid: 123)``; -9 is SIGKILL."""

    kind: ClassVar[str] = "worker_exit"
    exitcode: int | None = None
    local_rank: int | None = None
    pid: int | None = None


@dataclass(frozen=True, kw_only=True)
class TracebackLine(Event):
    """``Traceback (most recent call last):`` or a ``File "...", line N`` frame."""

    kind: ClassVar[str] = "traceback"
    file: str | None = None
    file_line: int | None = None


@dataclass(frozen=True, kw_only=True)
class ExceptionRaised(Event):
    """The last line of a traceback: ``RuntimeError: mat1 and mat2 must have ...``."""

    kind: ClassVar[str] = "exception"
    exc_type: str = ""
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class Unparsed(Event):
    kind: ClassVar[str] = "unparsed"


#: Every event class, by its ``kind``.
EVENT_KINDS: dict[str, type[Event]] = {
    cls.kind: cls for cls in (TrainStep, ValStep, Phase, CheckpointSaved, BestModel, ValResult,
                              NoImprovement, EarlyStop, Eta, HydraError, DeepSpeedTimers,
                              WorkerExit, TracebackLine, ExceptionRaised, Unparsed)
}


# --- parsing one line -----------------------------------------------------------------------


def _strip_prefixes(text: str) -> tuple[str, dict[str, Any]]:
    """Remove torchrun's and the logger's prefixes; return the message and what they said."""
    meta: dict[str, Any] = {}
    if not text.startswith("["):
        return text, meta
    m = _TORCHRUN_PREFIX.match(text)
    if m:
        if m.group(1) == "rank":
            meta["rank"] = int(m.group(2))
        text = text[m.end():]
    m = _HYDRA_PREFIX.match(text)
    if m:
        meta["time"] = _parse_time(m.group(1))
        meta["level"] = m.group(3)
        return text[m.end():], meta
    m = _DEEPSPEED_PREFIX.match(text)
    if m:
        meta["time"] = _parse_time(m.group(1))
        meta["level"] = m.group(2)
        return text[m.end():], meta
    return text, meta


def _step_header(message: str) -> dict[str, tuple[int | None, int | None]]:
    m = _STEP_HEADER.match(message)
    if m:
        g = [int(x) for x in m.groups()]
        return {"rank": (g[0], None), "epoch": (g[1], g[2]), "data_slice": (g[3], g[4]),
                "step_in_slice": (g[5], g[6]), "step_in_epoch": (g[7], None),
                "total step": (g[8], None)}
    header: dict[str, tuple[int | None, int | None]] = {}
    end = message.find("(loss_avg")
    for m in _STEP_FIELD.finditer(message, 0, end if end > 0 else len(message)):
        header.setdefault(m.group(1), (_to_int(m.group(2)), _to_int(m.group(3))))
    return header


def _numbers(texts: list[str] | tuple[str, ...]) -> list[float | None]:
    """:func:`to_float` of each, in one go (the usual case: all plain numbers)."""
    try:
        return list(map(float, texts))
    except ValueError:
        return [to_float(t) for t in texts]


def _number_dict(pairs: list[tuple[str, str]]) -> dict[str, float | None]:
    return dict(zip([k for k, _ in pairs], _numbers([v for _, v in pairs]), strict=True))


def _fast_stats(text: str) -> dict[str, float | None]:
    """FunASR's stats list without its outer ``[(' ... )]``: ``loss_ctc', 141.1), ('loss', 9.0``."""
    keys, values = [], []
    for pair in text.split("), ('"):
        key, sep, value = pair.partition("', ")
        if not sep or "'" in key:
            return _number_dict(_STATS_PAIR.findall(f"('{text})"))
        keys.append(key)
        values.append(value)
    return dict(zip(keys, _numbers(values), strict=True))


def _fast_step(m: re.Match[str], meta: dict[str, Any]) -> StepEvent:
    """The event of a line that :data:`_STEP_LINE` matched. Built without the frozen
    dataclass's ``__init__`` (one ``object.__setattr__`` per field): every field is set here,
    and this is the line a log has most of."""
    g = m.groups()
    cls = TrainStep if g[0] == "train" else ValStep
    (loss, loss_slice, ppl, acc, lr, data_load, forward, backward, optim, total, usage, peak,
     cache, cache_peak) = _numbers(g[10:15] + g[16:])
    ev = object.__new__(cls)
    ev.__dict__.update(
        line_no=meta["line_no"], offset=meta["offset"], text=meta["text"],
        time=meta.get("time"), level=meta.get("level"), rank=int(g[1]),
        epoch=int(g[2]), max_epoch=int(g[3]), data_slice=int(g[4]), data_slices=int(g[5]),
        step_in_slice=int(g[6]), steps_in_slice=int(g[7]), step_in_epoch=int(g[8]),
        total_step=int(g[9]), loss_avg_rank=loss, loss_avg_slice=loss_slice, ppl=ppl,
        acc=acc, lr=lr, stats=_fast_stats(g[15]),
        timings={"data_load": data_load, "forward_time": forward, "backward_time": backward,
                 "optim_time": optim, "total_time": total},
        mem_usage_gb=usage, mem_peak_gb=peak, mem_cache_gb=cache, mem_cache_peak_gb=cache_peak)
    return ev


def _parse_step(tag: str, message: str, meta: dict[str, Any]) -> StepEvent | None:
    if (m := _STEP_LINE.match(message)) is not None:
        return _fast_step(m, meta)
    header = _step_header(message)
    if "total step" not in header and "step_in_epoch" not in header:
        return None
    values = {m.group(1): to_float(m.group(2)) for m in _PAREN_VALUE.finditer(message)}
    stats: dict[str, float | None] = {}
    start = message.find("[('")
    if start >= 0:
        end = message.find(")]", start)
        end = len(message) if end < 0 else end + 1
        stats = {k: to_float(v) for k, v in _STATS_PAIR.findall(message, start, end)}
    timings: dict[str, float | None] = {}
    m = _TIMINGS.search(message)
    if m:
        timings = {k: to_float(v) for k, v in _TIMING_PAIR.findall(m.group(1))}
    mem = _GPU_MEMORY.search(message)
    rank = header.get("rank", (None, None))[0]
    if rank is not None:
        meta["rank"] = rank
    cls = TrainStep if tag == "train" else ValStep
    return cls(
        epoch=header.get("epoch", (None, None))[0],
        max_epoch=header.get("epoch", (None, None))[1],
        data_slice=header.get("data_slice", (None, None))[0],
        data_slices=header.get("data_slice", (None, None))[1],
        step_in_slice=header.get("step_in_slice", (None, None))[0],
        steps_in_slice=header.get("step_in_slice", (None, None))[1],
        step_in_epoch=header.get("step_in_epoch", (None, None))[0],
        total_step=header.get("total step", (None, None))[0],
        loss_avg_rank=values.get("loss_avg_rank"),
        loss_avg_slice=values.get("loss_avg_slice"),
        ppl=values.get("ppl_avg_slice"),
        acc=values.get("acc_avg_slice"),
        lr=values.get("lr"),
        stats=stats,
        timings=timings,
        mem_usage_gb=to_float(mem.group(1)) if mem else None,
        mem_peak_gb=to_float(mem.group(2)) if mem else None,
        mem_cache_gb=to_float(mem.group(3)) if mem else None,
        mem_cache_peak_gb=to_float(mem.group(4)) if mem else None,
        **meta,
    )


def _parse_overrides(text: str) -> list[str]:
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return [text.strip()]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def _parse_message(message: str, meta: dict[str, Any]) -> Event | None:
    """The event for a message without its prefixes, or ``None`` when it is not one we know."""
    m = _STEP_TAG.match(message)
    if m:
        return _parse_step(m.group(1), message, meta)
    if ", rank: " in message and (m := _STEP_TAG_ANYWHERE.search(message)) is not None:
        if "level" not in meta and (lv := _CUT_LEVEL.search(message, 0, m.start())) is not None:
            meta["level"] = lv.group(1)
        return _parse_step(m.group(1), message[m.start():], meta)
    cut = message.find(", rank: ", 0, 13)
    if cut > 0 and "total step: " in message:  # the cut went into the tag: "ain, rank: 0, ..."
        for tag in ("train", "val"):
            if tag.endswith(message[:cut]):
                return _parse_step(tag, tag + message[cut:], meta)
    # Each pattern below starts with a known literal (or a class of characters): a test of
    # the first character, or of a substring for the two searched anywhere, rules a line out
    # before its regex runs.
    c = message[:1]
    if "time (ms)" in message and (m := _DS_TIMERS.search(message)) is not None:
        timers = _number_dict(_DS_TIMER_PAIR.findall(m.group(2)))
        return DeepSpeedTimers(timers=timers, **{**meta, "rank": int(m.group(1))})
    if c in "TV" and (m := _PHASE.match(message)) is not None:
        return Phase(phase=m.group(1).lower(), epoch=int(m.group(2)),
                     **{**meta, "rank": int(m.group(3))})
    if c == "S" and (m := _SAVE_START.match(message)) is not None:
        return Phase(phase="save", epoch=int(m.group(1)), **{**meta, "rank": int(m.group(2))})
    if c == "C" and (m := _CHECKPOINT_SAVED.match(message)) is not None:
        return CheckpointSaved(path=m.group(1), **meta)
    if c == "U" and (m := _BEST.match(message)) is not None:
        return BestModel(metric=m.group(1), value=to_float(m.group(2)), path=m.group(3), **meta)
    if c == "c" and (m := _VAL_RESULT.match(message)) is not None:
        return ValResult(value=to_float(m.group(1)), best_before=to_float(m.group(2)), **meta)
    if c == "N" and (m := _NO_VAL_IMPROVEMENT.match(message)) is not None:
        return ValResult(improved=False, epochs_no_improve=int(m.group(1)),
                         patience=int(m.group(2)), **meta)
    if c == "N" and (m := _NO_IMPROVEMENT.match(message)) is not None:
        return NoImprovement(metric=m.group(1), value=to_float(m.group(2)),
                             best=to_float(m.group(3)), **meta)
    if c == "E" and (m := _EARLY_STOP.match(message)) is not None:
        return EarlyStop(epoch=int(m.group(1)), **meta)
    if c == "r" and (m := _ETA_SLICE.match(message)) is not None:
        return Eta(scope="slice", elapsed_hours=to_float(m.group(2)),
                   data_slices=int(m.group(3)), slices_remaining=int(m.group(4)),
                   epochs=int(m.group(6)), remaining_hours=to_float(m.group(7)),
                   **{**meta, "rank": int(m.group(1))})
    if c == "r" and (m := _ETA_EPOCH.match(message)) is not None:
        return Eta(scope="epoch", elapsed_hours=to_float(m.group(2)), epochs=int(m.group(3)),
                   remaining_hours=to_float(m.group(4)), **{**meta, "rank": int(m.group(1))})
    if c == "E" and (m := _HYDRA_ERROR.match(message)) is not None:
        return HydraError(overrides=_parse_overrides(m.group(1)), **meta)
    if "exitcode" in message and (m := _WORKER_EXIT.search(message)) is not None:
        return WorkerExit(exitcode=int(m.group(1)), local_rank=int(m.group(2)),
                          pid=int(m.group(3)), **meta)
    if c == "T" and _TRACEBACK.match(message):
        return TracebackLine(**meta)
    if c.isspace() and (m := _FRAME.match(message)) is not None:
        return TracebackLine(file=m.group(1), file_line=int(m.group(2)), **meta)
    if (c == "_" or (c.isascii() and c.isalpha())) and (m := _EXCEPTION.match(message)):
        return ExceptionRaised(exc_type=m.group(1), message=m.group(2), **meta)
    return None


def parse_line(text: str, *, line_no: int = 0, offset: int = 0) -> Event:
    """Parse one log line (without its newline). Never raises: an unknown or damaged line is
    :class:`Unparsed`."""
    message, meta = _strip_prefixes(_ANSI.sub("", text) if "\x1b" in text else text)
    meta.update(line_no=line_no, offset=offset, text=text)
    try:
        event = _parse_message(message, meta)
    except (ValueError, OverflowError, TypeError):  # e.g. an int too large, a mutated field
        event = None
    return event if event is not None else Unparsed(**meta)


# --- incremental parsing --------------------------------------------------------------------


class LogParser:
    """Parse a log as it grows, from any byte offset.

    Feed it raw bytes in chunks of any size (:meth:`feed`) or whole lines (:meth:`feed_line`);
    it returns the events of the lines completed so far. :attr:`offset` is the byte offset just
    after the last complete line, and :attr:`line_no` that line's number: a follower that
    reconnects and reads from ``offset`` (e.g. ``tail -c +$((offset + 1))``) with a parser made
    as ``LogParser(offset=..., line_no=...)`` gets every later line exactly once. A partial last
    line waits for its newline; :meth:`flush` parses it when the stream has ended.

    Lines end with ``\\n``; a trailing ``\\r`` is dropped, and inside a line only the text after
    the last ``\\r`` counts (a progress bar redrawn in place). Bytes that are not UTF-8 are
    replaced. A line longer than ``max_line`` bytes is cut there and parsed in pieces, so one
    runaway line cannot use unbounded memory.
    """

    def __init__(self, offset: int = 0, line_no: int = 0, *, max_line: int = 1 << 20) -> None:
        self.offset = offset
        self.line_no = line_no
        self.max_line = max_line
        self._partial = bytearray()

    @property
    def pending(self) -> int:
        """Bytes received after the last complete line (not yet parsed)."""
        return len(self._partial)

    def feed(self, data: bytes) -> list[Event]:
        """Take the next bytes of the log; return the events of the lines they complete."""
        self._partial += data
        events: list[Event] = []
        start = 0
        buf = self._partial
        last = buf.rfind(b"\n")
        if last >= 0 and buf.isascii():
            # the usual chunk: ASCII (one byte per character), decoded and split at once
            lines = buf[:last].decode("ascii").split("\n")
            if max(map(len, lines)) <= self.max_line:
                for text in lines:
                    events.append(self._line(b"", len(text) + 1, text))
                start = last + 1
        while True:
            end = buf.find(b"\n", start, start + self.max_line + 1)
            if end >= 0:
                events.append(self._line(bytes(buf[start:end]), end + 1 - start))
                start = end + 1
            elif len(buf) - start > self.max_line:  # cut: the piece counts as a whole line
                events.append(self._line(bytes(buf[start:start + self.max_line]), self.max_line))
                start += self.max_line
            else:
                break
        del buf[:start]
        return events

    def feed_line(self, text: str) -> Event:
        """Take one complete line as text (as a streaming channel delivers it, no newline)."""
        return self._line(text.encode("utf-8", "surrogatepass"), None, text)

    def flush(self) -> list[Event]:
        """The stream ended: parse a last line that had no newline."""
        if not self._partial:
            return []
        raw = bytes(self._partial)
        self._partial.clear()
        return [self._line(raw, len(raw))]

    def _line(self, raw: bytes, consumed: int | None, text: str | None = None) -> Event:
        if text is None:
            text = raw.decode("utf-8", "replace")
        text = text.rstrip("\r")
        if "\r" in text:
            text = text.rsplit("\r", 1)[1]
        self.line_no += 1
        event = parse_line(text, line_no=self.line_no, offset=self.offset)
        self.offset += consumed if consumed is not None else len(raw) + 1
        return event


def parse_lines(lines: Iterable[str], *, start_line: int = 1) -> Iterator[Event]:
    """Parse lines already split (no offsets known: each line's ``offset`` counts UTF-8 bytes
    plus one newline from 0)."""
    parser = LogParser(line_no=start_line - 1)
    for line in lines:
        yield parser.feed_line(line.rstrip("\n"))


def parse_file(path: str, *, chunk_size: int = 1 << 16) -> Iterator[Event]:
    """Every event of a log file, read in chunks (the file may be large)."""
    parser = LogParser()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            yield from parser.feed(chunk)
    yield from parser.flush()
