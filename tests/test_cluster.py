"""cluster.yaml: loading and its exact messages, defaults, the comment-keeping editor, atomic
writes, DeepSpeed hostfiles and the ``svconsole hostfile`` command."""

from __future__ import annotations

import io
import os
import socket
import stat
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.atomic import atomic_write
from console.cluster.model import (
    Cluster,
    ClusterConfigError,
    ClusterEditor,
    JumpHost,
    cluster_from_hostfile,
    export_hostfile,
    find_config,
    import_hostfile,
    load_cluster,
    load_or_default,
    local_cluster,
    parse_cluster,
)
from console.commands import hostfile as hostfile_command

EXAMPLE = Path(__file__).resolve().parent.parent / "cluster.yaml.example"

MINIMAL = """\
nodes:
  - name: a
    host: 10.0.0.1
"""


def issues_of(text: str) -> list[str]:
    with pytest.raises(ClusterConfigError) as info:
        parse_cluster(text)
    assert str(info.value) == "\n".join(str(i) for i in info.value.issues)
    return [str(i) for i in info.value.issues]


# The issue's own example: the third node, declared on line 14, has no host.
ISSUE_EXAMPLE = """\
cluster:
  name: sv-a100
  shared_dir: /data/shared
  master: node0
  master_port: 26669
ssh:
  user: train
  port: 22
nodes:
  - name: node0
    host: 192.168.1.100
  - name: node1
    host: 192.168.1.101
  - name: node2
    gpus: "0,1"
"""

