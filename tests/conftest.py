"""Shared pytest fixtures.

Loopback cluster (real OpenSSH sshd processes on 127.0.1.x, see console/ssh/loopback.py):

- ``loopback`` (session scope): a running :class:`console.ssh.loopback.LoopbackCluster` of 4 nodes
  (``node0``..``node3`` on 127.0.1.1..127.0.1.4, one free port for all), ``node2`` prints a banner
  on stdout and stderr for every command. ``loopback.cluster_yaml`` is a ready cluster.yaml (strict
  host keys). A test may break its nodes (``kill``/``hang``/``change_host_key``): every node is put
  back (original key, running) after each test that used the fixture.
- ``fresh_loopback`` (function scope): a factory ``fresh_loopback(n=2, banner_nodes=()) ->
  LoopbackCluster`` for a private cluster, already up, stopped after the test.

Every test also gets a private ``SVCONSOLE_STATE_DIR``, and the session a TORCH_EXTENSIONS_DIR
of its Python environment's own (unless one is set).

Every sshd is stopped at the end of the session, at interpreter exit if a teardown did not run,
and by a watchdog process if pytest itself is killed. SSH tests are skipped only when no sshd binary is installed.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from console.ssh.loopback import LoopbackCluster, find_sshd

# DeepSpeed's JIT-built CPU ops, kept between runs: one cache per Python environment. Two venvs
# sharing one cache rebuild the op in turn (their torch include paths differ), under torch's
# build lock, for half a minute each time; a rank killed then (a drill does) leaves the lock,
# and every later run waits on it at start (pre-flight now names such a lock).
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(
    Path.home() / ".cache" / "svconsole"
    / f"torch_extensions-{hashlib.sha1(sys.prefix.encode()).hexdigest()[:8]}"))

LOOPBACK_NODES = 4
LOOPBACK_BANNER_NODES = (2,)

_running: list[LoopbackCluster] = []


@atexit.register
def _stop_all_loopback() -> None:
    """Last resort: no sshd of ours outlives the test run."""
    for cluster in _running:
        cluster.down()


def _start(directory, n: int, banner_nodes: tuple[int, ...]) -> LoopbackCluster:
    if find_sshd() is None:
        pytest.skip("no sshd binary: install openssh-server (apt-get install openssh-server)")
    cluster = LoopbackCluster(directory, n, base_port=None, banner_nodes=banner_nodes, guard=True)
    _running.append(cluster)
    try:
        cluster.up()
    except BaseException:
        _stop(cluster)
        raise
    return cluster


def _stop(cluster: LoopbackCluster) -> None:
    cluster.down()
    _running.remove(cluster)


@pytest.fixture(scope="session")
def loopback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackCluster]:
    """The session's loopback cluster (4 nodes, node2 with a banner); healed after each test."""
    cluster = _start(tmp_path_factory.mktemp("loopback"), LOOPBACK_NODES, LOOPBACK_BANNER_NODES)
    yield cluster
    _stop(cluster)


@pytest.fixture(autouse=True)
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own svconsole state directory (facts cache, run index, setup runs),
    so neither the developer's real state nor another test's leaks into it."""
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(autouse=True)
def _heal_loopback(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used ``loopback``, put back every node it broke."""
    yield
    if "loopback" in request.fixturenames:
        request.getfixturevalue("loopback").heal()


@pytest.fixture
def fresh_loopback(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., LoopbackCluster]]:
    """Factory of private loopback clusters, up when returned, stopped after the test."""
    made: list[LoopbackCluster] = []

    def make(n: int = 2, banner_nodes: tuple[int, ...] = ()) -> LoopbackCluster:
        cluster = _start(tmp_path_factory.mktemp("fresh-loopback"), n, tuple(banner_nodes))
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        _stop(cluster)
