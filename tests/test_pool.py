"""The SSH session pool against real sshd processes (console/ssh/loopback.py), no mocks."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from pathlib import Path

from console import cli
from console.cluster.model import Cluster, Node, load_cluster
from console.ssh.loopback import LoopbackCluster
from console.ssh.pool import MAX_LINE, Line, NodeState, NodeStatus, Pool, _LineSplitter


def cluster_of(lb: LoopbackCluster, **ssh: object) -> Cluster:
    """The harness's cluster.yaml, loaded, with some ``ssh:`` settings changed."""
    cluster = load_cluster(lb.cluster_yaml)
    return dataclasses.replace(cluster, ssh=dataclasses.replace(cluster.ssh, **ssh))


def local_cluster(name: str = "here") -> Cluster:
    return Cluster(name="local", nodes=(Node(name=name, host="localhost", local=True),))


def _hex(address: str, port: int) -> str:
    """An IPv4 endpoint as /proc/net/tcp writes it (address bytes little-endian)."""
    return "".join(f"{int(o):02X}" for o in reversed(address.split("."))) + f":{port:04X}"


def established(local: tuple[str, int] | None = None,
                remote: tuple[str, int] | None = None) -> list[int]:
    """Socket inodes of ESTABLISHED TCP connections with that local and/or remote endpoint."""
    found = []
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        if fields[3] != "01":
            continue
        if local and fields[1] != _hex(*local):
            continue
        if remote and fields[2] != _hex(*remote):
            continue
        found.append(int(fields[9]))
    return found


