"""The loopback cluster harness, checked with the system ``ssh`` client (strict host keys)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from console.ssh.loopback import (
    LoopbackCluster,
    LoopbackError,
    _cmdline,
    _descendants,
    _stat,
    check_login_allowed,
    find_sshd,
    openssh_version,
)

REPO = Path(__file__).resolve().parent.parent


def ssh_all(cluster: LoopbackCluster, indices, command: str, timeout: float = 20,
            connect_timeout: float = 5) -> dict[int, subprocess.CompletedProcess[str]]:
    """Run ``command`` on several nodes at once with the system ssh client."""
    procs = {i: subprocess.Popen(cluster.ssh_argv(i, command, connect_timeout=connect_timeout),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in indices}
    results = {}
    for i, proc in procs.items():
        out, err = proc.communicate(timeout=timeout)
        results[i] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results


def ssh(cluster: LoopbackCluster, i: int, command: str, **kw) -> subprocess.CompletedProcess[str]:
    return ssh_all(cluster, [i], command, **kw)[i]


def open_session(cluster: LoopbackCluster, i: int, command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(cluster.ssh_argv(i, command), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def sshd_processes_of(cluster: LoopbackCluster) -> list[int]:
    """Live processes started with one of this cluster's sshd configs, or in a session on one of
    its nodes (found from /proc, independently of the harness's own bookkeeping)."""
    found = []
    needle = f" -f {cluster.directory}/"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _stat(int(entry))
        if st is None or st[0] == "Z":
            continue
        if needle in " ".join(_cmdline(int(entry))):
            found.append(int(entry))
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if any(f" {cluster.node(i).address} {cluster.port}".encode() in env
               for i in range(cluster.n)):
            found.append(int(entry))
    return found


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_every_node_answers_with_its_own_address(loopback: LoopbackCluster) -> None:
    results = ssh_all(loopback, range(loopback.n), 'echo "$SSH_CONNECTION"; hostname; whoami')
    for i, res in results.items():
        node = loopback.node(i)
        assert res.returncode == 0, res.stderr
        lines = res.stdout.splitlines()
        if node.banner:
            assert lines[0] == "Welcome to node2 (banner noise)"
            assert "Welcome to node2 (banner noise)" in res.stderr
            lines = lines[1:]
        else:
            assert "banner" not in res.stdout + res.stderr
        assert lines[0].split()[2:] == [node.address, str(loopback.port)]
        assert lines[2] == loopback.user
    assert [loopback.node(i).banner for i in range(4)] == [False, False, True, False]


def test_banner_node_is_noisy_for_every_command(loopback: LoopbackCluster) -> None:
    res = ssh(loopback, 2, "true")
    assert res.returncode == 0
    assert res.stdout == "Welcome to node2 (banner noise)\n"
    assert "Welcome to node2 (banner noise)" in res.stderr
    # The command's own shells stay quiet, as with a real noisy ~/.bashrc.
    res = ssh(loopback, 2, "bash -c 'echo inner'; sh -c 'exit 3'")
    assert res.stdout == "Welcome to node2 (banner noise)\ninner\n"
    assert res.returncode == 3


def test_sftp_works_on_banner_and_plain_nodes(loopback: LoopbackCluster) -> None:
    for i in (1, 2):
        target = loopback.shared_dir / f"sftp-{i}.txt"
        res = subprocess.run(
            ["sftp", "-b", "-", *loopback.ssh_options(), "-P", str(loopback.port),
             f"{loopback.user}@{loopback.node(i).address}"],
            input=f"put {REPO / 'pyproject.toml'} {target}\n", capture_output=True, text=True,
            timeout=20)
        assert res.returncode == 0, res.stderr
        assert target.read_bytes() == (REPO / "pyproject.toml").read_bytes()


def test_generated_files(loopback: LoopbackCluster) -> None:
    doc = yaml.safe_load(loopback.cluster_yaml.read_text())
    doc["cluster"].pop("id", None)  # svconsole writes the cluster's id there on first launch
    assert doc["cluster"] == {
        "name": "loopback", "shared_dir": str(loopback.shared_dir), "master": "node0",
        "master_port": loopback.master_port, "python": sys.executable,
    }
    assert loopback.master_port != loopback.port
    assert loopback.shared_dir.is_dir()
    assert doc["ssh"]["user"] == loopback.user
    assert doc["ssh"]["port"] == loopback.port
    assert doc["ssh"]["identity_file"] == str(loopback.identity_file)
    assert doc["ssh"]["known_hosts"] == str(loopback.known_hosts)
    assert doc["ssh"]["host_key_policy"] == "strict"
    assert [(n["name"], n["host"], n["role"]) for n in doc["nodes"]] == [
        ("node0", "127.0.1.1", "head"), ("node1", "127.0.1.2", "worker"),
        ("node2", "127.0.1.3", "worker"), ("node3", "127.0.1.4", "worker")]
    known = loopback.known_hosts.read_text().splitlines()
    assert [line.split()[0] for line in known] == [
        f"[127.0.1.{i + 1}]:{loopback.port}" for i in range(4)]
    keys = {line.split()[2] for line in known}
    assert len(keys) == 4 and all(line.split()[1] == "ssh-ed25519" for line in known)
    config = loopback.node(0).config.read_text()
    assert ("PerSourcePenalties no" in config) == (openssh_version(find_sshd()) >= (9, 8))
    assert "UsePAM no" in config and f"AllowUsers {loopback.user}" in config


def test_kill_fails_fast_then_restart(loopback: LoopbackCluster) -> None:
    session = open_session(loopback, 1, "echo started; sleep 60")
    assert session.stdout.readline() == "started\n"
    listener = loopback.status()[1]["pid"]
    tree = [listener, *_descendants(listener)]
    assert len(tree) >= 3  # listener, the connection's sshd processes, the shell, sleep
    loopback.kill(1)
    session.wait(timeout=5)  # the open connection dropped
    assert session.returncode != 0
    assert [p for p in tree if _stat(p) is not None and _stat(p)[0] != "Z"] == []
    t0 = time.monotonic()
    results = ssh_all(loopback, [0, 1, 3], "echo ok")
    assert time.monotonic() - t0 < 5
    assert results[1].returncode == 255 and "Connection refused" in results[1].stderr
    assert results[0].stdout == results[3].stdout == "ok\n"
    assert loopback.state(1) == "killed"
    loopback.restart(1)
    assert ssh(loopback, 1, "echo back").stdout == "back\n"  # same key: strict ssh accepts it


def test_hang_times_out_while_others_answer(loopback: LoopbackCluster) -> None:
    session = open_session(loopback, 3, "while read x; do echo got $x; done")
    session.stdin.write("a\n")
    session.stdin.flush()
    assert session.stdout.readline() == "got a\n"
    loopback.hang(3)
    listener = loopback.status()[3]["pid"]
    assert listener and _stat(listener)[0] == "T"
    assert all(_stat(p)[0] == "T" for p in _descendants(listener))
    t0 = time.monotonic()
    results = ssh_all(loopback, [0, 3], "echo ok", connect_timeout=2)
    assert results[3].returncode == 255 and "timed out" in results[3].stderr
    assert results[0].stdout == "ok\n"
    assert time.monotonic() - t0 >= 1.5
    session.stdin.write("b\n")  # the connection stays open, but nothing answers
    session.stdin.flush()
    assert session.poll() is None
    loopback.resume(3)
    assert session.stdout.readline() == "got b\n"  # and the answer comes after resume
    session.stdin.close()
    session.wait(timeout=5)
    assert ssh(loopback, 3, "echo back").stdout == "back\n"


def test_hang_then_restart(loopback: LoopbackCluster) -> None:
    loopback.hang(0)
    loopback.restart(0)
    assert loopback.state(0) == "up"
    assert ssh(loopback, 0, "echo back").stdout == "back\n"


def test_changed_host_key_is_refused_then_reset(loopback: LoopbackCluster) -> None:
    known_before = loopback.known_hosts.read_text()
    loopback.change_host_key(3)
    loopback.up()  # idempotent: all run; known_hosts keeps the first keys
    assert loopback.known_hosts.read_text() == known_before
    res = ssh(loopback, 3, "true")
    assert res.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in res.stderr
    assert "Host key verification failed" in res.stderr
    loopback.reset(3)
    assert ssh(loopback, 3, "echo ok").stdout == "ok\n"


def test_down_leaves_nothing_running_and_is_idempotent(fresh_loopback) -> None:
    cluster = fresh_loopback(2)
    session = open_session(cluster, 0, "echo started; sleep 60")
    assert session.stdout.readline() == "started\n"
    assert len(sshd_processes_of(cluster)) >= 3  # 2 listeners + the session's processes
    cluster.down()
    assert sshd_processes_of(cluster) == []
    session.wait(timeout=5)
    cluster.down()
    state = json.loads(cluster.state_file.read_text())
    assert [n["state"] for n in state["nodes"]] == ["down", "down"]
    assert cluster.node(0).log.read_text()  # kept for inspection


def test_up_again_in_the_same_directory_replaces_the_old_cluster(tmp_path: Path) -> None:
    first = LoopbackCluster(tmp_path, 2, base_port=None)
    first.up()
    old = sshd_processes_of(first)
    known = first.known_hosts.read_text().splitlines()
    second = LoopbackCluster(tmp_path, 1, base_port=None)
    try:
        second.up()  # another object (another process, say): stops the old nodes first
        assert not set(old) & set(sshd_processes_of(second))
        assert len(sshd_processes_of(second)) == 1
        assert second.known_hosts.read_text().splitlines() == known[:1] or (
            second.port != first.port
            and second.known_hosts.read_text().split()[1:] == known[0].split()[1:])
        assert ssh(second, 0, "echo ok").stdout == "ok\n"
    finally:
        second.down()
        first.down()
    assert sshd_processes_of(first) == []


def test_never_kills_a_process_that_is_not_its_own(tmp_path: Path) -> None:
    """A state.json whose pid now belongs to another program (pid reuse) kills nothing."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        cluster = LoopbackCluster(tmp_path, 1, base_port=None)
        cluster.port = 20001
        cluster._pids[0] = (other.pid, _stat(other.pid)[2])
        cluster._save()
        LoopbackCluster.load(tmp_path).down()
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_command_line_up_status_down(tmp_path: Path) -> None:
    script = str(REPO / "scripts" / "loopback-cluster")
    up = subprocess.run([script, "up", "2", str(tmp_path), "--port", "0", "--banner", "1"],
                        capture_output=True, text=True, timeout=60)
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == str(tmp_path / "cluster.yaml")
        assert f"svconsole --config {tmp_path / 'cluster.yaml'}" in up.stderr
        cluster = LoopbackCluster.load(tmp_path)
        assert ssh(cluster, 1, "echo hi").stdout == "Welcome to node1 (banner noise)\nhi\n"
        status = subprocess.run([script, "status", str(tmp_path)], capture_output=True,
                                text=True, timeout=30)
        assert status.stdout.count("answers=True") == 2
        hang = subprocess.run([script, "hang", str(tmp_path), "0"], timeout=30)
        assert hang.returncode == 0 and LoopbackCluster.load(tmp_path).state(0) == "hung"
    finally:
        down = subprocess.run([script, "down", str(tmp_path)], capture_output=True, text=True,
                              timeout=30)
    assert down.returncode == 0, down.stderr
    assert sshd_processes_of(cluster) == []
    bad = subprocess.run([script, "status", str(tmp_path / "nothing")], capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode == 1 and "no loopback cluster state here" in bad.stderr


def test_eight_nodes_start_quickly(fresh_loopback) -> None:
    t0 = time.monotonic()
    cluster = fresh_loopback(8)
    elapsed = time.monotonic() - t0
    print(f"\nup() of 8 nodes: {elapsed:.2f} s")
    results = ssh_all(cluster, range(8), 'echo "$SSH_CONNECTION"')
    assert [r.stdout.split()[2] for r in results.values()] == [
        f"127.0.1.{i + 1}" for i in range(8)]
    assert elapsed < 30


def test_locked_account_is_refused_with_advice(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    shadow.write_text("root:*:20228:0:99999:7:::\nalice:!:20263::::::\nbob:$y$j9T$abc:1::::::\n")
    check_login_allowed("root", shadow)
    check_login_allowed("bob", shadow)
    with pytest.raises(LoopbackError, match=r"'alice' is locked .*usermod -p '\*' alice"):
        check_login_allowed("alice", shadow)


def test_unknown_user_and_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(LoopbackError, match="no such user"):
        LoopbackCluster(tmp_path, 1, user="no-such-user-xyz").up()
    with pytest.raises(LoopbackError, match=r"banner_nodes \[5\]"):
        LoopbackCluster(tmp_path, 2, banner_nodes=(5,))
    with pytest.raises(LoopbackError, match="1 to 254"):
        LoopbackCluster(tmp_path, 0)


def test_port_in_use_gives_log_tail(tmp_path: Path) -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.1.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        cluster = LoopbackCluster(tmp_path, 1, base_port=port)
        with pytest.raises(LoopbackError, match="Address already in use|Cannot bind"):
            cluster.up()
        cluster.down()


def test_heal_restarts_a_node_killed_from_outside(fresh_loopback) -> None:
    cluster = fresh_loopback(1)
    pid = cluster.status()[0]["pid"]
    os.kill(pid, signal.SIGKILL)  # someone killed the listener behind the harness's back
    assert wait_until(lambda: not cluster.status()[0]["answers"])
    cluster.heal()
    assert ssh(cluster, 0, "echo ok").stdout == "ok\n"


def test_cluster_yaml_is_valid_for_svconsole(loopback: LoopbackCluster) -> None:
    from console.cluster.model import load_cluster

    cluster = load_cluster(loopback.cluster_yaml)
    assert cluster.names() == loopback.nodes
    assert [(n.host, n.port) for n in cluster.nodes] == [
        (loopback.node(i).address, loopback.port) for i in range(loopback.n)]
    assert cluster.master_node.role == "head"
    assert cluster.ssh.host_key_policy == "strict"
    assert cluster.python == sys.executable


def test_guard_stops_the_cluster_when_its_owner_is_killed(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from console.ssh.loopback import LoopbackCluster; "
         f"LoopbackCluster({str(tmp_path)!r}, 2, None, guard=True).up(); "
         "print('up', flush=True); time.sleep(60)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline() == "up\n"
        cluster = LoopbackCluster.load(tmp_path)
        guard = json.loads(cluster.state_file.read_text())["guard"]
        assert len(sshd_processes_of(cluster)) == 2
    finally:
        owner.kill()
        owner.wait()
    assert wait_until(lambda: sshd_processes_of(cluster) == [], timeout=10)
    assert wait_until(lambda: _stat(guard[0]) is None or _stat(guard[0])[0] == "Z")


def _ordinary_user() -> str | None:
    import pwd

    for entry in pwd.getpwall():
        if entry.pw_uid >= 1000 and entry.pw_shell.endswith(("/bash", "/sh")):
            return entry.pw_name
    return None


@pytest.mark.skipif(os.getuid() != 0 or _ordinary_user() is None,
                    reason="needs root and an ordinary user with a shell to switch to")
def test_runs_as_an_ordinary_user() -> None:
    """Started by an ordinary user, sshd logs in that user (and no one else)."""
    import pwd
    import shutil
    import tempfile

    user = pwd.getpwnam(_ordinary_user())
    directory = Path(tempfile.mkdtemp(prefix="svconsole-loopback-user-"))  # pytest's is 0700
    os.chown(directory, user.pw_uid, user.pw_gid)
    as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
               "env", f"HOME={user.pw_dir}"]
    script = str(REPO / "scripts" / "loopback-cluster")
    up = subprocess.run([*as_user, script, "up", "1", str(directory), "--port", "0"],
                        capture_output=True, text=True, timeout=60)
    try:
        assert up.returncode == 0, up.stderr
        cluster = LoopbackCluster.load(directory)
        assert cluster.user == user.pw_name
        assert "PermitRootLogin" not in cluster.node(0).config.read_text()
        assert ssh(cluster, 0, "whoami").stdout == f"{user.pw_name}\n"
    finally:
        down = subprocess.run([*as_user, script, "down", str(directory)], timeout=30)
        leftover = sshd_processes_of(LoopbackCluster.load(directory))
        shutil.rmtree(directory)
    assert down.returncode == 0
    assert leftover == []
