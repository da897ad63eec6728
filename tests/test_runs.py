"""Runs on real loopback sshd nodes: detached start, records, finding runs again, exit codes,
stop (SIGTERM, then SIGKILL for what ignores it, every process checked in /proc).

The training command here is a small Python program (fast); the real FunASR training through the
same path is in tests/test_launch.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.cluster.model import load_cluster
from console.ssh.pool import Pool
from console.training import runs
from console.training.launch import LaunchError, LaunchPlan, NodePlan, Preparation, launch
from console.training.profile import default_profile

PROGRAM = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    steps, code, stubborn, gate = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
    if stubborn:  # ignores SIGTERM, and has a child in a session of its own (as torchrun's ranks)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen([sys.executable, "-c", "import signal, time; "
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
                         start_new_session=True)
    for i in range(steps):
        print(f"step {i} on {os.environ['SVCONSOLE_NODE']}", flush=True)
        time.sleep(0.1)
    while os.path.exists(gate):  # the test holds the run open until it removes the gate
        time.sleep(0.1)
    sys.exit(code)
""")


def tagged(run_id: str) -> dict[int, str]:
    """Every live process on this machine (all loopback nodes) carrying the run id: pid -> node."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and f"SVCONSOLE_RUN_ID={run_id}".encode() in env:
            node = [v for v in env if v.startswith(b"SVCONSOLE_NODE=")][0].split(b"=")[1]
            found[int(entry)] = node.decode()
    return found


def stand_in_supervisor(record: runs.RunRecord, node: str, seconds: float = 120
                        ) -> subprocess.Popen:
    """A process the node script takes for the run's supervisor on ``node`` (a session leader
    running ``python - start PAYLOAD`` that names the run), sleeping ``seconds``; its pid and
    start time are set in the record."""
    payload = base64.b64encode(json.dumps({"run_id": record.id, "node": node,
                                           "record": record.record_path}).encode())
    proc = subprocess.Popen([sys.executable, "-", "start", payload.decode()],
                            stdin=subprocess.PIPE, start_new_session=True)
    assert proc.stdin is not None
    proc.stdin.write(f"import time; time.sleep({seconds})\n".encode())
    proc.stdin.close()
    record.node(node).pid, record.node(node).start_ticks = proc.pid, start_ticks_of(proc.pid)
    return proc


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(v.decode().split("=", 1) for v in raw if b"=" in v)


@pytest.fixture
def cluster2(fresh_loopback):
    lb = fresh_loopback(2)
    return lb, load_cluster(lb.cluster_yaml)


@pytest.fixture
def pools(cluster2) -> Iterator[list[Pool]]:
    made: list[Pool] = []
    yield made
    for pool in made:
        pool.close()


def dummy_plan(lb, cluster, out: Path, *, steps: int, code: int = 0, stubborn: bool = False,
               gate: Path | None = None) -> Preparation:
    """A plan running PROGRAM on both nodes; while ``gate`` exists the program does not end."""
    nodes = [NodePlan(n.name, n.host, rank, 1,
                      [sys.executable, "-c", PROGRAM, str(steps), str(code),
                       "1" if stubborn else "0", str(gate or "")],
                      {"PYTHONUNBUFFERED": "1"}, str(out), f"{out}/logs/{n.name}.log")
             for rank, n in enumerate(cluster.nodes)]
    plan = LaunchPlan(runs.new_run_id(), cluster.name, "node0", nodes[0].host, 1, str(out),
                      "train_ds", [], nodes)
    profile = default_profile().replace("output_dir", str(out))
    return Preparation({}, plan, [], profile)


def wait_state(pool: Pool, record: runs.RunRecord, state: str, timeout: float = 30) -> runs.RunStatus:
    deadline = time.monotonic() + timeout
    while True:
        status = runs.run_status(pool, record)
        if status.state == state or time.monotonic() > deadline:
            return status
        time.sleep(0.3)


def test_detached_run_outlives_the_console_and_is_found_again(cluster2, pools, tmp_path):
    lb, cluster = cluster2
    out = lb.shared_dir / "out"
    state = tmp_path / "state"
    pool = Pool(cluster)
    pools.append(pool)
    gate = tmp_path / "gate"
    gate.touch()
    record = launch(pool, dummy_plan(lb, cluster, out, steps=25, gate=gate), state)
    pool.close()  # the console goes away: every SSH connection is closed

    for node in record.nodes:
        assert runs.NodeRun and node.pid and Path(f"/proc/{node.pid}").exists(), node
    procs = tagged(record.id)
    assert sorted(set(procs.values())) == ["node0", "node1"]
    training = environ(next(iter(procs)))
    assert training["SVCONSOLE_RECORD"] == f"{out}/svconsole-run.json"
    assert not any(k.startswith("SSH_") for k in training), "the SSH session's env leaked"

    shared = json.loads((out / "svconsole-run.json").read_text())
    assert shared["id"] == record.id and [n["pid"] for n in shared["nodes"]] == \
        [n.pid for n in record.nodes]
    assert (state / "runs" / f"{record.id}.json").is_file()

    again = Pool(cluster)  # a new console
    pools.append(again)
    found = runs.find_runs(again, state)
    assert [s.record.id for s in found] == [record.id] and found[0].state == "running"
    assert all(s.alive for s in found[0].nodes.values()), found[0].nodes

    gate.unlink()
    done = wait_state(again, record, "finished")
    assert done.state == "finished", done
    assert {n: s.exit for n, s in done.nodes.items()} == {"node0": 0, "node1": 0}
    assert not tagged(record.id)
    for node in ("node0", "node1"):
        lines = (out / "logs" / f"{node}.log").read_text().splitlines()
        assert lines == [f"step {i} on {node}" for i in range(25)]


def test_a_console_elsewhere_finds_the_live_run_through_the_nodes(cluster2, pools, tmp_path):
    lb, cluster = cluster2
    out = lb.shared_dir / "out"
    pool = Pool(cluster)
    pools.append(pool)
    record = launch(pool, dummy_plan(lb, cluster, out, steps=100), tmp_path / "here")
    try:
        elsewhere = tmp_path / "elsewhere"  # empty index: only the nodes know
        found = runs.find_runs(pool, elsewhere, live_only=True)
        assert [s.record.id for s in found] == [record.id]
        assert runs.find_record(elsewhere, record.id[:15]).id == record.id
    finally:
        runs.stop_run(pool, record, grace=5)


async def test_a_cluster_sharing_the_hosts_never_sees_or_stops_the_others_run(
        fresh_loopback, pools, tmp_path, capsys, monkeypatch):
    """Two cluster.yaml files with the same name, the same node names and the same addresses,
    on other SSH ports (two loopback clusters on one machine: the node scan sees both clusters'
    processes): A's consoles neither list, index, ask nor stop B's run, even with B's record in
    the same state directory. The cluster id each launch wrote into its cluster.yaml (comments
    kept, the old file kept as .bak) is what tells them apart; a copied id still does not match
    another port or another host key, and a renamed cluster keeps its runs. The same through
    the CLI (runs, logs, stop), the exporter's run watcher and the Training screen."""
    from test_training_screen import loopback_app, show, wait_until

    from console.cli import main
    from console.cluster.identity import cluster_id
    from console.cluster.model import ClusterEditor
    from console.exporter import RunWatcher

    lb_a, lb_b = fresh_loopback(2), fresh_loopback(2)
    lb_a.cluster_yaml.write_text("# our lab\n" + lb_a.cluster_yaml.read_text())
    cluster_a, cluster_b = load_cluster(lb_a.cluster_yaml), load_cluster(lb_b.cluster_yaml)
    assert cluster_a.name == cluster_b.name and cluster_a.names() == cluster_b.names()
    assert [n.host for n in cluster_a.nodes] == [n.host for n in cluster_b.nodes]
    assert cluster_a.nodes[0].port != cluster_b.nodes[0].port
    assert cluster_id(cluster_a) is None  # none until the first launch
    pool_a, pool_b = Pool(cluster_a), Pool(cluster_b)
    pools += [pool_a, pool_b]
    state = tmp_path / "state"  # one user's state directory, for both clusters
    theirs = launch(pool_b, dummy_plan(lb_b, cluster_b, lb_b.shared_dir / "out", steps=600),
                    state)
    wait_state(pool_b, theirs, "running")
    # A's pre-flight sees B's run on the shared hosts: a warning that names it, not a clash
    from console.training.launch import prepare

    profile = dummy_plan(lb_a, cluster_a, lb_a.shared_dir / "out", steps=1).profile
    checks = [c for c in prepare(pool_a, profile).checks if c.name == "no other run"]
    assert {c.node for c in checks} == {"node0", "node1"}
    assert all(c.ok and c.warning and theirs.id in c.message and "another cluster" in c.message
               for c in checks), checks
    ours = launch(pool_a, dummy_plan(lb_a, cluster_a, lb_a.shared_dir / "out", steps=600),
                  tmp_path / "a")
    try:
        id_a = load_cluster(lb_a.cluster_yaml).id
        assert id_a and id_a != load_cluster(lb_b.cluster_yaml).id
        assert lb_a.cluster_yaml.read_text().startswith("# our lab\n")
        assert f"id: {id_a}" not in (lb_a.cluster_yaml.parent / "cluster.yaml.bak").read_text()
        assert ours.identity["cluster_id"] == id_a
        assert all(n["fingerprints"] for n in ours.identity["nodes"]), ours.identity
        deadline = time.monotonic() + 20
        while len(set(tagged(theirs.id).values())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        before = tagged(theirs.id)
        assert sorted(set(before.values())) == ["node0", "node1"]
        wait_state(pool_a, ours, "running")
        checks = [c for c in prepare(pool_a, profile).checks if c.name == "no other run"]
        assert all(not c.ok and ours.id in c.message and "of this cluster" in c.message
                   and theirs.id not in c.message for c in checks), checks

        elsewhere = tmp_path / "elsewhere"  # empty index: only the nodes know
        assert [s.record.id for s in runs.find_runs(pool_a, elsewhere)] == [ours.id]
        assert not (elsewhere / "runs" / f"{theirs.id}.json").exists()  # never indexed
        assert [s.record.id for s in runs.find_runs(pool_a, state)] == [ours.id]
        assert [s.record.id for s in runs.find_runs(pool_b, elsewhere / "b")] == [theirs.id]
        with pytest.raises(runs.RunNotFound, match="no run"):
            runs.resolve_run(pool_a, state, theirs.id)
        with pytest.raises(runs.ForeignRun, match="belongs to cluster id"):
            runs.stop_run(pool_a, theirs, grace=1)
        with pytest.raises(runs.ForeignRun, match="belongs to cluster id"):
            runs.run_status(pool_a, theirs)

        copied = runs.RunRecord.from_dict(theirs.to_dict())  # B's run under A's id
        copied.identity["cluster_id"] = id_a
        port_a, port_b = cluster_a.nodes[0].port, cluster_b.nodes[0].port
        assert runs.foreign_reason(copied, pool_a.cluster, runs.own_identity(pool_a)) == (
            f"it ran node 'node0' on 127.0.1.1:{port_b}, cluster 'loopback' has it on "
            f"127.0.1.1:{port_a}")
        rekeyed = runs.RunRecord.from_dict(ours.to_dict())
        rekeyed.identity["nodes"][1]["fingerprints"] = ["SHA256:another-machine"]
        assert "node 'node1' had host key SHA256:another-machine, the one known here is " \
            "SHA256:" in runs.foreign_reason(rekeyed, pool_a.cluster, runs.own_identity(pool_a))

        # the CLI, the exporter and the TUI of cluster A, with B's run in the same index
        monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(state))
        config = ["--config", str(lb_a.cluster_yaml)]
        capsys.readouterr()
        assert main([*config, "runs", "--json"]) == 0
        assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [ours.id]
        for command in (["stop", theirs.id, "--yes"], ["logs", theirs.id],
                        ["metrics", theirs.id]):
            assert main([*config, *command]) == 2, command
            assert f"no run '{theirs.id}'" in capsys.readouterr().err, command
        assert set(before) <= set(tagged(theirs.id))
        watcher = RunWatcher(pool_a, state, interval=0)
        try:
            watcher.poll()
            assert [w.run_id for w in watcher.runs()] == [ours.id]
        finally:
            watcher.stop()
        app, app_pool = loopback_app(lb_a.cluster_yaml, state)
        try:
            async with app.run_test(size=(100, 30)) as pilot:
                screen = await show(pilot)
                await wait_until(pilot, lambda: screen.record is not None and not screen.finding,
                                 60, "the screen's search for runs")
                assert screen.record.id == ours.id and screen.run_state == "running"
                await pilot.press("s")  # the stop question names our run, answered no
                await wait_until(pilot, lambda: app.screen is not screen, 10, "the question")
                assert ours.id in str(app.screen.question) and theirs.id not in \
                    str(app.screen.question)
                await pilot.press("n")
        finally:
            app_pool.close()
        assert set(before) <= set(tagged(theirs.id)) and tagged(ours.id)

        editor = ClusterEditor(lb_a.cluster_yaml)  # renamed: still the same cluster
        editor.set("cluster.name", "lab-a")
        renamed = editor.save()
        with Pool(renamed) as pool:
            assert [s.record.id for s in runs.find_runs(pool, tmp_path / "a")] == [ours.id]

        result = runs.stop_run(pool_a, ours, grace=1)
        assert all(r.ok for r in result.values()) and not tagged(ours.id), result
        assert set(before) <= set(tagged(theirs.id))  # B's run: every process untouched
        assert runs.run_status(pool_b, theirs).state == "running"
    finally:
        runs.stop_run(pool_a, ours, grace=1)
        runs.stop_run(pool_b, theirs, grace=1)
    assert not tagged(theirs.id) and not tagged(ours.id)


