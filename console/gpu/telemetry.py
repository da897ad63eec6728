"""GPU telemetry: the agent's JSON lines as typed samples, history rings, thresholds, collectors.

One long-lived agent per node (``scripts/gpu_agent.py``) streams a JSON line per interval over
the pool. A :class:`Collector` starts it, parses its lines into :class:`Sample` objects, keeps
their history in fixed-size rings (an hour at 1 Hz by default), marks the node stale when no
sample arrived within two intervals, and restarts the agent after a reconnect. :class:`Telemetry`
runs one collector per node and computes the cluster overview; the seed guide's thresholds (6.1)
classify utilisation and memory, alarming only during a run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import shlex
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any

from console.ssh.remote import local_python, script_path
from console.subscribers import Subscribers

log = logging.getLogger(__name__)

AGENT = "gpu_agent.py"
#: Where the agent (and a simulation fixture) is cached on a node, under $HOME.
CACHE_DIR = ".cache/svconsole"

#: Real readings of one H200 (NVML, idle and 12 s under load) replayed by ``--simulate``.
SIMULATION_FIXTURE = Path(__file__).resolve().parents[1] / "data" / "h200-nvml.json"
#: Environment variable naming an ``nvml.json`` fixture to replay instead of reading GPUs.
SIMULATE_ENV = "SVCONSOLE_GPU_SIMULATE"


def simulation_fixture(chosen: str | os.PathLike[str] | None,
                       environ: Mapping[str, str] = os.environ) -> Path | None:
    """The fixture to replay: ``chosen`` (``--simulate-gpus``), else ``SVCONSOLE_GPU_SIMULATE``;
    None for real GPUs. Raises ValueError naming the variable when the file does not exist."""
    chosen = chosen or environ.get(SIMULATE_ENV) or None
    if chosen is None:
        return None
    path = Path(chosen).expanduser()
    if not path.is_file():
        raise ValueError(f"{SIMULATE_ENV}={chosen}: no such file (give an nvml.json fixture, "
                         "e.g. tests/fixtures/h200/nvml.json)")
    return path


# ---------------------------------------------------------------------------- samples


@dataclass(frozen=True, slots=True)
class GPUProcess:
    """A compute process on a GPU: pid, GPU memory it holds (MiB), command line, ranks."""

    pid: int
    used_mb: float | None
    cmd: str | None
    rank: int | None = None         # torchrun's RANK and LOCAL_RANK in its environment
    local_rank: int | None = None


@dataclass(frozen=True, slots=True)
class GPUReading:
    """One GPU at one instant. A field is None when the node could not read it (see ``errors``)."""

    index: int
    uuid: str | None = None
    name: str | None = None
    util_gpu: float | None = None
    util_mem: float | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    throttle: tuple[str, ...] = ()
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    procs: tuple[GPUProcess, ...] = ()

    @property
    def mem_pct(self) -> float | None:
        """Memory used as a percentage of the total."""
        if self.mem_used_mb is None or not self.mem_total_mb:
            return None
        return 100.0 * self.mem_used_mb / self.mem_total_mb

    @property
    def power_pct(self) -> float | None:
        """Power draw as a percentage of the enforced limit."""
        if self.power_w is None or not self.power_limit_w:
            return None
        return 100.0 * self.power_w / self.power_limit_w


@dataclass(frozen=True, slots=True)
class HostReading:
    """The node's CPU use (%), RAM (MiB) and load averages."""

    cpu_pct: float | None = None
    mem_total_mb: float | None = None
    mem_used_mb: float | None = None
    load1: float | None = None
    load5: float | None = None
    load15: float | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of the agent. ``t`` is the node's clock; ``received`` the console's (set by the
    collector). ``no_gpu`` lines carry only the host and the ``reason`` no GPU could be read."""

    t: float
    seq: int | None
    source: str | None
    host: HostReading | None
    gpus: tuple[GPUReading, ...] = ()
    errors: dict[str, str] = field(default_factory=dict)
    no_gpu: bool = False
    reason: str | None = None
    received: float | None = None

    @property
    def simulated(self) -> bool:
        """True when the GPU values are a replay of fixture data, not this node's GPUs."""
        return self.source == "simulated"

    def age(self, now: float | None = None) -> float | None:
        """Seconds since the console received this sample."""
        if self.received is None:
            return None
        return (time.time() if now is None else now) - self.received


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _int(value: Any) -> int | None:
    n = _num(value)
    return int(n) if n is not None else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def gpu_from_json(d: dict, position: int = 0) -> GPUReading:
    """A GPU entry of the agent's JSON as a :class:`GPUReading`; wrong types become None."""
    ecc = _dict(d.get("ecc"))
    procs = tuple(
        GPUProcess(pid=p["pid"], used_mb=_num(p.get("used_mb")), cmd=_str(p.get("cmd")),
                   rank=_int(p.get("rank")), local_rank=_int(p.get("local_rank")))
        for p in _list(d.get("procs")) if isinstance(p, dict) and _int(p.get("pid")) is not None)
    index = _int(d.get("index"))
    return GPUReading(
        index=position if index is None else index, uuid=_str(d.get("uuid")),
        name=_str(d.get("name")), util_gpu=_num(d.get("util_gpu")),
        util_mem=_num(d.get("util_mem")), mem_used_mb=_num(d.get("mem_used_mb")),
        mem_total_mb=_num(d.get("mem_total_mb")), temp_c=_num(d.get("temp_c")),
        power_w=_num(d.get("power_w")), power_limit_w=_num(d.get("power_limit_w")),
        sm_clock_mhz=_num(d.get("sm_clock_mhz")),
        throttle=tuple(x for x in _list(d.get("throttle")) if isinstance(x, str)),
        ecc_corrected=_int(ecc.get("corrected")), ecc_uncorrected=_int(ecc.get("uncorrected")),
        procs=procs)


