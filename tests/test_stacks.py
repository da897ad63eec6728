"""``svconsole stacks``: real rank processes in a real gloo all_reduce loop on three loopback
nodes, tagged as a run's ranks are (``SVCONSOLE_RUN_ID``, ``SVCONSOLE_NODE``, torchrun's
``RANK``), each writing FunASR-style step lines to its node's log. One is frozen with SIGSTOP:
the stacks name it, with state T, and the others in one all_reduce group; the training is not
stopped by the dumps (it steps on after SIGCONT). The analysis itself is checked on stacks as
py-spy gives them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from walk import wait_until

from console.cli import main
from console.cluster.model import load_cluster
from console.ssh.pool import Pool
from console.training import runs
from console.training.stacks import Frame, RankStack, analyse, ranks_from_reply, take_stacks

RANK_PROGRAM = r'''
import os, sys, time
import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=os.environ["INIT"], rank=rank, world_size=world)
log = open(os.environ["LOG"], "a", buffering=1)
t = torch.ones(4096)
step = 0
while True:
    step += 1
    dist.all_reduce(t)
    t.fill_(1.0)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S") + ",%03d" % (time.time() % 1 * 1000)
    log.write(f"[{stamp}][root][INFO] - train, rank: {rank}, epoch: 0/1, data_slice: 0/1, "
              f"step_in_slice: {step}/100000, step_in_epoch: {step}, total step: {step}, "
              "(loss_avg_rank: 1.000), (lr: 1.000e-04), "
              "{'data_load': '0.001', 'forward_time': '0.010', 'backward_time': '0.010', "
              "'optim_time': '0.001', 'total_time': '0.050'}\n")
    time.sleep(0.05)
'''
NODES = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _identity(cluster) -> dict:
    """The cluster identity a launched run's record carries (where runs have one)."""
    if "identity" not in runs.RunRecord.__dataclass_fields__:
        return {}
    from console.cluster.identity import identity

    return {"identity": identity(cluster, create=True).to_dict()}


class FakeRun:
    """Rank processes tagged like a launched run's, one per node, and its record."""

    def __init__(self, cluster_yaml: Path, directory: Path, program_text: str = RANK_PROGRAM,
                 env: dict[str, str] | None = None, run_id: str | None = None) -> None:
        self.cluster = load_cluster(cluster_yaml)
        self.id = run_id or runs.new_run_id()
        self.directory = directory
        names = self.cluster.names()[:NODES]
        program = directory / "rank.py"
        program.write_text(program_text)
        init = f"tcp://127.0.0.1:{_free_port()}"
        self.procs: list[subprocess.Popen] = []
        nodes = []
        own = f"{directory}/svconsole/{self.id}"  # where launch puts them (runs.run_dir)
        Path(own).mkdir(parents=True)
        (directory / "logs").mkdir()
        for rank, node in enumerate(names):
            log = directory / "logs" / f"{node}.log"
            log.write_text("")
            tagged = {**os.environ, **(env or {}), "SVCONSOLE_RUN_ID": self.id,
                      "SVCONSOLE_NODE": node, "RANK": str(rank), "LOCAL_RANK": "0",
                      "WORLD_SIZE": str(NODES), "INIT": init, "LOG": str(log),
                      "OMP_NUM_THREADS": "1"}
            self.procs.append(subprocess.Popen([sys.executable, str(program)], env=tagged,
                                               stdin=subprocess.DEVNULL))
            nodes.append(runs.NodeRun(node, rank, str(log), f"{own}/{node}.pid",
                                      f"{own}/{node}.exit"))
        hosts = {n.name: n.host for n in self.cluster.nodes}
        plan = {"run_id": self.id, "cluster": self.cluster.name, "master": names[0],
                "master_addr": hosts[names[0]], "master_port": int(init.rsplit(":", 1)[1]),
                "output_dir": str(directory), "entry": "cpu-wrapper", "overrides": [],
                "nodes": [{"node": n, "host": hosts[n], "node_rank": i, "nproc": 1,
                           "argv": [sys.executable, str(program)], "env": {},
                           "cwd": str(directory), "log": str(directory / "logs" / f"{n}.log")}
                          for i, n in enumerate(names)]}
        self.record = runs.RunRecord(self.id, time.time(), self.cluster.name, str(directory),
                                     names[0], nodes, plan=plan, **_identity(self.cluster))
        self.logs = [Path(n.log) for n in nodes]

    def steps(self, rank: int) -> int:
        return self.logs[rank].read_text().count("train, rank:")

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.wait()


