"""The launch: the exact plan, pre-flight checks on loopback nodes, and end to end the real tiny
SenseVoice trained by FunASR's train_ds.py under torchrun + DeepSpeed ZeRO-1 (gloo) on two
loopback nodes through ``svconsole launch``; the console exits mid-run and a new one reattaches;
a resumed relaunch continues from output_dir/model.pt and ``svconsole stop`` ends every rank.

DeepSpeed JIT-compiles a CPU comm op on first use (~35 s); it is cached in TORCH_EXTENSIONS_DIR
(~/.cache/svconsole/torch_extensions, shared with tests/test_tiny_sensevoice.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
import yaml

from console.cli import main
from console.cluster.model import ClusterEditor, load_cluster, parse_cluster
from console.commands import launch as launch_command
from console.ssh.pool import Pool
from console.training import launch as launching
from console.training import runs
from console.training.flightrec import recorder_env
from console.training.follow import RunFollower, run_metrics
from console.training.launch import (
    Check,
    LaunchError,
    LaunchOptions,
    LaunchPlan,
    NodeInfo,
    NodePlan,
    PlanError,
    Preparation,
    build_plan,
    prepare,
)
from console.training.logparse import TrainStep, parse_file
from console.training.profile import default_profile

CLUSTER_YAML = """\
cluster:
  name: lab
  shared_dir: /nfs/shared
  master: a
  master_port: 29500
  python: /opt/venv/bin/python
nodes:
  - name: a
    host: 10.0.0.1
    gpus: [0, 1]
  - name: b
    host: 10.0.0.2
