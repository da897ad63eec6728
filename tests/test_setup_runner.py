"""The bring-up runner against the loopback cluster (real sshd): a real venv per node with a
package installed offline, a second run that changes nothing, one node failing while the others
finish, retry of what failed, cross-node blocking, and ``svconsole setup`` (dry run, twice,
confirmation)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from console.bringup import (
    Runner,
    SetupOptions,
    StepState,
    get_steps,
    load_summary,
    retry_selection,
)
from console.bringup.model import Command, Phase, Step
from console.bringup.runner import OutputLine, StateChanged
from console.cli import main
from console.cluster.model import load_cluster
from console.ssh.pool import Pool


def build_wheel(directory: Path) -> Path:
    """A tiny pure-Python wheel (svconsole-selftest 0.1), made by hand: no build backend."""
    name, version = "svconsole_selftest", "0.1"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "VALUE = 42\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: svconsole-selftest\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: svconsole-tests\n"
                         "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wheels")
    build_wheel(directory)
    return directory


@pytest.fixture
def pool(loopback):
    cluster = load_cluster(loopback.cluster_yaml)
    with Pool(cluster) as p:
        yield p


def env_options(tmp_path: Path, wheels: Path) -> SetupOptions:
    return SetupOptions(env_path=str(tmp_path / "{node}" / "venv"), base_python=sys.executable,
                        venv_with_pip=False, profile="test", find_links=str(wheels),
                        no_index=True)


def states(summary) -> dict[tuple[str, str], StepState]:
    return {(c.step, c.node): c.state for c in summary.cells}


def test_venv_and_profile_per_node_then_second_run_changes_nothing(pool, tmp_path, wheels) -> None:
    options = env_options(tmp_path, wheels)
    nodes = ["node0", "node2"]  # node2 prints a banner on every command
    steps = get_steps(["python-env", "python-packages"])
    events: list = []
    runner = Runner(pool, pool.cluster, steps, state_dir=tmp_path / "state", options=options,
                    nodes=nodes)
    runner.subscribe(events.append)
    first = runner.run()
    assert set(states(first).values()) == {StepState.DONE}, first.cells
    for node in nodes:
        python = tmp_path / node / "venv" / "bin" / "python"
        out = subprocess.run([python, "-c", "import svconsole_selftest as m; print(m.VALUE)"],
                             capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == "42"
        log = tmp_path / "state" / "runs" / first.run_id / node / "python-packages.log"
        assert "Successfully installed svconsole-selftest-0.1" in log.read_text()
    lines = [e for e in events if isinstance(e, OutputLine) and e.step == "python-packages"]
    assert any("svconsole-selftest" in e.text for e in lines)
    order = [(e.step, e.node, e.state) for e in events if isinstance(e, StateChanged)]
    assert order.index(("python-env", "node0", StepState.DONE)) < \
        order.index(("python-packages", "node0", StepState.RUNNING))
    summary_file = tmp_path / "state" / "runs" / first.run_id / "summary.json"
    assert json.loads(summary_file.read_text())["changed"] is True

    second = Runner(pool, pool.cluster, steps, state_dir=tmp_path / "state", options=options,
                    nodes=nodes).run()
    assert set(states(second).values()) == {StepState.ALREADY_DONE}
    assert not second.changed and second.ok
    assert second.message().startswith("nothing changed: every step was already done")


def test_one_node_fails_the_others_finish_then_retry_failed(pool, tmp_path, wheels) -> None:
    options = env_options(tmp_path, wheels)
    (tmp_path / "node1").write_text("a file where node1's env directory should be\n")
    steps = get_steps(["python-env", "python-packages"])
    state_dir = tmp_path / "state"
    first = Runner(pool, pool.cluster, steps, state_dir=state_dir, options=options,
                   nodes=["node0", "node1", "node3"]).run()
    got = states(first)
    assert got[("python-env", "node1")] == StepState.FAILED
    assert got[("python-packages", "node1")] == StepState.BLOCKED
    for node in ("node0", "node3"):
        assert got[("python-env", node)] == got[("python-packages", node)] == StepState.DONE
    failed = first.cell("python-env", "node1")
    assert failed.detail.startswith("apply exit 1") and "File exists" in failed.detail
    assert first.cell("python-packages", "node1").detail == \
        "needs python-env on node1, which is failed"
    assert not first.ok

    (tmp_path / "node1").unlink()
    previous = load_summary(state_dir)
    assert previous is not None and previous.run_id == first.run_id
    ids, only = retry_selection(previous)
    assert only == {("python-env", "node1"), ("python-packages", "node1")}
    retry = Runner(pool, pool.cluster, get_steps(ids), state_dir=state_dir, options=options,
                   only=only, previous=previous).run()
    assert states(retry) == {("python-env", "node1"): StepState.DONE,
                             ("python-packages", "node1"): StepState.DONE}
    assert retry.ok


def test_failed_head_step_blocks_workers_only_and_operator_skip(pool, tmp_path) -> None:
    marker = tmp_path / "ran-{node}"
    serve = Step("serve", "head fails", Phase.SOFTWARE, targets="head",
                 apply=lambda ctx: [Command("echo cannot serve >&2; exit 3")])
    mount = Step("mount", "needs head", Phase.SOFTWARE, targets="workers", depends=("serve",),
                 apply=lambda ctx: [Command(f"touch {ctx.path(str(marker))}")])
    own = Step("own", "independent", Phase.CONFIGURATION,
               check=lambda ctx: [Command(f"test -e {ctx.path(str(marker))}")],
               apply=lambda ctx: [Command(f"touch {ctx.path(str(marker))}")])
    runner = Runner(pool, pool.cluster, [serve, mount, own], state_dir=tmp_path / "s",
                    nodes=["node0", "node1", "node2"])
    assert runner.skip("own", "node2")
    got = states(runner.run())
    assert got[("serve", "node0")] == StepState.FAILED
    assert runner.cells[("serve", "node0")].detail == "apply exit 3: cannot serve"
    assert got[("mount", "node1")] == got[("mount", "node2")] == StepState.BLOCKED
    assert got[("own", "node0")] == got[("own", "node1")] == StepState.DONE
    assert got[("own", "node2")] == StepState.SKIPPED
    assert not (tmp_path / "ran-node2").exists() and (tmp_path / "ran-node1").exists()


def cli(loopback, monkeypatch, tmp_path, *argv: str) -> int:
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    return main(["--config", str(loopback.cluster_yaml), *argv])


def test_setup_dry_run_names_exact_commands_per_node_and_touches_nothing(
        loopback, monkeypatch, tmp_path, capsys) -> None:
    cluster = load_cluster(loopback.cluster_yaml)
    exports_before = Path("/etc/exports").read_bytes() if Path("/etc/exports").exists() else None
    code = cli(loopback, monkeypatch, tmp_path, "setup", "--dry-run", "--json", "--profile",
               "seed-2024", "--steps", "nfs-server,nfs-mount,python-packages")
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    assert list(plan) == cluster.names()
    head = {c["step"]: c for c in plan["node0"]}
    exports = next(c for c in head["nfs-server"]["apply"] if "ensure-block" in c)
    for worker in cluster.nodes[1:]:
        assert f"{cluster.shared_dir} {worker.host}(rw,sync,no_subtree_check)" in exports
        mount = {c["step"]: c for c in plan[worker.name]}["nfs-mount"]
        line = f"{cluster.nodes[0].host}:{cluster.shared_dir} {cluster.shared_dir} nfs"
        assert any(line in c for c in mount["apply"])
        assert mount["as_root"] is True
    assert "*(" not in exports and "nfs-mount" not in head
    pip = [c for c in head["python-packages"]["apply"] if " -m pip " in c][0]
    assert "'torch<=2.3'" in pip and "deepspeed==0.14.0" in pip  # the chosen profile's pins
    assert not (tmp_path / "state").exists()
    now = Path("/etc/exports").read_bytes() if Path("/etc/exports").exists() else None
    assert now == exports_before

    assert cli(loopback, monkeypatch, tmp_path, "setup", "--dry-run", "--steps", "nccl-env",
               "--nodes", "node1") == 0
    text = capsys.readouterr().out
    assert text.startswith("node1:\n  [nccl-env]") and "node0:" not in text
    assert f"ensure-block {cluster.shared_dir}/svconsole/nccl/node1.env nccl" in text


def test_setup_twice_through_the_cli_second_says_nothing_changed(
        loopback, monkeypatch, tmp_path, capsys) -> None:
    args = ("setup", "--steps", "nccl-env", "--nodes", "node1,node2", "--json")
    cluster = load_cluster(loopback.cluster_yaml)
    for node in ("node1", "node2"):
        Path(cluster.shared_dir, "svconsole", "nccl", f"{node}.env").unlink(missing_ok=True)
    assert cli(loopback, monkeypatch, tmp_path, *args) == 0
    first = json.loads(capsys.readouterr().out)
    nccl = {c["node"]: c["state"] for c in first["cells"] if c["step"] == "nccl-env"}
    assert nccl == {"node1": "done", "node2": "done"}
    assert cli(loopback, monkeypatch, tmp_path, *args) == 0
    second = json.loads(capsys.readouterr().out)
    assert {c["state"] for c in second["cells"]} == {"already done"}
    assert second["message"].startswith("nothing changed")
    log = tmp_path / "state" / "runs" / second["run_id"] / "node2" / "nccl-env.log"
    assert "already holds it" in log.read_text()
    assert cli(loopback, monkeypatch, tmp_path, *args[:-1]) == 0  # the same, as text
    text = capsys.readouterr().out
    assert "node2: [nccl-env] == already done: " in text
    assert text.rstrip().splitlines()[-1].startswith("nothing changed: every step was already")


def test_setup_root_steps_need_yes_when_not_interactive(
        loopback, monkeypatch, tmp_path, capsys) -> None:
    code = cli(loopback, monkeypatch, tmp_path, "setup", "--steps", "net-tuning")
    err = capsys.readouterr().err
    assert code == 1
    assert "net-tuning on node0, node1, node2, node3: writes /etc/sysctl.d/90-svconsole.conf" in err
    assert "--yes" in err and not (tmp_path / "state").exists()
    assert cli(loopback, monkeypatch, tmp_path, "setup", "--retry-failed") == 2
    assert cli(loopback, monkeypatch, tmp_path, "setup", "--profile", "nope") == 2
    assert "unknown package profile 'nope'" in capsys.readouterr().err


def test_reboot_and_not_applicable_states_and_cancel(pool, tmp_path) -> None:
    import threading
    import time

    kmod = Step("kmod", "module", Phase.SOFTWARE, needs_root=True,
                apply=lambda ctx: [Command("echo 'installed; reboot to load it'; exit 100")])
    gpu = Step("gpu", "only with GPU", Phase.SOFTWARE,
               check=lambda ctx: [Command("echo 'no GPU here'; exit 101")],
               apply=lambda ctx: [Command("exit 1")])
    summary = Runner(pool, pool.cluster, [kmod, gpu], state_dir=tmp_path,
                     nodes=["node0", "node2"]).run()
    assert summary.cell("kmod", "node2").state == StepState.NEEDS_REBOOT
    assert summary.cell("kmod", "node2").detail == "installed; reboot to load it"
    assert summary.cell("gpu", "node2").state == StepState.NOT_APPLICABLE
    assert retry_selection(summary)[1] == {("kmod", "node0"), ("kmod", "node2")}

    slow = Step("slow", "sleeps", Phase.SOFTWARE, apply=lambda ctx: [Command("sleep 60")])
    after = Step("after", "next", Phase.SOFTWARE, apply=lambda ctx: [Command("true")])
    runner = Runner(pool, pool.cluster, [slow, after], state_dir=tmp_path, nodes=["node1"])
    timer = threading.Timer(1.5, runner.cancel)
    timer.start()
    started = time.monotonic()
    summary = runner.run()
    timer.join()
    assert time.monotonic() - started < 30
    assert summary.cell("slow", "node1").state == StepState.FAILED
    assert summary.cell("after", "node1").state == StepState.SKIPPED