def test_exit_codes_are_recorded(cluster2, pools, tmp_path):
    lb, cluster = cluster2
    pool = Pool(cluster)
    pools.append(pool)
    record = launch(pool, dummy_plan(lb, cluster, lb.shared_dir / "out", steps=2, code=3),
                    tmp_path)
    status = wait_state(pool, record, "failed")
    assert status.state == "failed"
    assert {n: s.exit for n, s in status.nodes.items()} == {"node0": 3, "node1": 3}


def test_stop_kills_every_process_on_every_node(cluster2, pools, tmp_path):
    lb, cluster = cluster2
    pool = Pool(cluster)
    pools.append(pool)
    record = launch(pool, dummy_plan(lb, cluster, lb.shared_dir / "out", steps=6000,
                                     stubborn=True), tmp_path)
    deadline = time.monotonic() + 20
    while len(tagged(record.id)) < 4 and time.monotonic() < deadline:  # 2 programs + 2 children
        time.sleep(0.1)
    before = tagged(record.id)
    assert sorted(before.values()).count("node1") >= 2

    started = time.monotonic()
    result = runs.stop_run(pool, record, grace=1.0)
    assert time.monotonic() - started < 15
    assert all(r.ok for r in result.values()), result
    for node, r in result.items():  # SIGTERM was ignored: SIGKILL was needed, nothing is left
        assert r.killed and not r.remaining, (node, r)
        assert set(r.killed) >= {p for p, n in before.items() if n == node}
    assert not tagged(record.id)
    for node in record.nodes:
        assert not Path(f"/proc/{node.pid}/stat").exists() or \
            Path(f"/proc/{node.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    status = runs.run_status(pool, record)
    assert status.state == "stopped"
    assert {s.stop_signal for s in status.nodes.values()} == {signal.SIGKILL}


SAVER = textwrap.dedent("""
    import os, signal, sys, time
    out, gate = sys.argv[1], sys.argv[2]
    node = os.environ["SVCONSOLE_NODE"]
    def on_term(signum, frame):
        with open(f"{out}/{node}.events", "a") as f:
            f.write("sigterm\\n")
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    print("[2026-12-01 09:15:50,834][root][INFO] - Save checkpoint: 1, rank: 0", flush=True)
    while os.path.exists(gate):  # FunASR's save_checkpoint, as long as the test holds the gate
        time.sleep(0.05)
    with open(f"{out}/{node}.events", "a") as f:
        f.write("saved\\n")
    print(f"[2026-12-01 09:15:50,958][root][INFO] - Checkpoint saved to {out}/model.pt.ep1",
          flush=True)
    time.sleep(600)
""")


def saver_plan(cluster, out: Path, gate: Path) -> Preparation:
    """A plan whose program on both nodes is inside a checkpoint save while ``gate`` exists."""
    prep = dummy_plan(None, cluster, out, steps=0)
    for n in prep.plan.nodes:
        n.argv = [sys.executable, "-c", SAVER, str(out), str(gate)]
    return prep


def wait_for(what, timeout: float = 60, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while not (found := what()) and time.monotonic() < deadline:
        time.sleep(step)
    return found


def node_stop_running(run_id: str) -> bool:
    """The node script's stop for ``run_id`` is running on this machine (a loopback node)."""
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if len(argv) >= 4 and argv[2] == b"stop" and run_id.encode() in \
                    base64.b64decode(argv[3] + b"==="):
                return True
    return False


def test_a_stop_waits_for_the_checkpoint_save_in_progress(cluster2, pools, tmp_path, capsys,
                                                          monkeypatch):
    """Seen in CI: a stop during FunASR's checkpoint save left model.pt cut short, and the
    resume died with EOFError. The stop now waits for the ``Checkpoint saved to`` line; with
    --save-wait it gives up, says so, and the save is cut."""
    from console.cli import main

    lb, cluster = cluster2
    pool = Pool(cluster)
    pools.append(pool)
    out = lb.shared_dir / "out"
    gate = tmp_path / "gate"
    gate.touch()
    record = launch(pool, saver_plan(cluster, out, gate), tmp_path)
    events = {n.name: out / f"{n.name}.events" for n in cluster.nodes}
    logs = [Path(n.log) for n in record.nodes]

    def relaunch(saves: int) -> runs.RunRecord:
        """A new run inside its save (the ``saves``-th in the logs, which runs append to)."""
        for p in events.values():
            p.unlink()
        again = launch(pool, saver_plan(cluster, out, gate), tmp_path)
        assert wait_for(lambda: all(p.read_bytes().count(b"Save checkpoint") == saves
                                    for p in logs))
        return again
    try:
        assert wait_for(lambda: all(p.exists() and b"Save checkpoint" in p.read_bytes()
                                    for p in logs))
        stopping: dict = {}
        stopper = threading.Thread(target=lambda: stopping.update(
            runs.stop_run(pool, record, grace=5)))
        stopper.start()
        assert wait_for(lambda: node_stop_running(record.id))
        # the stop is on the nodes; while the save goes on, no rank gets a SIGTERM
        assert not wait_for(lambda: any(p.exists() for p in events.values()), timeout=2)
        assert stopper.is_alive()
        gate.unlink()
        stopper.join(120)
        assert not stopper.is_alive()
        for name, r in stopping.items():
            assert r.ok and r.save_waited is not None and r.save_waited > 2 and not r.save_cut, r
            assert events[name].read_text().split() == ["saved", "sigterm"], name
        assert runs.run_status(pool, record).state == "stopped"

        # a save that does not end in --save-wait: the stop goes ahead and says so
        monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path))
        gate.touch()
        record = relaunch(2)
        capsys.readouterr()
        assert main(["--config", str(lb.cluster_yaml), "stop", record.id, "--yes",
                     "--save-wait", "1"]) == 0
        printed = capsys.readouterr().out
        assert printed.count("STILL SAVING after") == 2, printed
        assert all(p.read_text().split() == ["sigterm"] for p in events.values())
        assert main(["--config", str(lb.cluster_yaml), "stop", record.id, "--yes", "--now",
                     "--save-wait", "1"]) == 2

        # a save in which nothing moves (a rank frozen in its barrier) is not waited out
        record = relaunch(3)
        stopped = runs.stop_run(pool, record, grace=5, save_wait=600, save_stall=1)
        assert all(r.ok and r.save_cut and r.save_stalled and r.save_waited < 300
                   for r in stopped.values()), stopped
    finally:
        gate.unlink(missing_ok=True)
        runs.stop_run(pool, record, grace=1, save_wait=0)


