"""Prometheus exporter: the cluster's nodes, GPUs and training runs as Prometheus metrics.

``svconsole exporter`` runs the same engine as the console, headless: the shared SSH pool with
its health probes, one GPU agent per node (:class:`console.gpu.telemetry.Telemetry`), and a follower
for every live training run (:class:`RunWatcher`, over :mod:`console.training.runs` and
:mod:`console.training.follow`). :class:`EngineCollector` is a prometheus-client collector: at every
scrape it builds the metric families from the engine's state at that moment, so a GPU, node or
run that is gone has no series left (Prometheus marks the series stale); nothing is cached
between scrapes.

What is served, and when (every metric is listed in :data:`METRICS` with its help text):

- Per node (label ``node``): ``svconsole_node_up`` (the SSH connection is up) and the SSH round
  trip, always; ``svconsole_node_last_probe_age_seconds`` when facts were ever probed
  (``svconsole check``); CPU, RAM and load, the GPU count and the sample age only while the
  node's agent is live (a sample within two intervals); ``svconsole_node_telemetry_up`` says
  which.
- Per GPU (labels ``node``, ``gpu``, ``uuid``, ``name``), only while the node's agent is live:
  utilisation and memory-controller utilisation (ratios 0-1), memory used/total (bytes),
  temperature (celsius), power draw and limit (watts), SM clock (hertz), ECC error counters
  (volatile, ``type`` corrected/uncorrected; they reset with the driver), a 0/1 gauge per
  throttle reason, the compute process count and the sample age. ``svconsole_gpu_info`` (value
  1) carries ``source`` (nvml, nvidia-smi, simulated) and ``simulated`` ("true" when the values
  replay fixture data instead of reading this GPU). A field the node could not read has no
  series.
- Per run and rank (labels ``run``, ``rank``, ``node``): total step, epoch, last train loss
  (NaN when FunASR logged nan), learning rate, median step time, the last and the median DeepSpeed
  gradient synchronisation time (``bwd_allreduce``; the seed's thresholds: < 0.5 s normal, > 2 s
  bad), GPU memory from the log (bytes), seconds since the rank's last log line. Per run:
  ``svconsole_run_faults_total{kind, severity}``, the faults detected, counted as the store reports
  them (a detector's fault that clears and comes back counts again), and the ETA.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from console.cluster.probe import FactsCache, FactsCacheError, NodeFacts
from console.gpu.telemetry import (
    GPUReading,
    NodeStatus,
    Sample,
    Telemetry,
    TelemetryUpdate,
    agent_module,
    feed_utilisation,
)
from console.ssh.pool import NodeState, Pool
from console.training.faults import Finding
from console.training.metrics import MetricsStore

log = logging.getLogger(__name__)

MIB = 1024 * 1024
GIB = 1024 ** 3  # FunASR logs GPU memory as torch's bytes / 1024**3, printed as "GB"

NODE = ("node",)
GPU = ("node", "gpu", "uuid", "name")
RANK = ("run", "rank", "node")
RUN = ("run",)


# ---------------------------------------------------------------------------- the catalogue


@dataclass(frozen=True)
class MetricSpec:
    """One metric the exporter serves: its full name (counters end in ``_total``), kind,
    label names and help text."""

    name: str
    kind: Literal["gauge", "counter"]
    labels: tuple[str, ...]
    help: str


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("svconsole_node_up", "gauge", NODE,
               "1 when the node's SSH connection is up, else 0"),
    MetricSpec("svconsole_node_ssh_rtt_seconds", "gauge", NODE,
               "Round trip of the last SSH health probe"),
    MetricSpec("svconsole_node_last_probe_age_seconds", "gauge", NODE,
               "Seconds since the node's facts were last probed (svconsole check)"),
    MetricSpec("svconsole_node_telemetry_up", "gauge", NODE,
               "1 while the node's GPU agent streams (a sample within two intervals), else 0"),
    MetricSpec("svconsole_node_sample_age_seconds", "gauge", NODE,
               "Seconds since the node's last agent sample arrived"),
    MetricSpec("svconsole_node_cpu_utilization_ratio", "gauge", NODE,
               "Host CPU busy, 0-1 (all cores)"),
    MetricSpec("svconsole_node_memory_used_bytes", "gauge", NODE,
               "Host RAM in use (total minus available)"),
    MetricSpec("svconsole_node_memory_total_bytes", "gauge", NODE, "Host RAM"),
    MetricSpec("svconsole_node_load1", "gauge", NODE, "Load average over 1 minute"),
    MetricSpec("svconsole_node_load5", "gauge", NODE, "Load average over 5 minutes"),
    MetricSpec("svconsole_node_load15", "gauge", NODE, "Load average over 15 minutes"),
    MetricSpec("svconsole_node_gpus", "gauge", NODE,
               "GPUs the agent reads on the node (0: no GPU, see the agent's reason)"),
    MetricSpec("svconsole_gpu_info", "gauge", (*GPU, "source", "simulated"),
               "Always 1; source is nvml, nvidia-smi or simulated (simulated=\"true\": the "
               "values replay recorded H200 readings, not this GPU)"),
    MetricSpec("svconsole_gpu_utilization_ratio", "gauge", GPU,
               "GPU busy (kernel running), 0-1; seed 6.1: normal 0.7-0.9 during a run"),
    MetricSpec("svconsole_gpu_memory_utilization_ratio", "gauge", GPU,
               "GPU memory controller busy, 0-1"),
    MetricSpec("svconsole_gpu_memory_used_bytes", "gauge", GPU, "GPU memory in use"),
    MetricSpec("svconsole_gpu_memory_total_bytes", "gauge", GPU, "GPU memory"),
    MetricSpec("svconsole_gpu_temperature_celsius", "gauge", GPU, "GPU core temperature"),
    MetricSpec("svconsole_gpu_power_watts", "gauge", GPU, "GPU power draw"),
    MetricSpec("svconsole_gpu_power_limit_watts", "gauge", GPU, "GPU enforced power limit"),
    MetricSpec("svconsole_gpu_sm_clock_hertz", "gauge", GPU, "GPU SM clock"),
    MetricSpec("svconsole_gpu_ecc_errors_total", "counter", (*GPU, "type"),
               "Volatile ECC errors since the driver loaded, type corrected or uncorrected"),
    MetricSpec("svconsole_gpu_throttle_reason", "gauge", (*GPU, "reason"),
               "1 while the clock event (throttle) reason is active, else 0"),
    MetricSpec("svconsole_gpu_processes", "gauge", GPU, "Compute processes on the GPU"),
    MetricSpec("svconsole_gpu_sample_age_seconds", "gauge", GPU,
               "Seconds since the reading of this GPU arrived"),
    MetricSpec("svconsole_run_step", "gauge", RANK, "Total step of the rank's last train line"),
    MetricSpec("svconsole_run_epoch", "gauge", RANK, "Epoch of the rank's last train line"),
    MetricSpec("svconsole_run_loss", "gauge", RANK,
               "Train loss (loss_avg_rank) of the rank's last train line; NaN when logged nan"),
    MetricSpec("svconsole_run_learning_rate", "gauge", RANK,
               "Learning rate of the rank's last train line"),
    MetricSpec("svconsole_run_step_time_seconds", "gauge", RANK,
               "Median time per step over the rank's last lines"),
    MetricSpec("svconsole_run_grad_sync_seconds", "gauge", RANK,
               "DeepSpeed bwd_allreduce of the rank's last step (gradient synchronisation)"),
    MetricSpec("svconsole_run_grad_sync_median_seconds", "gauge", RANK,
               "Median bwd_allreduce over the rank's last steps; seed 6.1: < 0.5 s normal, "
               "> 2 s bad"),
    MetricSpec("svconsole_run_gpu_memory_used_bytes", "gauge", RANK,
               "GPU memory allocated by the rank, from its last train line"),
    MetricSpec("svconsole_run_gpu_memory_peak_bytes", "gauge", RANK,
               "Peak GPU memory allocated by the rank, from its last train line"),
    MetricSpec("svconsole_run_last_line_age_seconds", "gauge", RANK,
               "Seconds since the rank's last log line arrived"),
    MetricSpec("svconsole_run_step_time_relative", "gauge", RANK,
               "The rank's own time a step (less its waits for the others) relative to the "
               "median over ranks: 0.34 for 34% slower (a straggler above 0.1)"),
    MetricSpec("svconsole_run_eta_seconds", "gauge", RUN,
               "Time left to the last epoch's end, from the measured step time"),
    MetricSpec("svconsole_run_faults_total", "counter", (*RUN, "kind", "severity"),
               "Faults detected in the run by kind (the fault catalog's id)"),
)

SPECS: dict[str, MetricSpec] = {m.name: m for m in METRICS}


class _Families:
    """Metric families of one scrape, created on first use; ``None`` values are left out."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def add(self, name: str, labels: Iterable[str], value: float | None) -> None:
        if value is None:
            return
        family = self._families.get(name)
        if family is None:
            spec = SPECS[name]
            if spec.kind == "counter":
                family = CounterMetricFamily(name, spec.help, labels=list(spec.labels))
            else:
                family = GaugeMetricFamily(name, spec.help, labels=list(spec.labels))
            self._families[name] = family
        family.add_metric(list(labels), float(value))

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