def own_sockets() -> set[int]:
    """Inodes of the sockets this test process holds."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def endpoint(lb: LoopbackCluster, i: int) -> tuple[str, int]:
    node = lb.node(i)
    return node.address, node.port


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------


def test_fan_out_to_eight_nodes(fresh_loopback) -> None:
    lb = fresh_loopback(8)
    with Pool(cluster_of(lb)) as pool:
        results = pool.run_all('echo "$SSH_CONNECTION"; echo to-stderr >&2; exit 7')
        assert list(results) == lb.nodes
        for i, name in enumerate(lb.nodes):
            r = results[name]
            assert r.error is None, r
            assert r.exit == 7 and not r.ok
            # SSH_CONNECTION = client_ip client_port server_ip server_port: this node's sshd
            assert r.stdout.split()[2:] == [lb.node(i).address, str(lb.node(i).port)]
            assert r.stderr.endswith("to-stderr\n")
        assert {pool.connection_count(n) for n in lb.nodes} == {1}
        again = list(pool.iter_run_all("hostname", nodes=["node3", "node5"]))
        assert sorted(r.node for r in again) == ["node3", "node5"] and all(r.ok for r in again)
        assert {pool.connection_count(n) for n in lb.nodes} == {1}


def test_many_callers_share_one_connection_per_node(loopback) -> None:
    callers = 50
    barrier = threading.Barrier(callers)
    outputs: dict[int, str] = {}

    with Pool(cluster_of(loopback)) as pool:
        def caller(i: int) -> None:
            barrier.wait()  # everybody races to open the connections at once
            r = pool.run(f"node{i % loopback.n}", f"echo {i}", timeout=60)
            outputs[i] = r.stdout.splitlines()[-1] if r.ok else f"failed: {r}"  # node2: banner

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outputs == {i: str(i) for i in range(callers)}
        mine = own_sockets()
        for i, name in enumerate(loopback.nodes):
            assert pool.connection_count(name) == 1
            # server side: sshd holds exactly one connection; client side: it is ours
            assert len(established(local=endpoint(loopback, i))) == 1
            assert len(mine & set(established(remote=endpoint(loopback, i)))) == 1
    for i in range(loopback.n):  # close() really closed them
        wait_for(lambda i=i: not established(remote=endpoint(loopback, i)), 5, "closed sockets")


def test_stream_delivers_lines_as_they_arrive(loopback) -> None:
    with Pool(cluster_of(loopback)) as pool:
        started = time.monotonic()
        arrivals: list[tuple[float, Line]] = []
        with pool.stream("node1", "echo a; echo oops >&2; sleep 2; echo b") as stream:
            for line in stream:
                arrivals.append((time.monotonic() - started, line))
        total = time.monotonic() - started
        # (stderr may also carry noise from the login shell's rc files, e.g. pyenv's rehash lock)
        out = [(t, ln.text) for t, ln in arrivals if ln.fd == "out"]
        assert [text for _, text in out] == ["a", "b"]
        assert "oops" in [ln.text for _, ln in arrivals if ln.fd == "err"]
        assert all(ln.node == "node1" for _, ln in arrivals)
        assert out[0][0] < total - 1.5  # "a" came long before the command ended
        assert stream.exit == 0 and stream.error is None


def test_stream_cancel_from_another_thread(loopback) -> None:
    with Pool(cluster_of(loopback)) as pool:
        stream = pool.stream("node0", "echo started; sleep 30; echo never")
        lines = []
        cancelled_at: list[float] = []

        def cancel() -> None:
            cancelled_at.append(time.monotonic())
            stream.cancel()

        for line in stream:
            if line.fd == "out":
                lines.append(line.text)
                threading.Timer(0.2, cancel).start()
        ended = time.monotonic()
        assert lines == ["started"]
        assert ended - cancelled_at[0] < 2  # the iteration ended soon after cancel()
        assert stream.error == "cancelled" and stream.exit is None
        assert pool.run("node0", "echo still-usable").stdout == "still-usable\n"


def test_stream_stdin_agent_exits_when_stdin_closes(loopback) -> None:
    with Pool(cluster_of(loopback)) as pool:
        stream = pool.stream("node0", "while read -r x; do echo \"got $x\"; done; echo bye")
        out = (ln.text for ln in stream if ln.fd == "out")
        stream.write("one\n")
        assert next(out) == "got one"
        stream.write(b"two\n")
        assert next(out) == "got two"
        stream.close_stdin()
        assert list(out) == ["bye"]
        assert stream.exit == 0


def test_run_stdin_env_timeout(loopback) -> None:
    with Pool(cluster_of(loopback)) as pool:
        r = pool.run("node0", 'tr a-z A-Z; echo "$GREETING"', stdin="hello\n",
                     env={"GREETING": "it's $HOME"})
        assert r.ok and r.stdout == "HELLO\nit's $HOME\n"
        started = time.monotonic()
        r = pool.run("node0", "sleep 20", timeout=1)
        assert time.monotonic() - started < 3
        assert r.exit is None and "timeout after 1s" in (r.error or "")
        assert pool.run("node0", "true").ok  # the connection survived the timeout
        assert pool.connection_count("node0") == 1


def test_killed_node_fails_fast_others_succeed(loopback) -> None:
    with Pool(cluster_of(loopback)) as pool:
        assert all(r.ok for r in pool.run_all("true").values())
        loopback.kill(1)
        started = time.monotonic()
        results = pool.run_all("echo fine", timeout=20)
        assert time.monotonic() - started < 10
        assert "connection refused" in (results["node1"].error or "")
        assert results["node1"].seconds < 2
        assert pool.status("node1").state == NodeState.DOWN
        assert all(results[n].stdout.endswith("fine\n") for n in loopback.nodes if n != "node1")


def test_hung_node_times_out_without_stalling_others(loopback) -> None:
    """A SIGSTOPped sshd: once with an open connection, once for a fresh pool (banner wait)."""
    with Pool(cluster_of(loopback, connect_timeout=2.0)) as warm:
        assert all(r.ok for r in warm.run_all("true").values())
        loopback.hang(1)
        with Pool(cluster_of(loopback, connect_timeout=2.0)) as cold:
            for pool in (warm, cold):
                started = time.monotonic()
                results = pool.run_all("echo fine", timeout=3)
                elapsed = time.monotonic() - started
                assert elapsed < 6, elapsed
                hung = results["node1"]
                assert hung.error is not None and hung.seconds < 4, hung
                for n in loopback.nodes:
                    if n != "node1":
                        assert results[n].ok, results[n]
                        assert results[n].seconds < 3, results[n]  # nobody waited for node1
            with Pool(cluster_of(loopback)) as third:  # a sub-second deadline holds too
                quick = third.run("node1", "true", timeout=0.5)
                assert quick.error is not None and quick.seconds < 1.5, quick
            status = cold.ping("node1", deadline=1.0)
            assert status.state == NodeState.DOWN and "no SSH handshake" in status.reason, status
            status = warm.ping("node1", deadline=1.0)
            assert status.state == NodeState.DOWN and "no reply within 1s" in status.reason, status


def test_hung_node_is_marked_down_and_later_calls_fail_fast(loopback) -> None:
    """8 calls to one hung node cost one connect_timeout, not eight; back once it answers."""
    seen: list[NodeStatus] = []
    with Pool(cluster_of(loopback, connect_timeout=2.0)) as warm, \
            Pool(cluster_of(loopback, connect_timeout=2.0)) as cold:
        warm.subscribe(seen.append)
        assert warm.run("node1", "true").ok
        loopback.hang(1)
        for pool, first_words in ((warm, "timed out opening a channel"),
                                  (cold, "no SSH handshake")):
            started = time.monotonic()
            results = [pool.run("node1", "true", timeout=10) for _ in range(8)]
            elapsed = time.monotonic() - started
            assert first_words in (results[0].error or ""), results[0]
            assert elapsed < 2.0 + 1.5, elapsed  # the first call's timeout, then almost nothing
            for later in results[1:]:
                assert later.error is not None and later.error.startswith("node1 down since "), later
                assert later.seconds < 0.5, later
            assert pool.status("node1").state == NodeState.DOWN
            assert all(pool.run(n, "true").ok for n in ("node0", "node3"))  # others unaffected
        assert any(s.node == "node1" and s.reason == "channel open timed out" for s in seen)
        loopback.resume(1)
        for pool in (warm, cold):
            assert pool.ping("node1", deadline=5).state == NodeState.UP  # the probe always tries
            assert pool.run("node1", "echo back", timeout=10).stdout == "back\n"


def test_status_changes_reach_subscribers_in_order(loopback) -> None:
    """A change made while a subscriber still handles the previous one is published after it."""
    with Pool(cluster_of(loopback)) as pool:
        peer = pool._peers["node3"]
        second_started = threading.Event()
        order: list[str] = []

        def slow(status: NodeStatus) -> None:
            if status.reason == "first":
                second_started.wait(1.0)  # give the second change every chance to overtake
            order.append(status.reason)

        pool.subscribe(slow)
        first = threading.Thread(target=pool._set_status, args=(peer, NodeState.DOWN, "first"))
        first.start()
        wait_for(lambda: pool.status("node3").reason == "first", 5, "the first change")

        def second_change() -> None:
            second_started.set()
            pool._set_status(peer, NodeState.UP, "second")

        second = threading.Thread(target=second_change)
        second.start()
        first.join(5)
        second.join(5)
        assert order == ["first", "second"]
        assert pool.status("node3").reason == order[-1]


class CountingPool(Pool):
    """The real pool, counting how many ``run`` calls are in flight at once."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster)
        self.in_flight = self.most = 0
        self.count_lock = threading.Lock()

    def run(self, *args, **kwargs):
        with self.count_lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            return super().run(*args, **kwargs)
        finally:
            with self.count_lock:
                self.in_flight -= 1