def test_unknown_run_is_named(tmp_path):
    with pytest.raises(runs.RunNotFound, match="no run 'nope'; known runs: none"):
        runs.find_record(tmp_path, "nope")


def test_cli_logs_follow_and_stop_asks_first(cluster2, pools, tmp_path, capsys, monkeypatch):
    from console.cli import main

    lb, cluster = cluster2
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path))
    pool = Pool(cluster)
    pools.append(pool)
    gate = tmp_path / "gate"
    gate.touch()
    record = launch(pool, dummy_plan(lb, cluster, lb.shared_dir / "out", steps=5, gate=gate),
                    tmp_path)
    config = ["--config", str(lb.cluster_yaml)]
    try:
        assert main([*config, "stop", record.id]) == 2  # no terminal, no --yes: nothing stopped
        assert "not confirmed" in capsys.readouterr().err and tagged(record.id)
        gate.unlink()
        assert main([*config, "logs", "latest", "--follow"]) == 0  # returns when the run ends
        lines = capsys.readouterr().out.splitlines()
        assert sorted(lines) == sorted(f"{n}: step {i} on {n}" for n in ("node0", "node1")
                                       for i in range(5))
        assert main([*config, "stop", record.id, "--yes"]) == 0
        assert "is not running (finished)" in capsys.readouterr().out
        assert main([*config, "logs", "nope"]) == 2
        assert "no run 'nope'" in capsys.readouterr().err
    finally:
        runs.stop_run(pool, record, grace=1)


