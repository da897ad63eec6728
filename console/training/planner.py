"""The resource planner (the guide's 7.2): how long the run will take and whether its storage
will hold, from what the run itself measured.

- :func:`estimate_time` takes one rank's train step lines (their own timestamps) and gives the
  time per epoch and the ETA with a 90 % band. Steps are timed inside an epoch; what an epoch
  costs on top of its steps (validation, the checkpoint save, model averaging) is measured at
  each epoch boundary once one has been seen. Until then the band's upper side allows for it
  with :data:`UNSEEN_OVERHEAD` of an epoch's step time (the point estimate with
  :data:`PRIOR_OVERHEAD`), and says so. The band narrows as steps
  and boundaries are seen: ``z * s * sqrt(R**2 / n + R)`` for R steps left, n measured.
- :func:`estimate_storage` projects output_dir when the run ends (checkpoints kept
  ``keep_nbest_models`` deep, the averaged model, logs) against the free space of shared_dir,
  from ``du``/``df`` on the master.
- :data:`GUIDE_TABLE` is the guide's table of cluster sizes, shown beside this cluster's
  measured throughput for a planned run.
"""

from __future__ import annotations

import math
import shlex
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from console.ssh.pool import Pool
from console.training.logparse import StepEvent, TrainStep

#: z for a two-sided 90 % band.
Z90 = 1.645
#: Until an epoch boundary was seen, the upper side of the band allows this share of an epoch's
#: step time for validation and the checkpoint save (a SenseVoiceSmall checkpoint on an H200
#: took 1.5x its epoch's steps; a tiny CPU model far less).
UNSEEN_OVERHEAD = 1.5
#: ... and the point estimate counts this share (a tiny CPU run measured 0.2 of its epochs'
#: step time at each boundary; the band, not this guess, carries the uncertainty).
PRIOR_OVERHEAD = 0.25


@dataclass(frozen=True)
class GuideRow:
    name: str
    nodes: int
    gpus: str
    days: str
    storage: str


#: The guide's 7.2 table (训练规模 / 节点数量 / GPU数量 / 预计训练时间 / 存储需求).
GUIDE_TABLE = (
    GuideRow("basic", 1, "2×A100", "7-10 days", "500 GB"),
    GuideRow("standard", 3, "12×A100", "3-5 days", "2 TB"),
    GuideRow("high end", 5, "20×H100", "1-2 days", "5 TB"),
)


@dataclass(frozen=True)
class TimeEstimate:
    """Where the run stands in time. Seconds throughout; ``eta_*`` count from ``at`` (the last
    step line's time)."""

    at: float
    steps_done: int
    steps_total: int
    steps_per_epoch: int
    max_epoch: int
    step_s: float
    step_sd_s: float
    measured_steps: int
    epoch_overhead_s: float | None
    """What an epoch costs beyond its steps, measured at the boundaries seen (None: none yet)."""
    epoch_s: float
    eta_s: float
    eta_low_s: float
    eta_high_s: float
    notes: tuple[str, ...] = ()

    @property
    def fraction(self) -> float:
        return self.steps_done / self.steps_total if self.steps_total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fraction": self.fraction}


def _step_index(ev: StepEvent, steps_per_epoch: int) -> int | None:
    if ev.epoch is not None and ev.step_in_epoch is not None:
        return ev.epoch * steps_per_epoch + ev.step_in_epoch
    return ev.total_step


def estimate_time(events: Iterable[StepEvent], *, rank: int | None = None
                  ) -> TimeEstimate | None:
    """The estimate from one rank's train lines (``rank``: which; default the lowest seen).
    None until two timed train lines of one epoch are known."""
    steps = [e for e in events if isinstance(e, TrainStep) and e.time is not None]
    if rank is None and steps:
        rank = min((e.rank for e in steps if e.rank is not None), default=None)
    steps = [e for e in steps if e.rank == rank]
    lead = steps[-1] if steps else None
    if lead is None or lead.max_epoch is None or not lead.steps_in_slice:
        return None
    per_epoch = lead.steps_in_slice * (lead.data_slices or 1)
    total = per_epoch * lead.max_epoch
    per_step: list[float] = []          # seconds per step, one per interval inside an epoch
    weights: list[int] = []
    boundaries: list[float] = []        # extra seconds at each epoch boundary
    prev: StepEvent | None = None
    for ev in steps:
        if prev is not None:
            a, b = _step_index(prev, per_epoch), _step_index(ev, per_epoch)
            dt = ev.time - prev.time  # type: ignore[operator]
            if a is not None and b is not None and b > a and dt >= 0:
                if ev.epoch == prev.epoch:
                    per_step.append(dt / (b - a))
                    weights.append(b - a)
                elif per_step:
                    boundaries.append(max(0.0, dt - (b - a) * _mean(per_step, weights)))
        prev = ev
    if not per_step:
        return None
    step = _mean(per_step, weights)
    sd = statistics.pstdev(per_step) if len(per_step) > 1 else step * 0.25
    n = sum(weights)
    done = min(_step_index(lead, per_epoch) or 0, total)
    left = max(total - done, 0)
    epochs_left = max(lead.max_epoch - (lead.epoch or 0), 0)   # boundaries still to come
    notes: list[str] = []
    overhead = statistics.fmean(boundaries) if boundaries else None
    if overhead is None:
        notes.append("no epoch has ended yet: validation and the checkpoint save are not "
                     "measured; the band's upper side allows for them")
        extra_low = 0.0
        extra = PRIOR_OVERHEAD * per_epoch * step * epochs_left
        extra_high = UNSEEN_OVERHEAD * per_epoch * step * epochs_left
    else:
        extra = overhead * epochs_left
        spread = statistics.pstdev(boundaries) if len(boundaries) > 1 else overhead * 0.5
        margin = Z90 * spread * math.sqrt(epochs_left)
        extra_low, extra_high = max(0.0, extra - margin), extra + margin
    band = Z90 * sd * math.sqrt(left * left / max(n, 1) + left)
    return TimeEstimate(
        at=float(lead.time), steps_done=done, steps_total=total, steps_per_epoch=per_epoch,
        max_epoch=lead.max_epoch, step_s=step, step_sd_s=sd, measured_steps=n,
        epoch_overhead_s=overhead, epoch_s=per_epoch * step + (overhead or 0.0),
        eta_s=left * step + extra, eta_low_s=max(0.0, left * step - band + extra_low),
        eta_high_s=left * step + band + extra_high, notes=tuple(notes))