# ---------------------------------------------------------------------------- runs


@dataclass
class WatchedRun:
    """A run whose metrics are served: its store, the follower feeding it (None when the store
    is fed by someone else), and when its logs were seen complete."""

    run_id: str
    store: MetricsStore
    follower: Any = None
    ended_at: float | None = None
    nodes: frozenset[str] = frozenset()
    """The nodes the run trains on: their GPU utilisation goes into its store."""


class FaultCounts:
    """Monotone fault counts per run, kind and severity from a store's current findings.

    A finding's ``count`` grows as matching lines come; a detector's finding (stalled rank,
    slow gradient sync) can vanish when the condition clears. Each look adds what a finding grew
    by since the last look, and a finding that came back after vanishing counts again."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str, str | None, int | None], int] = {}
        self._totals: dict[tuple[str, str, str], int] = {}
        self._lock = threading.Lock()

    def update(self, run_id: str, findings: Iterable[Finding]) -> dict[tuple[str, str], int]:
        """Take the run's findings now; return its totals by (kind, severity)."""
        with self._lock:
            now: dict[tuple[str, str, str | None, int | None], int] = {}
            for f in findings:
                key = (run_id, f.id, f.node, f.rank)
                now[key] = now.get(key, 0) + f.count
                total = (run_id, f.id, f.severity.value)
                before = self._seen.get(key, 0)
                grew = now[key] - before if now[key] >= before else now[key]
                self._totals[total] = self._totals.get(total, 0) + grew
            for key in [k for k in self._seen if k[0] == run_id and k not in now]:
                del self._seen[key]
            self._seen.update(now)
            return {(k, s): n for (r, k, s), n in self._totals.items() if r == run_id}

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._seen = {k: v for k, v in self._seen.items() if k[0] != run_id}
            self._totals = {k: v for k, v in self._totals.items() if k[0] != run_id}