# ---------------------------------------------------------------- hostile records


def good_record_data(out: str = "/data/shared/out", run_id: str = "20261130-004512-3fa2"
                     ) -> dict:
    """A record's JSON as launch writes it (two nodes)."""
    own = runs.run_dir(out, run_id)
    return {"id": run_id, "created": 1.0, "cluster": "loopback", "output_dir": out,
            "master": "node0", "plan": {}, "profile": {}, "resumed_from": None,
            "nodes": [{"node": n, "node_rank": i, "log": f"{out}/logs/{n}.log",
                       "pid_file": f"{own}/{n}.pid", "exit_file": f"{own}/{n}.exit",
                       "pid": 4242 + i, "start_ticks": 100, "child": 4300 + i,
                       "log_offset": 0, "started": 2.0}
                      for i, n in enumerate(("node0", "node1"))]}


def hostile(change) -> dict:
    data = good_record_data()
    change(data)
    return data


@pytest.mark.parametrize(("data", "message"), [
    (hostile(lambda d: d.update(id="../../outside")), r"id: '\.\./\.\./outside' is not a run id"),
    (hostile(lambda d: d.update(id=7)), r"\.id: int 7 is not of the right type"),
    (hostile(lambda d: d.update(evil=1)), r"\.evil: unknown field"),
    (hostile(lambda d: d.pop("nodes")), r"\.nodes: missing"),
    (hostile(lambda d: d.update(nodes=[])), r"nodes: empty"),
    (hostile(lambda d: d.update(output_dir="/data/../etc")), r"output_dir: .* not a clean"),
    (hostile(lambda d: d.update(output_dir="/")), r"output_dir: '/' is not a clean"),
    (hostile(lambda d: d.update(master="elsewhere")), r"master: 'elsewhere' is not one of"),
    (hostile(lambda d: d["nodes"][1].update(node="node0")), r"nodes\[1\]\.node: 'node0' .*twice"),
    (hostile(lambda d: d["nodes"][0].update(node="../x")), r"nodes\[0\]\.node: '\.\./x' is not"),
    (hostile(lambda d: d["nodes"][0].update(log="/etc/shadow")),
     r"nodes\[0\]\.log: '/etc/shadow' is not /data/shared/out/logs/node0\.log"),
    (hostile(lambda d: d["nodes"][0].update(log="/data/shared/out/logs/../../../etc/x")),
     r"nodes\[0\]\.log: .* is not /data/shared/out/logs/node0\.log"),
    (hostile(lambda d: d["nodes"][1].update(exit_file="/etc/cron.d/x")),
     r"nodes\[1\]\.exit_file: '/etc/cron\.d/x' is not /data/shared/out/svconsole/"),
    (hostile(lambda d: d["nodes"][0].update(pid_file="/tmp/x.pid")), r"nodes\[0\]\.pid_file"),
    (hostile(lambda d: d["nodes"][0].update(pid=1)), r"nodes\[0\]\.pid: 1 is not a process"),
    (hostile(lambda d: d["nodes"][0].update(pid=-5)), r"nodes\[0\]\.pid: -5 is not a process"),
    (hostile(lambda d: d["nodes"][0].update(pid=True)), r"nodes\[0\]\.pid: bool"),
    (hostile(lambda d: d["nodes"][0].update(pid="1; rm -rf /")), r"nodes\[0\]\.pid: str"),
    (hostile(lambda d: d["nodes"][0].update(log_offset=-1)), r"negative rank, offset"),
    (hostile(lambda d: d.update(resumed_from="../x")), r"resumed_from: '\.\./x' is not a run"),
    (["not", "a", "record"], r"not a JSON object"),
])
def test_hostile_records_are_refused_with_the_field_named(data, message):
    with pytest.raises(runs.BadRecord, match=message):
        runs.check_record(data, "node0:/data/shared/out/svconsole-run.json")
    assert runs.check_record(good_record_data(), "x").id == "20261130-004512-3fa2"


