"""The Prometheus exporter against the loopback cluster: scraped over real HTTP, parsed with
prometheus-client's own parser, values checked against what the GPU agents sent and what the real
FunASR logs say; a killed node; loopback binding; SIGTERM leaves no agent behind; the Grafana
dashboard only uses metrics the exporter serves."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_telemetry import agent_pids  # tests/ is on sys.path (conftest.py lives there)

from console.cluster.model import load_cluster
from console.cluster.probe import FactsCache, probe_node
from console.exporter import METRICS, Exporter, is_loopback
from console.gpu.telemetry import TelemetryUpdate
from console.ssh.pool import Pool
from console.training.logparse import parse_file
from console.training.metrics import MetricsStore

ROOT = Path(__file__).resolve().parents[1]
NVML = ROOT / "tests" / "fixtures" / "h200" / "nvml.json"
LOGS = ROOT / "tests" / "fixtures" / "logs"
TRAIN_LOG = LOGS / "funasr-sensevoicesmall-zero1-fp32-bs6000.log"
FAILED_LOG = LOGS / "funasr-sensevoicesmall-zero1-bf16-dtype-failure.log"
DASHBOARD = ROOT / "scripts" / "grafana-dashboard.json"
MIB = 1024 * 1024
#: The real ``svconsole`` entry point of this environment.
SVCONSOLE = ([str(Path(sys.executable).with_name("svconsole"))]
             if Path(sys.executable).with_name("svconsole").exists()
             else [sys.executable, "-m", "console.cli"])


# ---------------------------------------------------------------------------- helpers


Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str) -> Samples:
    """GET the metrics page and parse it: sample name -> [(labels, value)]."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    out: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name].append((s.labels, s.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The one value of ``name`` whose labels include ``labels`` (None when absent)."""
    hits = [v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None


def wait_for(predicate, timeout: float, what: str, explain=lambda: ""):
    end = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} {explain()}")
        time.sleep(0.1)


def last_train_line(path: Path) -> dict[str, float]:
    """Step, epoch, loss and lr of the log's last train line, read with a regex of our own."""
    line = [x for x in path.read_text().splitlines() if "] - train, rank: 0," in x][-1]
    m = re.search(r"epoch: (\d+)/\d+.*total step: (\d+), \(loss_avg_rank: ([-\d.e+]+)\).*"
                  r"\(lr: ([-\d.e+]+)\)", line)
    mem = re.search(r"memory: usage: ([\d.]+) GB, peak: ([\d.]+) GB", line)
    assert m and mem, line
    return {"epoch": int(m[1]), "step": int(m[2]), "loss": float(m[3]), "lr": float(m[4]),
            "mem_gb": float(mem[1]), "peak_gb": float(mem[2])}


# ---------------------------------------------------------------------------- the exporter


@pytest.fixture
def running(loopback, tmp_path):
    """An exporter on the 4 loopback nodes with simulated 8-GPU agents, a probed node0, two
    runs fed with real FunASR logs; serving on a free loopback port."""
    cluster = load_cluster(loopback.cluster_yaml)
    with Pool(cluster) as pool:
        FactsCache(tmp_path, cluster.name).save(
            {"node0": probe_node(pool, cluster, "node0", torch_timeout=0)})
        exporter = Exporter(pool, cluster, state_dir=tmp_path, interval=0.25, simulate=NVML,
                            sim_gpus=8, health_interval=0.5, runs_interval=0)
        sent: dict[str, list] = defaultdict(list)

        def keep(update: TelemetryUpdate) -> None:
            if update.sample is not None:
                sent[update.node].append(update.sample)

        exporter.telemetry.subscribe(keep)
        stores = []
        for run, log, node in (("run-fp32", TRAIN_LOG, "node0"), ("run-bf16", FAILED_LOG, "node1")):
            store = MetricsStore()
            store.add_all(parse_file(str(log)), node=node)
            exporter.runs.attach(run, store)
            stores.append(store)
        host, port = exporter.serve(0)
        exporter.start()
        try:
            yield exporter, f"http://{host}:{port}/metrics", sent, cluster
        finally:
            exporter.stop()
            for store in stores:
                store.close()