class RunWatcher:
    """The runs the exporter serves.

    Every ``interval`` seconds (0: never) it asks the cluster for live runs
    (:func:`console.training.runs.find_runs`: the local index under ``state_dir`` plus runs found alive on
    the nodes) and follows each new one into its own :class:`MetricsStore` from the start of its
    logs (:class:`console.training.follow.RunFollower`). A run whose logs ended is served ``retain_s``
    seconds more (its final values get scraped), then dropped. :meth:`attach` serves a store fed
    elsewhere (a screen's run, a test)."""

    def __init__(self, pool: Pool, state_dir: Path | None, *, interval: float = 30.0,
                 retain_s: float = 300.0, clock: Callable[[], float] = time.time) -> None:
        self.pool = pool
        self.state_dir = state_dir
        self.interval = interval
        self.retain_s = retain_s
        self.clock = clock
        self.error: str | None = None
        self._runs: dict[str, WatchedRun] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, run_id: str, store: MetricsStore, follower: Any = None,
               nodes: Iterable[str] = ()) -> WatchedRun:
        """Serve ``store``'s metrics as run ``run_id`` (trained on ``nodes``, or the nodes of
        the follower's run record)."""
        record = getattr(follower, "record", None)
        if record is not None and not nodes:
            nodes = [n.node for n in record.nodes]
        watched = WatchedRun(run_id, store, follower, nodes=frozenset(nodes))
        with self._lock:
            self._runs[run_id] = watched
        return watched

    def detach(self, run_id: str) -> WatchedRun | None:
        """Stop serving a run (and stop its follower, if this watcher started it)."""
        with self._lock:
            watched = self._runs.pop(run_id, None)
        if watched is not None and watched.follower is not None:
            watched.follower.stop()
            watched.store.close()
        return watched

    def gpu_sample(self, update: TelemetryUpdate) -> None:
        """A telemetry update: the GPU utilisation of a node goes into the store of every run
        that trains on it, where the seed's "below 50% through a run" fault is judged."""
        for watched in self.runs():
            if update.node in watched.nodes and watched.ended_at is None:
                feed_utilisation(watched.store, update)

    def runs(self) -> list[WatchedRun]:
        with self._lock:
            return sorted(self._runs.values(), key=lambda w: w.run_id)

    def poll(self) -> None:
        """Follow live runs not followed yet; drop ended runs past their retention."""
        from console.training.follow import RunFollower
        from console.training.runs import find_runs

        assert self.state_dir is not None
        for status in find_runs(self.pool, self.state_dir, live_only=True):
            with self._lock:
                known = status.record.id in self._runs
            if not known:
                follower = RunFollower(self.pool, status.record).start()
                self.attach(status.record.id, follower.store, follower)
                log.info("following run %s", status.record.id)
        now = self.clock()
        for watched in self.runs():
            if watched.follower is None or not watched.follower.ended:
                continue
            if watched.ended_at is None:
                watched.ended_at = now
            elif now - watched.ended_at >= self.retain_s:
                self.detach(watched.run_id)

    def start(self) -> None:
        if self._thread is not None or self.interval <= 0 or self.state_dir is None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="svconsole-exporter-runs",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
                self.error = None
            except Exception as exc:  # a failed look must not end the watcher: try again
                self.error = f"{type(exc).__name__}: {exc}"
                log.warning("looking for runs failed: %s", self.error)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        for watched in self.runs():
            if watched.follower is not None:
                self.detach(watched.run_id)