BAD_INPUTS = [
    (ISSUE_EXAMPLE, ["cluster.yaml:14:5: nodes[2].host: required"]),
    (
        "ssh:\n  identity_fle: ~/.ssh/id\n" + MINIMAL,
        ["cluster.yaml:2:3: ssh.identity_fle: unknown key (did you mean identity_file?)"],
    ),
    (
        "node:\n  - name: a\n",
        [
            "cluster.yaml:1:1: node: unknown key (did you mean nodes?)",
            "cluster.yaml:1:1: nodes: required",
        ],
    ),
    (
        "cluster:\n  zzz: 1\n" + MINIMAL,
        [
            "cluster.yaml:2:3: cluster.zzz: unknown key (valid keys: name, shared_dir, master, master_port, python, id, read_only)"
        ],
    ),
    (
        MINIMAL + "    colour: red\n",
        [
            "cluster.yaml:4:5: nodes[0].colour: unknown key (valid keys: name, host, port, user, "
            "identity_file, role, gpus, local)"
        ],
    ),
    (
        "ssh:\n  port: 70000\n" + MINIMAL,
        ["cluster.yaml:2:9: ssh.port: must be a port number from 1 to 65535, got 70000"],
    ),
    (
        MINIMAL + '    port: "22"\n',
        ["cluster.yaml:4:11: nodes[0].port: must be a port number from 1 to 65535, got '22'"],
    ),
    (
        MINIMAL + "    port: true\n",
        ["cluster.yaml:4:11: nodes[0].port: must be a port number from 1 to 65535, got true"],
    ),
    (
        MINIMAL + "    port: 22.5\n",
        ["cluster.yaml:4:11: nodes[0].port: must be a port number from 1 to 65535, got 22.5"],
    ),
    (
        "cluster:\n  master_port: 0\n" + MINIMAL,
        ["cluster.yaml:2:16: cluster.master_port: must be a port number from 1 to 65535, got 0"],
    ),
    (
        MINIMAL + "  - name: a\n    host: 10.0.0.2\n",
        ["cluster.yaml:4:11: nodes[1].name: duplicate node name 'a' (also nodes[0])"],
    ),
    (
        "ssh:\n  port: 2222\n" + MINIMAL + "  - name: b\n    host: 10.0.0.1\n    port: 2222\n",
        ["cluster.yaml:7:11: nodes[1].host: 10.0.0.1:2222 is already nodes[0]"],
    ),
    (
        "cluster:\n  master: nodeb\n" + MINIMAL + "  - name: node-b\n    host: h2\n",
        ["cluster.yaml:2:11: cluster.master: 'nodeb' is not a node (did you mean node-b?)"],
    ),
    (
        "cluster:\n  master: zz\n" + MINIMAL,
        ["cluster.yaml:2:11: cluster.master: 'zz' is not a node (nodes: a)"],
    ),
    (
        MINIMAL + '    gpus: "0,x"\n',
        [
            "cluster.yaml:4:11: nodes[0].gpus: must be GPU indices separated by commas, like \"0,1,2,3\", got '0,x'"
        ],
    ),
    (MINIMAL + '    gpus: "0,1,1"\n', ["cluster.yaml:4:11: nodes[0].gpus: GPU 1 is listed twice"]),
    (
        MINIMAL + "    gpus: -1\n",
        [
            'cluster.yaml:4:11: nodes[0].gpus: must be GPU indices separated by commas, like "0,1,2,3", got -1'
        ],
    ),
    (
        MINIMAL + "    gpus: [0, 1.5]\n",
        [
            'cluster.yaml:4:11: nodes[0].gpus: must be GPU indices separated by commas, like "0,1,2,3", got a list'
        ],
    ),
    (
        "ssh:\n  host_key_policy: yolo\n" + MINIMAL,
        ["cluster.yaml:2:20: ssh.host_key_policy: must be accept-new or strict, got 'yolo'"],
    ),
    (
        MINIMAL + "    role: boss\n",
        ["cluster.yaml:4:11: nodes[0].role: must be head or worker, got 'boss'"],
    ),
    (
        MINIMAL + "    role: head\n  - name: b\n    host: h2\n    role: head\n",
        ["cluster.yaml:7:11: nodes[1].role: only one node can be the head (nodes[0] is)"],
    ),
    (
        MINIMAL + "    local: maybe\n",
        ["cluster.yaml:4:12: nodes[0].local: must be true or false, got 'maybe'"],
    ),
    (
        "nodes:\n  - name: a\n    host: 12\n",
        ["cluster.yaml:3:11: nodes[0].host: must be a string, got 12 (put it in quotes)"],
    ),
    (
        "nodes:\n  - name: a\n    host: -oProxyCommand=x\n",
        [
            "cluster.yaml:3:11: nodes[0].host: must be a host name or IP address, got '-oProxyCommand=x'"
        ],
    ),
    (
        "nodes:\n  - name: a b\n    host: h\n",
        [
            "cluster.yaml:2:11: nodes[0].name: must be letters, digits, '.', '_' or '-' (starting with a letter or "
            "digit), got 'a b'"
        ],
    ),
    ("nodes:\n  - host: h\n", ["cluster.yaml:2:5: nodes[0].name: required"]),
    ("nodes:\n  - name:\n    host: h\n", ["cluster.yaml:2:5: nodes[0].name: required"]),
    (
        "ssh:\n  jump_host: a@b:c:d@\n" + MINIMAL,
        ["cluster.yaml:2:14: ssh.jump_host: must be [user@]host[:port] (or a comma-separated chain of them), got 'a@b:c:d@'"],
    ),
    (
        "ssh:\n  connect_timeout: 0\n" + MINIMAL,
        ["cluster.yaml:2:20: ssh.connect_timeout: must be a number of seconds above 0, got 0"],
    ),
    (
        "ssh:\n  max_parallel: 0\n" + MINIMAL,
        ["cluster.yaml:2:17: ssh.max_parallel: must be a whole number of at least 1, got 0"],
    ),
    (
        "cluster:\n  shared_dir: data\n" + MINIMAL,
        [
            "cluster.yaml:2:15: cluster.shared_dir: must be an absolute path (or start with ~), got 'data'"
        ],
    ),
    ("ssh: 22\n" + MINIMAL, ["cluster.yaml:1:6: ssh: must be a mapping, got 22"]),
    (
        "nodes:\n  - name: a\n    host: [h\n",
        ["cluster.yaml:4:1: invalid YAML: expected ',' or ']', but got '<stream end>'"],
    ),
    (
        "nodes:\n  - name: a\n    host: h\n    name: b\n",
        [
            'cluster.yaml:4:5: invalid YAML: found duplicate key "name" with value "b" (original value: "a")'
        ],
    ),
    ("", ["cluster.yaml:1:1: the file is empty (it needs at least a nodes: list)"]),
    (
        "# only a comment\n",
        ["cluster.yaml:1:1: the file is empty (it needs at least a nodes: list)"],
    ),
    (
        "- name: a\n  host: h\n",
        ["cluster.yaml:1:1: must be a mapping with cluster, ssh and nodes, got a list"],
    ),
    (
        "just text\n",
        ["cluster.yaml:1:1: must be a mapping with cluster, ssh and nodes, got 'just text'"],
    ),
    ("cluster:\n  name: x\n", ["cluster.yaml:1:1: nodes: required"]),
    ("nodes: []\n", ["cluster.yaml:1:8: nodes: must list at least one node, got an empty list"]),
    ("nodes: node0\n", ["cluster.yaml:1:8: nodes: must list at least one node, got 'node0'"]),
    (
        "nodes:\n  - node0\n",
        ["cluster.yaml:2:5: nodes[0]: must be a mapping with name and host, got 'node0'"],
    ),
    (
        # a master that is a node with problems of its own is not "not a node"
        "cluster:\n  master: b\n" + MINIMAL + "  - name: b\n    host: h\n    role: x\n",
        ["cluster.yaml:8:11: nodes[1].role: must be head or worker, got 'x'"],
    ),
    (
        # every problem is reported, in file order
        "ssh:\n  port: 0\n  usr: x\nnodes:\n  - name: a\n  - name: a\n    host: h\n    role: x\n",
        [
            "cluster.yaml:2:9: ssh.port: must be a port number from 1 to 65535, got 0",
            "cluster.yaml:3:3: ssh.usr: unknown key (did you mean user?)",
            "cluster.yaml:5:5: nodes[0].host: required",
            "cluster.yaml:6:11: nodes[1].name: duplicate node name 'a' (also nodes[0])",
            "cluster.yaml:8:11: nodes[1].role: must be head or worker, got 'x'",
        ],
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), BAD_INPUTS, ids=[str(i) for i in range(len(BAD_INPUTS))]
)
def test_bad_input_gives_exact_messages(text: str, expected: list[str]) -> None:
    assert issues_of(text) == expected