def parse_sample(line: str | bytes) -> Sample | None:
    """One agent line as a :class:`Sample`; None for anything that is not a sample (garbage,
    a partial line, a shell's message). Missing or mistyped fields become None, never errors."""
    try:
        d = json.loads(line)
    except (ValueError, TypeError):
        return None
    if not isinstance(d, dict) or _num(d.get("t")) is None:
        return None
    host = d.get("host")
    host_reading = None
    if isinstance(host, dict):
        host_reading = HostReading(**{f.name: _num(host.get(f.name)) for f in fields(HostReading)})
    gpus = tuple(gpu_from_json(g, i) for i, g in enumerate(_list(d.get("gpus")))
                 if isinstance(g, dict))
    errors = {str(k): str(v) for k, v in _dict(d.get("errors")).items()}
    return Sample(t=float(d["t"]), seq=_int(d.get("seq")), source=_str(d.get("source")),
                  host=host_reading, gpus=gpus, errors=errors, no_gpu=d.get("no_gpu") is True,
                  reason=_str(d.get("reason")))


_agent_module: ModuleType | None = None


def agent_module() -> ModuleType:
    """The node agent loaded as a module, so the console parses nvidia-smi CSV with the very
    code the agent runs (``smi_row``)."""
    global _agent_module
    if _agent_module is None:
        spec = importlib.util.spec_from_file_location("svconsole_gpu_agent", script_path(AGENT))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _agent_module = module
    return _agent_module


@dataclass(frozen=True)
class CSVReadings:
    """Rows of an ``nvidia-smi --query-gpu`` CSV: readings and, per row, the fields it lacked."""

    gpus: list[GPUReading]
    errors: list[dict[str, str]]


def parse_smi_csv(text: str, fields: Sequence[str]) -> CSVReadings:
    """Parse ``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`` output.

    Fields the agent does not model (``timestamp``, ``pci.bus_id``, ...) are skipped; rows
    without an ``index`` column count as GPU 0. ``[N/A]`` values become None with the reason."""
    smi_row = agent_module().smi_row
    gpus, errors = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        g, errs = smi_row(list(fields), line.split(","))
        gpus.append(gpu_from_json(g))
        errors.append(errs)
    return CSVReadings(gpus, errors)


# ---------------------------------------------------------------------------- history


