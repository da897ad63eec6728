"""The node agent (scripts/gpu_agent.py) run as a real process on this GPU-less machine, and its
readers fed with the real H200 readings of tests/fixtures/h200/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from console.gpu.telemetry import agent_module, parse_sample
from console.ssh.remote import script_path

FIXTURES = Path(__file__).parent / "fixtures" / "h200"
AGENT = str(script_path("gpu_agent.py"))
H200_UUID = "GPU-6a6cead0-ea07-7520-cae2-b62c198dfdea"


def no_gpu_env(tmp_path: Path) -> dict[str, str]:
    """This interpreter (nvidia-ml-py importable, no driver) and a PATH without nvidia-smi."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    return dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin")


def start_agent(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, AGENT, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, **kw)


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting for its reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def wait_gone(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if gone(pid):
            return True
        time.sleep(0.05)
    return gone(pid)


def test_no_gpu_reports_nvml_reason_and_exits_when_stdin_closes(tmp_path):
    p = start_agent("--interval", "0.2", env=no_gpu_env(tmp_path))
    try:
        first = json.loads(p.stdout.readline())
        second = parse_sample(p.stdout.readline())
        assert first["no_gpu"] is True and first["gpus"] == [] and first["seq"] == 0
        # the real nvidia-ml-py, no driver: NVML's own error, then why the fallback failed too
        assert "NVMLError_LibraryNotFound" in first["reason"]
        assert "nvidia-smi: not found on PATH" in first["reason"]
        assert first["host"]["mem_total_mb"] > 0 and first["host"]["load1"] is not None
        # host-only samples keep coming, so the console sees the node live
        assert second is not None and second.no_gpu and second.seq == 1 and second.host is not None
        p.stdin.close()
        assert p.wait(timeout=3) == 0
    finally:
        p.kill()
        p.wait()
    assert gone(p.pid)


def test_exits_when_its_stdout_reader_goes_away(tmp_path):
    p = start_agent("--interval", "0.1", env=no_gpu_env(tmp_path))
    try:
        assert json.loads(p.stdout.readline())["no_gpu"]
        p.stdout.close()              # the connection dropped: the next write fails with EPIPE
        assert p.wait(timeout=3) == 0
        assert p.stdin.writable()     # its stdin was still open: EPIPE alone ended it
    finally:
        p.kill()
        p.wait()


def test_exits_when_its_parent_dies(tmp_path):
    # bash starts the agent in the background (stdin still ours, kept open) and exits
    shell = subprocess.Popen(
        ["bash", "-c", f'"{sys.executable}" "{AGENT}" --interval 0.1 >/dev/null & echo $!; sleep 0.5'],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=no_gpu_env(tmp_path), text=True)
    try:
        pid = int(shell.stdout.readline())
        assert not gone(pid)
        shell.wait(timeout=5)
        assert wait_gone(pid, 3), f"agent {pid} outlived its parent"
    finally:
        shell.stdin.close()
        shell.kill()
        shell.wait()


def test_simulated_lines_replay_the_fixture_and_say_so():
    # a bounded run (--count) writes all its lines even with stdin closed from the start
    out = subprocess.run(
        [sys.executable, AGENT, "--interval", "0.01", "--count", "30", "--sim-gpus", "8",
         "--simulate", str(FIXTURES / "nvml.json")], stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=30, check=True).stdout.splitlines()
    samples = [parse_sample(x) for x in out]
    assert len(samples) == 30
    assert all(s is not None and s.source == "simulated" and s.simulated for s in samples)
    assert all(len(s.gpus) == 8 for s in samples)
    gpu0 = [s.gpus[0] for s in samples]
    assert gpu0[0].name == "NVIDIA H200" and gpu0[0].mem_total_mb == pytest.approx(143771, abs=1)
    assert gpu0[0].util_gpu == 0 and gpu0[0].power_w == pytest.approx(77.455)
    assert max(g.util_gpu for g in gpu0) >= 94 and max(g.power_w for g in gpu0) > 680
    assert {g.uuid for g in samples[0].gpus} == {f"{H200_UUID}-sim{i}" for i in range(8)}
    # the GPUs are phase-shifted, not eight copies of one
    assert len({g.power_w for g in samples[0].gpus}) > 1


class FixtureNVML(SimpleNamespace):
    """NVML answering from one snapshot of the H200 fixture, with nvidia-ml-py's real error
    classes and constants; ``unsupported`` functions raise NVMLError_NotSupported as NVLink did
    on that machine."""

    def __init__(self, ident: dict, snap: dict, unsupported: set[str] = frozenset()):
        super().__init__(**{k: getattr(pynvml, k) for k in dir(pynvml) if k.startswith("NVML")})
        self.ident, self.snap, self.unsupported = ident, snap, unsupported

    def __getattr__(self, name):
        raise AttributeError(name)

    def _answer(self, name, value):
        if name in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self._answer("name", self.ident["name"])

    def nvmlDeviceGetUUID(self, h):
        return self._answer("uuid", self.ident["uuid"])

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._answer("util", SimpleNamespace(gpu=self.snap["util_gpu"], memory=self.snap["util_mem"]))

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._answer("memory", SimpleNamespace(used=self.snap["mem_used"], total=self.snap["mem_total"]))

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._answer("temp", self.snap["temp"])

    def nvmlDeviceGetPowerUsage(self, h):
        return self._answer("power", self.snap["power_mw"])

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._answer("limit", self.ident["power_limit_mw"])

    def nvmlDeviceGetClockInfo(self, h, clock):
        assert clock == pynvml.NVML_CLOCK_SM
        return self._answer("clock", self.snap["sm_clock"])

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._answer("throttle", self.ident["throttle"])

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        assert counter == pynvml.NVML_VOLATILE_ECC
        return self._answer("ecc", 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self._answer("procs", [SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used"])
                                      for p in self.snap["procs"]])


@pytest.fixture(scope="module")
def h200() -> dict:
    return json.loads((FIXTURES / "nvml.json").read_text())


def test_nvml_reader_converts_the_h200_reading(h200):
    loaded = next(s for s in h200["load_series"] if s["util_gpu"] >= 94)
    source = agent_module().NvmlSource(FixtureNVML(h200["gpus"][0], loaded))
    (g,), errors = source.read()
    assert errors == {}
    assert g["name"] == "NVIDIA H200" and g["uuid"] == H200_UUID
    assert g["mem_total_mb"] == 143771.0 and g["mem_used_mb"] == 1753.9
    assert g["power_w"] == pytest.approx(281.604) and g["power_limit_w"] == 700.0
    assert g["throttle"] == ["gpu_idle"]          # the fixture's mask 1
    assert g["ecc"] == {"corrected": 0, "uncorrected": 0}
    assert [(p["pid"], p["used_mb"]) for p in g["procs"]] == [(432, 1130.0)]


def test_process_entries_carry_torchrun_ranks():
    env = dict(os.environ, RANK="3", LOCAL_RANK="1")
    with subprocess.Popen(["sleep", "30"], env=env) as child:
        try:
            time.sleep(0.05)
            entry = agent_module().gpu_proc(child.pid, 512.0)
        finally:
            child.kill()
    assert entry == {"pid": child.pid, "used_mb": 512.0, "cmd": "sleep 30", "rank": 3, "local_rank": 1}
    s = parse_sample(json.dumps({"t": 1, "gpus": [{"index": 0, "procs": [entry]}]}))
    assert (s.gpus[0].procs[0].rank, s.gpus[0].procs[0].local_rank) == (3, 1)


def test_nvml_field_errors_become_nulls_with_the_reason(h200):
    nv = FixtureNVML(h200["gpus"][0], h200["gpus"][0]["idle"], unsupported={"power", "ecc", "procs"})
    (g,), errors = agent_module().NvmlSource(nv).read()
    assert g["power_w"] is None and g["ecc"] == {"corrected": None, "uncorrected": None}
    assert g["procs"] == [] and g["util_gpu"] == 0 and g["temp_c"] == 32
    assert errors == {"gpu0.power_w": "NVMLError_NotSupported",
                      "gpu0.ecc.corrected": "NVMLError_NotSupported",
                      "gpu0.ecc.uncorrected": "NVMLError_NotSupported",
                      "gpu0.procs": "NVMLError_NotSupported"}


def test_nvidia_smi_fallback_runs_one_long_lived_process(tmp_path):
    """A stand-in nvidia-smi (the fixture's values, -lms honoured) on PATH, NVML absent."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "starts.log"
    fake = bindir / "nvidia-smi"
    fake.write_text(f"""#!{sys.executable}
import os, sys, time
open({str(log)!r}, "a").write("%d %s\\n" % (os.getpid(), sys.argv[1]))
args = sys.argv[1:]
if args[0].startswith("--query-compute-apps"):
    print("{H200_UUID}, 432, 1130")
    sys.exit(0)
fields = args[0].split("=", 1)[1].split(",")
if "clocks_event_reasons.active" in fields:
    print("Field \\"clocks_event_reasons.active\\" is not a valid field to query.")
    sys.exit(2)
values = {{"index": "0", "uuid": "{H200_UUID}", "name": "NVIDIA H200", "utilization.gpu": "98",
          "utilization.memory": "25", "memory.used": "1754", "memory.total": "143771",
          "temperature.gpu": "54", "power.draw": "690.79", "power.limit": "700.00",
          "clocks.sm": "1515", "clocks_throttle_reasons.active": "0x0000000000000004",
          "ecc.errors.corrected.volatile.total": "[N/A]", "ecc.errors.uncorrected.volatile.total": "0"}}
while True:
    print(", ".join(values[f] for f in fields), flush=True)
    time.sleep(int(args[args.index("-lms") + 1]) / 1000)
""")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin")
    p = start_agent("--interval", "0.1", "--count", "15", env=env)
    out = p.stdout.read().decode().splitlines()
    p.stdin.close()
    assert p.wait(timeout=5) == 0, p.stderr.read()
    samples = [parse_sample(x) for x in out]
    assert len(samples) == 15 and all(s.source == "nvidia-smi" for s in samples), out
    g = samples[-1].gpus[0]
    assert (g.name, g.util_gpu, g.mem_total_mb, g.power_w) == ("NVIDIA H200", 98, 143771, 690.79)
    assert g.throttle == ("sw_power_cap",) and g.ecc_corrected is None and g.ecc_uncorrected == 0
    assert samples[-1].errors == {"gpu0.ecc.corrected": "N/A"}
    assert [(x.pid, x.used_mb) for x in g.procs] == [(432, 1130.0)]
    starts = [line.split() for line in log.read_text().splitlines()]
    # new field name refused, old one accepted; then one compute-apps query per 5 s: 1.5 s here
    assert [s[1].split("=")[0] for s in starts] == ["--query-gpu", "--query-gpu", "--query-compute-apps"]
    assert wait_gone(int(starts[1][0]), 3), "the agent left its nvidia-smi running"