def test_a_bad_record_in_the_index_is_skipped_and_none_is_written_outside(tmp_path):
    state = tmp_path / "state"
    good = runs.check_record(good_record_data(), "x")
    runs.index_record(good, state)
    bad = runs.RunRecord.from_dict(good_record_data())
    bad.id = "../../outside"
    with pytest.raises(runs.BadRecord, match="is not a run id"):
        runs.index_record(bad, state)
    assert not (tmp_path / "outside.json").exists()
    planted = good_record_data(run_id="20261130-004512-beef")
    planted["nodes"][0]["exit_file"] = "/etc/passwd"
    (state / "runs" / "20261130-004512-beef.json").write_text(json.dumps(planted))
    (state / "runs" / "20261130-004512-dead.json").write_text(json.dumps(good_record_data()))
    assert [r.id for r in runs.load_index(state)] == [good.id]  # the misfiled copy too


def start_ticks_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def test_planted_records_on_a_node_are_never_indexed_followed_or_signalled(cluster2, pools,
                                                                          tmp_path):
    """Processes on node0 name planted records in SVCONSOLE_RECORD: one whose id is
    ``../../outside``, one whose log is /etc/passwd, and one well-formed record whose pid is
    an innocent session leader (its start time and the cluster's identity copied). The first
    two are never indexed (no
    file outside the state directory); the third is listed, but its pid is not taken for the
    run's supervisor: stopping it leaves the innocent process alive."""
    from console.cluster.identity import identity

    lb, cluster = cluster2
    pool = Pool(cluster)
    pools.append(pool)
    state = tmp_path / "state" / "svconsole"
    innocent = subprocess.Popen(["sleep", "300"], start_new_session=True)
    planted: list[subprocess.Popen] = []

    def plant(name: str, data: dict) -> None:
        out = lb.shared_dir / name
        out.mkdir()
        (out / "svconsole-run.json").write_text(json.dumps(data))
        env = {**os.environ, "SVCONSOLE_RUN_ID": data["id"], "SVCONSOLE_NODE": "node0",
               "SVCONSOLE_RECORD": str(out / "svconsole-run.json")}
        planted.append(subprocess.Popen(["sleep", "300"], env=env))

    try:
        outside = good_record_data(str(lb.shared_dir / "a"), "20261130-000001-aaaa")
        outside["id"] = "../../outside"
        plant("a", outside)
        leak = good_record_data(str(lb.shared_dir / "b"), "20261130-000002-bbbb")
        leak["nodes"][0]["log"] = "/etc/passwd"
        plant("b", leak)
        decoy = good_record_data(str(lb.shared_dir / "c"), "20261130-000003-cccc")
        decoy["identity"] = identity(cluster, create=True).to_dict()  # not a secret: copied
        decoy["nodes"][0].update(pid=innocent.pid, start_ticks=start_ticks_of(innocent.pid))
        decoy["nodes"][1].update(pid=innocent.pid, start_ticks=start_ticks_of(innocent.pid))
        plant("c", decoy)

        found = runs.find_runs(pool, state)
        assert [s.record.id for s in found] == ["20261130-000003-cccc"]
        assert sorted(p.name for p in (state / "runs").iterdir()) == ["20261130-000003-cccc.json"]
        assert not list(tmp_path.rglob("outside*")) and not list(lb.shared_dir.rglob("outside*"))
        status = found[0]
        assert not status.nodes["node0"].alive and not status.nodes["node1"].alive
        assert status.nodes["node0"].processes == [planted[2].pid]  # only the tagged process

        result = runs.stop_run(pool, status.record, grace=1)
        assert result["node0"].terminated == [planted[2].pid], result
        assert innocent.poll() is None, "the innocent session leader was signalled"
        assert planted[2].wait(10) is not None
        assert planted[0].poll() is None and planted[1].poll() is None  # never asked
    finally:
        for proc in (innocent, *planted):
            proc.kill()
            proc.wait()