class Ring:
    """A fixed-capacity history of timestamped metrics in compact arrays (8-byte times, 4-byte
    values: an hour at 1 Hz of 5 metrics for 512 GPUs is about 50 MB); the oldest drop off."""

    def __init__(self, capacity: int, fields: Sequence[str]):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.fields = tuple(fields)
        self._t = array("d", bytes(8 * capacity))
        self._v = {f: array("f", bytes(4 * capacity)) for f in self.fields}
        self._head = 0
        self._len = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._len

    def append(self, t: float, values: Sequence[float | None]) -> None:
        with self._lock:
            self._t[self._head] = t
            for f, v in zip(self.fields, values, strict=True):
                self._v[f][self._head] = math.nan if v is None else v
            self._head = (self._head + 1) % self.capacity
            self._len = min(self._len + 1, self.capacity)

    def _ordered(self, a: array) -> list[float]:
        start = (self._head - self._len) % self.capacity
        if start + self._len <= self.capacity:
            return a[start:start + self._len].tolist()
        return a[start:].tolist() + a[:self._head].tolist()

    def times(self) -> list[float]:
        """Receive times, oldest first."""
        with self._lock:
            return self._ordered(self._t)

    def series(self, name: str) -> list[float | None]:
        """One metric, oldest first; None where it was not read."""
        with self._lock:
            return [None if math.isnan(x) else x for x in self._ordered(self._v[name])]


GPU_SERIES = ("util_gpu", "util_mem", "mem_used_mb", "power_w", "temp_c")
HOST_SERIES = ("cpu_pct", "mem_used_mb", "load1")


# ---------------------------------------------------------------------------- thresholds


class Level(str, Enum):
    NORMAL = "normal"
    WATCH = "watch"        # outside the normal range, not yet abnormal
    WARN = "warn"
    CRITICAL = "critical"
    IDLE = "idle"          # nothing running on it: never an alarm
    UNKNOWN = "unknown"    # not read


@dataclass(frozen=True)
class Verdict:
    level: Level
    advice: str = ""

    @property
    def alarming(self) -> bool:
        return self.level in (Level.WARN, Level.CRITICAL)


#: The seed guide's 6.1 thresholds.
UTIL_NORMAL = (70.0, 90.0)
UTIL_LOW, UTIL_HIGH = 50.0, 95.0
MEM_NORMAL_BELOW, MEM_CRITICAL_ABOVE = 85.0, 95.0
UTIL_ADVICE_LOW = "utilisation below 50%: adjust batch_size (raise dataset batch_size, check the data loader)"
UTIL_ADVICE_HIGH = "utilisation above 95%: adjust batch_size (lower it to leave headroom)"
MEM_ADVICE = "memory above 95%: mixed precision (bf16 where supported), smaller batch"


def classify_util(pct: float | None, *, in_run: bool) -> Verdict:
    """GPU utilisation against 6.1: normal 70-90%, warn below 50% or above 95%; no alarm
    outside a run."""
    if pct is None:
        return Verdict(Level.UNKNOWN)
    if not in_run:
        return Verdict(Level.IDLE if pct < 1 else Level.NORMAL)
    if pct < UTIL_LOW:
        return Verdict(Level.WARN, UTIL_ADVICE_LOW)
    if pct > UTIL_HIGH:
        return Verdict(Level.WARN, UTIL_ADVICE_HIGH)
    if UTIL_NORMAL[0] <= pct <= UTIL_NORMAL[1]:
        return Verdict(Level.NORMAL)
    return Verdict(Level.WATCH)


def classify_memory(pct: float | None, *, in_run: bool) -> Verdict:
    """GPU memory against 6.1: normal below 85%, critical above 95%; no alarm outside a run."""
    if pct is None:
        return Verdict(Level.UNKNOWN)
    if not in_run or pct < MEM_NORMAL_BELOW:
        return Verdict(Level.NORMAL)
    if pct > MEM_CRITICAL_ABOVE:
        return Verdict(Level.CRITICAL, MEM_ADVICE)
    return Verdict(Level.WATCH)


@dataclass(frozen=True)
class GPUVerdicts:
    util: Verdict
    memory: Verdict


def judge_gpu(gpu: GPUReading, *, in_run: bool) -> GPUVerdicts:
    """Both verdicts for one GPU. During a run a GPU with no compute process and no load is
    idle (not part of the run), not an alarm."""
    if in_run and not gpu.procs and not gpu.util_gpu:
        return GPUVerdicts(Verdict(Level.IDLE), classify_memory(gpu.mem_pct, in_run=False))
    return GPUVerdicts(classify_util(gpu.util_gpu, in_run=in_run),
                       classify_memory(gpu.mem_pct, in_run=in_run))


# ---------------------------------------------------------------------------- collector


class NodeStatus(str, Enum):
    STARTING = "starting"
    LIVE = "live"
    STALE = "stale"        # the stream stopped: values shown are old
    DOWN = "down"          # the agent could not run or its connection ended; retrying
    STOPPED = "stopped"


