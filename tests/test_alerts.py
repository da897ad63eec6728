"""Alerts: the rules from cluster.yaml (file:line errors, secrets kept private), the engine
(one alert per kind, node and rank until it clears, then "resolved"), the sinks against a real
HTTP server on 127.0.0.1 and a real command hook, and ``svconsole watch`` on a real tiny run that
fails: one "failed" alert with the fault's id and evidence, and no duplicates."""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from console.alerts.engine import (
    AlertEngine,
    Condition,
    finding_conditions,
    node_conditions,
    run_end_condition,
)
from console.alerts.rules import AlertRules, cli_webhooks, load_rules, parse_alerts
from console.alerts.sinks import Dispatcher, ExecSink, LogSink, Sink, WebhookSink, payload
from console.cli import main
from console.cluster.model import ClusterConfigError, load_cluster
from console.ssh.pool import NodeState, NodeStatus
from console.training import faults

# ------------------------------------------------------------------------------ helpers


class Hooks:
    """A real HTTP server on 127.0.0.1 that keeps every JSON body POSTed to it."""

    def __init__(self, status: int = 200) -> None:
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", 0))
                hooks.bodies.append(json.loads(self.rfile.read(length)))
                hooks.paths.append(self.path)
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook/T0/secret-token") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks():
    server = Hooks()
    yield server
    server.close()


def write_cluster(tmp_path: Path, alerts: str, mode: int = 0o600) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text("cluster:\n  name: t\nnodes:\n  - name: n0\n    host: 127.0.0.1\n" + alerts)
    path.chmod(mode)
    return path


def finding(fault_id: str, node: str = "node1", rank: int | None = 1, text: str = "boom"):
    return faults.Finding(faults.fault(fault_id), (text,), node, rank, 12, "detail")


def cond(what: str = "x", **kw) -> Condition:
    return Condition(kw.pop("kind", "fault"), what, "error", f"title {what}", "text", **kw)


# ------------------------------------------------------------------------------- rules


def test_rules_default_without_a_section(tmp_path):
    rules = load_rules(load_cluster(write_cluster(tmp_path, "")))
    assert rules == AlertRules() and rules.node_down_s == 60 and rules.straggler_minutes == 5


def test_bad_rules_name_file_line_and_field(tmp_path):
    path = write_cluster(tmp_path, "alerts:\n  stall: maybe\n  node_down_s: -1\n"
                                   "  rate_limit: 0\n  colour: red\n"
                                   "  webhooks:\n    - format: teams\n      url_file: x\n")
    with pytest.raises(ClusterConfigError) as err:
        load_rules(load_cluster(path))
    text = str(err.value)
    assert f"{path}:7:" in text and "alerts.stall: must be true or false" in text
    assert f"{path}:8:" in text and "alerts.node_down_s: must be a number of seconds" in text
    assert "alerts.rate_limit: must be a whole number" in text
    assert f"{path}:10:3: alerts.colour: unknown key" in text
    assert "alerts.webhooks[0].format: must be one of generic, slack, feishu" in text


def test_webhook_urls_are_secrets_kept_in_private_files(tmp_path):
    secret = "https://hooks.example/T0/B0/very-secret"
    url_file = tmp_path / "slack.url"
    url_file.write_text(secret + "\n")
    url_file.chmod(0o644)
    path = write_cluster(tmp_path, "alerts:\n  webhooks:\n    - url_file: slack.url\n"
                                   "      format: slack\n")
    with pytest.raises(ClusterConfigError) as err:   # relative to cluster.yaml's directory
        load_rules(load_cluster(path))
    assert "mode 0644" in str(err.value) and f"chmod 600 {url_file}" in str(err.value)
    url_file.chmod(0o600)
    (hook,) = load_rules(load_cluster(path)).webhooks
    assert hook.url == secret and hook.format == "slack" and secret not in repr(hook)

    inline = write_cluster(tmp_path, f"alerts:\n  webhooks:\n    - url: {secret}\n",
                           mode=0o644)
    with pytest.raises(ClusterConfigError) as err:
        load_rules(load_cluster(inline))
    assert "a webhook URL is a secret" in str(err.value) and secret not in str(err.value)
    inline.chmod(0o600)
    assert load_rules(load_cluster(inline)).webhooks[0].url == secret