def test_the_node_script_refuses_paths_and_ids_of_no_run(cluster2, pools):
    """The node's own guard, whatever the console sends: nothing signalled, written or read."""
    lb, cluster = cluster2
    pool = Pool(cluster)
    pools.append(pool)
    out = str(lb.shared_dir / "out")
    ok = runs.node_args(runs.check_record(good_record_data(out), "x"),
                        runs.check_record(good_record_data(out), "x").nodes[0])
    for bad in ({"run_id": "../../x"}, {"exit_file": "/etc/cron.d/x"}, {"log": "/etc/passwd"},
                {"node": "node0; true"}, {"pid": 1}, {"pid": "1"}):
        with pytest.raises(runs.NodeCallError, match="refused"):
            runs.node_call(pool, "node0", "stop", {**ok, **bad, "grace": 0})
    assert runs.node_call(pool, "node0", "status", ok)["alive"] is False


# ---------------------------------------------------------------- state that tells the truth


def test_each_nodes_part_and_the_run_state_derived_from_them():
    record = runs.check_record(good_record_data(), "x")

    def status(**nodes: runs.NodeState) -> runs.RunStatus:
        return runs.RunStatus(record, nodes)

    up = runs.NodeState("node0", alive=True, processes=[5])
    done = runs.NodeState("node1", exit=0)
    away = runs.NodeState("node1", error="node1: status failed: connection refused",
                          since=time.mktime((2026, 12, 1, 9, 30, 5, 0, 0, -1)))
    assert up.part == "running" and done.part == "exited 0"
    assert runs.NodeState("n", exit=3).part == "exited 3"
    assert runs.NodeState("n", exit=-9).part == "killed by signal 9"
    assert runs.NodeState("n", exit=-15, stop_signal=15).part == "killed by signal 15"
    assert runs.NodeState("n").part == "lost (no process, no exit file)"
    assert away.part == ("unknown (node unreachable since 09:30:05: node1: status failed: "
                         "connection refused)")
    assert status(node0=up, node1=away).state == "running"
    assert status(node0=runs.NodeState("node0", exit=0), node1=away).state == "unknown"
    assert status(node0=runs.NodeState("node0", exit=0), node1=away).live  # worth following
    assert status(node0=runs.NodeState("node0", exit=0), node1=done).state == "finished"
    assert status(node0=runs.NodeState("node0", exit=1), node1=done).state == "failed"
    assert status(node0=runs.NodeState("node0"), node1=done).state == "lost"
    assert status(node0=runs.NodeState("node0", exit=-15, stop_signal=15),
                  node1=done).state == "stopped"
    assert status(node0=up, node1=away).to_dict()["nodes"]["node1"]["part"] == away.part