@dataclass(frozen=True)
class TelemetryUpdate:
    """What a collector publishes: a new sample (``sample`` set) or a status change."""

    node: str
    status: NodeStatus
    sample: Sample | None = None
    reason: str = ""


Subscriber = Callable[[TelemetryUpdate], None]


def feed_utilisation(store: Any, update: TelemetryUpdate) -> None:
    """Put an update's GPU utilisation into a run's :class:`console.training.metrics.MetricsStore`, where
    the seed's "GPU utilisation below 50% through a run" fault is judged."""
    sample = update.sample
    if sample is None:
        return
    for gpu in sample.gpus:
        if gpu.util_gpu is not None:
            store.add_gpu_sample(update.node, gpu.index, sample.t, gpu.util_gpu)


class Collector:
    """Runs the agent on one node over the pool's streaming channel and keeps its history.

    The agent is uploaded once to ``~/.cache/svconsole/`` under a name keyed by its content
    hash, then run with the cluster's Python (``python3`` by default); it exits when the channel
    closes. Subscribers are called on the collector's threads."""

    def __init__(self, pool: Any, node: str, *, interval: float = 1.0, python: str | None = None,
                 simulate: str | Path | None = None, sim_gpus: int = 8,
                 history_s: float = 3600.0, restart_after: float | None = None,
                 max_backoff: float = 30.0):
        self.pool = pool
        self.node = node
        self.interval = interval
        self.python = python or "python3"
        self.simulate = Path(simulate) if simulate else None
        self.sim_gpus = sim_gpus
        self.capacity = max(1, int(history_s / interval))
        self.restart_after = restart_after if restart_after is not None else max(10.0, 10 * interval)
        self.max_backoff = max_backoff
        self.status = NodeStatus.STOPPED
        self.reason = ""
        self.latest: Sample | None = None
        self.host_history = Ring(self.capacity, HOST_SERIES)
        self.gpu_history: dict[int, Ring] = {}
        self.agent_starts = 0
        self._subscribers: Subscribers[TelemetryUpdate] = Subscribers("telemetry")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stream: Any = None
        self._given_up: Any = None    # the silent stream check() cancelled
        self._started_at = 0.0
        self._threads: list[threading.Thread] = []

    # -- subscribers
    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        return self._subscribers.subscribe(callback)

    def _publish(self, update: TelemetryUpdate) -> None:
        self._subscribers.publish(update)

    def _set_status(self, status: NodeStatus, reason: str = "") -> None:
        with self._lock:
            if status == self.status and reason == self.reason:
                return
            self.status, self.reason = status, reason
        self._publish(TelemetryUpdate(self.node, status, reason=reason))

    # -- life cycle
    def start(self) -> None:
        """Start the agent and the stale watchdog (threads); returns at once."""
        if self._threads:
            return
        self._stop.clear()
        self._threads = [threading.Thread(target=self._run, name=f"telemetry-{self.node}", daemon=True),
                         threading.Thread(target=self._watch, name=f"telemetry-watch-{self.node}", daemon=True)]
        for t in self._threads:
            t.start()

    def cancel(self) -> None:
        """Ask the collector to end (returns at once): the stream is cancelled, so the agent
        sees its channel close and exits."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()

    def stop(self, timeout: float = 10.0) -> None:
        """:meth:`cancel`, then wait for the collector's threads to end."""
        self.cancel()
        for t in self._threads:
            t.join(timeout)
        self._threads = []
        self._set_status(NodeStatus.STOPPED)

    def age(self, now: float | None = None) -> float | None:
        """Seconds since the last sample arrived (None before the first)."""
        latest = self.latest
        return None if latest is None else latest.age(now)

    def gpu_ring(self, index: int) -> Ring | None:
        return self.gpu_history.get(index)

    # -- remote side
    def _files(self) -> dict[str, bytes]:
        agent = script_path(AGENT).read_bytes()
        files = {f"gpu_agent-{hashlib.sha256(agent).hexdigest()[:16]}.py": agent}
        if self.simulate is not None:
            data = self.simulate.read_bytes()
            files[f"sim-{hashlib.sha256(data).hexdigest()[:16]}.json"] = data
        return files

    def command(self) -> str:
        """Upload what is missing from the node's cache; return the command that runs the agent."""
        files = self._files()
        marker = "svconsole-cache"  # prefix of our lines: a login banner may print others
        result = self.pool.run(
            self.node, f'mkdir -p "$HOME/{CACHE_DIR}" && cd "$HOME/{CACHE_DIR}" && '
            f'echo "{marker}=$PWD" && ls -1 | sed "s/^/{marker}:/"', timeout=30)
        if not result.ok:
            raise RuntimeError(f"cannot prepare ~/{CACHE_DIR}: "
                               f"{result.error or result.stderr.strip() or f'exit {result.exit}'}")
        lines = result.stdout.splitlines()
        directory = next((x.split("=", 1)[1] for x in lines if x.startswith(marker + "=")), None)
        if not directory:
            raise RuntimeError(f"cannot prepare ~/{CACHE_DIR}: no directory in {result.stdout!r}")
        present = {x.split(":", 1)[1] for x in lines if x.startswith(marker + ":")}
        for name, data in files.items():
            if name not in present:
                self.pool.put(self.node, data, f"{directory}/{name}")
        names = list(files)
        args = ["-u", f"{directory}/{names[0]}", "--interval", str(self.interval)]
        if self.simulate is not None:
            args += ["--simulate", f"{directory}/{names[1]}", "--sim-gpus", str(self.sim_gpus)]
        argv = " ".join(shlex.quote(a) for a in args)
        if self.python.startswith("/"):  # the cluster's interpreter; python3 where it is missing
            return f'PY={shlex.quote(self.python)}; [ -x "$PY" ] || PY=python3; exec "$PY" {argv}'
        return f"exec {shlex.quote(self.python)} {argv}"

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            self._set_status(NodeStatus.STARTING, self.reason)
            reason, last_err = "", ""
            try:
                cmd = self.command()
                self._started_at = time.time()
                self.agent_starts += 1
                with self.pool.stream(self.node, cmd) as stream:
                    self._stream = stream
                    if self._stop.is_set():
                        stream.cancel()
                    for line in stream:
                        if line.fd == "err":
                            last_err = line.text.strip() or last_err
                            continue
                        sample = parse_sample(line.text)
                        if sample is not None:
                            self._accept(sample)
                            backoff = 1.0
                reason = stream.error or f"agent ended (exit {stream.exit})"
                reason += f": {last_err}" if last_err else ""
            except Exception as e:  # a failed remote or pool call must not end the collector
                reason = f"{type(e).__name__}: {e}"
            finally:
                self._stream = None
            if self._stop.is_set():
                break
            self._set_status(NodeStatus.DOWN, reason)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff)

    def _accept(self, sample: Sample) -> None:
        now = time.time()
        sample = replace(sample, received=now)
        self.latest = sample
        if sample.host is not None:
            self.host_history.append(now, [getattr(sample.host, f) for f in HOST_SERIES])
        for g in sample.gpus:
            ring = self.gpu_history.get(g.index)
            if ring is None:
                ring = self.gpu_history[g.index] = Ring(self.capacity, GPU_SERIES)
            ring.append(now, [getattr(g, f) for f in GPU_SERIES])
        with self._lock:
            self.status, self.reason = NodeStatus.LIVE, ""
        self._publish(TelemetryUpdate(self.node, NodeStatus.LIVE, sample=sample))

    def check(self, now: float | None = None) -> None:
        """Mark the node stale when no sample arrived within two intervals; cancel a stream that
        stayed silent for ``restart_after`` seconds so that the agent is restarted."""
        now = time.time() if now is None else now
        latest = self.latest
        last = latest.received if latest is not None and latest.received is not None else None
        if self.status == NodeStatus.LIVE and last is not None and now - last > 2 * self.interval:
            self._set_status(NodeStatus.STALE, f"no sample for {now - last:.1f} s")
        silent_since = max(last or 0.0, self._started_at)
        stream = self._stream
        if (stream is not None and stream is not self._given_up and silent_since
                and now - silent_since > self.restart_after):
            self._given_up = stream
            self._set_status(NodeStatus.STALE, f"no sample for {now - silent_since:.0f} s: restarting the agent")
            stream.cancel()

    def _watch(self) -> None:
        while not self._stop.wait(min(0.25, self.interval / 4)):
            self.check()