def test_max_parallel_bounds_run_record_calls(loopback) -> None:
    """runs.node_calls (the run records of every node) talks to at most ssh.max_parallel nodes at
    once, like every fan-out of the pool."""
    from console.training.runs import NodeCallError, node_calls

    for limit in (1, 3):
        with CountingPool(cluster_of(loopback, max_parallel=limit)) as pool:
            replies = node_calls(pool, "no-such-op", {n: {} for n in loopback.nodes}, timeout=60)
            assert set(replies) == set(loopback.nodes)
            assert all(isinstance(r, NodeCallError) for r in replies.values())
            assert pool.most <= limit, pool.most
            pool.most = 0
            pool.run_all("sleep 0.3")
            assert pool.most <= limit


def test_health_loop_reconnects_restarted_node(loopback) -> None:
    seen: list[NodeStatus] = []
    with Pool(cluster_of(loopback, connect_timeout=2.0)) as pool:
        unsubscribe = pool.subscribe(seen.append)
        pool.start_health(0.3, backoff_cap=1.0)
        wait_for(lambda: all(s.state == NodeState.UP and s.rtt is not None
                             for s in pool.statuses().values()), 15, "all nodes up, pinged")
        loopback.kill(2)
        wait_for(lambda: pool.status("node2").state == NodeState.DOWN, 10, "node2 down")
        loopback.restart(2)
        wait_for(lambda: pool.status("node2").state == NodeState.UP, 10, "node2 up again")
        assert pool.connection_count("node2") >= 2
        assert pool.run("node2", "echo back").stdout.endswith("back\n")
        unsubscribe()
    states = [s.state for s in seen if s.node == "node2"]
    assert NodeState.DOWN in states
    assert states[-1] == NodeState.UP and states.index(NodeState.DOWN) < len(states) - 1