def test_cli_webhooks_read_a_private_file_and_never_echo_the_url(tmp_path):
    f = tmp_path / "hook"
    f.write_text("https://h.example/x\n")
    f.chmod(0o640)
    with pytest.raises(ValueError, match="mode 0640"):
        cli_webhooks([f"@{f}"])
    f.chmod(0o600)
    assert cli_webhooks([f"@{f}"], "feishu", first=2)[0].label == "webhook #3 (feishu)"
    with pytest.raises(ValueError) as err:
        cli_webhooks(["ftp://secret-host/x"])
    assert "secret-host" not in str(err.value)


def test_parse_alerts_accepts_every_key():
    rules = parse_alerts({"fault": False, "stall": True, "straggler_minutes": 2,
                          "run_end": True, "node_down_s": 30, "gpu_minutes": 0,
                          "rate_limit": 3, "bell": False, "exec": "page-me"}, "c.yaml", None)
    assert (rules.fault, rules.straggler_minutes, rules.node_down_s, rules.gpu_minutes,
            rules.rate_limit, rules.bell, rules.exec) == (False, 2.0, 30.0, 0.0, 3, False,
                                                          ("page-me",))


# ------------------------------------------------------------------------------ engine


def test_one_alert_per_condition_until_it_clears_then_resolved():
    engine = AlertEngine("c", "run1")
    a = cond("oom", node="node1", rank=1)
    first = engine.evaluate([a, a], now=100)
    assert [(x.state, x.condition.what) for x in first] == [("firing", "oom")]
    assert engine.evaluate([a], now=110) == []                 # still true: nothing new
    other_rank = cond("oom", node="node1", rank=2)
    assert [x.condition.rank for x in engine.evaluate([a, other_rank], now=120)] == [2]
    gone = engine.evaluate([other_rank], now=160)
    assert [(x.state, x.condition.rank, x.at - x.since) for x in gone] == [("resolved", 1, 60)]
    assert "RESOLVED" in gone[0].summary and "cleared after 60 s" in gone[0].summary
    assert engine.evaluate([], now=170)[0].condition.rank == 2


def test_held_conditions_fire_only_after_their_time():
    engine = AlertEngine("c")
    slow = cond("straggler", kind="straggler", rank=3, hold_s=300)
    assert engine.evaluate([slow], now=0) == []
    assert engine.evaluate([slow], now=299) == []
    assert [x.state for x in engine.evaluate([slow], now=300)] == ["firing"]
    # cleared before its time: never told, so never resolved
    brief = cond("blip", kind="straggler", rank=4, hold_s=300)
    engine.evaluate([slow, brief], now=301)
    assert engine.evaluate([slow], now=302) == []


def test_node_down_counts_from_when_the_node_went_down():
    rules = AlertRules(node_down_s=60)
    status = {"node2": NodeStatus("node2", NodeState.DOWN, "connection refused", since=1000),
              "node0": NodeStatus("node0", NodeState.UP, since=0)}
    engine = AlertEngine("c")
    assert engine.evaluate(node_conditions(status, rules), now=1030) == []
    (alert,) = engine.evaluate(node_conditions(status, rules), now=1060)
    assert alert.condition.node == "node2" and "connection refused" in alert.condition.text
    status["node2"] = NodeStatus("node2", NodeState.UP, since=1100)
    assert [x.state for x in engine.evaluate(node_conditions(status, rules), now=1100)] == \
        ["resolved"]