def test_load_names_the_file_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cluster.yaml").write_text(ISSUE_EXAMPLE)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ClusterConfigError, match=r"^cluster\.yaml:14:5: nodes\[2\]\.host: required$"
    ):
        load_cluster("cluster.yaml")
    with pytest.raises(ClusterConfigError) as info:
        load_cluster(tmp_path / "cluster.yaml")
    assert str(info.value) == f"{tmp_path / 'cluster.yaml'}:14:5: nodes[2].host: required"


def test_unreadable_files(tmp_path: Path) -> None:
    (tmp_path / "latin1.yaml").write_bytes(b"nodes:\n  - name: caf\xe9\n")
    with pytest.raises(ClusterConfigError) as info:
        load_cluster(tmp_path / "latin1.yaml")
    assert str(info.value) == f"{tmp_path / 'latin1.yaml'}:2:14: not UTF-8 text (byte 0xe9)"
    with pytest.raises(ClusterConfigError, match="missing.yaml: no such file$"):
        load_cluster(tmp_path / "missing.yaml")
    with pytest.raises(ClusterConfigError, match="is a directory, not a file$"):
        load_cluster(tmp_path)


def test_example_loads() -> None:
    cluster = load_cluster(EXAMPLE)
    assert cluster.name == "sv-a100"
    assert cluster.names() == ["node0", "node1"]
    assert cluster.master_node.name == "node0"
    assert cluster.shared_dir == "/data/shared"
    assert cluster.master_port == 26669
    node0, node1 = cluster.nodes
    assert (node0.role, node0.gpus, node0.port, node0.user) == ("head", (0, 1, 2, 3), 22, "train")
    node1_line = EXAMPLE.read_text().splitlines().index("  - name: node1") + 1
    assert (node1.role, node1.port, node1.line) == ("worker", 2222, node1_line)
    assert cluster.ssh.host_key_policy == "accept-new"


