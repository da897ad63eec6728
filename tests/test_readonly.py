"""Read-only mode (``--read-only``, or ``read_only: true`` under ``cluster:``): every action that
would change a node or a file is refused with the reason, each one tried; reading still works."""

from __future__ import annotations

import os

import pytest

from console.cli import main

#: Every CLI action that changes a node or a file, as an operator would type it.
CHANGING = [
    (["setup", "--yes"], "setup apply"),
    (["launch", "--yes"], "launch"),
    (["stop", "latest", "--yes"], "stop"),
    (["exec", "--", "touch", "/tmp/svconsole-readonly-{pid}"], "exec"),
    (["hostfile", "import", "HOSTS", "-o", "OUT"], "hostfile import"),
    (["hostfile", "export", "-o", "OUT"], "hostfile export -o"),
]


def readonly_yaml(tmp_path, flag: bool) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text("cluster:\n  name: ro\n" + ("  read_only: true\n" if flag else "")
                    + "nodes:\n  - name: node0\n    host: 127.0.0.1\n    gpus: [0]\n")
    return str(path)


@pytest.mark.parametrize("how", ["flag", "cluster.yaml"])
@pytest.mark.parametrize("argv,action", CHANGING, ids=[a for _, a in CHANGING])
def test_every_changing_command_is_refused(tmp_path, capsys, monkeypatch, argv, action, how):
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    config = readonly_yaml(tmp_path, flag=how == "cluster.yaml")
    hosts = tmp_path / "hosts"
    hosts.write_text("10.0.0.9 slots=8\n")
    out = tmp_path / "out.yaml"
    argv = [str(hosts) if a == "HOSTS" else str(out) if a == "OUT" else
            a.format(pid=os.getpid()) for a in argv]
    before = {p.name for p in tmp_path.iterdir()}
    code = main(["--config", config, *(["--read-only"] if how == "flag" else []), *argv])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "read-only" in err and action in err and "would change a node or a file" in err
    assert {p.name for p in tmp_path.iterdir()} - before <= {"state"}   # nothing written
    assert not os.path.exists(f"/tmp/svconsole-readonly-{os.getpid()}")


def test_reading_still_works(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    config = readonly_yaml(tmp_path, flag=True)
    assert main(["--config", config, "hostfile", "export"]) == 0
    assert "127.0.0.1 slots=1" in capsys.readouterr().out
    assert main(["--config", config, "setup", "--list"]) == 0
    assert "read-only" not in capsys.readouterr().err


def test_read_only_must_be_true_or_false(tmp_path, capsys):
    path = tmp_path / "cluster.yaml"
    path.write_text("cluster:\n  read_only: sometimes\nnodes:\n  - name: n0\n    host: h\n")
    assert main(["--config", str(path), "runs"]) == 2
    assert f"{path}:2:14: cluster.read_only:" in capsys.readouterr().err