def test_findings_become_conditions_by_kind():
    rules = AlertRules(straggler_minutes=5)
    found = [finding("stalled-rank"), finding("host-oom-kill", rank=0, text="x" * 5000),
             finding("loss-divergence", rank=2),   # a warning: never paged
             finding("job-failed", rank=None)]     # generic: the run's end tells it
    conditions = finding_conditions(found, rules)
    by_kind = {(c.kind, c.what, c.rank) for c in conditions}
    assert by_kind == {("stall", "stalled-rank", 1), ("fault", "host-oom-kill", 0)}
    oom = next(c for c in conditions if c.what == "host-oom-kill")
    assert len(oom.evidence[0]) == 500 and oom.evidence[0].endswith("…")
    assert finding_conditions(found, AlertRules(stall=False, fault=False)) == []


def test_run_end_is_told_once_with_its_cause():
    rules = AlertRules()
    cause = finding("host-oom-kill", node="node1", rank=1, text="exitcode: -9")
    end = run_end_condition("failed", rules, [cause])
    assert end is not None and end.fault_id == "host-oom-kill" and end.evidence == ("exitcode: -9",)
    assert "node1 rank 1" in end.text
    engine = AlertEngine("c", "r")
    assert len(engine.evaluate([end], now=1)) == 1
    assert engine.evaluate([end], now=2) == [] and engine.evaluate([], now=3) == []
    assert run_end_condition("running", rules) is None
    assert run_end_condition("failed", AlertRules(run_end=False)) is None


# ------------------------------------------------------------------------------- sinks


class Collect(Sink):
    label = "collect"

    def __init__(self):
        self.got = []
        super().__init__()

    def deliver(self, alert):
        self.got.append(alert)


def test_rate_limit_counts_what_it_leaves_out():
    now = [0.0]
    sink = Collect()
    dispatcher = Dispatcher([sink], rate_limit=2, window_s=600, clock=lambda: now[0])
    engine = AlertEngine("c")
    dispatcher.send(engine.evaluate([cond(str(i)) for i in range(5)], now=0))
    now[0] = 601
    dispatcher.send(engine.evaluate([cond(str(i)) for i in range(5)] + [cond("new")], now=601))
    dispatcher.close()
    assert [a.condition.what for a in sink.got] == ["0", "1", "new"]
    assert sink.got[2].suppressed == 3 and "3 earlier alert(s) left out" in sink.got[2].summary


def test_webhook_payloads_reach_a_real_server(hooks):
    alert = AlertEngine("lab", "run7").evaluate([cond("oom", node="node1", rank=1,
                                                      fault_id="host-oom-kill",
                                                      evidence=("Killed",))], now=5)[0]
    sinks = [WebhookSink(w) for w in cli_webhooks([hooks.url("/g")], "generic")
             + cli_webhooks([hooks.url("/s")], "slack", 1)
             + cli_webhooks([hooks.url("/f")], "feishu", 2)]
    dispatcher = Dispatcher(sinks)
    dispatcher.send([alert])
    dispatcher.close()
    got = dict(zip(hooks.paths, hooks.bodies, strict=True))
    assert got["/g"]["schema"] == "svconsole.alert/1" and got["/g"]["fault_id"] == "host-oom-kill"
    assert got["/g"]["node"] == "node1" and got["/g"]["rank"] == 1
    assert got["/g"]["evidence"] == ["Killed"] and got["/g"]["state"] == "firing"
    assert got["/s"] == {"text": alert.summary}
    assert got["/f"] == {"msg_type": "text", "content": {"text": alert.summary}}
    assert payload(alert, "slack")["text"].startswith("[svconsole lab] ERROR: title oom")


def test_a_failing_webhook_is_named_by_label_never_by_url(tmp_path):
    dead = Hooks(status=500)
    (hook,) = cli_webhooks([dead.url("/T0/secret-token")], "slack")
    sink = WebhookSink(hook)
    sink.put(AlertEngine("c").evaluate([cond()], now=0)[0])
    sink.close()
    dead.close()
    assert sink.failures == ["webhook #1 (slack): HTTP 500 Internal Server Error"]
    assert all("secret-token" not in f for f in sink.failures)


