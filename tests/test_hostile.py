"""Hostile input and hostile neighbours on the nodes (real sshd, the loopback cluster).

- Files svconsole writes on a node never sit at a predictable path in a world-writable
  directory: node-side scripts go into a ``mktemp -d`` directory (0700, the SSH user's), removed
  afterwards, and a symlink planted where the old fixed path was is never followed; the storage
  measurement refuses a symlinked folder in shared_dir.
- Secrets never become world-readable: a run's record (which holds ``--env`` values for resume)
  is written mode 0600 on the node and in the local index; names like ``*TOKEN*`` are shown as
  ``********`` in the plan (CLI and TUI text), the JSON output and the setup logs, while the
  training itself gets the real value.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from console.bringup import Runner, SetupOptions, StepState
from console.bringup.measure import MEASUREMENTS, node_script
from console.bringup.model import Command, Phase, Step
from console.cluster.model import load_cluster
from console.cluster.redact import REDACTED, redact, redact_env, redact_text
from console.ssh.pool import Pool
from console.ssh.remote import script_path
from console.training import runs
from console.training.launch import LaunchPlan, NodePlan, Preparation, launch
from console.training.profile import default_profile


class Recorder:
    """A pool that records every command line and every uploaded path before passing it on
    (the loopback nodes are this machine, so a test can look at what a command left behind)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.commands: list[str] = []
        self.puts: list[tuple[str, str]] = []
        self.put_parents: dict[str, os.stat_result] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)

    def run(self, node: str, cmd: str, **kw: Any):
        with self._lock:
            self.commands.append(cmd)
        return self.pool.run(node, cmd, **kw)

    def stream(self, node: str, cmd: str, **kw: Any):
        with self._lock:
            self.commands.append(cmd)
        return self.pool.stream(node, cmd, **kw)

    def put(self, node: str, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        self.pool.put(node, data, remote_path, mode)
        with self._lock:
            self.puts.append((node, remote_path))
            self.put_parents[remote_path] = os.stat(Path(remote_path).parent)


def world_writable(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IWOTH)


@pytest.fixture
def pool(loopback):
    with Pool(load_cluster(loopback.cluster_yaml)) as p:
        yield p


def test_node_scripts_go_into_a_private_directory_never_a_fixed_tmp_path(pool, tmp_path) -> None:
    # Where the scripts used to go: a neighbour plants a symlink there, to a file of ours.
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    planted = Path("/tmp/svconsole-node1")
    made_link = not planted.exists() and not planted.is_symlink()
    if made_link:
        planted.symlink_to(victim)
    try:
        with node_script(pool, "node1", "burnin.py") as path:
            folder = Path(path).parent
            info = folder.stat()
            assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
            assert Path(path).read_bytes() == script_path("burnin.py").read_bytes()
            assert not str(folder).startswith(str(planted))
        assert not folder.exists(), "the private directory is removed afterwards"
    finally:
        if made_link:
            planted.unlink()
    assert victim.read_text() == "keep me\n"


def test_measurements_write_nothing_in_a_world_writable_place(pool, tmp_path) -> None:
    pytest.importorskip("torch")
    recorder = Recorder(pool)
    steps = [MEASUREMENTS[s] for s in ("gpu-burnin", "collective", "storage")]
    options = SetupOptions(burnin_seconds=0.1, burnin_size=64, bench_mb=1, bench_iters=1,
                           storage_mb=1)
    summary = Runner(recorder, pool.cluster, steps, state_dir=tmp_path, options=options,
                     nodes=["node1", "node2"]).run()
    assert all(c.state in (StepState.DONE, StepState.NOT_APPLICABLE) for c in summary.cells), \
        [(c.step, c.node, c.state, c.detail) for c in summary.cells]
    assert {Path(p).name for _, p in recorder.puts} == {"burnin.py", "collective_bench.py"}
    for path, parent in recorder.put_parents.items():
        assert not parent.st_mode & stat.S_IWOTH, f"{path}: its directory is world-writable"
        assert stat.S_IMODE(parent.st_mode) == 0o700 and parent.st_uid == os.getuid(), path
        assert not Path(path).parent.exists(), f"{path}: its private directory was left behind"
    assert not any("/tmp/svconsole-" in c for c in recorder.commands)


def test_storage_measurement_refuses_a_symlinked_folder(pool, tmp_path) -> None:
    cluster = pool.cluster
    folder = cluster.local_path(cluster.shared_dir) / ".svconsole-io"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    saved = None
    if folder.is_symlink() or folder.exists():
        saved = folder.with_name(".svconsole-io.saved-by-test")
        folder.rename(saved)
    folder.symlink_to(elsewhere)
    try:
        result = MEASUREMENTS["storage"].measure(pool, cluster, ["node1"],
                                                 SetupOptions(storage_mb=1), lambda n, t: None)
    finally:
        folder.unlink()
        if saved is not None:
            saved.rename(folder)
    outcome = result.outcomes["node1"]
    assert outcome.state == StepState.FAILED
    assert "refusing" in outcome.detail and "symlink" in outcome.detail
    assert list(elsewhere.iterdir()) == []


# ------------------------------------------------------------------------------ secrets

TOKEN = "hf_s3cr3t-" + os.urandom(4).hex()


def test_redaction_of_names_like_token_key_secret_password() -> None:
    env = {"HF_TOKEN": TOKEN, "WANDB_API_KEY": TOKEN, "aws_secret_access_key": TOKEN,
           "DB_PASSWORD": TOKEN, "NCCL_DEBUG": "WARN"}
    assert redact_env(env) == {"HF_TOKEN": REDACTED, "WANDB_API_KEY": REDACTED,
                               "aws_secret_access_key": REDACTED, "DB_PASSWORD": REDACTED,
                               "NCCL_DEBUG": "WARN"}
    line = (f"cd /out && env HF_TOKEN='{TOKEN} x' MY_SECRET=\"{TOKEN}\" OMP_NUM_THREADS=4 "
            f"API_KEY={TOKEN} torchrun ssh -o StrictHostKeyChecking=accept-new")
    shown = redact_text(line)
    assert TOKEN not in shown
    assert shown == (f"cd /out && env HF_TOKEN={REDACTED} MY_SECRET={REDACTED} "
                     f"OMP_NUM_THREADS=4 API_KEY={REDACTED} torchrun "
                     f"ssh -o StrictHostKeyChecking=accept-new")
    data = {"plan": {"nodes": [{"env": env, "argv": ["++x=1", f"HF_TOKEN={TOKEN}"]}]}}
    assert TOKEN not in json.dumps(redact(data))
    assert data["plan"]["nodes"][0]["env"]["HF_TOKEN"] == TOKEN  # a copy: the data is kept


def test_run_record_with_env_secrets_is_0600_and_plan_output_redacted(pool, tmp_path) -> None:
    cluster = pool.cluster
    out = tmp_path / "out"
    program = "import os, time; print('token length', len(os.environ['HF_TOKEN']), flush=True)"
    nodes = [NodePlan(n.name, n.host, rank, 1, [sys.executable, "-c", program],
                      {"PYTHONUNBUFFERED": "1", "HF_TOKEN": TOKEN}, str(out),
                      f"{out}/logs/{n.name}.log")
             for rank, n in enumerate(cluster.nodes[:2])]
    plan = LaunchPlan(runs.new_run_id(), cluster.name, nodes[0].node, nodes[0].host, 1, str(out),
                      "train_ds", [], nodes)
    prep = Preparation({}, plan, [], default_profile().replace("output_dir", str(out)))
    text = plan.describe()
    assert f"HF_TOKEN={REDACTED}" in text and TOKEN not in text
    assert TOKEN not in json.dumps(prep.to_dict())
    assert plan.to_dict()["nodes"][0]["env"]["HF_TOKEN"] == TOKEN  # the record keeps it (resume)
    state = tmp_path / "state"
    record = launch(pool, prep, state)
    try:
        shared = Path(record.record_path)
        local = runs.index_dir(state) / f"{record.id}.json"
        for path in (shared, local):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            assert TOKEN in path.read_text()  # there for resume, readable by its owner only
        log = Path(f"{out}/logs/{nodes[0].node}.log")
        deadline = __import__("time").monotonic() + 60
        while "token length" not in (log.read_text() if log.exists() else ""):
            assert __import__("time").monotonic() < deadline, "the training never started"
            __import__("time").sleep(0.2)
        assert f"token length {len(TOKEN)}" in log.read_text()  # the training got the value
        listing = subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True)
        assert TOKEN not in listing.stdout
    finally:
        runs.stop_run(pool, record, grace=5)


def test_setup_logs_hide_secret_assignments(pool, tmp_path) -> None:
    step = Step("print-env", "prints a token", Phase.CONFIGURATION,
                apply=lambda ctx: [Command(f"echo HF_TOKEN={TOKEN}; echo done")])
    seen: list[str] = []
    runner = Runner(pool, pool.cluster, [step], state_dir=tmp_path, nodes=["node2"])
    runner.subscribe(lambda event: seen.append(getattr(event, "text", "")))
    summary = runner.run()
    assert summary.state("print-env", "node2") == StepState.DONE
    log = Path(summary.cell("print-env", "node2").log).read_text()
    assert f"HF_TOKEN={REDACTED}" in log and "done" in log
    assert TOKEN not in log and not any(TOKEN in line for line in seen)