# ---------------------------------------------------------------------------- cluster view


@dataclass(frozen=True)
class HotGPU:
    node: str
    index: int
    temp_c: float


@dataclass(frozen=True)
class Alarm:
    node: str
    index: int
    metric: str            # "util" or "memory"
    value: float | None
    verdict: Verdict


@dataclass(frozen=True)
class Overview:
    """The cluster at a glance, from the live (not stale) nodes' latest samples."""

    nodes_total: int
    nodes_live: int
    stale: tuple[str, ...]
    down: tuple[str, ...]
    no_gpu: dict[str, str]
    gpus_total: int
    gpus_in_use: int
    mean_util: float | None
    total_power_w: float
    hottest: HotGPU | None
    simulated: bool
    alarms: tuple[Alarm, ...]


def overview(latest: dict[str, Sample | None], statuses: dict[str, NodeStatus], *,
             in_run: bool = False) -> Overview:
    """Aggregate the latest samples: GPUs in use (a compute process or load) / total, mean
    utilisation, total power, hottest GPU, and the 6.1 alarms (only when ``in_run``)."""
    live = [n for n, s in statuses.items() if s == NodeStatus.LIVE and latest.get(n) is not None]
    gpus = [(n, g) for n in live for g in latest[n].gpus]  # type: ignore[union-attr]
    utils = [g.util_gpu for _, g in gpus if g.util_gpu is not None]
    temps = [(g.temp_c, n, g.index) for n, g in gpus if g.temp_c is not None]
    hottest = max(temps, key=lambda x: x[0], default=None)
    alarms = []
    for n, g in gpus:
        verdicts = judge_gpu(g, in_run=in_run)
        for metric, value, verdict in (("util", g.util_gpu, verdicts.util),
                                       ("memory", g.mem_pct, verdicts.memory)):
            if verdict.alarming:
                alarms.append(Alarm(n, g.index, metric, value, verdict))
    return Overview(
        nodes_total=len(statuses), nodes_live=len(live),
        stale=tuple(n for n, s in statuses.items() if s == NodeStatus.STALE),
        down=tuple(n for n, s in statuses.items() if s in (NodeStatus.DOWN, NodeStatus.STARTING)),
        no_gpu={n: latest[n].reason or "no GPU" for n in live if latest[n].no_gpu},  # type: ignore[union-attr]
        gpus_total=len(gpus),
        gpus_in_use=sum(1 for _, g in gpus if g.procs or (g.util_gpu or 0) > 0),
        mean_util=sum(utils) / len(utils) if utils else None,
        total_power_w=sum(g.power_w for _, g in gpus if g.power_w is not None),
        hottest=HotGPU(hottest[1], hottest[2], hottest[0]) if hottest else None,
        simulated=any(latest[n].simulated for n in live),  # type: ignore[union-attr]
        alarms=tuple(alarms))