def test_jump_host_is_one_shared_connection(loopback) -> None:
    host, port = endpoint(loopback, 0)
    cluster = cluster_of(loopback, jump_host=f"{loopback.user}@{host}:{port}")
    with Pool(cluster) as pool:
        results = pool.run_all('echo "$SSH_CONNECTION"', nodes=["node1", "node2", "node3"])
        for i in (1, 2, 3):  # each command ran on its own node, reached through node0
            last = results[f"node{i}"].stdout.splitlines()[-1]  # node2 prints a banner first
            assert last.split()[2:] == [loopback.node(i).address, str(port)]
        assert pool.connection_count("node0") == 1
        mine = own_sockets()
        assert len(mine & set(established(remote=(host, port)))) == 1
        for i in (1, 2, 3):
            assert pool.connection_count(f"node{i}") == 1
            assert not mine & set(established(remote=endpoint(loopback, i)))  # tunnelled
        assert pool.run("node0", "echo direct").stdout == "direct\n"
        assert pool.connection_count("node0") == 1


def test_jump_host_named_by_its_node_name(loopback) -> None:
    """``jump_host: node0`` means that cluster node: reached directly, the others through it."""
    with Pool(cluster_of(loopback, jump_host="node0")) as pool:
        results = pool.run_all('echo "$SSH_CONNECTION"')
        assert all(r.ok for r in results.values()), results
        assert pool.connection_count("node0") == 1
        for i in (1, 2, 3):
            endpoint = pool.endpoint(f"node{i}")
            assert endpoint is not None and endpoint.describe().endswith(" via node0")
        node0 = pool.endpoint("node0")
        assert node0 is not None and node0.jumps == ()


def test_fabric_connection_shares_the_pool_transport(loopback) -> None:
    with Pool(cluster_of(loopback)) as pool:
        conn = pool.fabric_connection("node3")
        out = conn.run("echo via-fabric", hide=True, in_stream=False)
        assert out.stdout == "via-fabric\n"
        assert pool.run("node3", "echo via-pool").stdout == "via-pool\n"
        assert pool.connection_count("node3") == 1


def test_put_writes_a_file(loopback, tmp_path) -> None:
    target = loopback.shared_dir / "put-test" / "data.bin"
    payload = bytes(range(256)) * 100
    with Pool(cluster_of(loopback)) as pool:
        pool.put("node1", payload, str(target), mode=0o600)
    assert target.read_bytes() == payload
    assert target.stat().st_mode & 0o777 == 0o600


