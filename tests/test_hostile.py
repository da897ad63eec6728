"""Hostile input and hostile neighbours on the nodes (real sshd, the loopback cluster).

- Files svconsole writes on a node never sit at a predictable path in a world-writable
  directory: node-side scripts go into a ``mktemp -d`` directory (0700, the SSH user's), removed
  afterwards, and a symlink planted where the old fixed path was is never followed; the storage
  measurement refuses a symlinked folder in shared_dir.
- Secrets never become world-readable: a run's record (which holds ``--env`` values for resume)
  is written mode 0600 on the node and in the local index, and the values never go on a command
  line (``ps``); names like ``*TOKEN*`` are shown as ``********`` in the plan (CLI and TUI text),
  the JSON output, the setup logs, the followed training logs and the launch dialog (which keeps
  the real value), while the training itself gets the real value.
- Every value that reaches a remote shell is quoted: ONE test runs every command builder (the
  setup steps' check/apply/verify and gather, every measurement, the launch's inspection, the
  launch, follow and stop) with hostile values in cluster.yaml, the setup options and the run
  (``$(touch X)``, backticks, ``;``, quotes, spaces) against real sshd, and X never appears;
  programs that would change this machine (apt-get, exportfs, mount, sysctl, ssh...) are
  replaced on the nodes' PATH by a recorder, which also proves each value arrived as one
  argument. What cannot be quoted safely (a newline, a blank in shared_dir, a driver branch that
  becomes a package name, an NCCL level, a node name) is refused when loaded, with its place.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shlex
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from console.bringup import Runner, SetupOptions, StepState
from console.bringup.catalog import CATALOG
from console.bringup.catalog import STEPS as CATALOG_STEPS
from console.bringup.measure import MEASUREMENTS, node_script
from console.bringup.model import Command, Phase, Step, StepContext
from console.cli import main
from console.cluster.model import ClusterConfigError, load_cluster, parse_cluster
from console.cluster.redact import REDACTED, redact, redact_env, redact_text
from console.ssh.pool import Pool
from console.ssh.remote import script_path
from console.training import runs
from console.training.follow import read_run
from console.training.launch import LaunchPlan, NodePlan, Preparation, inspect_nodes, launch
from console.training.profile import ProfileError, default_profile, parse_profile


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


def test_nfs_mount_check_never_follows_a_planted_symlink(pool, tmp_path) -> None:
    """The mount check writes a probe file on shared_dir (shared by a group, 2775) as root: a
    group member's symlink at a fixed name would make root create any file (/etc/nologin)."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "findmnt").write_text("#!/bin/sh\necho 'nfs4 head:/shared'\n")  # as if mounted
    (stubs / "findmnt").chmod(0o755)
    cluster = pool.cluster
    shared = cluster.local_path(cluster.shared_dir)
    target = tmp_path / "made-by-root"
    planted = shared / ".svconsole-mount-node1"
    planted.symlink_to(target)
    try:
        ctx = StepContext(cluster, cluster.node("node1"), SetupOptions())
        for command in CATALOG["nfs-mount"].verify(ctx):
            result = pool.run("node1", command.text, env={"PATH": f"{stubs}:{os.environ['PATH']}"})
            assert result.ok, result
    finally:
        planted.unlink(missing_ok=True)
    assert not target.exists()
    assert not list(shared.glob(".svconsole-mount-node1.*"))  # its own probe is gone too


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