class Telemetry:
    """One :class:`Collector` per node of the cluster, sharing one pool."""

    def __init__(self, pool: Any, cluster: Any, *, interval: float = 1.0,
                 nodes: Iterable[str] | None = None, simulate: str | Path | None = None,
                 sim_gpus: int = 8, history_s: float = 3600.0):
        names = list(nodes) if nodes is not None else cluster.names()
        # the local node's agent runs with svconsole's own Python, which has nvidia-ml-py
        self.collectors = {
            n: Collector(pool, n, interval=interval,
                         python=local_python() if cluster.node(n).local else cluster.python,
                         simulate=simulate, sim_gpus=sim_gpus, history_s=history_s)
            for n in names}

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback`` for every node's updates; returns the unsubscribe function."""
        undo = [c.subscribe(callback) for c in self.collectors.values()]

        def unsubscribe() -> None:
            for u in undo:
                u()
        return unsubscribe

    def start(self) -> None:
        for c in self.collectors.values():
            c.start()

    def stop(self, wait: float | None = None) -> None:
        """Cancel every collector (their streams close, so the agents exit on the nodes), then
        wait for their threads: up to ``wait`` seconds in all (None: each collector's own
        limit). A thread still connecting after that ends by itself."""
        for c in self.collectors.values():
            c.cancel()
        deadline = None if wait is None else time.monotonic() + wait
        for c in self.collectors.values():
            if deadline is None:
                c.stop()
            else:
                c.stop(timeout=max(0.0, deadline - time.monotonic()))

    def latest(self) -> dict[str, Sample | None]:
        return {n: c.latest for n, c in self.collectors.items()}

    def statuses(self) -> dict[str, NodeStatus]:
        return {n: c.status for n, c in self.collectors.items()}

    def overview(self, *, in_run: bool = False) -> Overview:
        return overview(self.latest(), self.statuses(), in_run=in_run)