def test_defaults_and_ssh_params(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    directory = tmp_path / "lab-cluster"
    directory.mkdir()
    (directory / "cluster.yaml").write_text(
        textwrap.dedent("""\
        ssh:
          user: train
          port: 2200
          identity_file: keys/id_ed25519
          jump_host: ops@bastion:2022
        nodes:
          - name: w0
            host: w0.example.org
            gpus: 3
          - name: w1
            host: w1.example.org
            user: other
            port: 22
            identity_file: ~/.ssh/w1
            gpus: [0, 1]
          - name: here
            local: true
            gpus: ""
        """)
    )
    cluster = load_cluster(directory / "cluster.yaml")
    assert cluster.name == "lab-cluster"
    assert cluster.master == "w0"  # no head: the first node
    assert [n.gpus for n in cluster.nodes] == [(3,), (0, 1), ()]
    p0 = cluster.ssh_params("w0")
    assert (p0.host, p0.port, p0.user) == ("w0.example.org", 2200, "train")
    assert p0.identity_file == directory / "keys/id_ed25519"
    assert p0.known_hosts == tmp_path / "home/.config/svconsole/known_hosts"
    assert p0.jump == JumpHost("bastion", 2022, "ops")
    p1 = cluster.ssh_params(cluster.node("w1"))
    assert (p1.port, p1.user, p1.identity_file) == (22, "other", tmp_path / "home/.ssh/w1")
    here = cluster.node("here")
    assert here.local and cluster.ssh_params(here).local


def test_same_host_on_another_port_is_fine() -> None:
    text = MINIMAL + "  - name: b\n    host: 10.0.0.1\n    port: 2222\n    role: head\n"
    cluster = parse_cluster(text)
    assert cluster.master == "b"  # the head is the default master


def test_find_config_and_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert find_config(None) is None
    default = load_or_default(None)
    assert default == local_cluster()
    (node,) = default.nodes
    assert node.local and node.role == "head" and default.master == node.name
    assert default.name == socket.gethostname()
    assert default.shared_dir == str(home / ".local/share/svconsole/shared")
    assert not (home / ".local/share/svconsole/shared").exists()

    user_config = home / ".config/svconsole/cluster.yaml"
    user_config.parent.mkdir(parents=True)
    user_config.write_text(MINIMAL)
    assert find_config(None) == user_config
    assert load_or_default(None).name == socket.gethostname()  # not "svconsole"
    (work / "cluster.yaml").write_text(MINIMAL)
    assert find_config(None) == Path("cluster.yaml")
    assert load_or_default(None).name == "work"
    with pytest.raises(ClusterConfigError, match=r"^nope\.yaml: no such file$"):
        load_or_default("nope.yaml")


# ------------------------------------------------------------------------------ editor

COMMENTED = """\
# my cluster
cluster:
  name: lab    # the lab
  master: a
nodes:   # all of them
  # a is the head
  - name: a
    host: 10.0.0.1   # rack 1
    role: head
  # b is in rack 2
  - name: b
    host: 10.0.0.2
    gpus: '0,1'      # quoted my way
  # c is new
  - name: c
    host: 10.0.0.3
# end of file
"""


def test_editor_round_trip_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(COMMENTED)
    assert ClusterEditor(path).text() == COMMENTED
    four = "nodes:\n    -   name: a\n        host: h\n"
    path.write_text(four)
    assert ClusterEditor(path).text() == four


def test_editor_edits_keep_comments_and_save_keeps_backup(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(COMMENTED)
    os.chmod(path, 0o640)
    editor = ClusterEditor(path)
    editor.add_node({"name": "d", "host": "10.0.0.4", "gpus": "0,1"})
    editor.update_node("b", {"port": 2222})
    editor.remove_node("c")
    editor.set("ssh.user", "train")
    assert editor.validate() == []
    cluster = editor.save()
    assert cluster.names() == ["a", "b", "d"]
    assert (tmp_path / "cluster.yaml.bak").read_text() == COMMENTED
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert path.read_text() == textwrap.dedent("""\
        # my cluster
        cluster:
          name: lab    # the lab
          master: a
        nodes:   # all of them
          # a is the head
          - name: a
            host: 10.0.0.1   # rack 1
            role: head
          # b is in rack 2
          - name: b
            host: 10.0.0.2
            gpus: '0,1'      # quoted my way
            port: 2222
          - name: d
            host: 10.0.0.4
            gpus: "0,1"
        # end of file
        ssh:
          user: train
        """)
    assert load_cluster(path).node("b").port == 2222


def test_editor_remove_first_node_keeps_the_comment_of_the_next(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    for header in ("nodes:\n", "nodes:   # list\n"):
        path.write_text(
            header
            + "  # about a\n  - name: a\n    host: h1\n  # about b\n  - name: b\n    host: h2\n"
        )
        editor = ClusterEditor(path)
        editor.remove_node("a")
        assert editor.text() == header + "  # about b\n  - name: b\n    host: h2\n"


def test_editor_refuses_invalid_with_loader_messages(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(COMMENTED)
    editor = ClusterEditor(path)
    editor.add_node({"name": "e", "host": "10.0.0.1"})
    editor.set("ssh.port", 70000)
    # positions are those of the text that would be saved, messages those of the loader
    assert [str(i) for i in editor.validate()] == [
        f"{path}:18:11: nodes[3].host: 10.0.0.1:22 is already nodes[0]",
        f"{path}:21:9: ssh.port: must be a port number from 1 to 65535, got 70000",
    ]
    assert editor.text().splitlines()[17:21] == [
        "    host: 10.0.0.1",
        "# end of file",
        "ssh:",
        "  port: 70000",
    ]
    with pytest.raises(ClusterConfigError):
        editor.save()
    assert path.read_text() == COMMENTED
    assert not (tmp_path / "cluster.yaml.bak").exists()
    with pytest.raises(ValueError, match="already exists"):
        editor.add_node({"name": "a", "host": "x"})
    with pytest.raises(KeyError):
        editor.remove_node("zz")


# ------------------------------------------------------------------------------ atomic writes


def test_atomic_write_keeps_mode_and_backup_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    atomic_write(path, "one\n")
    assert path.read_text() == "one\n" and not (tmp_path / "f.txt.bak").exists()
    os.chmod(path, 0o600)
    atomic_write(path, b"two\n")
    assert path.read_text() == "two\n"
    assert (tmp_path / "f.txt.bak").read_text() == "one\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    atomic_write(path, "three\n", mode=0o644)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert (tmp_path / "f.txt.bak").read_text() == "two\n"
    atomic_write(path, "four\n", backup=False)
    assert (tmp_path / "f.txt.bak").read_text() == "two\n"
    with pytest.raises(TypeError):
        atomic_write(path, 42)  # type: ignore[arg-type]
    assert path.read_text() == "four\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt", "f.txt.bak"]


def test_atomic_write_new_file_uses_umask_and_follows_symlink(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "new", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o640
    (tmp_path / "link").symlink_to("new")
    atomic_write(tmp_path / "link", "y")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "new").read_text() == "y"


# ------------------------------------------------------------------------------ hostfiles

HOSTFILE = """\
# DeepSpeed hostfile
worker-1.example.org slots=8

10.0.0.7 slots=4   # the small one
"""


def test_import_hostfile() -> None:
    assert import_hostfile(HOSTFILE) == [("worker-1.example.org", 8), ("10.0.0.7", 4)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a slots=1\nb\n", ["hostfile:2:1: expected \"HOST slots=N\", got 'b'"]),
        ("a slots=1\n  a slots=2\n", ["hostfile:2:3: a is already on line 1"]),
        ("a slots=0\n", ["hostfile:1:9: slots must be a number of GPUs from 1 to 999999"]),
        (
            "a slots=x\nb slots=1 c\n",
            [
                "hostfile:1:1: expected \"HOST slots=N\", got 'a slots=x'",
                "hostfile:2:1: expected \"HOST slots=N\", got 'b slots=1 c'",
            ],
        ),
        ("# nothing\n\n", ['hostfile: no hosts (expected lines "HOST slots=N")']),
        ("-x slots=1\n", ["hostfile:1:1: not a host name: '-x'"]),
    ],
)
def test_import_hostfile_errors(text: str, expected: list[str]) -> None:
    with pytest.raises(ClusterConfigError) as info:
        import_hostfile(text)
    assert [str(i) for i in info.value.issues] == expected


