#!/usr/bin/env python3
"""svconsole GPU agent: one long-lived process per node that streams GPU and host telemetry.

svconsole uploads this file to a cache directory on the node and runs it over its SSH pool; it
needs only the Python standard library (3.8+), plus nvidia-ml-py (``import pynvml``) when the node
has it. It writes ONE JSON line per interval on stdout::

    {"t": 1764461696.1, "seq": 7, "source": "nvml",
     "host": {"cpu_pct": 12.5, "mem_total_mb": 515000, "mem_used_mb": 40210,
              "load1": 0.5, "load5": 0.4, "load15": 0.3},
     "gpus": [{"index": 0, "uuid": "GPU-...", "name": "NVIDIA H200", "util_gpu": 98,
               "util_mem": 25, "mem_used_mb": 1754, "mem_total_mb": 143771, "temp_c": 54,
               "power_w": 690.8, "power_limit_w": 700.0, "sm_clock_mhz": 1515,
               "throttle": ["sw_power_cap"], "ecc": {"corrected": 0, "uncorrected": 0},
               "procs": [{"pid": 432, "used_mb": 1130, "cmd": "python train.py",
                          "rank": 3, "local_rank": 1}]}],
     "errors": {"gpu0.power_w": "NVMLError_NotSupported"}}

Sources, in order: NVML through nvidia-ml-py; else one long-lived
``nvidia-smi --query-gpu=... --format=csv,noheader,nounits -lms <interval>`` (its compute
processes come from a short ``nvidia-smi --query-compute-apps`` every max(5 s, 5 intervals));
``--simulate FIXTURE`` replays the H200 fixture series instead and marks every line
``"source": "simulated"``.

A field that cannot be read is null, and ``errors`` names the reason: the agent never dies of it.
Without any GPU source every line is a host-only sample with ``"no_gpu": true`` and ``"reason"``
(NVML's error and the nvidia-smi reason), so the console still sees the node live.

The agent exits when its stdin reaches end of file (the console closed the channel), when writing
stdout fails (the connection dropped), or when its parent process changes (the SSH session died):
no orphan is left on the node.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

#: NVML clock event ("throttle") reason bits, named as nvidia-smi -q names them.
THROTTLE_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clocks_setting"),
)

MIB = 1024 * 1024


def throttle_names(mask):
    """The reason names set in an NVML clock event bitmask."""
    return [name for bit, name in THROTTLE_BITS if mask & bit]


def proc_cmd(pid):
    """The command line of a process from /proc (None when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return None
    text = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    return text[:300] or None


def gpu_proc(pid, used_mb):
    """A compute process entry: pid, GPU memory (MiB), command line, and the torchrun ranks
    (RANK, LOCAL_RANK from /proc/<pid>/environ; None when absent or not readable)."""
    ranks = {}
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                key, _, value = item.partition(b"=")
                if key in (b"RANK", b"LOCAL_RANK") and value.isdigit():
                    ranks[key.decode()] = int(value)
    except OSError:
        pass
    return {"pid": pid, "used_mb": used_mb, "cmd": proc_cmd(pid),
            "rank": ranks.get("RANK"), "local_rank": ranks.get("LOCAL_RANK")}


class HostReader:
    """Host CPU (from /proc/stat deltas), RAM (/proc/meminfo) and load average."""

    def __init__(self):
        self._last = self._cpu_times()

    @staticmethod
    def _cpu_times():
        try:
            with open("/proc/stat") as f:
                parts = f.readline().split()[1:]
            values = [int(p) for p in parts]
        except (OSError, ValueError):
            return None
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return sum(values), idle

    def read(self):
        host = {"cpu_pct": None, "mem_total_mb": None, "mem_used_mb": None,
                "load1": None, "load5": None, "load15": None}
        now = self._cpu_times()
        if now and self._last and now[0] > self._last[0]:
            total = now[0] - self._last[0]
            busy = total - (now[1] - self._last[1])
            host["cpu_pct"] = round(100.0 * busy / total, 1)
        self._last = now
        try:
            info = {}
            with open("/proc/meminfo") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    info[key] = int(rest.split()[0])
            host["mem_total_mb"] = info["MemTotal"] // 1024
            host["mem_used_mb"] = (info["MemTotal"] - info.get("MemAvailable", info.get("MemFree", 0))) // 1024
        except (OSError, ValueError, KeyError, IndexError):
            pass
        try:
            host["load1"], host["load5"], host["load15"] = (round(x, 2) for x in os.getloadavg())
        except OSError:
            pass
        return host


def _empty_gpu(index):
    return {"index": index, "uuid": None, "name": None, "util_gpu": None, "util_mem": None,
            "mem_used_mb": None, "mem_total_mb": None, "temp_c": None, "power_w": None,
            "power_limit_w": None, "sm_clock_mhz": None, "throttle": None,
            "ecc": {"corrected": None, "uncorrected": None}, "procs": []}


class NvmlSource:
    """Reads every GPU through NVML (nvidia-ml-py); each field on its own, errors become nulls."""

    name = "nvml"

    def __init__(self, nv):
        self.nv = nv
        nv.nvmlInit()
        self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]

    def _get(self, errors, key, fn, *args):
        try:
            return fn(*args)
        except self.nv.NVMLError as e:
            errors[key] = type(e).__name__
            return None

    def read(self):
        nv = self.nv
        gpus, errors = [], {}
        for i, h in enumerate(self.handles):
            g = _empty_gpu(i)

            def get(key, fn, *args, _prefix=f"gpu{i}."):
                return self._get(errors, _prefix + key, fn, *args)

            name = get("name", nv.nvmlDeviceGetName, h)
            g["name"] = name.decode() if isinstance(name, bytes) else name
            uuid = get("uuid", nv.nvmlDeviceGetUUID, h)
            g["uuid"] = uuid.decode() if isinstance(uuid, bytes) else uuid
            util = get("util", nv.nvmlDeviceGetUtilizationRates, h)
            if util is not None:
                g["util_gpu"], g["util_mem"] = util.gpu, util.memory
            mem = get("memory", nv.nvmlDeviceGetMemoryInfo, h)
            if mem is not None:
                g["mem_used_mb"] = round(mem.used / MIB, 1)
                g["mem_total_mb"] = round(mem.total / MIB, 1)
            g["temp_c"] = get("temp_c", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            power = get("power_w", nv.nvmlDeviceGetPowerUsage, h)
            g["power_w"] = None if power is None else round(power / 1000.0, 3)
            limit = get("power_limit_w", nv.nvmlDeviceGetEnforcedPowerLimit, h)
            g["power_limit_w"] = None if limit is None else round(limit / 1000.0, 3)
            g["sm_clock_mhz"] = get("sm_clock_mhz", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nv.nvmlDeviceGetCurrentClocksThrottleReasons
            mask = get("throttle", reasons_fn, h)
            g["throttle"] = None if mask is None else throttle_names(mask)
            for kind, code in (("corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                               ("uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
                g["ecc"][kind] = get("ecc." + kind, nv.nvmlDeviceGetTotalEccErrors, h, code,
                                     nv.NVML_VOLATILE_ECC)
            procs = get("procs", nv.nvmlDeviceGetComputeRunningProcesses, h) or []
            for pr in procs:
                used = getattr(pr, "usedGpuMemory", None)
                g["procs"].append(gpu_proc(pr.pid, None if used is None else round(used / MIB, 1)))
            gpus.append(g)
        return gpus, errors

    def close(self):
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass


#: nvidia-smi --query-gpu field -> (JSON key, kind). Fields not listed are ignored by smi_row.
SMI_FIELDS = {
    "index": ("index", "int"),
    "uuid": ("uuid", "str"),
    "name": ("name", "str"),
    "utilization.gpu": ("util_gpu", "num"),
    "utilization.memory": ("util_mem", "num"),
    "memory.used": ("mem_used_mb", "num"),
    "memory.total": ("mem_total_mb", "num"),
    "temperature.gpu": ("temp_c", "num"),
    "power.draw": ("power_w", "num"),
    "power.limit": ("power_limit_w", "num"),
    "clocks.sm": ("sm_clock_mhz", "num"),
    "clocks_event_reasons.active": ("throttle", "mask"),
    "clocks_throttle_reasons.active": ("throttle", "mask"),
    "ecc.errors.corrected.volatile.total": ("ecc.corrected", "int"),
    "ecc.errors.uncorrected.volatile.total": ("ecc.uncorrected", "int"),
}

#: What the agent asks nvidia-smi for; older drivers know the throttle field by its old name.
_SMI_QUERY = ["index", "uuid", "name", "utilization.gpu", "utilization.memory", "memory.used",
              "memory.total", "temperature.gpu", "power.draw", "power.limit", "clocks.sm",
              "clocks_event_reasons.active", "ecc.errors.corrected.volatile.total",
              "ecc.errors.uncorrected.volatile.total"]
SMI_QUERIES = (_SMI_QUERY,
               [f.replace("clocks_event_reasons", "clocks_throttle_reasons") for f in _SMI_QUERY])


def smi_row(fields, values, position=0):
    """One CSV row of ``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`` as a GPU
    dict of the agent's JSON, plus the field errors (``[N/A]``, ``[Not Supported]``, garbage).

    ``position`` is the GPU index used when the row has no ``index`` column."""
    g = _empty_gpu(position)
    errors = {}
    for field, raw in zip(fields, values):  # noqa: B905 (Python 3.8: no strict=)
        spec = SMI_FIELDS.get(field.strip())
        if spec is None:
            continue
        key, kind = spec
        raw = raw.strip()
        value = None
        if raw.startswith("[") or raw in ("N/A", ""):
            errors[key] = raw.strip("[]") or "empty"
        else:
            try:
                if kind == "int":
                    value = int(raw)
                elif kind == "num":
                    value = float(raw)
                    value = int(value) if value.is_integer() else value
                elif kind == "mask":
                    value = throttle_names(int(raw, 16))
                else:
                    value = raw
            except ValueError:
                errors[key] = f"unparsable {raw!r}"
        if key.startswith("ecc."):
            g["ecc"][key[4:]] = value
        else:
            g[key] = value
    prefixed = {f"gpu{g['index']}.{k}": v for k, v in errors.items()}
    return g, prefixed


class SmiSource:
    """Falls back to one long-lived ``nvidia-smi ... -lms`` process and keeps its latest rows."""

    name = "nvidia-smi"

    def __init__(self, smi, interval):
        self.smi = smi
        self.interval = interval
        self.proc_every = max(5.0, 5 * interval)
        self.rows = {}
        self.lock = threading.Lock()
        self.procs = {}
        self.procs_at = 0.0
        self.started_at = 0.0
        self.proc = None
        self.fields = None
        last_error = "no output"
        for fields in SMI_QUERIES:
            ok, last_error = self._start(fields)
            if ok:
                return
        raise RuntimeError(last_error)

    def _start(self, fields):
        self.started_at = time.monotonic()
        cmd = [self.smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits",
               "-lms", str(max(100, int(self.interval * 1000)))]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
        first = self.proc.stdout.readline()
        values = first.split(",")
        if len(values) != len(fields):
            self.proc.kill()
            self.proc.wait()
            return False, (first.strip() or f"nvidia-smi exited with {self.proc.returncode}")
        self.fields = fields
        self._take(first)
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        return True, ""

    def _take(self, line):
        g, errors = smi_row(self.fields, line.split(","))
        with self.lock:
            self.rows[g["index"]] = (g, errors)

    def _pump(self, proc):
        for line in proc.stdout:
            if line.strip():
                self._take(line)

    def _refresh_procs(self):
        self.procs_at = time.monotonic()
        procs = {}
        try:
            out = subprocess.run(
                [self.smi, "--query-compute-apps=gpu_uuid,pid,used_memory",
                 "--format=csv,noheader,nounits"], stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 3 or not parts[1].isdigit():
                continue
            used = float(parts[2]) if parts[2].replace(".", "", 1).isdigit() else None
            procs.setdefault(parts[0], []).append(gpu_proc(int(parts[1]), used))
        self.procs = procs

    def read(self):
        errors = {}
        if self.proc.poll() is not None:
            errors["nvidia-smi"] = f"exited with {self.proc.returncode}"
            if time.monotonic() - self.started_at > 30:
                self._start(self.fields)
        if time.monotonic() - self.procs_at >= self.proc_every:
            self._refresh_procs()
        with self.lock:
            rows = sorted(self.rows.items())
        gpus = []
        for _, (g, errs) in rows:
            g = dict(g, procs=self.procs.get(g["uuid"], []))
            gpus.append(g)
            errors.update(errs)
        return gpus, errors

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class SimSource:
    """Replays the H200 fixture's ``load_series`` (nvml.json) on N simulated GPUs, each GPU a few
    steps apart; one series step per sample. Every line says ``"source": "simulated"``."""

    name = "simulated"

    def __init__(self, fixture, gpus):
        with open(fixture) as f:
            data = json.load(f)
        self.series = data["load_series"]
        if not self.series:
            raise ValueError(f"{fixture}: load_series is empty")
        ident = data["gpus"][0]
        self.name_ = ident.get("name")
        self.uuid = ident.get("uuid") or "GPU-simulated"
        self.limit_w = ident.get("power_limit_mw", 0) / 1000.0 or None
        self.count = gpus
        self.step = 0

    def read(self):
        gpus = []
        n = len(self.series)
        for i in range(self.count):
            s = self.series[(self.step + 7 * i) % n]
            g = _empty_gpu(i)
            g.update(
                uuid=f"{self.uuid}-sim{i}", name=self.name_, util_gpu=s["util_gpu"],
                util_mem=s["util_mem"], mem_used_mb=round(s["mem_used"] / MIB, 1),
                mem_total_mb=round(s["mem_total"] / MIB, 1), temp_c=s["temp"],
                power_w=round(s["power_mw"] / 1000.0, 3), power_limit_w=self.limit_w,
                sm_clock_mhz=s["sm_clock"], throttle=[], ecc={"corrected": 0, "uncorrected": 0},
                procs=[{"pid": p["pid"], "used_mb": round(p["used"] / MIB, 1),
                        "cmd": "python matmul_load.py (simulated)", "rank": None,
                        "local_rank": None} for p in s.get("procs", [])])
            gpus.append(g)
        self.step += 1
        return gpus, {}

    def close(self):
        pass


def open_source(args):
    """The GPU source to use, or (None, reason) when the node has none."""
    if args.simulate:
        return SimSource(args.simulate, args.sim_gpus), None
    reasons = []
    try:
        import pynvml
    except ImportError as e:
        reasons.append(f"NVML: nvidia-ml-py not importable ({e})")
    else:
        try:
            source = NvmlSource(pynvml)
        except pynvml.NVMLError as e:
            reasons.append(f"NVML: {type(e).__name__}: {e}")
        else:
            if source.handles:
                return source, None
            source.close()
            reasons.append("NVML: the driver reports 0 GPUs")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        reasons.append("nvidia-smi: not found on PATH")
    else:
        try:
            return SmiSource(smi, args.interval), None
        except (OSError, RuntimeError) as e:
            reasons.append(f"nvidia-smi: {e}")
    return None, "; ".join(reasons)


def watch_stdin(stop):
    """Set ``stop`` when stdin reaches end of file (the console closed the channel)."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    stop.set()


def emit(record):
    """Write one JSON line; False when stdout is gone (the connection dropped)."""
    data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    try:
        while data:
            data = data[os.write(1, data):]
    except OSError:
        return False
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between lines (default 1)")
    ap.add_argument("--simulate", metavar="FIXTURE", help="replay this nvml.json load_series")
    ap.add_argument("--sim-gpus", type=int, default=8, help="simulated GPU count (default 8)")
    ap.add_argument("--count", type=int, default=0, help="write N lines and exit, whatever stdin does (default 0: until stdin closes)")
    args = ap.parse_args(argv)
    if args.interval <= 0:
        ap.error("--interval must be > 0")

    stop = threading.Event()
    if not args.count:  # a bounded run (--count) ignores stdin: it ends by itself
        threading.Thread(target=watch_stdin, args=(stop,), daemon=True).start()
    parent = os.getppid()
    host = HostReader()
    source, reason = open_source(args)
    seq = 0
    deadline = time.monotonic()
    try:
        while not stop.is_set():
            record = {"t": round(time.time(), 3), "seq": seq,
                      "source": source.name if source else None, "host": host.read()}
            if source is None:
                record.update(no_gpu=True, reason=reason, gpus=[], errors={})
            else:
                record["gpus"], record["errors"] = source.read()
            if not emit(record):
                break
            seq += 1
            if args.count and seq >= args.count:
                break
            if os.getppid() != parent:
                break
            deadline = max(deadline + args.interval, time.monotonic())
            stop.wait(deadline - time.monotonic())
    finally:
        if source is not None:
            source.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
