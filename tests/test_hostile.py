"""Hostile input and hostile neighbours on the nodes (real sshd, the loopback cluster).

- Files svconsole writes on a node never sit at a predictable path in a world-writable
  directory: node-side scripts go into a ``mktemp -d`` directory (0700, the SSH user's), removed
  afterwards, and a symlink planted where the old fixed path was is never followed; the storage
  measurement refuses a symlinked folder in shared_dir.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from console.bringup import Runner, SetupOptions, StepState
from console.bringup.measure import MEASUREMENTS, node_script
from console.cluster.model import load_cluster
from console.ssh.pool import Pool
from console.ssh.remote import script_path


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