def gpus_of(samples: Samples, node: str) -> list[dict[str, str]]:
    return [lab for lab, _ in samples.get("svconsole_gpu_info", []) if lab["node"] == node]


def test_nodes_gpus_and_runs_scraped_over_http(running, loopback):
    exporter, url, sent, cluster = running
    nodes = cluster.names()

    def all_live() -> Samples | None:
        s = scrape(url)
        ok = all(value(s, "svconsole_node_up", node=n) == 1 and len(gpus_of(s, n)) == 8
                 and value(s, "svconsole_node_cpu_utilization_ratio", node=n) is not None
                 for n in nodes)   # (an agent's first sample has no CPU use yet)
        return s if ok else None

    s = wait_for(all_live, 30, "every node up with 8 simulated GPUs", lambda: (
        {n: (c.status.value, c.reason) for n, c in exporter.telemetry.collectors.items()},
        exporter.pool.statuses()))

    # every metric of the catalogue is served (the dashboard test relies on the catalogue)
    served = set(s)
    # the H200 log's train lines carry no per-phase timings, so no rank has a time relative
    # to the others (tests/test_metrics.py and test_hangs.py serve it from real timings)
    needs_timings = {"svconsole_run_step_time_relative"}
    for spec in METRICS:
        if spec.name in needs_timings:
            continue
        assert spec.name in served, spec.name
        for labels, _ in s[spec.name]:
            assert set(spec.labels) <= set(labels), (spec.name, labels)

    # the probed node has its probe age, the others none
    age = value(s, "svconsole_node_last_probe_age_seconds", node="node0")
    assert age is not None and 0 <= age < 60
    assert value(s, "svconsole_node_last_probe_age_seconds", node="node1") is None

    for n in nodes:
        infos = gpus_of(s, n)
        assert sorted(int(g["gpu"]) for g in infos) == list(range(8))
        for g in infos:
            assert g["name"] == "NVIDIA H200"
            assert g["uuid"].startswith("GPU-6a6cead0-") and g["uuid"].endswith(f"-sim{g['gpu']}")
            assert g["simulated"] == "true" and g["source"] == "simulated"
        assert value(s, "svconsole_node_telemetry_up", node=n) == 1
        assert value(s, "svconsole_node_gpus", node=n) == 8
        total = value(s, "svconsole_node_memory_total_bytes", node=n)
        used = value(s, "svconsole_node_memory_used_bytes", node=n)
        assert total is not None and used is not None and 0 < used < total
        assert total % MIB == 0   # the agent reads MiB
        cpu = value(s, "svconsole_node_cpu_utilization_ratio", node=n)
        assert cpu is not None and 0 <= cpu <= 1
        assert value(s, "svconsole_node_load1", node=n) is not None

        # the GPU values are those of one sample the node's agent really sent
        def matches(sample, n: str = n) -> bool:
            for g in sample.gpus:
                lab = {"node": n, "gpu": str(g.index)}
                want = {
                    "svconsole_gpu_utilization_ratio": g.util_gpu / 100,
                    "svconsole_gpu_memory_utilization_ratio": g.util_mem / 100,
                    "svconsole_gpu_memory_used_bytes": g.mem_used_mb * MIB,
                    "svconsole_gpu_memory_total_bytes": g.mem_total_mb * MIB,
                    "svconsole_gpu_temperature_celsius": g.temp_c,
                    "svconsole_gpu_power_watts": g.power_w,
                    "svconsole_gpu_power_limit_watts": g.power_limit_w,
                    "svconsole_gpu_sm_clock_hertz": g.sm_clock_mhz * 1e6,
                    "svconsole_gpu_processes": len(g.procs),
                }
                if any(not math.isclose(value(s, k, **lab), v, rel_tol=1e-9)
                       for k, v in want.items()):
                    return False
            return True

        assert any(matches(x) for x in sent[n]), f"{n}: scraped GPU values match no sample sent"
        g0 = {"node": n, "gpu": "0"}
        assert value(s, "svconsole_gpu_memory_total_bytes", **g0) == 143771 * MIB
        assert value(s, "svconsole_gpu_power_limit_watts", **g0) == 700.0
        assert value(s, "svconsole_gpu_ecc_errors_total", type="uncorrected", **g0) == 0
        reasons = {lab["reason"]: v for lab, v in s["svconsole_gpu_throttle_reason"]
                   if lab["node"] == n and lab["gpu"] == "0"}
        assert "sw_power_cap" in reasons and set(reasons.values()) == {0.0}
        assert 0 <= value(s, "svconsole_gpu_sample_age_seconds", **g0) < 5

    # the training run: the last train line of the real FunASR log, rank 0 on node0
    want = last_train_line(TRAIN_LOG)
    rank = {"run": "run-fp32", "rank": "0", "node": "node0"}
    assert value(s, "svconsole_run_step", **rank) == want["step"]
    assert value(s, "svconsole_run_epoch", **rank) == want["epoch"]
    assert value(s, "svconsole_run_loss", **rank) == pytest.approx(want["loss"])
    assert value(s, "svconsole_run_learning_rate", **rank) == pytest.approx(want["lr"])
    text = TRAIN_LOG.read_text()
    total_times = [float(x) for x in re.findall(r"'total_time': '([\d.]+)'", text)]
    assert value(s, "svconsole_run_step_time_seconds", **rank) == pytest.approx(
        statistics.median(total_times[-20:]))
    allreduce = [float(x) for x in re.findall(r"bwd_allreduce(?:_microstep)?: ([\d.]+)", text)]
    assert allreduce, "the fixture has DeepSpeed timer lines"
    assert value(s, "svconsole_run_grad_sync_seconds", **rank) == pytest.approx(allreduce[-1] / 1000)
    median = value(s, "svconsole_run_grad_sync_median_seconds", **rank)
    assert 0 < median < 0.5   # the seed's "normal"
    assert value(s, "svconsole_run_gpu_memory_used_bytes", **rank) == pytest.approx(
        want["mem_gb"] * 1024 ** 3)
    assert value(s, "svconsole_run_gpu_memory_peak_bytes", **rank) == pytest.approx(
        want["peak_gb"] * 1024 ** 3)
    assert 0 <= value(s, "svconsole_run_last_line_age_seconds", **rank) < 120

    # the failed run: its faults by kind, counted
    faults = {(lab["kind"], lab["severity"]): v for lab, v in s["svconsole_run_faults_total"]
              if lab["run"] == "run-bf16"}
    assert faults[("bf16-dtype-mismatch", "error")] >= 1
    assert all(v >= 1 for v in faults.values())
    assert not [lab for lab, _ in s["svconsole_run_faults_total"] if lab["run"] == "run-fp32"]
    assert value(s, "svconsole_run_faults_total", run="run-bf16", kind="bf16-dtype-mismatch") \
        == value(scrape(url), "svconsole_run_faults_total", run="run-bf16",
                 kind="bf16-dtype-mismatch")   # a scrape counts nothing by itself

    # a run no longer served leaves no series behind
    exporter.runs.detach("run-bf16")
    after = scrape(url)
    assert not [lab for lab, _ in after["svconsole_run_faults_total"] if lab["run"] == "run-bf16"]
    assert not [lab for lab, _ in after["svconsole_run_step"] if lab["run"] == "run-bf16"]

    # a killed node: up 0, its agent's series gone (not left at their last values)
    loopback.kill(3)

    def node3_gone() -> Samples | None:
        x = scrape(url)
        return x if (value(x, "svconsole_node_up", node="node3") == 0
                     and value(x, "svconsole_node_telemetry_up", node="node3") == 0) else None

    s = wait_for(node3_gone, 15, "node3 down")
    assert gpus_of(s, "node3") == []
    assert not [lab for name, rows in s.items() if name.startswith("svconsole_gpu_")
                for lab, _ in rows if lab.get("node") == "node3"]
    assert value(s, "svconsole_node_cpu_utilization_ratio", node="node3") is None
    age = value(s, "svconsole_node_sample_age_seconds", node="node3")   # still told, growing
    time.sleep(0.5)
    assert value(scrape(url), "svconsole_node_sample_age_seconds", node="node3") >= age + 0.5
    assert all(len(gpus_of(s, n)) == 8 for n in ("node0", "node1", "node2"))