async def test_launch_dialog_shows_a_secret_redacted_and_keeps_it() -> None:
    from textual.widgets import Input

    from console.cluster.model import local_cluster
    from console.training.launch import LaunchOptions
    from screens.app import SVConsoleApp
    from screens.training import LaunchDialog

    cluster = local_cluster()
    with Pool(cluster) as local:
        app = SVConsoleApp(cluster, local, health_interval=None)
        async with app.run_test(size=(100, 30)) as pilot:
            options = LaunchOptions(env={"HF_TOKEN": TOKEN, "OMP_PROC_BIND": "close"})
            dialog = LaunchDialog(local, None, options=options)
            await app.push_screen(dialog)
            await pilot.pause(0.2)
            field = dialog.query_one("#launch-env", Input)
            assert TOKEN not in field.value and f"HF_TOKEN='{REDACTED}'" in field.value
            assert dialog.spec().options.env == options.env  # left as it was: kept
            field.value = f"HF_TOKEN='{REDACTED}' OMP_PROC_BIND=spread EXTRA=1"
            assert dialog.spec().options.env == {"HF_TOKEN": TOKEN, "OMP_PROC_BIND": "spread",
                                                 "EXTRA": "1"}
            field.value = "HF_TOKEN=new-one"
            assert dialog.spec().options.env == {"HF_TOKEN": "new-one"}


def test_run_record_with_env_secrets_is_0600_and_plan_output_redacted(pool, tmp_path) -> None:
    cluster = pool.cluster
    out = tmp_path / "out"
    program = ("import os; print('token length', len(os.environ['HF_TOKEN'])); "
               "print('HF_TOKEN=' + os.environ['HF_TOKEN'], flush=True)")
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
        shown = [e.text for _n, e in read_run(pool, record, nodes=[nodes[0].node])]
        assert f"HF_TOKEN={REDACTED}" in shown and not any(TOKEN in t for t in shown)
        listing = subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True)
        assert TOKEN not in listing.stdout
        for word in listing.stdout.split():  # nor inside the node script's payload
            try:
                decoded = base64.b64decode(word, validate=True)
            except ValueError:
                continue
            assert TOKEN.encode() not in decoded
        assert not list(Path(runs.run_dir(str(out), record.id)).glob("*.secrets"))
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


# ------------------------------------------------------------------------------ hostile values

RECORDER = """#!/bin/sh
# stands in for a program that would change this machine: records its arguments, one per line
{{ echo "== $(basename "$0")"; for a in "$@"; do printf '%s\\n' "$a"; done; }} >> {log}
exit 0
"""
CHANGES_THE_MACHINE = ("apt-get", "dpkg-query", "exportfs", "mount", "mountpoint", "findmnt",
                       "sysctl", "groupadd", "chgrp", "ssh", "nvidia-smi")


def hostile(name: str, *, blanks: bool = True) -> str:
    """A value that runs ``touch`` of ``$SV_MARK`` (set on the nodes to the marker's path) and
    of ``name`` in the shell's directory if any shell ever takes it for code; without
    ``blanks`` it has no blanks or quotes. No slash: a directory made of it is one directory."""
    if not blanks:
        return f"$(touch${{IFS}}{name})`touch${{IFS}}$SV_MARK`;touch${{IFS}}$SV_MARK&"
    return f"x $(touch {name}) `touch \"$SV_MARK\"`; touch \"$SV_MARK\" && echo \"'q'\" ' \\"


