"""The namespace cluster of the ``test_netns_*`` drills (see console/ssh/netns.py).

``netns_cluster`` (session scope, import it into a test module): 3 nodes in their own network,
UTS and mount namespaces with a real sshd each, shared by every netns test; each node is put back
(no firewall, no extra mount, its /etc/hosts, sshd up) after every test that used it. Under
``CI=true`` a machine that cannot make namespaces FAILS the tests (CI must prove what they
prove); elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator

import pytest

from console.ssh.netns import NetnsCluster, namespaces_unavailable

NETNS_NODES = 3
NETNS_PREFIX = "nsnode"
"""Node names (and hostnames) nsnode0 ..: the nodes share this machine's /proc with the loopback
clusters' node0 .., and runs are told apart by node name there."""
_running: list[NetnsCluster] = []


@atexit.register
def _down_all() -> None:
    for cluster in _running:
        cluster.down()


def require_namespaces() -> None:
    """Fail under CI, skip elsewhere, when this machine cannot make a namespace cluster."""
    reason = namespaces_unavailable()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but the namespace cluster cannot be made: {reason}")
    pytest.skip(f"namespace cluster unavailable: {reason}")


@pytest.fixture(scope="session")
def netns_cluster_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    require_namespaces()
    cluster = NetnsCluster(tmp_path_factory.mktemp("netns"), NETNS_NODES, prefix=NETNS_PREFIX,
                           guard=True)
    _running.append(cluster)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
        _running.remove(cluster)


@pytest.fixture
def netns_cluster(netns_cluster_session: NetnsCluster) -> Iterator[NetnsCluster]:
    """The session's namespace cluster, every node put back after the test."""
    yield netns_cluster_session
    for i in range(netns_cluster_session.n):
        netns_cluster_session.reset(i)