def test_default_bind_is_loopback(loopback, tmp_path):
    from console.cli import build_parser

    args = build_parser().parse_args(["exporter"])
    assert (args.bind, args.port) == ("127.0.0.1", 9877)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")

    cluster = load_cluster(loopback.cluster_yaml)
    with Pool(cluster) as pool:
        exporter = Exporter(pool, cluster, state_dir=tmp_path, runs_interval=0)
        host, port = exporter.serve(0)
        try:
            assert host == "127.0.0.1"
            # served on loopback: no agents started, the nodes are simply not checked yet
            s = scrape(f"http://127.0.0.1:{port}/metrics")
            assert {lab["node"] for lab, _ in s["svconsole_node_up"]} == set(cluster.names())
            # the same port on another address of this machine is not listening
            with pytest.raises(OSError):
                socket.create_connection(("127.0.1.1", port), timeout=2).close()
            outside = [a for a in _addresses() if not is_loopback(a)]
            for address in outside:
                with pytest.raises(OSError):
                    socket.create_connection((address, port), timeout=2).close()
        finally:
            exporter.stop()
        with pytest.raises(urllib.error.URLError):
            scrape(f"http://127.0.0.1:{port}/metrics")


def _addresses() -> list[str]:
    """This machine's IPv4 addresses as the kernel lists them."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout
    return [a for a in out.split() if ":" not in a]


def test_command_serves_then_stops_on_sigterm_without_orphans(loopback, tmp_path):
    marker = "--interval 0.3141"   # only this test's agents run with this interval
    env = {**os.environ, "SVCONSOLE_STATE_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*SVCONSOLE, "--config", str(loopback.cluster_yaml), "exporter",
         "--port", "0", "--interval", "0.3141", "--health-interval", "1", "--runs-interval", "0",
         "--simulate", str(NVML), "--sim-gpus", "2", "--bind", "0.0.0.0"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"serving http://([\d.]+):(\d+)/metrics", line)
        assert m, line + proc.stderr.read()
        assert "SIMULATED" in line
        url = f"http://127.0.0.1:{m[2]}/metrics"
        s = wait_for(lambda: (x := scrape(url)) and len(x["svconsole_gpu_info"]) == 8 and x,
                     30, "2 simulated GPUs on each of the 4 nodes")
        assert {lab["node"] for lab, _ in s["svconsole_gpu_info"]} == set(loopback.nodes)
        assert value(s, "process_cpu_seconds_total") > 0   # the exporter's own process
        assert len(agent_pids(marker)) == 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read()
    assert "warning: listening on 0.0.0.0, not loopback" in stderr
    assert "stopped" in proc.stdout.read()
    wait_for(lambda: agent_pids(marker) == [], 5, "the agents to exit")


def test_command_refuses_bad_options(tmp_path):
    env = {**os.environ, "SVCONSOLE_STATE_DIR": str(tmp_path)}
    for args, message in ((["--interval", "0"], "--interval must be > 0"),
                          (["--simulate", str(tmp_path / "none.json")], "no such file"),
                          (["--port", "70000"], "must be 0-65535")):
        r = subprocess.run([*SVCONSOLE, "exporter", *args], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)


# ---------------------------------------------------------------------------- the dashboard


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = []

    def walk(panels: list[dict]) -> None:
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if "expr" in t)
            walk(p.get("panels", []))

    walk(doc["panels"])
    exprs.extend(v["query"]["query"] if isinstance(v.get("query"), dict) else v["query"]
                 for v in doc["templating"]["list"] if v["type"] == "query")
    return exprs


PROMQL_WORDS = {"sum", "avg", "max", "min", "count", "by", "without", "on", "ignoring",
                "group_left", "group_right", "rate", "increase", "irate", "label_values",
                "topk", "bottomk", "and", "or", "unless", "time", "histogram_quantile",
                "max_over_time", "min_over_time", "avg_over_time", "changes", "resets", "delta",
                "deriv", "clamp_min", "clamp_max", "abs", "vector", "scalar", "offset", "bool",
                "label_replace", "sort", "sort_desc", "absent", "last_over_time"}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside label matchers, strings and
    grouping clauses that are not PromQL's own words."""
    expr = re.sub(r"label_values\(([^,()]+),\s*\w+\)", r"\1", expr)  # its label argument
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)          # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)                      # label matchers
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)                     # range selectors
    words = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", expr))
    return {w for w in words if w not in PROMQL_WORDS and not re.fullmatch(r"\d+(e\d+)?", w)
            and not re.fullmatch(r"[0-9.]+[smhd]?", w)}