def _mean(values: Sequence[float], weights: Sequence[int]) -> float:
    return sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)


# --------------------------------------------------------------------------- storage


@dataclass(frozen=True)
class StorageEstimate:
    output_dir: str
    used_bytes: int
    checkpoint_bytes: int | None
    """One saved checkpoint (the newest ``model.pt.epN``), None before the first save."""
    keep_nbest: int
    projected_bytes: int | None
    free_bytes: int | None
    shared_dir: str
    findings: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool | None:
        if self.projected_bytes is None or self.free_bytes is None:
            return None
        return self.projected_bytes - self.used_bytes <= self.free_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits}


def _du_script(output_dir: str, shared_dir: str) -> str:
    out, shared = shlex.quote(output_dir), shlex.quote(shared_dir)
    return (f"cd {out} 2>/dev/null || exit 3; du -sb -- . | cut -f1; "
            "for d in model.pt.ep*; do [ -d \"$d\" ] && du -sb -- \"$d\"; done; "
            f"echo @df; df -B1 --output=avail -- {shared} | tail -1")


def estimate_storage(pool: Pool, node: str, output_dir: str, shared_dir: str, *,
                     keep_nbest: int, max_epoch: int, log_bytes_per_epoch: int = 0
                     ) -> StorageEstimate:
    """Measure output_dir and shared_dir's free space on ``node`` (the master) and project the
    end of the run: ``min(keep_nbest, max_epoch)`` checkpoints, plus ``model.pt`` and
    ``model.pt.best`` and the averaged model (each about one checkpoint's model states), plus
    the logs."""
    result = pool.run(node, _du_script(output_dir, shared_dir), timeout=120)
    if result.exit == 3:
        return StorageEstimate(output_dir, 0, None, keep_nbest, None, None, shared_dir,
                               (f"{output_dir} does not exist on {node} yet",))
    if not result.ok:
        reason = (result.error or result.stderr or f"exit {result.exit}").strip()
        return StorageEstimate(output_dir, 0, None, keep_nbest, None, None, shared_dir,
                               (f"could not measure {output_dir} on {node}: {reason}",))
    head, _, df = result.stdout.partition("@df")
    lines = [line.split("\t") for line in head.split("\n") if line.strip()]
    used = int(lines[0][0])
    checkpoints = sorted(((int(size), name) for size, name in lines[1:]),
                         key=lambda sn: _epoch_of(sn[1]))
    free = int(df.split()[-1]) if df.split() else None
    ckpt = checkpoints[-1][0] if checkpoints else None
    projected = None
    findings: list[str] = []
    if ckpt is not None:
        kept = min(keep_nbest, max_epoch)
        projected = (used - sum(s for s, _ in checkpoints) + kept * ckpt + 3 * ckpt
                     + log_bytes_per_epoch * max_epoch)
        if free is not None and projected - used > free:
            findings.append(f"the run will need about {_gb(projected - used)} more in "
                            f"{output_dir} but {shared_dir} has {_gb(free)} free: lower "
                            f"keep_nbest_models ({keep_nbest}) or free space")
    else:
        findings.append("no checkpoint saved yet: the projection starts with the first one")
    return StorageEstimate(output_dir, used, ckpt, keep_nbest, projected, free, shared_dir,
                           tuple(findings))


def _epoch_of(name: str) -> int:
    digits = name.rsplit("ep", 1)[-1]
    return int(digits) if digits.isdigit() else -1


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"