def test_exec_hook_gets_the_alert_as_json_on_stdin(tmp_path):
    out = tmp_path / "got.json"
    sink = ExecSink(f"{sys.executable} -c 'import sys; open(sys.argv[1], \"w\").write("
                    f"sys.stdin.read())' {out}")
    sink.put(AlertEngine("c", "r1").evaluate([cond("hang", kind="stall", rank=3)], now=0)[0])
    sink.close()
    assert sink.failures == []
    doc = json.loads(out.read_text())
    assert (doc["kind"], doc["rank"], doc["run"], doc["state"]) == ("stall", 3, "r1", "firing")
    bad = ExecSink("echo nope >&2; exit 3")
    bad.put(AlertEngine("c").evaluate([cond()], now=0)[0])
    bad.close()
    assert bad.failures == ["exec #1: exit 3: nope"]


def test_alerts_log_is_private_and_one_line_per_alert(tmp_path):
    log = tmp_path / "state" / "alerts.log"
    sink = LogSink(log)
    for a in AlertEngine("c").evaluate([cond("a"), cond("b")], now=0):
        sink.put(a)
    sink.close()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert [json.loads(line)["key"] for line in log.read_text().splitlines()] == \
        ["fault///a", "fault///b"]


# ------------------------------------------------------------- svconsole watch, for real


@pytest.mark.slow
def test_watch_pages_once_when_a_real_run_fails(fresh_loopback, tmp_path, capsys, monkeypatch,
                                                hooks):
    from test_launch import _needs_training_stack, tiny_profile

    _needs_training_stack()
    from svconsole_scripts import tiny_sensevoice

    lb = fresh_loopback(2)
    tiny = tiny_sensevoice.make(lb.shared_dir / "tiny", samples=8, seconds=1.5)
    for wav in Path(tiny.train_jsonl).parent.rglob("*.wav"):   # the data path goes bad
        wav.unlink()
    profile = tmp_path / "training.yaml"
    profile.write_text(yaml.safe_dump(tiny_profile(tiny, lb.shared_dir / "exp", max_epoch=1)))
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    cache = os.environ.get("TORCH_EXTENSIONS_DIR",
                           str(Path.home() / ".cache" / "svconsole" / "torch_extensions"))
    common = ["--config", str(lb.cluster_yaml)]
    code = main([*common, "launch", "--profile", str(profile), "--entry", "cpu-wrapper",
                 "--env", f"TORCH_EXTENSIONS_DIR={cache}", "--yes", "--force", "--json"])
    launched = capsys.readouterr()
    assert code == 0, launched
    hook_file = tmp_path / "hook.url"
    hook_file.write_text(hooks.url())
    hook_file.chmod(0o600)
    started = time.monotonic()
    code = main([*common, "watch", "latest", "--webhook", f"@{hook_file}", "--interval", "1"])
    watched = capsys.readouterr()
    assert code == 1, watched
    assert time.monotonic() - started < 400
    failed = [b for b in hooks.bodies if b["kind"] == "run"]
    assert len(failed) == 1, hooks.bodies
    assert all(len(b["text"]) <= 600 for b in hooks.bodies)
    (end,) = failed
    assert end["state"] == "firing" and end["title"] == "run failed"
    assert end["fault_id"] and end["evidence"], end
    keys = [(b["state"], b["key"]) for b in hooks.bodies]
    assert len(keys) == len(set(keys)), f"duplicate alerts: {keys}"
    assert "run failed" in watched.out and "secret-token" not in watched.out + watched.err
    log = (tmp_path / "state" / "alerts.log").read_text()
    assert "secret-token" not in log and json.loads(log.splitlines()[-1])["title"] == "run failed"
