"""console/gpu/telemetry.py: the parser on the real H200 readings, rings, the 6.1 thresholds, the
overview, and collectors running the real agent over the loopback cluster (real sshd)."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest

from console.cluster.model import load_cluster
from console.gpu.telemetry import (
    Collector,
    Level,
    NodeStatus,
    Ring,
    Telemetry,
    agent_module,
    classify_memory,
    classify_util,
    judge_gpu,
    overview,
    parse_sample,
    parse_smi_csv,
)
from console.ssh.pool import Pool

FIXTURES = Path(__file__).parent / "fixtures" / "h200"
QUERY_FIELDS = ("index,uuid,name,pci.bus_id,driver_version,memory.total,memory.used,utilization.gpu,"
                "utilization.memory,temperature.gpu,power.draw,power.limit,clocks.sm,clocks.mem,"
                "pstate,compute_cap").split(",")
TRAINING_FIELDS = ["timestamp", "utilization.gpu", "memory.used", "power.draw", "temperature.gpu"]


def agent_lines(n: int, gpus: int = 1) -> list[str]:
    """The agent's JSON lines for the first ``n`` steps of the fixture's load series."""
    sim = agent_module().SimSource(str(FIXTURES / "nvml.json"), gpus)
    lines = []
    for seq in range(n):
        g, errors = sim.read()
        lines.append(json.dumps({"t": 1000.0 + seq, "seq": seq, "source": "simulated",
                                 "host": {"cpu_pct": 5.0, "mem_total_mb": 1000, "mem_used_mb": 10,
                                          "load1": 0.1, "load5": 0.1, "load15": 0.1},
                                 "gpus": g, "errors": errors}))
    return lines


# ------------------------------------------------------------------------------------- parser


def test_parse_sample_on_the_h200_load_series():
    series = json.loads((FIXTURES / "nvml.json").read_text())["load_series"]
    samples = [parse_sample(x) for x in agent_lines(len(series))]
    gpus = [s.gpus[0] for s in samples]
    assert all(g.name == "NVIDIA H200" and g.mem_total_mb == pytest.approx(143771, abs=1) for g in gpus)
    assert gpus[0].util_gpu == 0 and gpus[0].power_w == pytest.approx(77.455)
    peak = [g for g in gpus if g.util_gpu >= 90]
    assert len(peak) > 40 and all(94 <= g.util_gpu <= 99 for g in peak)
    assert max(g.power_w for g in gpus) == pytest.approx(693.74)
    assert max(g.power_pct for g in gpus) == pytest.approx(99.1, abs=0.1)
    busy = peak[0]
    assert [(p.pid, p.used_mb) for p in busy.procs] == [(432, 1130.0)]
    assert busy.mem_pct == pytest.approx(1.22, abs=0.01)
    assert samples[0].simulated and samples[0].host.cpu_pct == 5.0


@pytest.mark.parametrize("line", [
    "", "garbage", "[1, 2]", '{"seq": 1}', '{"t": "soon"}', '{"t": 1, "gpus": [', b"\xff\xfe",
    "Welcome to node2 (banner)",
])
def test_parse_sample_rejects_what_is_not_a_sample(line):
    assert parse_sample(line) is None


def test_parse_sample_tolerates_missing_and_mistyped_fields():
    s = parse_sample(json.dumps({"t": 5, "host": "x", "errors": [1], "gpus": [
        {"util_gpu": "98", "temp_c": True, "power_w": 1e400, "procs": [{"pid": "x"}, 7, {"pid": 3}]},
        "junk", {"index": 4, "throttle": ["sw_power_cap", 3], "ecc": {"corrected": 2}}]}))
    assert s is not None and s.host is None and s.errors == {} and s.source is None
    first, second = s.gpus
    assert (first.index, first.util_gpu, first.temp_c, first.power_w) == (0, None, None, None)
    assert [p.pid for p in first.procs] == [3] and first.mem_pct is None
    assert second.index == 4 and second.throttle == ("sw_power_cap",) and second.ecc_corrected == 2


def test_no_gpu_line():
    s = parse_sample('{"t": 1.5, "seq": 0, "source": null, "no_gpu": true, "reason": '
                     '"NVML: NVMLError_LibraryNotFound", "host": {"cpu_pct": 1}, "gpus": []}')
    assert s.no_gpu and s.reason == "NVML: NVMLError_LibraryNotFound" and s.gpus == ()


def test_parse_smi_query_csv():
    parsed = parse_smi_csv((FIXTURES / "query-gpu.csv").read_text(), QUERY_FIELDS)
    (g,) = parsed.gpus
    assert (g.index, g.name, g.uuid) == (0, "NVIDIA H200", "GPU-6a6cead0-ea07-7520-cae2-b62c198dfdea")
    assert (g.mem_total_mb, g.mem_used_mb, g.util_gpu, g.temp_c) == (143771, 0, 0, 32)
    assert (g.power_w, g.power_limit_w, g.sm_clock_mhz) == (86.6, 700, 375)
    assert parsed.errors == [{}]


def test_parse_smi_training_csv_is_the_low_utilisation_case():
    parsed = parse_smi_csv((FIXTURES / "nvidia-smi-during-funasr-training.csv").read_text(),
                           TRAINING_FIELDS)
    assert len(parsed.gpus) == 262
    busy = [g for g in parsed.gpus if g.util_gpu > 0]
    assert max(g.mem_used_mb for g in parsed.gpus) > 28000 and max(g.util_gpu for g in busy) <= 70
    verdicts = [classify_util(g.util_gpu, in_run=True).level for g in busy]
    # "utilisation mostly 10-60%": during a run most busy samples are the seed's < 50% warning
    assert verdicts.count(Level.WARN) > len(busy) / 2


def test_smi_values_not_available_become_null_with_reason():
    parsed = parse_smi_csv("1, [N/A], 12x\n", ["index", "power.draw", "temperature.gpu"])
    (g,) = parsed.gpus
    assert g.index == 1 and g.power_w is None and g.temp_c is None
    assert parsed.errors == [{"gpu1.power_w": "N/A", "gpu1.temp_c": "unparsable '12x'"}]


# ------------------------------------------------------------------------------------ history


def test_ring_keeps_the_newest_in_order():
    ring = Ring(3, ("a", "b"))
    for i in range(5):
        ring.append(float(i), [i * 10, None if i == 3 else i])
    assert len(ring) == 3 and ring.times() == [2.0, 3.0, 4.0]
    assert ring.series("a") == [20, 30, 40] and ring.series("b") == [2, None, 4]


# --------------------------------------------------------------------------------- thresholds


@pytest.mark.parametrize("pct,level,advice", [
    (80, Level.NORMAL, ""), (70, Level.NORMAL, ""), (90, Level.NORMAL, ""),
    (60, Level.WATCH, ""), (93, Level.WATCH, ""),
    (45, Level.WARN, "batch_size"), (97, Level.WARN, "batch_size"), (None, Level.UNKNOWN, ""),
])
def test_util_thresholds_during_a_run(pct, level, advice):
    v = classify_util(pct, in_run=True)
    assert v.level == level and advice in v.advice and v.alarming == (level == Level.WARN)


@pytest.mark.parametrize("pct,level", [(50, Level.NORMAL), (84.9, Level.NORMAL), (90, Level.WATCH),
                                       (96, Level.CRITICAL)])
def test_memory_thresholds_during_a_run(pct, level):
    v = classify_memory(pct, in_run=True)
    assert v.level == level
    assert ("mixed precision" in v.advice and "smaller batch" in v.advice) == (level == Level.CRITICAL)


def test_no_alarm_outside_a_run_and_idle_gpus_are_not_alarms():
    assert classify_util(0, in_run=False).level == Level.IDLE
    assert not classify_util(20, in_run=False).alarming
    assert not classify_memory(99, in_run=False).alarming
    idle = parse_sample(agent_lines(1)[0]).gpus[0]     # 0% and no process, during a run
    assert judge_gpu(idle, in_run=True).util.level == Level.IDLE


def test_overview_aggregates_live_nodes_only():
    lines = agent_lines(30, gpus=2)
    busy = parse_sample(lines[-1])                      # step 29: both GPUs at 97-99%
    idle = parse_sample(lines[0])
    no_gpu = parse_sample('{"t": 1, "no_gpu": true, "reason": "NVML: NVMLError_LibraryNotFound", "gpus": []}')
    latest = {"a": busy, "b": idle, "c": no_gpu, "d": busy}
    statuses = {"a": NodeStatus.LIVE, "b": NodeStatus.LIVE, "c": NodeStatus.LIVE, "d": NodeStatus.STALE}
    ov = overview(latest, statuses, in_run=True)
    assert (ov.nodes_total, ov.nodes_live, ov.stale) == (4, 3, ("d",))
    assert ov.gpus_total == 4 and ov.gpus_in_use == 2 and ov.no_gpu == {"c": "NVML: NVMLError_LibraryNotFound"}
    utils = [g.util_gpu for s in (busy, idle) for g in s.gpus]
    assert ov.mean_util == pytest.approx(sum(utils) / 4)
    assert ov.total_power_w == pytest.approx(sum(g.power_w for s in (busy, idle) for g in s.gpus))
    hottest = max(busy.gpus, key=lambda g: g.temp_c)
    assert (ov.hottest.node, ov.hottest.index, ov.hottest.temp_c) == ("a", hottest.index, hottest.temp_c)
    # the busy GPUs are above 95% during the run: a warning each; the idle ones are not alarms
    assert {(a.node, a.index, a.metric) for a in ov.alarms} == {("a", 0, "util"), ("a", 1, "util")}
    assert ov.simulated
    assert overview(latest, statuses, in_run=False).alarms == ()


# -------------------------------------------------------------------------- collectors (SSH)


def agent_pids(marker: str) -> list[int]:
    """Agent processes on this machine (the loopback nodes' /proc) whose command line has
    ``marker``."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "gpu_agent-" in cmd and marker in cmd and state != "Z":
            pids.append(int(p.name))
    return pids


def remote_agent_count(pool: Pool, node: str, marker: str) -> int:
    """Count agent processes through the node itself, reading its /proc."""
    r = pool.run(node, "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done"
                 f" | grep -c '[g]pu_agent-.*{marker}' || true", timeout=20)
    assert r.exit == 0, r
    return int(r.stdout.strip().splitlines()[-1])


def wait_until(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def unique_interval() -> float:
    """An interval no other test uses: it marks this test's agents in the process table."""
    return round(0.3 + random.random() / 10, 4)


def test_agent_over_ssh_reports_no_gpu_and_exits_when_the_channel_closes(loopback):
    interval = unique_interval()
    marker = f"--interval {interval}"
    cluster = load_cluster(loopback.cluster_yaml)
    with Pool(cluster) as pool:
        # node2's shell prints a banner on every command: the collector must not mind
        collectors = [Collector(pool, n, interval=interval, python=cluster.python) for n in ("node1", "node2")]
        got: list = []
        collectors[0].subscribe(got.append)
        for c in collectors:
            c.start()
        try:
            wait_until(lambda: all(c.latest is not None and c.latest.seq >= 1 for c in collectors),
                       15, "two samples from each node")
            for c in collectors:
                assert c.status == NodeStatus.LIVE and c.latest.no_gpu and c.latest.gpus == ()
                assert "NVMLError_LibraryNotFound" in c.latest.reason
                assert c.latest.host.mem_total_mb > 0 and c.age() < 2 * interval
            assert remote_agent_count(pool, "node1", marker) == 2   # node1's and node2's (same machine)
            assert [u.status for u in got[:2]] == [NodeStatus.STARTING, NodeStatus.LIVE]
            assert all(u.node == "node1" for u in got)
        finally:
            for c in collectors:
                c.stop()
        assert all(c.status == NodeStatus.STOPPED for c in collectors)
        wait_until(lambda: remote_agent_count(pool, "node1", marker) == 0, 5,
                   "the agents to exit after their channels closed")
        assert agent_pids(marker) == []
        assert all(c.agent_starts == 1 for c in collectors)


def test_simulated_collector_keeps_history_and_is_labelled(loopback):
    cluster = load_cluster(loopback.cluster_yaml)
    with Pool(cluster) as pool:
        tel = Telemetry(pool, cluster, interval=0.05, nodes=["node0"], simulate=FIXTURES / "nvml.json",
                        sim_gpus=8, history_s=1.0)
        tel.start()
        try:
            c = tel.collectors["node0"]
            wait_until(lambda: c.latest is not None and c.latest.seq >= 25, 20, "25 samples")
            assert c.latest.simulated and len(c.latest.gpus) == 8
            ring = c.gpu_ring(0)
            assert len(ring) == 20                              # 1 s of history at 0.05 s
            assert ring.times() == sorted(ring.times())
            ov = tel.overview()
            assert ov.simulated and ov.gpus_total == 8 and ov.nodes_live == 1
        finally:
            tel.stop()


def test_killed_node_goes_stale_then_comes_back(fresh_loopback):
    lb = fresh_loopback(2)
    cluster = load_cluster(lb.cluster_yaml)
    interval = 0.25
    with Pool(cluster) as pool:
        c = Collector(pool, "node1", interval=interval, python=cluster.python, max_backoff=0.5)
        changes: list[tuple[NodeStatus, float]] = []
        c.subscribe(lambda u: u.sample is None and changes.append((u.status, time.monotonic())))
        c.start()
        try:
            wait_until(lambda: c.status == NodeStatus.LIVE, 15, "the node to be live")
            killed = time.monotonic()
            lb.kill(1)
            wait_until(lambda: c.status != NodeStatus.LIVE, 2 * interval + 1.0, "the node to be marked not live")
            assert time.monotonic() - killed <= 2 * interval + 1.0
            ov_statuses = {"node1": c.status}
            assert overview({"node1": c.latest}, ov_statuses).nodes_live == 0
            lb.restart(1)
            wait_until(lambda: c.status == NodeStatus.LIVE and c.agent_starts >= 2, 20,
                       "the agent to be restarted after the reconnect")
        finally:
            c.stop()
        after_kill = [s for s, t in changes if t >= killed]
        assert after_kill[0] in (NodeStatus.DOWN, NodeStatus.STALE), after_kill
        assert NodeStatus.STARTING in after_kill          # then it tried again


def test_hung_node_is_marked_stale_then_its_agent_is_replaced(fresh_loopback):
    lb = fresh_loopback(2)
    cluster = load_cluster(lb.cluster_yaml)
    interval = unique_interval()
    with Pool(cluster) as pool:
        c = Collector(pool, "node1", interval=interval, python=cluster.python, restart_after=1.5,
                      max_backoff=0.5)
        stale = threading.Event()
        c.subscribe(lambda u: u.status == NodeStatus.STALE and stale.set())
        c.start()
        try:
            wait_until(lambda: c.status == NodeStatus.LIVE, 15, "the node to be live")
            lb.hang(1)
            last = c.latest.received
            assert stale.wait(2 * interval + 1.0)
            assert time.time() - last <= 2 * interval + 1.0 and c.status == NodeStatus.STALE
            wait_until(lambda: c.status == NodeStatus.DOWN, 10, "the silent stream to be given up")
            lb.resume(1)
            wait_until(lambda: c.status == NodeStatus.LIVE and c.agent_starts >= 2, 20,
                       "a new agent after the node came back")
            # the frozen agent saw its channel closed when it thawed: only the new one is left
            wait_until(lambda: len(agent_pids(f"--interval {interval}")) == 1, 5, "one agent")
        finally:
            c.stop()
        wait_until(lambda: agent_pids(f"--interval {interval}") == [], 5, "no agent after stop")


# ------------------------------------------------------------------------------------- the CLI


def test_gpus_command_once_json_over_ssh(loopback, capsys):
    from console import cli

    rc = cli.main(["--config", str(loopback.cluster_yaml), "gpus", "--json", "--once",
                   "--nodes", "node1,node2", "--interval", "0.2", "--simulate",
                   str(FIXTURES / "nvml.json"), "--sim-gpus", "2"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert set(out["nodes"]) == {"node1", "node2"}
    for rec in out["nodes"].values():
        assert rec["status"] == "live" and rec["simulated"] and rec["source"] == "simulated"
        assert [g["name"] for g in rec["gpus"]] == ["NVIDIA H200"] * 2
    assert out["overview"]["gpus_total"] == 4 and out["overview"]["simulated"] is True


def test_gpus_command_text_says_no_gpu_plainly(loopback, capsys):
    from console import cli

    rc = cli.main(["--config", str(loopback.cluster_yaml), "gpus", "--nodes", "node0",
                   "--interval", "0.2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "node0" in out and "no GPU: NVML: NVMLError_LibraryNotFound" in out
    assert "0/0 GPUs in use" in out and "SIMULATED" not in out


def test_gpus_command_rejects_unknown_nodes(loopback, capsys):
    from console import cli

    assert cli.main(["--config", str(loopback.cluster_yaml), "gpus", "--nodes", "node9"]) == 2
    assert "unknown node(s) node9" in capsys.readouterr().err


def test_missing_cluster_python_falls_back_to_python3(loopback):
    cluster = load_cluster(loopback.cluster_yaml)
    with Pool(cluster) as pool:
        c = Collector(pool, "node0", interval=0.2, python="/nonexistent/venv/bin/python")
        c.start()
        try:
            wait_until(lambda: c.latest is not None, 20, "a sample from python3")
            assert c.latest.no_gpu and c.status == NodeStatus.LIVE
        finally:
            c.stop()