def test_dashboard_uses_only_served_metrics():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["schemaVersion"] >= 36
    assert [i["name"] for i in doc["__inputs"]] == ["DS_PROMETHEUS"]
    assert {v["name"] for v in doc["templating"]["list"]} >= {"node", "run"}
    served = {m.name for m in METRICS}
    used: set[str] = set()
    for expr in dashboard_exprs():
        names = metric_names(expr)
        assert names, expr
        assert names <= served, (expr, names - served)
        used |= names
    # the panels the issue asks for are there
    for needed in ("svconsole_node_up", "svconsole_gpu_utilization_ratio",
                   "svconsole_gpu_memory_used_bytes", "svconsole_gpu_temperature_celsius",
                   "svconsole_gpu_power_watts", "svconsole_gpu_power_limit_watts",
                   "svconsole_run_loss", "svconsole_run_learning_rate",
                   "svconsole_run_step_time_seconds", "svconsole_run_grad_sync_median_seconds",
                   "svconsole_run_faults_total"):
        assert needed in used, needed
    # the seed's gradient sync thresholds (500 ms, 2000 ms) are drawn on the grad sync panel
    sync = [p for p in _all_panels(doc["panels"])
            if any("grad_sync" in t.get("expr", "") for t in p.get("targets", []))]
    assert sync
    steps = sync[0]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 0.5, 2.0]
    assert sync[0]["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off"


def _all_panels(panels: list[dict]) -> list[dict]:
    out = []
    for p in panels:
        out.append(p)
        out.extend(_all_panels(p.get("panels", [])))
    return out


def test_metric_name_parser_is_not_blind():
    assert metric_names('sum by (node) (rate(svconsole_gpu_ecc_errors_total{type="x"}[5m]))') \
        == {"svconsole_gpu_ecc_errors_total"}
    assert metric_names("svconsole_gpu_power_watts / svconsole_gpu_power_limit_watts * 100") \
        == {"svconsole_gpu_power_watts", "svconsole_gpu_power_limit_watts"}
    assert metric_names("label_values(svconsole_run_step, run)") == {"svconsole_run_step"}
    assert metric_names("max(svconsole_run_grad_sync_median_seconds) > 0.5") \
        == {"svconsole_run_grad_sync_median_seconds"}


# ---------------------------------------------------------------------------- run discovery


def test_run_watcher_finds_a_live_run_follows_its_log_and_drops_it_after_the_end(loopback,
                                                                                 tmp_path):
    """A run in the local index whose supervisor is alive on node0 (a stand-in process here;
    the log is the real FunASR one) is found, followed over SSH into a store, and dropped once
    its logs ended and the retention passed."""
    from test_runs import stand_in_supervisor

    from console.cluster.identity import identity
    from console.exporter import RunWatcher
    from console.training.runs import NodeRun, RunRecord, index_record, new_run_id, run_dir

    cluster = load_cluster(loopback.cluster_yaml)
    log = tmp_path / "logs" / "node0.log"
    log.parent.mkdir()
    log.write_bytes(TRAIN_LOG.read_bytes())
    run_id = new_run_id()
    own = run_dir(str(tmp_path), run_id)
    record = RunRecord(id=run_id, created=time.time(), cluster=cluster.name,
                       output_dir=str(tmp_path), master="node0",
                       nodes=[NodeRun(node="node0", node_rank=0, log=str(log),
                                      pid_file=f"{own}/node0.pid",
                                      exit_file=f"{own}/node0.exit")],
                       identity=identity(cluster, create=True).to_dict())
    supervisor = stand_in_supervisor(record, "node0")
    index_record(record, tmp_path)
    want = last_train_line(TRAIN_LOG)
    try:
        with Pool(cluster) as pool:
            watcher = RunWatcher(pool, tmp_path, interval=0, retain_s=0)
            watcher.poll()
            [watched] = watcher.runs()
            assert watched.run_id == record.id and watched.follower is not None

            def followed():
                ranks = watched.store.ranks()
                return ranks and ranks[0].last_step == want["step"]

            wait_for(followed, 20, "the log to be followed to its last train line")
            [rank] = watched.store.ranks()
            assert (rank.node, rank.loss, rank.lr) == ("node0", want["loss"], want["lr"])
            watcher.poll()
            assert [w.run_id for w in watcher.runs()] == [record.id]   # still live: kept
            supervisor.terminate()
            supervisor.wait()
            wait_for(lambda: watched.follower.ended, 20, "the follower to see the run end")
            watcher.poll()   # ended: retention starts
            watcher.poll()   # retention (0 s) passed: dropped, not found again
            assert watcher.runs() == []
            watcher.stop()
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()


def test_gpu_utilisation_of_a_runs_nodes_feeds_its_low_utilisation_fault(tmp_path):
    """Telemetry of the nodes a run trains on goes into that run's store: 90 s at 12% is the
    seed's "GPU utilisation below 50%" fault; another node's samples and an ended run are not."""
    from console.exporter import RunWatcher
    from console.gpu.telemetry import NodeStatus, parse_sample

    watcher = RunWatcher(None, tmp_path, interval=0)  # no pool needed: nothing is polled
    with MetricsStore() as training, MetricsStore() as ended, MetricsStore() as other:
        watcher.attach("training", training, nodes=["node0"])
        watcher.attach("ended", ended, nodes=["node0"]).ended_at = 1.0
        watcher.attach("other", other, nodes=["node1"])
        for i in range(46):  # every 2 s for 90 s
            line = json.dumps({"t": 1000.0 + 2 * i, "seq": i, "source": "nvml",
                               "gpus": [{"index": 0, "name": "NVIDIA H200", "util_gpu": 12},
                                        {"index": 1, "name": "NVIDIA H200", "util_gpu": None}]})
            watcher.gpu_sample(TelemetryUpdate("node0", NodeStatus.LIVE, parse_sample(line)))
        found = [f for f in training.findings() if f.id == "low-gpu-util"]
        assert len(found) == 1 and found[0].node == "node0", training.findings()
        assert "mean 12% over 90 s" in found[0].detail
        assert not [f for f in ended.findings() if f.id == "low-gpu-util"]
        assert not [f for f in other.findings() if f.id == "low-gpu-util"]