def python_at(path: Path) -> str:
    """A working interpreter at a hostile path (a wrapper of this test's Python)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def test_every_command_builder_quotes_hostile_values(loopback, tmp_path) -> None:
    marker = tmp_path / f"PWNED{secrets.token_hex(4)}"
    bad, bad_word = hostile(marker.name), hostile(marker.name, blanks=False)
    home_marker = Path.home() / marker.name
    stubs, recorded = tmp_path / "stubs", tmp_path / "recorded.txt"
    stubs.mkdir()
    for program in CHANGES_THE_MACHINE:
        (stubs / program).write_text(RECORDER.format(log=shlex.quote(str(recorded))))
        (stubs / program).chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "SV_MARK": str(marker)}

    # cluster.yaml with hostile values wherever the loader lets them through
    base = tmp_path / f"base {bad}"
    shared = tmp_path / f"shared{bad_word}"
    shared.mkdir()
    text = loopback.cluster_yaml.read_text()
    text = text.replace("  name: loopback\n", f"  name: {json.dumps('lb ' + bad)}\n")
    text = text.replace(f"  shared_dir: {loopback.shared_dir}\n", f"  shared_dir: {json.dumps(str(shared))}\n")
    python = python_at(base / "py" / "bin" / "python")
    text = "".join(f"  python: {json.dumps(python)}\n" if line.startswith("  python:") else line
                   + "\n" for line in text.splitlines())
    hostile_yaml = tmp_path / "cluster.yaml"
    hostile_yaml.write_text(text)
    cluster = load_cluster(hostile_yaml)
    assert cluster.shared_dir == str(shared) and cluster.python == python
    nodes = ["node0", "node1", "node2"]  # node2 prints a banner
    options = SetupOptions(
        env_path=f"{base}/env/{{node}}", base_python=python, venv_with_pip=False,
        profile="test", find_links=f"{base}/wheels", no_index=True, conda=f"{base}/conda",
        ssh_dir=f"{base}/ssh/{{node}}", exports_file=f"{base}/etc/exports",
        fstab_file=f"{base}/etc/fstab", sysctl_file=f"{base}/etc/sysctl.d/90.conf",
        latency_count=20, bench_mb=1, bench_iters=1, iperf_seconds=1, burnin_seconds=0.1,
        burnin_size=64, storage_mb=1)
    ran: list[str] = []

    with Pool(cluster) as real:
        pool = Recorder(real)  # every upload's place is checked at the end

        def run(node: str, command: Command) -> str:
            ran.append(command.text)
            result = pool.run(node, command.text, stdin=command.stdin or "", env=env, timeout=120)
            assert result.error is None, (command.text, result.error)
            return result.stdout

        # every setup step: gather, check, apply, verify, on each of its nodes
        for step in CATALOG_STEPS:
            if step.measure is not None:
                continue
            gathered: dict[str, str] = {}
            if step.gather is not None:
                for name in nodes:
                    ctx = StepContext(cluster, cluster.node(name), options)
                    gathered[name] = "".join(run(name, c) for c in step.gather(ctx))
            for name in [n for n in step.nodes(cluster) if n in nodes]:
                ctx = StepContext(cluster, cluster.node(name), options, gathered)
                for build in (step.check, step.apply, step.verify):
                    for command in build(ctx):
                        run(name, command)
        exports = Path(options.exports_file).read_text()
        assert f"{shared} 127.0.1.2(rw,sync,no_subtree_check)" in exports  # the whole path
        args = recorded.read_text().split("\n")
        assert options.sysctl_file in args  # each value reached its program as one argument
        assert str(shared) in args and "nvidia-driver-550-server" in args
        assert (Path(options.ssh_dir.replace("{node}", "node1")) / "id_ed25519.pub").exists()

        # every measurement, through the runner
        steps = [s for s in MEASUREMENTS.values()]
        summary = Runner(pool, cluster, steps, state_dir=tmp_path / "state", options=options,
                         nodes=nodes).run()
        failed = [(c.step, c.node, c.detail) for c in summary.cells
                  if c.state == StepState.FAILED and c.step != "iperf3"]
        assert not failed, failed

        # the launch: the nodes inspected, a run started, followed and stopped
        out = f"{base}/out"
        profile = default_profile().replace("output_dir", out)
        profile = profile.replace("train_data_set_list", f"{base}/train.jsonl")
        infos = inspect_nodes(pool, profile, cluster.master_port)
        assert all(i.error is None for i in infos.values()), infos
        program = "import sys, time; print('argument', sys.argv[1], flush=True); time.sleep(60)"
        plans = [NodePlan(n, cluster.node(n).host, rank, 1, [python, "-c", program, bad],
                          {"HOSTILE": bad, "PYTHONUNBUFFERED": "1"}, out, f"{out}/logs/{n}.log")
                 for rank, n in enumerate(nodes[:2])]
        plan = LaunchPlan(runs.new_run_id(), cluster.name, "node0", plans[0].host, 1, out,
                          "train_ds", [], plans)
        record = launch(pool, Preparation(infos, plan, [], profile), tmp_path / "state")
        try:
            log = Path(f"{out}/logs/node1.log")
            deadline = time.monotonic() + 60
            while f"argument {bad}" not in (log.read_text() if log.exists() else ""):
                assert time.monotonic() < deadline, "the run never printed its argument"
                time.sleep(0.2)
            lines = [e.text for _node, e in read_run(pool, record)]
            assert f"argument {bad}" in lines
            assert runs.run_status(pool, record).state == "running"
        finally:
            stopped = runs.stop_run(pool, record, grace=5)
        assert set(stopped) == {"node0", "node1"}
        assert runs.run_status(pool, record).state != "running"

    assert len(ran) > 60
    assert {Path(p).name for _, p in pool.puts} >= {"burnin.py", "svconsole-run.json"}
    for path, parent in pool.put_parents.items():  # nothing at a guessable world-writable place
        assert not parent.st_mode & stat.S_IWOTH, f"{path}: its directory is world-writable"
    assert not marker.exists() and not home_marker.exists(), "a hostile value was run"
    assert not list(tmp_path.rglob(marker.name)) and not list(Path.home().glob(marker.name))


def test_values_that_cannot_be_quoted_safely_are_refused_at_load_time(tmp_path, capsys) -> None:
    def issues(**cluster: str) -> str:
        conf = {"name": "t", "shared_dir": "/data", "master": "a", **cluster}
        body = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in conf.items())
        text = f"cluster:\n{body}nodes:\n  - name: a\n    host: 10.0.0.1\n"
        with pytest.raises(ClusterConfigError) as err:
            parse_cluster(text)
        return str(err.value)

    assert "cluster.yaml:3:15: cluster.shared_dir: must be a path without blanks" in \
        issues(shared_dir="/data/my share")  # /etc/exports would have exported /data/my
    assert "cluster.shared_dir: must be one line" in issues(shared_dir="/data\n/x")
    assert "cluster.python: must be one line" in issues(python="/opt/py\n$(touch X)")
    with pytest.raises(ClusterConfigError) as err:
        parse_cluster("cluster:\n  name: t\n  shared_dir: /d\n  master: a\nnodes:\n"
                      "  - name: a\n    host: 10.0.0.1\n  - name: '$(touch X)'\n    host: b\n"
                      "  - name: c\n    host: 'h;touch X'\n")
    assert "cluster.yaml:8:11: nodes[1].name: must be letters, digits" in str(err.value)
    assert "cluster.yaml:11:11: nodes[2].host: must be a host name" in str(err.value)
    with pytest.raises(ProfileError) as perr:
        parse_profile('output_dir: "/out\\n$(touch X)"\nextra:\n  "a b=c": 1\n', "training.yaml")
    assert "training.yaml:1: output_dir: must be one line" in str(perr.value)
    assert "training.yaml:3: extra.a b=c: the override key 'a b=c' is not letters" \
        in str(perr.value)
    with pytest.raises(ValueError) as oerr:
        SetupOptions(driver="550'; touch X; '", nccl_debug="$(touch X)", export_options="rw sync")
    for field_name in ("driver:", "nccl_debug:", "export_options:"):
        assert field_name in str(oerr.value)
    path = tmp_path / "cluster.yaml"
    path.write_text("cluster:\n  name: t\n  shared_dir: /d\n  master: a\nnodes:\n"
                    "  - name: a\n    local: true\n")
    assert main(["--config", str(path), "setup", "--dry-run", "--driver", "550'; touch X"]) == 2
    assert "driver: \"550'; touch X\" is not a driver branch" in capsys.readouterr().err
    assert main(["--config", str(path), "launch", "--dry-run", "--env", "A B=1"]) == 2
    assert "--env 'A B': a variable name is letters" in capsys.readouterr().err