"""
SAMPLE = {"key": "k1", "source": "/nfs/shared/wav/k1.wav", "source_len": 150,
          "target": "hello world", "target_len": 2, "text_language": "<|en|>",
          "emo_target": "<|NEUTRAL|>", "event_target": "<|Speech|>",
          "with_or_wo_itn": "<|woitn|>"}


def info(node: str, **kw) -> NodeInfo:
    base = {"python": "/opt/venv/bin/python", "train_ds": "/opt/venv/lib/funasr/bin/train_ds.py",
            "torchrun": "/opt/venv/bin/torchrun", "cpus": 32,
            "versions": {"torch": "2.13.0", "deepspeed": "0.19.8", "funasr": "1.4.16"}}
    return NodeInfo(node, **{**base, **kw})


# ---------------------------------------------------------------- the plan (no I/O)


def test_plan_is_exact_per_node():
    cluster = parse_cluster(CLUSTER_YAML)
    profile = default_profile().replace("output_dir", "/nfs/shared/out/")
    nccl = {"exists": True, "values": {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"}}
    infos = {"a": info("a", gpus=[0, 1, 2, 3], env_file=nccl),
             "b": info("b", gpus=[0, 1, 2, 3], torchrun=None, env_file=nccl)}
    plan = build_plan(cluster, profile, infos, LaunchOptions(env={"NCCL_DEBUG": "WARN"}),
                      run_id="r1")
    a, b = plan.nodes
    overrides = profile.to_overrides()
    assert a.argv == ["/opt/venv/bin/torchrun", "--nnodes", "2", "--nproc-per-node", "2",
                      "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29500",
                      "/opt/venv/lib/funasr/bin/train_ds.py", *overrides]
    assert b.argv[:14] == ["/opt/venv/bin/python", "-m", "torch.distributed.run", "--nnodes", "2",
                           "--nproc-per-node", "4", "--node-rank", "1", "--master-addr",
                           "10.0.0.1", "--master-port", "29500",
                           "/opt/venv/lib/funasr/bin/train_ds.py"]
    assert a.env == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_SOCKET_IFNAME": "eth0",
                     "NCCL_IB_DISABLE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "16",
                     "NCCL_DEBUG": "WARN", **recorder_env("/nfs/shared/out", "r1")}
    assert b.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and b.env["OMP_NUM_THREADS"] == "8"
    assert (a.cwd, a.log, b.log) == ("/nfs/shared/out", "/nfs/shared/out/logs/a.log",
                                     "/nfs/shared/out/logs/b.log")
    assert plan.world_size == 6 and plan.env_file == "/nfs/shared/svconsole/nccl/{node}.env"
    text = plan.describe()
    for needed in ("world size 6", "NCCL_SOCKET_IFNAME=eth0", "CUDA_VISIBLE_DEVICES=0,1",
                   "log: /nfs/shared/out/logs/b.log", "++train_conf.use_deepspeed=true",
                   "--node-rank 1", "torch.distributed.run"):
        assert needed in text, needed
    assert LaunchPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_edited_deepspeed_json_is_shipped_with_the_run(lb2, tmp_path):
    """The JSON saved by the Config screen goes to every node for this run, and the run's
    ++train_conf.deepspeed_config points there; pre-flight validates that very text."""
    lb, pool = lb2
    cluster = pool.cluster
    out = str(lb.shared_dir / "out")
    profile = default_profile().replace("output_dir", out)
    edited = json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                         "bf16": {"enabled": False}, "zero_optimization": {"stage": 7}})
    infos = {n.name: info(n.name, gpus=[0]) for n in cluster.nodes}
    options = LaunchOptions(deepspeed_json=edited)
    run_id = runs.new_run_id()
    plan = build_plan(cluster, profile, infos, options, run_id=run_id)
    shipped = f"{out}/svconsole/{run_id}/ds_config.json"
    assert f"++train_conf.deepspeed_config={shipped}" in plan.overrides
    check = launching._config_check(pool, plan, profile, infos)
    assert not check.ok and "zero_optimization.stage" in check.message, check
    # launch writes the text on the nodes (a stand-in command instead of torchrun)
    for node in plan.nodes:
        node.argv[:] = ["true"]
    record = launching.launch(pool, Preparation(infos, plan, [], profile), tmp_path)
    runs.stop_run(pool, record, grace=2)
    assert Path(shipped).read_text() == edited


def test_cpu_entry_is_explicit_and_bad_nodes_are_named():
    cluster = parse_cluster(CLUSTER_YAML)
    profile = default_profile()
    plan = build_plan(cluster, profile, {"a": info("a", gpus=None), "b": info("b", gpus=None)},
                      LaunchOptions(entry="cpu-wrapper", nproc_per_node=2))
    entry = f"{profile.output_dir}/svconsole/sv_train_cpu.py"
    assert all(n.argv[11] == entry and n.argv[-2:] == ["++device=cpu", "++backend=gloo"]
               for n in plan.nodes)
    assert plan.world_size == 4 and "entry cpu-wrapper" in plan.describe()
    with pytest.raises(PlanError) as err:
        build_plan(cluster, profile, {"a": info("a", gpus=[0]),
                                      "b": info("b", gpus=[], error=None)})
    assert str(err.value) == "b: no GPU found (use the cpu-wrapper entry to train on CPUs)"
    with pytest.raises(PlanError, match="a: unreachable\nb: funasr/bin/train_ds.py not found "
                                        r"\(funasr is not installed"):
        build_plan(cluster, profile, {
            "a": NodeInfo("a", error="unreachable"),
            "b": info("b", train_ds=None,
                      train_ds_error="funasr is not installed for /usr/bin/python3")})
    assert launch_command.ENTRIES == launching.ENTRIES


def test_versions_must_match_on_every_node():
    infos = {"a": info("a"), "b": info("b"),
             "c": info("c", versions={"torch": "2.11.0", "deepspeed": "0.19.8", "funasr": None})}
    check = launching._same_versions(infos)
    assert not check.ok
    assert check.message == ("torch: 2.13.0 on a, b; 2.11.0 on c | "
                             "funasr: 1.4.16 on a, b; missing on c")


# ---------------------------------------------------------------- pre-flight on loopback nodes


@pytest.fixture
def lb2(fresh_loopback):
    lb = fresh_loopback(2)
    pool = Pool(load_cluster(lb.cluster_yaml))
    yield lb, pool
    pool.close()


def test_preflight_names_every_failure_and_launch_refuses(lb2, tmp_path):
    lb, pool = lb2
    cluster = pool.cluster
    train = lb.shared_dir / "train.jsonl"
    train.write_text(json.dumps(SAMPLE) + "\n")
    profile = (default_profile().replace("output_dir", str(lb.shared_dir / "out"))
               .replace("train_data_set_list", str(train))
               .replace("valid_data_set_list", str(lb.shared_dir / "missing.jsonl"))
               .replace("train_conf.use_deepspeed", False))
    # another run alive on node1, and the master port taken on the master
    busy = runs.new_run_id()
    other = LaunchPlan(busy, cluster.name, "node1", "127.0.1.2", 1, str(lb.shared_dir / "other"),
                       "train_ds", [], [NodePlan("node1", "127.0.1.2", 0, 1, ["sleep", "120"], {},
                                                 str(lb.shared_dir),
                                                 f"{lb.shared_dir}/other/logs/node1.log")])
    record = launching.launch(pool, Preparation({}, other, [], profile), tmp_path)
    port = socket.socket()
    port.bind(("127.0.1.1", cluster.master_port))
    port.listen()
    try:
        started = time.monotonic()
        prep = prepare(pool, profile, LaunchOptions(entry="cpu-wrapper"))
        took = time.monotonic() - started
    finally:
        port.close()
        runs.stop_run(pool, record, grace=2)
    failed = {(c.name, c.node): c.message for c in prep.failures}
    missing = f"{lb.shared_dir}/missing.jsonl: No such file or directory"
    assert failed == {
        ("data", "node0"): missing, ("data", "node1"): missing,
        ("master port", "node0"): f"port {cluster.master_port} is in use (Address already in use)",
        ("no other run", "node1"): f"svconsole run {busy} (pids "
                                   f"{failed[('no other run', 'node1')].split('(pids ')[1]}",
        **{("data files", n): f"{train}: 1 of 1 sampled audio files do not exist on {n}: "
                              f"line 1: {SAMPLE['source']}. Every rank would fail reading them. "
                              f"Fix: put the audio on storage every node mounts at the same "
                              f"path, or fix the paths in the list" for n in ("node0", "node1")},
    }, failed
    assert Check("data format", True, f"{train}: SenseVoice fields present") in prep.checks
    assert prep.plan is not None and prep.plan.world_size == 2
    assert took < 30, took
    with pytest.raises(LaunchError, match="pre-flight failed:\n.*data: node0: "):
        launching.launch(pool, prep, tmp_path)


def test_a_build_lock_left_by_a_killed_build_is_named_before_launch(lb2, tmp_path):
    """torch's JIT build lock (``<TORCH_EXTENSIONS_DIR>/<op>/lock``), left by a rank killed
    while it loaded DeepSpeed's op (seen here: every later run hung at start, in
    FileBaton.wait, for good): old and with no build running, pre-flight fails on every node
    and says which file to remove; a fresh one is a build under way (a warning); none, ok."""
    lb, pool = lb2
    extensions = tmp_path / "torch_extensions"
    lock = extensions / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    profile = default_profile().replace("output_dir", str(lb.shared_dir / "out"))

    def checks() -> dict[str, Check]:
        prep = prepare(pool, profile, LaunchOptions(entry="cpu-wrapper",
                                                    env={"TORCH_EXTENSIONS_DIR": str(extensions)}))
        return {c.node: c for c in prep.checks if c.name == "build locks"}

    fresh = checks()
    assert set(fresh) == {"node0", "node1"}
    assert all(c.ok and c.warning and str(lock) in c.message for c in fresh.values()), fresh
    old = time.time() - 600
    os.utime(lock, (old, old))
    stale = checks()
    assert all(not c.ok and f"rm {lock}" in c.message and "killed midway" in c.message
               for c in stale.values()), stale
    lock.unlink()
    assert all(c.ok and not c.warning for c in checks().values())


def test_plan_takes_each_nodes_nccl_env_from_setup(lb2, tmp_path):
    """What setup's nccl-env step writes on shared storage is what the launch sets on each node."""
    from console.bringup.catalog import CATALOG
    from console.bringup.runner import Runner

    lb, pool = lb2
    assert Runner(pool, pool.cluster, [CATALOG["nccl-env"]], state_dir=tmp_path).run().ok
    train = lb.shared_dir / "train.jsonl"
    train.write_text(json.dumps(SAMPLE) + "\n")
    profile = (default_profile().replace("output_dir", str(lb.shared_dir / "out"))
               .replace("train_data_set_list", str(train))
               .replace("valid_data_set_list", str(train))
               .replace("train_conf.use_deepspeed", False))
    prep = prepare(pool, profile, LaunchOptions(entry="cpu-wrapper"))
    assert prep.plan is not None and "nccl/{node}.env" in prep.plan.describe()
    for node in prep.plan.nodes:
        assert node.env["NCCL_SOCKET_IFNAME"] and node.env["GLOO_SOCKET_IFNAME"], node.env
        assert "NCCL_TIMEOUT" not in node.env