def test_hostfile_round_trip() -> None:
    entries = import_hostfile(HOSTFILE)
    cluster = parse_cluster(cluster_from_hostfile(entries, name="lab", user="train", port=2200))
    assert cluster.name == "lab"
    assert cluster.names() == ["worker-1", "node0"]
    assert cluster.master == "worker-1" and cluster.nodes[0].role == "head"
    assert [(n.host, n.port, n.user) for n in cluster.nodes] == [
        ("worker-1.example.org", 2200, "train"),
        ("10.0.0.7", 2200, "train"),
    ]
    exported = export_hostfile(cluster)
    assert import_hostfile(exported) == entries
    assert import_hostfile(export_hostfile(cluster, {"node0": 2})) == [
        ("worker-1.example.org", 8),
        ("10.0.0.7", 2),
    ]


def test_export_hostfile_is_read_by_deepspeed() -> None:
    runner = pytest.importorskip("deepspeed.launcher.runner")
    cluster = parse_cluster(
        MINIMAL.replace("10.0.0.1", "10.0.0.1\n    gpus: 0,1")
        + "  - name: b\n    host: h\n    gpus: ''\n"
    )
    text = export_hostfile(cluster)
    assert dict(runner._parse_hostfile(text.splitlines())) == {"10.0.0.1": 2}