# ---------------------------------------------------------------------------- the collector


class EngineCollector:
    """A prometheus-client collector over the engine: pool statuses, the facts cache, the
    telemetry collectors and the watched runs, read at scrape time."""

    def __init__(self, pool: Pool, telemetry: Telemetry, runs: RunWatcher, *,
                 facts: FactsCache | None = None, clock: Callable[[], float] = time.time) -> None:
        self.pool = pool
        self.telemetry = telemetry
        self.runs = runs
        self.facts = facts
        self.clock = clock
        self.faults = FaultCounts()
        self._facts_cache: tuple[float, dict[str, NodeFacts]] | None = None
        self._counted: set[str] = set()   # runs FaultCounts knows
        self._lock = threading.Lock()
        self.throttle_reasons = tuple(name for _, name in agent_module().THROTTLE_BITS)

    def collect(self) -> Iterator[Metric]:
        """The metric families of this instant (one scrape at a time)."""
        with self._lock:
            out = _Families()
            now = self.clock()
            self._nodes(out, now)
            self._runs(out, now)
        yield from out

    # -- nodes and GPUs
    def _probe_facts(self) -> dict[str, NodeFacts]:
        """The facts cache, re-read only when its file changed."""
        if self.facts is None:
            return {}
        try:
            mtime = self.facts.path.stat().st_mtime
        except OSError:
            return {}
        if self._facts_cache is None or self._facts_cache[0] != mtime:
            try:
                self._facts_cache = (mtime, self.facts.load())
            except FactsCacheError as exc:
                log.warning("%s", exc)
                self._facts_cache = (mtime, {})
        return self._facts_cache[1]

    def _nodes(self, out: _Families, now: float) -> None:
        facts = self._probe_facts()
        statuses = self.pool.statuses()
        collectors = self.telemetry.collectors
        for name, status in statuses.items():
            n = (name,)
            out.add("svconsole_node_up", n, 1.0 if status.state == NodeState.UP else 0.0)
            out.add("svconsole_node_ssh_rtt_seconds", n, status.rtt)
            if name in facts:
                out.add("svconsole_node_last_probe_age_seconds", n, facts[name].age(now))
            collector = collectors.get(name)
            if collector is None:
                continue
            sample = collector.latest
            live = collector.status == NodeStatus.LIVE and sample is not None
            out.add("svconsole_node_telemetry_up", n, 1.0 if live else 0.0)
            if sample is not None:
                out.add("svconsole_node_sample_age_seconds", n, sample.age(now))
            if live:
                assert sample is not None
                self._host(out, name, sample)
                for gpu in sample.gpus:
                    self._gpu(out, name, sample, gpu, now)

    @staticmethod
    def _host(out: _Families, node: str, sample: Sample) -> None:
        n = (node,)
        out.add("svconsole_node_gpus", n, len(sample.gpus))
        host = sample.host
        if host is None:
            return
        out.add("svconsole_node_cpu_utilization_ratio", n,
                None if host.cpu_pct is None else host.cpu_pct / 100.0)
        out.add("svconsole_node_memory_used_bytes", n,
                None if host.mem_used_mb is None else host.mem_used_mb * MIB)
        out.add("svconsole_node_memory_total_bytes", n,
                None if host.mem_total_mb is None else host.mem_total_mb * MIB)
        out.add("svconsole_node_load1", n, host.load1)
        out.add("svconsole_node_load5", n, host.load5)
        out.add("svconsole_node_load15", n, host.load15)

    def _gpu(self, out: _Families, node: str, sample: Sample, g: GPUReading, now: float) -> None:
        labels = (node, str(g.index), g.uuid or "", g.name or "")
        out.add("svconsole_gpu_info", (*labels, sample.source or "",
                                       "true" if sample.simulated else "false"), 1.0)
        ratio = {"svconsole_gpu_utilization_ratio": g.util_gpu,
                 "svconsole_gpu_memory_utilization_ratio": g.util_mem}
        for metric, pct in ratio.items():
            out.add(metric, labels, None if pct is None else pct / 100.0)
        out.add("svconsole_gpu_memory_used_bytes", labels,
                None if g.mem_used_mb is None else g.mem_used_mb * MIB)
        out.add("svconsole_gpu_memory_total_bytes", labels,
                None if g.mem_total_mb is None else g.mem_total_mb * MIB)
        out.add("svconsole_gpu_temperature_celsius", labels, g.temp_c)
        out.add("svconsole_gpu_power_watts", labels, g.power_w)
        out.add("svconsole_gpu_power_limit_watts", labels, g.power_limit_w)
        out.add("svconsole_gpu_sm_clock_hertz", labels,
                None if g.sm_clock_mhz is None else g.sm_clock_mhz * 1e6)
        out.add("svconsole_gpu_ecc_errors_total", (*labels, "corrected"), g.ecc_corrected)
        out.add("svconsole_gpu_ecc_errors_total", (*labels, "uncorrected"), g.ecc_uncorrected)
        if f"gpu{g.index}.throttle" not in sample.errors:
            for reason in self.throttle_reasons:
                out.add("svconsole_gpu_throttle_reason", (*labels, reason),
                        1.0 if reason in g.throttle else 0.0)
        out.add("svconsole_gpu_processes", labels, len(g.procs))
        out.add("svconsole_gpu_sample_age_seconds", labels, sample.age(now))

    # -- runs
    def _runs(self, out: _Families, now: float) -> None:
        served = set()
        for watched in self.runs.runs():
            served.add(watched.run_id)
            store = watched.store
            run = watched.run_id
            sync = store.grad_sync()
            for r in store.ranks(now):
                labels = (run, str(r.rank), r.node or "")
                median = sync.get(f"rank{r.rank}", {}).get("median_ms")
                out.add("svconsole_run_step", labels, r.last_step)
                out.add("svconsole_run_epoch", labels, r.epoch)
                out.add("svconsole_run_loss", labels, r.loss)
                out.add("svconsole_run_learning_rate", labels, r.lr)
                out.add("svconsole_run_step_time_seconds", labels, r.step_time_s)
                out.add("svconsole_run_grad_sync_seconds", labels,
                        None if r.grad_sync_ms is None else r.grad_sync_ms / 1000.0)
                out.add("svconsole_run_grad_sync_median_seconds", labels,
                        None if median is None else median / 1000.0)
                out.add("svconsole_run_gpu_memory_used_bytes", labels,
                        None if r.gpu_mem_gb is None else r.gpu_mem_gb * GIB)
                out.add("svconsole_run_gpu_memory_peak_bytes", labels,
                        None if r.gpu_peak_gb is None else r.gpu_peak_gb * GIB)
                out.add("svconsole_run_last_line_age_seconds", labels, r.seconds_since)
                out.add("svconsole_run_step_time_relative", labels, r.rel_time)
            out.add("svconsole_run_eta_seconds", (run,), store.progress().eta_s)
            totals = self.faults.update(run, store.findings(now))
            for (kind, severity), count in sorted(totals.items()):
                out.add("svconsole_run_faults_total", (run, kind, severity), count)
        for run in self._counted - served:
            self.faults.forget(run)
        self._counted = served