@pytest.fixture
def fake_run(loopback, tmp_path: Path) -> Iterator[FakeRun]:
    run = FakeRun(loopback.cluster_yaml, tmp_path)
    try:
        wait_until(lambda: all(run.steps(r) >= 3 for r in range(NODES)), 120,
                   "every rank stepping")
        yield run
    finally:
        run.close()


def test_stopped_rank_is_named_with_state_t_and_the_others_wait_in_all_reduce(
        fake_run: FakeRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = Pool(fake_run.cluster)
    try:
        healthy = take_stacks(pool, fake_run.record)
        assert [r.rank for r in healthy.ranks] == [0, 1, 2]
        assert all(r.frames and r.state in "RS" for r in healthy.ranks), healthy.to_dict()
        assert healthy.suspects == [], healthy.text()  # stepping: differences are by chance

        victim = fake_run.procs[1]
        os.kill(victim.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        steps = [fake_run.steps(r) for r in range(NODES)]
        # the others block in all_reduce; stack differences count once lines are 10 s stale
        wait_until(lambda: time.monotonic() - frozen_at > 11, 30, "lines to go stale")
        runs.index_record(fake_run.record, Path(os.environ["SVCONSOLE_STATE_DIR"]))
        started = time.monotonic()
        code = main(["--config", str(fake_run.cluster.path), "stacks", fake_run.id, "--json"])
        took = time.monotonic() - started
        report = json.loads(capsys.readouterr().out)
        assert code == 1  # (its time is bench/stacks.py's: tests check behaviour)
        names = fake_run.cluster.names()
        assert report["suspects"] == [
            {"node": names[1], "rank": 1,
             "why": report["suspects"][0]["why"]}], report["suspects"]
        assert report["suspects"][0]["why"].startswith(f"rank 1 on {names[1]} is stopped "
                                                       "(state T)")
        by_rank = {r["rank"]: r for r in report["ranks"]}
        assert by_rank[1]["state"] == "T" and by_rank[1]["dump_mode"] == "nonblocking"
        assert by_rank[1]["cpu_s"] == 0
        assert all(by_rank[r]["state"] == "S" for r in (0, 2)), by_rank
        assert all(by_rank[r]["last_log_age_s"] > 10 for r in (0, 1, 2)), by_rank
        (group,) = [g for g in report["groups"] if g["majority"]]
        # rank 1 is in it too when SIGSTOP came while it was inside all_reduce itself (seen in
        # CI); its state names it all the same
        assert {0, 2} <= set(group["ranks"]) and group["collective"] == "all_reduce", group
        assert group["waited_s"] > 10
        assert {"name", "file", "line"} <= set(by_rank[0]["frames"][0])
        # the dumps did not stop the training: after SIGCONT every rank steps on
        assert [fake_run.steps(r) for r in range(NODES)] == steps
        os.kill(victim.pid, signal.SIGCONT)
        wait_until(lambda: all(fake_run.steps(r) > steps[r] + 5 for r in range(NODES)), 60,
                   "every rank stepping again after SIGCONT")
        print(f"\nstacks on {NODES} nodes: {took:.2f} s (CLI, window 1 s)")
    finally:
        pool.close()


def test_text_report_and_unknown_run(fake_run: FakeRun,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    runs.index_record(fake_run.record, Path(os.environ["SVCONSOLE_STATE_DIR"]))
    code = main(["--config", str(fake_run.cluster.path), "stacks", fake_run.id])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "suspects: none" in out and "stepping" in out, out
    code = main(["--config", str(fake_run.cluster.path), "stacks", "no-such-run"])
    assert code == 2
    assert "no run 'no-such-run'" in capsys.readouterr().err


# ---------------------------------------------------------------- analysis


def _collective(rank: int, node: str) -> RankStack:
    frames = [Frame("all_reduce", "/venv/torch/distributed/distributed_c10d.py", 2800),
              Frame("wrapper", "/venv/torch/distributed/c10d_logger.py", 81),
              Frame("all_reduce", "/venv/deepspeed/comm/torch.py", 185),
              Frame("train_epoch", "/venv/funasr/train_utils/trainer_ds.py", 600)]
    return RankStack(node, rank, 0, 100 + rank, "S", cpu_s=0.0, frames=frames,
                     last_log_age_s=40.0)


def test_analysis_names_dataloader_and_save_and_missing_ranks() -> None:
    loader = RankStack("node4", 3, 0, 203, "R", cpu_s=0.9, last_log_age_s=40.0, frames=[
        Frame("_next_data", "/venv/torch/utils/data/dataloader.py", 1400),
        Frame("__next__", "/venv/torch/utils/data/dataloader.py", 700),
        Frame("train_epoch", "/venv/funasr/train_utils/trainer_ds.py", 560)])
    saving = RankStack("node2", 2, 0, 202, "S", last_log_age_s=41.0, frames=[
        Frame("_save", "/venv/torch/serialization.py", 900),
        Frame("save", "/venv/torch/serialization.py", 850),
        Frame("save_checkpoint", "/venv/funasr/train_utils/trainer_ds.py", 300)])
    ranks = [_collective(0, "node1"), _collective(1, "node1"), saving, loader,
             _collective(5, "node5")]
    groups, suspects = analyse(ranks, world_size=7, unreachable={"node6": "timed out"},
                               placement={6: "node6"})
    assert groups[0].majority and groups[0].ranks == [0, 1, 5]
    assert groups[0].collective == "all_reduce" and groups[0].waited_s == 40.0
    whys = {s.rank: s.why for s in suspects}
    assert whys[3] == ("rank 3 on node4 is in DataLoader.__next__ for 40 s, while ranks 0, 1, 5 "
                       "wait in all_reduce")
    assert whys[2].startswith("rank 2 on node2 is in torch.save for 41 s")
    assert whys[4] == "rank 4 has no process: it exited or never started"
    assert whys[6] == "rank 6 on node6: the node could not be asked (timed out)"
    assert set(whys) == {2, 3, 4, 6}


def test_every_rank_waiting_on_a_left_build_lock_is_named_with_the_fix() -> None:
    """Seen on this machine: a rank killed while it loaded DeepSpeed's JIT-built comm op left
    torch's build lock, and every later run's ranks waited in FileBaton.wait for good (these
    are the frames py-spy dumped of one of them). All ranks wait there, none in a collective:
    each is named, with the lock to remove."""
    frames = [Frame("FileBaton.wait", "/venv/torch/utils/file_baton.py", 50),
              Frame("_jit_compile", "/venv/torch/utils/cpp_extension.py", 2400),
              Frame("load", "/venv/torch/utils/cpp_extension.py", 1927),
              Frame("OpBuilder.jit_load", "/venv/deepspeed/ops/op_builder/builder.py", 613),
              Frame("build_shm_op", "/venv/deepspeed/comm/torch.py", 51),
              Frame("main", "/venv/funasr/bin/train_ds.py", 126)]
    ranks = [RankStack(f"node{r}", r, 0, 100 + r, "S", cpu_s=0.0, frames=frames,
                       last_log_age_s=900.0) for r in range(3)]
    groups, suspects = analyse(ranks)
    assert len(groups) == 1 and groups[0].collective is None
    assert [s.rank for s in suspects] == [0, 1, 2]
    assert suspects[1].why.startswith("rank 1 on node1 waits for torch's extension build lock "
                                      "for 900 s (FileBaton.wait")
    assert "<TORCH_EXTENSIONS_DIR>/<op>/lock" in suspects[1].why
    assert "remove that lock file" in suspects[1].why


def test_analysis_states_and_ties() -> None:
    stuck = RankStack("node2", 1, 0, 9, "D", wchan="nfs_wait_on_request", last_log_age_s=90.0)
    _, suspects = analyse([_collective(0, "node1"), stuck])
    assert [s.why for s in suspects] == [
        "rank 1 on node2 is in uninterruptible sleep (state D, wchan nfs_wait_on_request): "
        "waiting on storage or a device for 90 s"]
    # two ranks, two places, neither in a collective: no side is the norm, nobody is blamed
    a = RankStack("n1", 0, 0, 1, "R", frames=[Frame("forward", "/m/model.py", 10)],
                  last_log_age_s=30.0)
    b = RankStack("n2", 1, 0, 2, "R", frames=[Frame("backward", "/m/model.py", 20)],
                  last_log_age_s=30.0)
    groups, suspects = analyse([a, b])
    assert suspects == [] and not any(g.majority for g in groups)
    # a rank in the collective alone against one elsewhere: the collective is the norm
    c = RankStack("n2", 1, 0, 3, "R", frames=a.frames, last_log_age_s=30.0)
    groups, suspects = analyse([_collective(0, "n1"), c])
    assert groups[0].majority and groups[0].collective == "all_reduce"
    assert [s.why for s in suspects] == [
        "rank 1 on n2 is in forward (/m/model.py:10) for 30 s, while ranks 0 wait in all_reduce"]


def test_reply_without_pyspy_or_ptrace_says_what_to_do() -> None:
    reply = {"pyspy": None, "python": "/opt/venv/bin/python",
             "ptrace": "kernel.yama.ptrace_scope is 1: py-spy may only attach to its own children",
             "ranks": [{"pid": 5, "rank": 0, "local_rank": 0, "state": "T", "cpu_s": 0.0}],
             "last_lines": {"0": {"text": "train, rank: 0, ...", "age_s": 12.5}}}
    ranks, notes = ranks_from_reply("node1", reply)
    assert ranks[0].state == "T" and ranks[0].last_log_age_s == 12.5 and not ranks[0].frames
    assert notes[0].startswith("node1: py-spy is not installed for the training Python "
                               "(/opt/venv/bin/python)")
    assert "ptrace_scope is 1" in notes[1]
    _, suspects = analyse(ranks)
    assert suspects[0].why == "rank 0 on node1 is stopped (state T) for 12 s"


def test_stall_watch_diagnoses_a_stall_once_and_names_the_stopped_rank(
        fake_run: FakeRun) -> None:
    from test_metrics import Clock, train_line

    from console.training.logparse import parse_line
    from console.training.metrics import MetricsStore
    from console.training.stacks import StallWatch

    names = fake_run.cluster.names()
    clock = Clock()
    store = MetricsStore(clock=clock)
    for step in (1, 2, 3):
        for rank in range(NODES):
            store.add(parse_line(train_line(rank, step)), node=names[rank])
    pool = Pool(fake_run.cluster)
    watch = StallWatch(pool, fake_run.record, store)
    os.kill(fake_run.procs[1].pid, signal.SIGSTOP)
    try:
        assert watch.check() is None  # no stall yet: nothing asked
        clock.now += 61
        text = watch.check()
        assert text is not None and f"stacks: rank 1 on {names[1]} is stopped (state T)" in text
        assert "reachab" in text  # the reachability checks were asked (or say why not)
        assert watch.check() is None  # one diagnosis per stall
        [stall] = [f for f in store.findings() if f.id == "run-stalled"]
        assert (stall.rank, stall.node) == (1, names[1])
        assert "diagnosis: " in stall.detail and "is stopped (state T)" in stall.detail
    finally:
        os.kill(fake_run.procs[1].pid, signal.SIGCONT)
        pool.close()
        store.close()


def test_a_rank_stopped_before_the_first_step_is_named_when_the_start_up_goes_quiet(
        fake_run: FakeRun) -> None:
    """The start-up goes quiet (no step line yet, as the store sees it) for 30 s: the watch
    looks at the real ranks at once instead of waiting out the 900 s start-up allowance. With
    every rank running nothing is certain (no stall; looked at again only after 3x as long);
    with rank 1 stopped the stall is confirmed and names it."""
    from test_metrics import DATALOADER_LINE, Clock

    from console.training.logparse import parse_line
    from console.training.metrics import MetricsStore
    from console.training.stacks import StallWatch

    names = fake_run.cluster.names()
    clock = Clock()
    store = MetricsStore(clock=clock)
    store.watch_run(clock.now)
    for rank in range(NODES):
        store.add(parse_line(DATALOADER_LINE.format(rank=rank)), node=names[rank])
    pool = Pool(fake_run.cluster)
    watch = StallWatch(pool, fake_run.record, store)
    try:
        assert watch.check() is None  # quiet 0 s: nothing asked
        clock.now += 31
        text = watch.check()  # every rank running: a look, nothing certain
        assert text is not None and "is stopped" not in text, text
        assert not [f for f in store.findings() if f.id == "run-stalled"] and not watch.diagnosed
        clock.now += 30
        assert watch.check() is None  # 61 s: not yet 3x 31 s
        os.kill(fake_run.procs[1].pid, signal.SIGSTOP)
        clock.now += 40
        text = watch.check()  # 101 s: looked at again
        assert text is not None and f"stacks: rank 1 on {names[1]} is stopped (state T)" in text
        [stall] = [f for f in store.findings() if f.id == "run-stalled"]
        assert (stall.rank, stall.node) == (1, names[1]), stall
        assert stall.detail.startswith("no step line yet, and no line from any rank for 101 s")
        assert watch.check() is None and len(watch.diagnosed) == 1  # certain: no more looks
    finally:
        os.kill(fake_run.procs[1].pid, signal.SIGCONT)
        pool.close()
        store.close()


async def test_stacks_view_from_the_training_screen(fake_run: FakeRun) -> None:
    from test_training_screen import FedApp, show
    from textual.widgets import Collapsible, Static

    from console.training.metrics import MetricsStore
    from screens.stacks import StacksScreen

    names = fake_run.cluster.names()
    pool = Pool(fake_run.cluster)
    app = FedApp(fake_run.cluster, pool, health_interval=None)
    os.kill(fake_run.procs[1].pid, signal.SIGSTOP)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            screen = await show(pilot)
            screen.show_run(fake_run.record, MetricsStore(), "running")
            await pilot.press("t")
            await pilot.pause()
            view = app.screen
            assert isinstance(view, StacksScreen)
            for _ in range(300):
                if view.report is not None:
                    break
                await pilot.pause(0.1)
            assert view.report is not None, "no stacks within 30 s"
            await pilot.pause()
            suspects = str(view.query_one("#stacks-suspects", Static).render())
            assert f"rank 1 on {names[1]} is stopped (state T)" in suspects, suspects
            columns = list(view.query(".stacks-group"))
            assert len(columns) >= 2 and any(c.has_class("-suspect") for c in columns)
            ranks = list(view.query(Collapsible))
            assert len(ranks) == NODES and all(c.collapsed for c in ranks)
            flagged = [c for c in ranks if c.has_class("-suspect-rank")]
            assert len(flagged) == 1 and "state T" in flagged[0].title
            flagged[0].collapsed = False
            await pilot.pause()
            assert not flagged[0].collapsed
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen is screen
    finally:
        os.kill(fake_run.procs[1].pid, signal.SIGCONT)
        pool.close()


def test_pyspy_setup_step_checks_installs_and_verifies(tmp_path: Path) -> None:
    from test_steps import CLUSTER, ctx, run

    from console.bringup.catalog import CATALOG
    from console.bringup.model import SetupOptions
    from console.cluster.model import load_cluster

    (tmp_path / "cluster.yaml").write_text(CLUSTER.format(shared=tmp_path / "shared"))
    cluster = load_cluster(tmp_path / "cluster.yaml")
    step = CATALOG["py-spy"]
    assert step.depends == ("python-env",)
    here = ctx(cluster, "w1", SetupOptions(env_path=str(Path(sys.executable).parent.parent)))
    assert run(step.check(here)[0]).returncode == 0  # this venv has it (the dev extra)
    verified = run(step.verify(here)[0])
    assert verified.returncode == 0 and verified.stdout.startswith("py-spy 0.")
    bare = tmp_path / "bare-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    fresh = ctx(cluster, "w1", SetupOptions(env_path=str(bare)))
    assert run(step.check(fresh)[0]).returncode != 0
    [apply] = step.apply(fresh)
    assert "install" in apply.text and "'py-spy>=0.4'" in apply.text
    assert apply.text.startswith(f"{bare}/bin/python -m pip install")  # into that env


# ---------------------------------------------------------------- flight recorder

#: Ranks in an all_reduce loop with torch's flight recorder on (the launch's environment); rank 1
#: stops taking part after 5 collectives, so the others hang in the 6th. Each rank writes its
#: recorder's dump with torch's own code (``_dump_fr_trace``, what the NCCL watchdog writes on a
#: timeout; gloo has no watchdog dump) to TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank once the test
#: creates the file DUMP.
FR_PROGRAM = r'''
import os, threading, time
import torch
import torch.distributed as dist
import torch._C._distributed_c10d as c10d

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=os.environ["INIT"], rank=rank, world_size=world)

def dumper():
    while not os.path.exists(os.environ["DUMP"]):
        time.sleep(0.1)
    path = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + str(rank)
    with open(path + ".tmp", "wb") as f:
        f.write(c10d._dump_fr_trace())
    os.replace(path + ".tmp", path)

threading.Thread(target=dumper, daemon=True).start()
t = torch.ones(64)
for step in range(1000000):
    if rank == 1 and step == 5:
        while True:
            time.sleep(1)
    dist.all_reduce(t)
    open(os.environ["LOG"], "a").write(f"train, rank: {rank}, step {step}\n")
'''


def test_flight_recorder_dumps_written_by_torch_are_collected_and_name_the_rank_behind(
        loopback, tmp_path: Path) -> None:
    from console.training import flightrec

    run_id = runs.new_run_id()
    trigger = tmp_path / "DUMP"
    env = {**flightrec.recorder_env(str(tmp_path), run_id, entries=100), "DUMP": str(trigger)}
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f"{tmp_path}/svconsole/{run_id}/" \
        "nccl_trace_rank_"
    run = FakeRun(loopback.cluster_yaml, tmp_path, FR_PROGRAM, env, run_id=run_id)
    names = run.cluster.names()
    pool = Pool(run.cluster)
    try:
        wait_until(lambda: all(run.steps(r) >= 5 for r in range(NODES)), 120,
                   "five collectives on every rank")
        trigger.write_text("")
        prefix = Path(env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"])
        wait_until(lambda: all(Path(f"{prefix}{r}").exists() for r in range(NODES)), 60,
                   "every rank's dump")
        dumps = flightrec.collect(pool, run.record)
        assert sorted(dumps.dumps) == [0, 1, 2] and dumps.errors == []
        assert dumps.dumps[0]["entries"][0]["profiling_name"] == "gloo:all_reduce"
        lines = flightrec.analyse(dumps, NODES)
        assert lines[0].startswith(f"process group default_pg: rank 1 on {names[1]} behind at "
                                   "collective #5, the others at #6"), lines
        found = flightrec.finding(run.record, dumps)
        assert found.evidence == tuple(lines) and "3 dump(s) read" in found.detail
        assert "torch fr_trace: " in found.detail  # the installed torch has its analysis
        assert "fr_trace failed" not in found.detail, found.detail
        assert "Not all ranks joining collective, sequence number: 6" in found.detail
        assert "missing ranks: {1}" in found.detail, found.detail
        # a followed run's watchdog timeout: the watch collects and attaches the same
        from console.training.logparse import parse_line
        from console.training.metrics import MetricsStore
        from console.training.stacks import StallWatch

        store = MetricsStore()
        watch = StallWatch(pool, run.record, store)
        assert not watch.check_flight_recorder()  # no timeout yet: nothing collected
        store.add(parse_line(
            "[rank0]:[E1201 09:50:03.830110874 ProcessGroupNCCL.cpp:685] [Rank 0] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum=6, OpType=ALLREDUCE, "
            "NumelIn=64, NumelOut=64, Timeout(ms)=600000) ran for 600005 milliseconds before "
            "timing out."), node=names[0])
        assert watch.check_flight_recorder() and not watch.check_flight_recorder()
        [attached] = [f for f in store.findings() if f.id == "flight-recorder"]
        assert attached.evidence == tuple(lines)
        store.close()
    finally:
        run.close()
        pool.close()


def test_flight_recorder_refuses_code_and_says_when_there_is_no_dump(loopback,
                                                                    tmp_path: Path) -> None:
    import pickle

    from console.training import flightrec

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch /tmp/svconsole-pwned",))

    with pytest.raises(ValueError, match="refused"):
        flightrec.read_dump(pickle.dumps({"entries": [Evil()]}))
    with pytest.raises(ValueError, match="no entries"):
        flightrec.read_dump(pickle.dumps([1, 2]))
    run = FakeRun(loopback.cluster_yaml, tmp_path, "import time\ntime.sleep(60)\n")
    pool = Pool(run.cluster)
    try:
        dumps = flightrec.collect(pool, run.record)
        assert dumps.dumps == {} and dumps.errors == []
        found = flightrec.finding(run.record, dumps)
        assert found.evidence[0] == "no dump from rank(s) 0, 1, 2 (the process died, or its " \
            "watchdog did not fire)"
        assert "CPU/gloo runs write none" in found.detail
    finally:
        run.close()
        pool.close()


def test_preflight_says_where_pyspy_is_missing(loopback, tmp_path: Path) -> None:
    from dataclasses import replace

    from console.training.stacks import pyspy_checks

    cluster = load_cluster(loopback.cluster_yaml)
    names = cluster.names()[:2]
    with Pool(cluster) as pool:
        found = pyspy_checks(pool, names)
    assert [(c.node, c.ok, c.warning) for c in found] == [(n, True, False) for n in names]
    assert found[0].message.endswith("/py-spy (svconsole stacks)")
    bare = tmp_path / "bare-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    elsewhere = replace(cluster, python=str(bare / "bin" / "python"))
    env_path = os.environ["PATH"]
    os.environ["PATH"] = ":".join(p for p in env_path.split(":")
                                  if not Path(p, "py-spy").exists())
    try:
        with Pool(elsewhere) as pool:
            [missing] = pyspy_checks(pool, names[:1])
    finally:
        os.environ["PATH"] = env_path
    assert missing.ok and missing.warning  # a launch goes on; stacks shows states only
    assert missing.message.startswith(f"py-spy missing for {bare}/bin/python: svconsole "
                                      "stacks will show the ranks' states but no stacks; run "
                                      "the setup step py-spy")