def test_an_unreachable_node_is_unknown_never_running(cluster2, pools, tmp_path):
    lb, cluster = cluster2
    pool = Pool(cluster)
    pools.append(pool)
    record = launch(pool, dummy_plan(lb, cluster, lb.shared_dir / "out", steps=3), tmp_path)
    done = wait_state(pool, record, "finished")
    assert done.state == "finished", done
    lb.kill(1)
    status = runs.run_status(pool, record)
    assert status.state == "unknown" and status.nodes["node0"].part == "exited 0", status
    assert status.nodes["node1"].part.startswith("unknown (node unreachable since "), status


def test_a_launch_that_fails_on_a_node_leaves_nothing_in_the_index(cluster2, pools, tmp_path):
    lb, cluster = cluster2
    pool = Pool(cluster)
    pools.append(pool)
    prep = dummy_plan(lb, cluster, lb.shared_dir / "out", steps=600)
    prep.plan.nodes[1].cwd = str(lb.shared_dir / "no-such-dir")
    with pytest.raises(LaunchError, match="node1: working directory .* does not exist"):
        launch(pool, prep, tmp_path)
    assert not list((tmp_path / "runs").glob("*.json")) if (tmp_path / "runs").exists() else True
    assert not tagged(prep.plan.run_id)  # node0's part was stopped
    assert runs.find_runs(pool, tmp_path) == []