# ---------------------------------------------------------------------------- the exporter


def is_loopback(bind: str) -> bool:
    """True when ``bind`` only accepts connections from this machine."""
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False


class Exporter:
    """The engine behind ``svconsole exporter``: telemetry, runs and an HTTP endpoint serving
    :class:`EngineCollector` (plus the exporter process's own ``process_*`` metrics).

    ``health_interval``: seconds between the pool's SSH health probes (``svconsole_node_up``).
    ``runs_interval``: seconds between looks for live runs (0: none; :meth:`RunWatcher.attach`
    still serves stores fed elsewhere)."""

    def __init__(self, pool: Pool, cluster: Any, *, state_dir: Path | None = None,
                 interval: float = 1.0, simulate: str | Path | None = None, sim_gpus: int = 8,
                 health_interval: float = 5.0, runs_interval: float = 30.0,
                 retain_s: float = 300.0) -> None:
        self.pool = pool
        self.cluster = cluster
        self.health_interval = health_interval
        self.telemetry = Telemetry(pool, cluster, interval=interval, simulate=simulate,
                                   sim_gpus=sim_gpus, history_s=60 * interval)
        self.runs = RunWatcher(pool, state_dir, interval=runs_interval, retain_s=retain_s)
        facts = FactsCache(state_dir, cluster.name) if state_dir is not None else None
        self.collector = EngineCollector(pool, self.telemetry, self.runs, facts=facts)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)
        self._server: Any = None
        self._server_thread: threading.Thread | None = None

    def serve(self, port: int, bind: str = "127.0.0.1") -> tuple[str, int]:
        """Listen on ``bind:port`` (port 0: any free port; bind: loopback unless told);
        returns the address really bound. Raises OSError when it cannot listen."""
        self._server, self._server_thread = start_http_server(port, bind, registry=self.registry)
        host, bound = self._server.server_address[:2]
        return host, bound

    def start(self) -> None:
        """Start the health probes, the GPU agents and the run watcher (returns at once)."""
        self.pool.start_health(self.health_interval)
        self.telemetry.subscribe(self.runs.gpu_sample)
        self.telemetry.start()
        self.runs.start()

    def stop(self) -> None:
        """Stop serving, stop following runs and stop the agents (their channels close, so
        they exit on the nodes)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._server_thread is not None:
                self._server_thread.join(timeout=5)
            self._server = None
        self.runs.stop()
        self.telemetry.stop()

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