# ---------------------------------------------------------------- end to end: real training


def _needs_training_stack() -> None:
    for module in ("torch", "deepspeed", "funasr", "kaldi_native_fbank", "sentencepiece"):
        if importlib.util.find_spec(module) is None:  # not imported: svconsole launch does
            pytest.skip(f"{module} is not installed")
    if shutil.which("g++") is None:
        pytest.skip("g++ missing: DeepSpeed cannot build its CPU comm op")


def tiny_profile(tiny, out: Path, max_epoch: int) -> dict:
    return {
        "model": str(tiny.model_dir), "train_data_set_list": str(tiny.train_jsonl),
        "valid_data_set_list": str(tiny.valid_jsonl), "output_dir": str(out),
        "params_millions": 1.8,
        "dataset_conf": {"batch_size": 500, "batch_type": "token", "sort_size": 64,
                         "num_workers": 0, "data_split_num": 1},
        "train_conf": {"max_epoch": max_epoch, "log_interval": 1, "validate_interval": 100000,
                       "save_checkpoint_interval": 100000, "keep_nbest_models": 5,
                       "avg_keep_nbest_models_type": "loss", "resume": True,
                       "use_deepspeed": True, "deepspeed_config": str(tiny.ds_config)},
        "optim_conf": {"lr": 0.0002},
        "extra": {"disable_update": True, "dataset_conf.batch_sampler": "BatchSampler",
                  "train_conf.avg_nbest_model": 2},
    }


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def tagged(run_id: str) -> list[int]:
    """Live processes on this machine (every loopback node) that belong to the run."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and f"SVCONSOLE_RUN_ID={run_id}\0".encode() in env:
            found.append(int(entry))
    return found


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.5)


def train_rows(record: runs.RunRecord) -> list[tuple[str, int, int, int, float]]:
    """(node, rank, epoch, total step, loss) of every train line of the run, read from the files."""
    rows = []
    for node in record.nodes:
        for event in parse_file(node.log):
            if event.offset >= node.log_offset and isinstance(event, TrainStep):
                rows.append((node.node, event.rank, event.epoch, event.total_step, event.loss))
    return rows


@pytest.mark.slow
def test_tiny_sensevoice_two_nodes_launch_reattach_resume_stop(fresh_loopback, tmp_path,
                                                               capsys, monkeypatch):
    _needs_training_stack()
    from svconsole_scripts import tiny_sensevoice

    lb = fresh_loopback(2)
    tiny = tiny_sensevoice.make(lb.shared_dir / "tiny", samples=8, seconds=1.5)
    out = lb.shared_dir / "exp"
    profile_file = tmp_path / "training.yaml"
    profile_file.write_text(yaml.safe_dump(tiny_profile(tiny, out, max_epoch=1)))
    state = tmp_path / "state"
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(state))
    cache = os.environ.get("TORCH_EXTENSIONS_DIR",
                           str(Path.home() / ".cache" / "svconsole" / "torch_extensions"))
    common = ["--config", str(lb.cluster_yaml)]
    pool = Pool(load_cluster(lb.cluster_yaml))
    others: list[tuple[runs.RunRecord, Path]] = []  # the other cluster's run, for the clean-up
    try:
        # 1. svconsole launch (a whole console process: it exits while the training runs)
        code, stdout, err = cli(capsys, *common, "launch", "--profile", str(profile_file),
                                "--entry", "cpu-wrapper", "--env", f"TORCH_EXTENSIONS_DIR={cache}",
                                "--yes", "--json")
        reply = json.loads(stdout)
        assert code == 0, (reply["message"], [c for c in reply["checks"] if not c["ok"]], err)
        first = runs.RunRecord.from_dict(reply["run"])
        assert {n["node"] for n in reply["plan"]["nodes"]} == {"node0", "node1"}
        assert all("--nnodes" in n["argv"] and n["argv"][n["argv"].index("--nnodes") + 1] == "2"
                   for n in reply["plan"]["nodes"])
        assert tagged(first.id), "the training did not outlive the console"

        # 2. a new console finds the live run and follows it to the end
        (live,) = runs.find_runs(pool, state, live_only=True)
        assert live.record.id == first.id
        follower = RunFollower(pool, live.record, interval=0.5)
        seen: list = []
        follower.subscribe(lambda update: seen.extend(update.events))
        with follower:
            assert follower.wait(400), {n: (f.state, f.error) for n, f in
                                        follower.followers.items()}
        status = runs.run_status(pool, first)
        assert status.state == "finished", [open(n.log).read()[-2000:] for n in first.nodes]
        rows = train_rows(first)
        assert {(node, rank) for node, rank, *_ in rows} == {("node0", 0), ("node1", 1)}
        followed = [(node, e.rank, e.epoch, e.total_step, e.loss) for node, e in seen
                    if isinstance(e, TrainStep)]
        assert sorted(followed) == sorted(rows) and len(rows) >= 2
        again = run_metrics(pool, first)  # svconsole metrics RUN's engine
        assert again.progress().total_step == follower.store.progress().total_step == \
            max(r[3] for r in rows)
        for tag in ("model.pt", "model.pt.ep1"):
            assert (out / tag / "mp_rank_00_model_states.pt").is_file(), tag
            for rank in (0, 1):
                assert (out / tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").is_file()

        code, stdout, _ = cli(capsys, *common, "logs", first.id, "--node", "node1")
        lines = stdout.splitlines()
        assert code == 0 and lines and all(line.startswith("node1: ") for line in lines)
        assert len(lines) == len(list(parse_file(first.node("node1").log)))

        code, stdout, _ = cli(capsys, *common, "metrics", first.id, "--json")
        doc = json.loads(stdout)
        assert code == 0 and {f["node"] for f in doc["files"]} == {"node0", "node1"}
        cli_rows = sorted((r["node"], r["rank"], r["epoch"], r["total_step"], r["loss_avg_rank"])
                          for r in doc["lines"] if r["kind"] == "train")
        assert cli_rows == sorted(rows)

        # 3. output_dir holds the finished run's checkpoint: a plain launch asks for a choice,
        # and resuming without more epochs is refused (nothing is started by either)
        for extra in ([], ["--resume", first.id]):
            code, stdout, _ = cli(capsys, *common, "launch", "--profile", str(profile_file),
                                  "--entry", "cpu-wrapper", *extra, "--yes", "--json")
            reply = json.loads(stdout)
            failed = {c["name"]: c["message"] for c in reply["checks"] if not c["ok"]}
            assert code == 1 and "run" not in reply and set(failed) == {"checkpoint"}, failed
            assert ("choose: --resume" if not extra else "finished its max_epoch 1") in \
                failed["checkpoint"] and "model.pt.ep1: epoch 1, its end" in failed["checkpoint"]

        # 4. resume with more epochs (more than it gets: it is stopped mid-training)
        profile_file.write_text(yaml.safe_dump(tiny_profile(tiny, out, max_epoch=400)))
        code, stdout, err = cli(capsys, *common, "launch", "--resume", first.id, "--profile",
                                str(profile_file), "--yes", "--json")
        reply = json.loads(stdout)
        assert code == 0, (reply["message"], err)
        second = runs.RunRecord.from_dict(reply["run"])
        assert second.resumed_from == first.id
        assert "++train_conf.resume=true" in reply["plan"]["overrides"]
        wait_for(lambda: any(r[2] >= 1 for r in train_rows(second)), 300,
                 "a train line of the resumed run")
        log0 = Path(second.node("node0").log).read_bytes()[second.node("node0").log_offset:]
        assert f"Checkpoint loaded successfully from '{out / 'model.pt'}'".encode() in log0
        assert min(r[2] for r in train_rows(second)) == 1  # epoch 0 was not trained again

        # 5. a second cluster over the same machines (same name, node names and addresses,
        # other SSH ports) trains at the same time: neither lists nor stops the other's run
        theirs, theirs_yaml = _train_another_cluster_alongside(
            fresh_loopback, tmp_path, capsys, monkeypatch, cache, pool.cluster.master_port,
            others)
        monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(state))
        assert tagged(theirs.id) and tagged(second.id)  # both train now
        code, stdout, _ = cli(capsys, *common, "runs", "--json")
        assert {r["id"] for r in json.loads(stdout)} == {first.id, second.id}

        code, stdout, _ = cli(capsys, *common, "stop", second.id[:17], "--yes", "--grace", "5")
        assert code == 0, stdout
        assert "none left" in stdout and not tagged(second.id)
        code, stdout, _ = cli(capsys, *common, "runs", "--json")
        states = {r["id"]: r["state"] for r in json.loads(stdout)}
        assert states == {first.id: "finished", second.id: "stopped"}
        assert tagged(theirs.id), "stopping our run touched the other cluster's"
        wait_for(lambda: not tagged(theirs.id), 400, "the other cluster's run to end")
        with Pool(load_cluster(theirs_yaml)) as pool_b:
            status = runs.run_status(pool_b, theirs)
        assert status.state == "finished", [open(n.log).read()[-2000:] for n in theirs.nodes]
    finally:
        for record, cluster_yaml in others:
            if tagged(record.id):
                with Pool(load_cluster(cluster_yaml)) as pool_b:
                    runs.stop_run(pool_b, record, grace=2)
        for record in runs.load_index(state):  # whatever was launched, even if a step failed
            if tagged(record.id):
                runs.stop_run(pool, record, grace=2)
        pool.close()


def _train_another_cluster_alongside(fresh_loopback, tmp_path, capsys, monkeypatch, cache: str,
                                     taken_port: int, others: list
                                     ) -> tuple[runs.RunRecord, Path]:
    """Cluster B: its own cluster.yaml (another id), state directory and tiny set, launched with
    the CLI while cluster A trains on the same addresses. Its pre-flight names A's run as another
    cluster's (a warning) and refuses the master port A's rendezvous holds; on another port it
    launches, and A's run is nowhere in what B lists. Returns B's run, once it is stepping, and
    B's cluster.yaml (both also put in ``others``, for the test's clean-up)."""
    from svconsole_scripts import tiny_sensevoice

    lb = fresh_loopback(2)
    editor = ClusterEditor(lb.cluster_yaml)  # both cluster.yaml files name the same port
    editor.set("cluster.master_port", taken_port)
    editor.save()
    state = tmp_path / "state-b"
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(state))
    tiny = tiny_sensevoice.make(lb.shared_dir / "tiny", samples=8, seconds=1.5)
    profile_file = tmp_path / "training-b.yaml"
    profile_file.write_text(yaml.safe_dump(tiny_profile(tiny, lb.shared_dir / "exp", 60)))
    launch = ["--config", str(lb.cluster_yaml), "launch", "--profile", str(profile_file),
              "--entry", "cpu-wrapper", "--env", f"TORCH_EXTENSIONS_DIR={cache}", "--yes",
              "--json"]
    code, stdout, _ = cli(capsys, *launch, "--dry-run")
    reply = json.loads(stdout)
    checks = {(c["name"], c["node"]): c for c in reply["checks"]}
    for node in ("node0", "node1"):
        other = checks[("no other run", node)]
        assert other["ok"] and other["warning"] and "of another cluster" in other["message"], other
    taken = checks[("master port", "node0")]
    assert not taken["ok"] and f"port {taken_port} is in use" in taken["message"], taken
    code, stdout, err = cli(capsys, *launch, "--master-port", str(taken_port + 7))
    reply = json.loads(stdout)
    assert code == 0, (reply["message"], [c for c in reply["checks"] if not c["ok"]], err)
    theirs = runs.RunRecord.from_dict(reply["run"])
    others.append((theirs, lb.cluster_yaml))
    wait_for(lambda: train_rows(theirs), 300, "a train line of the other cluster's run")
    code, stdout, _ = cli(capsys, "--config", str(lb.cluster_yaml), "runs", "--json")
    assert [r["id"] for r in json.loads(stdout)] == [theirs.id]
    return theirs, lb.cluster_yaml


def test_resume_profile_forces_resume_and_takes_changes():
    profile = default_profile().replace("train_conf.resume", False)
    record = runs.RunRecord("r1", 0.0, "lab", "/o", "a", [], {}, profile.to_dict())
    again = launching.resume_profile(record, **{"train_conf.max_epoch": 7})
    assert again.train_conf.resume is True and again.train_conf.max_epoch == 7
    assert again.to_overrides() == [o.replace("resume=false", "resume=true")
                                    .replace("max_epoch=50", "max_epoch=7")
                                    for o in profile.to_overrides()]


# ---------------------------------------------------------------- resume on purpose


def test_checkpoint_choice_rules():
    profile = default_profile().replace("output_dir", "/o").replace("train_conf.max_epoch", 2)
    end = {"path": "/o/model.pt", "saved": 0.0, "name": "model.pt.ep2", "epoch": 2, "step": None}
    mid = {**end, "name": "model.pt.ep1.400", "epoch": 1, "step": 400}

    def check(ck, choice, p=profile):
        return launching.checkpoint_check(ck, p, LaunchOptions(checkpoint=choice))

    assert check(None, "refuse").ok and check(None, "fresh").ok
    assert not check(None, "resume").ok  # nothing to resume
    refused = check(mid, "refuse")
    assert not refused.ok and "model.pt.ep1.400: epoch 1, step 400" in refused.message
    assert "--resume" in refused.message and "--fresh" in refused.message
    resumed = profile.replace("train_conf.resume", True)
    assert check(mid, "resume", resumed).ok
    finished = check(end, "resume", resumed)
    assert not finished.ok and "finished its max_epoch 2; raise train_conf.max_epoch" in \
        finished.message
    assert check(end, "resume", resumed.replace("train_conf.max_epoch", 3)).ok
    assert not check(mid, "resume", profile.replace("train_conf.resume", False)).ok
    assert check(end, "fresh").ok and "moved aside" in check(end, "fresh").message


def test_launch_into_a_checkpoint_needs_a_choice_and_fresh_moves_it_aside(lb2, tmp_path):
    """The nodes report output_dir's model.pt with the newest model.pt.ep* beside it; a plain
    launch fails that check, --fresh moves the old output_dir aside (kept whole) and starts in
    an empty one."""
    lb, pool = lb2
    out = lb.shared_dir / "out"
    out.mkdir()
    for name in ("model.pt.ep1", "model.pt.ep2.120", "model.pt"):
        (out / name).write_text(name)
        time.sleep(0.02)  # newest by mtime: ep2.120 (model.pt is a copy of it)
    profile = default_profile().replace("output_dir", str(out)) \
        .replace("train_conf.use_deepspeed", False)
    prep = prepare(pool, profile, LaunchOptions(entry="cpu-wrapper"))
    [check] = [c for c in prep.checks if c.name == "checkpoint"]
    assert not check.ok and "model.pt.ep2.120: epoch 2, step 120" in check.message, check
    for node in prep.plan.nodes:  # a run that trained there before, and finished
        node.argv[:] = ["true"]
    before = launching.launch(pool, prep, tmp_path, force=True)
    deadline = time.monotonic() + 60
    while runs.run_status(pool, before).state != "finished" and time.monotonic() < deadline:
        time.sleep(0.3)
    fresh = prepare(pool, profile, LaunchOptions(entry="cpu-wrapper", checkpoint="fresh"))
    assert [c.ok for c in fresh.checks if c.name == "checkpoint"] == [True]
    for node in fresh.plan.nodes:
        node.argv[:] = ["true"]
    record = launching.launch(pool, fresh, tmp_path, force=True)
    runs.stop_run(pool, record, grace=2)
    [aside] = [p for p in lb.shared_dir.iterdir() if p.name.startswith("out.")]
    assert sorted(p.name for p in aside.iterdir() if p.name.startswith("model")) == \
        ["model.pt", "model.pt.ep1", "model.pt.ep2.120"]
    assert not (out / "model.pt").exists() and (out / "svconsole-run.json").exists()
    # the earlier run moved with its files: still finished, not lost
    [moved] = [r for r in runs.load_index(tmp_path) if r.id == before.id]
    assert moved.output_dir == str(aside) and moved.node("node0").log.startswith(f"{aside}/")
    assert runs.run_status(pool, moved).state == "finished"


def test_a_model_pt_cut_short_by_a_stop_is_named_before_a_resume(lb2, tmp_path):
    """Seen in CI: the walkthrough's stop came while FunASR copied model.pt.ep12 to model.pt,
    and the resume failed with EOFError: Ran out of input. The nodes compare model.pt's files
    with the newest model.pt.ep*: an empty or shorter one fails the checkpoint check, naming
    the file and the copy that mends it; --fresh moves it aside as usual."""
    lb, pool = lb2
    out = lb.shared_dir / "out"
    for name, sizes in (("model.pt.ep12", (7381, 7364)), ("model.pt", (0, 7364))):
        (out / name).mkdir(parents=True)
        for file, size in zip(("mp_rank_00_model_states.pt",
                               "zero_pp_rank_0_mp_rank_00_optim_states.pt"), sizes, strict=True):
            (out / name / file).write_bytes(b"x" * size)
    profile = default_profile().replace("output_dir", str(out)) \
        .replace("train_conf.use_deepspeed", False).replace("train_conf.resume", True)

    def check(choice: str) -> Check:
        prep = prepare(pool, profile, LaunchOptions(entry="cpu-wrapper", checkpoint=choice))
        (found,) = [c for c in prep.checks if c.name == "checkpoint"]
        return found

    broken = check("resume")
    assert not broken.ok and "model.pt is incomplete (mp_rank_00_model_states.pt is 0 bytes, " \
        "model.pt.ep12's 7381)" in broken.message, broken
    assert f"cp -a {out}/model.pt.ep12/. {out}/model.pt/" in broken.message
    assert not check("refuse").ok and check("fresh").ok
    (out / "model.pt" / "mp_rank_00_model_states.pt").write_bytes(b"x" * 7381)  # mended
    assert check("resume").ok


# ---------------------------------------------------------------- the master's address


def test_master_address_is_one_the_workers_reach():
    """A local head: the address a worker says the console connected from (SSH_CONNECTION),
    or the head's host from cluster.yaml; none known: refused. Loopback addresses only when
    every node is on this machine."""
    def cluster(head: str) -> str:
        return ("cluster: {name: lab, shared_dir: /data/shared}\nnodes:\n"
                f"  - {{name: head, role: head, {head}}}\n"
                "  - {name: w1, host: 10.0.0.11}\n  - {name: w2, host: 10.0.0.12}\n")

    infos = {n: info(n, gpus=[0]) for n in ("head", "w1", "w2")}
    routed = {**infos, "w1": info("w1", gpus=[0], ssh_client="10.0.0.1")}
    profile = default_profile()
    local = parse_cluster(cluster("local: true"))
    plan = build_plan(local, profile, routed)
    assert plan.master_addr == "10.0.0.1"
    assert all(n.argv[n.argv.index("--master-addr") + 1] == "10.0.0.1" for n in plan.nodes)
    with pytest.raises(PlanError, match="head: the master is this machine .* set head's host"):
        build_plan(local, profile, infos)
    named = parse_cluster(cluster("local: true, host: 10.0.0.1"))
    assert build_plan(named, profile, infos).master_addr == "10.0.0.1"
    loop = parse_cluster(cluster("host: 127.0.0.1"))
    with pytest.raises(PlanError, match="the master is this machine \\(127.0.0.1\\)"):
        build_plan(loop, profile, infos)
    assert build_plan(loop, profile, routed).master_addr == "10.0.0.1"
    same_machine = parse_cluster(cluster("host: 127.0.1.1").replace("10.0.0.", "127.0.1."))
    assert build_plan(same_machine, profile, infos).master_addr == "127.0.1.1"
    alone = parse_cluster("cluster: {name: one}\nnodes:\n  - {name: head, local: true}\n")
    assert build_plan(alone, profile, {"head": info("head", gpus=[0])}).master_addr