def test_put_never_follows_a_planted_symlink(loopback, tmp_path) -> None:
    """Neither a symlink at the old fixed temp name nor one at the target (to a file or to a
    directory) redirects the write; nothing but the target is left in its directory."""
    folder = loopback.shared_dir / "put-hostile"
    folder.mkdir(exist_ok=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    target = folder / "data.txt"
    (folder / "data.txt.svconsole-tmp").symlink_to(victim)  # where the old put wrote first
    with Pool(cluster_of(loopback)) as pool:
        pool.put("node1", b"one\n", str(target), mode=0o640)
        assert target.read_bytes() == b"one\n" and not target.is_symlink()
        assert target.stat().st_mode & 0o777 == 0o640
        for link_to in (victim, victim_dir):
            target.unlink()
            target.symlink_to(link_to)
            pool.put("node1", b"two\n", str(target))
            assert not target.is_symlink() and target.read_bytes() == b"two\n"
    assert victim.read_text() == "precious\n" and list(victim_dir.iterdir()) == []
    assert sorted(p.name for p in folder.iterdir()) == ["data.txt", "data.txt.svconsole-tmp"]


def test_local_node_same_api(tmp_path) -> None:
    with Pool(local_cluster()) as pool:
        r = pool.run("here", 'cat; echo "$X" >&2; exit 3', stdin=b"in\n", env={"X": "a b"})
        assert (r.exit, r.stdout, r.stderr, r.error) == (3, "in\n", "a b\n", None)
        assert pool.run("here", "sleep 10", timeout=0.5).error.startswith("timeout")
        ignored = pool.run("here", "echo early", stdin=b"x" * 1_000_000)  # stdin never read
        assert (ignored.exit, ignored.stdout, ignored.error) == (0, "early\n", None)
        started = time.monotonic()
        stream = pool.stream("here", "echo a; sleep 2; echo b")
        first = next(iter(stream))
        assert first == Line("here", "out", "a") and time.monotonic() - started < 1.5
        stream.cancel()
        assert list(stream) == [] and stream.error == "cancelled"
        assert pool.ping("here").state == NodeState.UP
        assert pool.connection_count("here") == 0


def test_sudo_password_never_shows(loopback, tmp_path, monkeypatch, caplog) -> None:
    """This machine runs the tests as root without sudo, so a stand-in ``sudo`` on PATH (a script
    that is as careless as possible: it echoes the password it reads) plays the password case."""
    secret = "pa55-Wörd-that-must-not-leak"
    fake = tmp_path / "bin" / "sudo"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$1" = -n ] && exit 1\nread -r pw\n'
                    'echo "sudo got $pw"; echo "stderr $pw" >&2\nshift 4; exec "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    caplog.set_level(logging.DEBUG)
    with Pool(local_cluster(), sudo_password=lambda: secret) as pool:
        pool._peers["here"].sudo_mode = "password"  # what a non-root account learns from the probe
        r = pool.run("here", "cat; echo done", sudo=True, stdin="payload\n")
        assert r.ok, r
        assert r.stdout == "sudo got ********\npayload\ndone\n"
        assert r.stderr == "stderr ********\n"
        timed_out = pool.run("here", f"sleep 5; echo {secret}", sudo=True, timeout=0.5)
    asked: list[str] = []
    with Pool(cluster_of(loopback), sudo_password=lambda: asked.append("?") or secret) as pool:
        as_root = pool.run("node0", "id -u", sudo=True)  # root: no sudo, no password needed
        assert as_root.stdout == "0\n" and asked == []  # so nobody was asked for one
    for thing in (r, timed_out, as_root, repr(pool), repr(r)):
        assert secret not in repr(thing)
    assert secret not in caplog.text
    with Pool(local_cluster(), sudo_password=lambda: None) as pool:
        pool._peers["here"].sudo_mode = "password"
        assert "needs a password" in pool.run("here", "true", sudo=True).error


def test_line_splitter_bounds_memory() -> None:
    splitter = _LineSplitter()
    assert splitter.feed(b"a\r\nb") == ["a"]
    assert splitter.feed(b"c\nd") == ["bc"]
    huge = b"x" * (MAX_LINE + 10)
    cut = splitter.feed(huge[: MAX_LINE // 2]) + splitter.feed(huge[MAX_LINE // 2:] + b"\nnext\n")
    assert len(cut) == 2 and cut[1] == "next"
    assert cut[0] == "d" + "x" * (MAX_LINE - 1) + " [line cut at 1 MiB]"
    assert len(splitter.partial) == 0
    assert splitter.feed(b"tail") == [] and splitter.flush() == ["tail"]


# ------------------------------------------------------------------------- the CLI commands


def test_cli_exec_and_nodes(loopback, capsys) -> None:
    config = str(loopback.cluster_yaml)
    code = cli.main(["--config", config, "exec", "--nodes", "node1,node3", "--",
                     "echo", "hi;", "echo", "err", ">&2"])
    out, err = capsys.readouterr()
    assert code == 0
    assert sorted(out.splitlines()) == ["node1: hi", "node3: hi"]
    assert sorted(ln for ln in err.splitlines() if ln.endswith(": err")) == ["node1: err", "node3: err"]

    code = cli.main(["--config", config, "exec", "--json", "--", "echo $((6*7)); exit 4"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert set(data) == set(loopback.nodes)
    assert data["node0"]["exit"] == 4 and data["node0"]["stdout"] == "42\n"
    assert isinstance(data["node0"]["seconds"], float)

    assert cli.main(["--config", config, "nodes"]) == 0
    table = capsys.readouterr().out
    assert all(f"{n} " in table for n in loopback.nodes) and table.count(" up ") == 4
    loopback.kill(3)
    assert cli.main(["--config", config, "nodes", "--json", "--no-facts"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["node3"]["state"] == "unreachable" and "refused" in data["node3"]["error"]
    assert data["node0"]["state"] == "up" and data["node0"]["rtt_ms"] > 0
    assert "facts" not in data["node0"]

    assert cli.main(["--config", config, "exec", "--nodes", "nodeX", "--", "true"]) == 2
    assert "nodeX" in capsys.readouterr().err


def test_cli_nodes_json_carries_facts_and_verdicts(loopback, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path))
    loopback.kill(1)
    assert cli.main(["--config", str(loopback.cluster_yaml), "nodes", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["node0"]["facts"]["cpu_usable"] == len(os.sched_getaffinity(0))
    assert data["node0"]["verdict"] in ("ready", "degraded", "not ready")
    assert data["node1"]["state"] == "unreachable" and data["node1"]["verdict"] == "not ready"



class _LateChannel:
    """A channel whose last bytes and EOF come in between the reader's checks (seen in CI: a
    once-only log read lost its end). paramiko buffers a packet's data before it sets
    ``eof_received``, which is what this one does, in the window after ``recv_ready`` said no."""

    def __init__(self, late: bytes) -> None:
        self.buffer, self.late, self.eof_received, self.closed = b"", late, False, False

    def recv_ready(self) -> bool:
        if self.late is not None and not self.buffer:
            ready = False
            self.buffer, self.late, self.eof_received = self.late, None, True  # arrives now
            return ready
        return bool(self.buffer)

    def recv(self, n: int) -> bytes:
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def recv_stderr_ready(self) -> bool:
        return False


def test_output_that_arrives_with_the_eof_between_the_checks_is_read():
    from console.ssh.pool import _ChannelProcess

    process = _ChannelProcess("n", _LateChannel(b"last line\n@svcE eof\n"), lambda: None)
    assert b"".join(data for _fd, data in process.chunks(None)) == b"last line\n@svcE eof\n"


def test_a_stream_cancelled_after_its_connection_dropped_ends_quietly(loopback) -> None:
    """Seen in CI: Ctrl-C on ``logs --follow`` printed a traceback. The pool's connection was
    gone (the ending closes the pool in the background), and cancelling the follower's stream
    sent the channel's close over it: paramiko raised EOFError. Cancelling and closing a
    stream whose connection is gone is quiet."""
    with Pool(cluster_of(loopback)) as pool:
        stream = pool.stream("node0", "echo started; sleep 30")
        for line in stream:
            if line.text == "started":
                stream._process.channel.get_transport().sock.close()  # the connection drops
                stream.cancel()
        assert stream.error == "cancelled"