def test_export_hostfile_needs_gpu_counts() -> None:
    cluster = parse_cluster(MINIMAL)
    with pytest.raises(ClusterConfigError, match=r"^cluster\.yaml:2: nodes\[0\]\.gpus: not set"):
        export_hostfile(Cluster(**{**cluster.__dict__, "path": Path("cluster.yaml")}))


# ------------------------------------------------------------------------------ the command


def run_command(argv: list[str], cluster: Cluster | None = None) -> tuple[int, str]:
    import argparse

    parser = argparse.ArgumentParser()
    hostfile_command.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    out = io.StringIO()
    from console.cli import Context

    ctx = Context(out=out)
    if cluster is not None:
        ctx.cluster = cluster   # the cached property, given
    code = args.func(args, ctx)
    return code, out.getvalue()


def test_hostfile_command_import_new_then_merge(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(HOSTFILE)
    target = tmp_path / "cluster.yaml"
    code, out = run_command(
        ["hostfile", "import", str(hostfile), "-o", str(target), "--user", "train"]
    )
    assert code == 0 and "written with 2 nodes (worker-1, node0)" in out
    assert load_cluster(target).nodes[1].user == "train"

    target.write_text(COMMENTED)
    hostfile.write_text("10.0.0.2 slots=4\n10.0.0.9 slots=2\n")
    code, out = run_command(["hostfile", "import", str(hostfile), "-o", str(target)])
    assert code == 0 and out.startswith(f"{target}: added node0; updated b")
    text = target.read_text()
    assert "# b is in rack 2" in text and "# end of file" in text and "# the lab" in text
    assert (tmp_path / "cluster.yaml.bak").read_text() == COMMENTED
    cluster = load_cluster(target)
    assert cluster.node("b").gpus == (0, 1, 2, 3) and cluster.node("node0").host == "10.0.0.9"
    code, out = run_command(["hostfile", "import", str(hostfile), "-o", str(target)])
    assert code == 0 and "nothing changed" in out

    hostfile.write_text("bad line\n")
    with pytest.raises(ClusterConfigError, match=r"hostfile:1:1: expected"):
        run_command(["hostfile", "import", str(hostfile), "-o", str(target)])


def test_hostfile_command_export(tmp_path: Path) -> None:
    cluster = load_cluster(EXAMPLE)
    code, out = run_command(["hostfile", "export"], cluster)
    assert code == 0
    assert import_hostfile(out) == [("192.168.1.100", 4), ("192.168.1.101", 4)]
    code, out = run_command(
        ["hostfile", "export", "-o", str(tmp_path / "hf"), "--slots", "1"], cluster
    )
    assert code == 0
    assert import_hostfile((tmp_path / "hf").read_text()) == [
        ("192.168.1.100", 1),
        ("192.168.1.101", 1),
    ]


# ------------------------------------------------------------------------------ fuzz

FUZZ = settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def load_or_config_error(text: str) -> None:
    try:
        cluster = parse_cluster(text)
    except ClusterConfigError as e:
        assert e.issues and all(str(i).startswith("cluster.yaml") for i in e.issues)
    else:
        assert cluster.nodes and cluster.master in cluster.names()


@FUZZ
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_fuzz_random_text(text: str) -> None:
    load_or_config_error(text)


EXAMPLE_TEXT = EXAMPLE.read_text()
YAML_BITS = st.sampled_from(
    [
        ":",
        "-",
        " ",
        "\n",
        "  ",
        "#",
        '"',
        "'",
        "[",
        "]",
        "{",
        "}",
        "&a",
        "*a",
        "!!int",
        "<<: ",
        "0",
        "-1",
        "true",
        "null",
        "~",
        "99999",
        "name",
        "host",
        "port",
        "gpus",
        "node0",
        "\t",
        "%YAML 1.1\n",
        "---\n",
    ]
)


EDITS = st.lists(
    st.tuples(st.integers(0, len(EXAMPLE_TEXT)), st.integers(0, 20), YAML_BITS), max_size=6
)


def mutated_example(edits: list[tuple[int, int, str]]) -> str:
    """The example with each (position, characters cut, text inserted) edit applied."""
    text = EXAMPLE_TEXT
    for at, cut, insert in edits:
        at = min(at, len(text))
        text = text[:at] + insert + text[at + cut :]
    return text


@FUZZ
@given(EDITS)
def test_fuzz_mutated_example(edits: list[tuple[int, int, str]]) -> None:
    load_or_config_error(mutated_example(edits))


@FUZZ
@given(EDITS)
def test_fuzz_editor(edits: list[tuple[int, int, str]]) -> None:
    try:
        editor = ClusterEditor("cluster.yaml", text=mutated_example(edits))
    except ClusterConfigError:
        return
    editor.set("cluster.master_port", 29500)
    assert all(str(i).startswith("cluster.yaml") for i in editor.validate())


def test_svconsole_hostfile_export_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from console.cli import main

    assert main(["--config", str(EXAMPLE), "hostfile", "export"]) == 0
    assert import_hostfile(capsys.readouterr().out) == [("192.168.1.100", 4), ("192.168.1.101", 4)]
    bad = tmp_path / "cluster.yaml"
    bad.write_text(ISSUE_EXAMPLE)
    assert main(["--config", str(bad), "hostfile", "export"]) == 2
    assert capsys.readouterr().err == f"svconsole: {bad}:14:5: nodes[2].host: required\n"
