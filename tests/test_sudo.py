"""Root steps through REAL sudo on loopback nodes, as ordinary users (real sshd, real sudo).

The test makes three users with ``useradd`` (removed afterwards, even on failure) and one sudoers
file in /etc/sudoers.d: ``<p>`` needs its password (set with ``chpasswd``), ``<n>`` has NOPASSWD,
``<x>`` may not use sudo. Each user gets its own loopback cluster (sshd lets one user in); the
password user's second node prints a login banner on stdout and stderr for every command.

- The one sudo probe parser reads the mode on the banner node too.
- A wrong password fails every root cell with a clear message, and sudo saw exactly one attempt
  per node (its own log file says so), however many commands the steps have.
- The right password runs the steps as root (a file only root may write, through the edits
  program on stdin); NOPASSWD runs them without asking anyone; the user without sudo is told so.
- The password never appears in ``ps``, in svconsole's logs and summaries, in sshd's logs, in
  sudo's log, in the user's home, or in Python's log records.
- The Setup screen asks again after sudo refused its password (instead of sending it again),
  and the right one then runs the steps.
"""

from __future__ import annotations

import logging
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_setup_screen import pane_text, settle, status  # tests/ is on sys.path (conftest.py)

from console.bringup import Runner, StepState
from console.bringup.catalog import edit
from console.bringup.model import Command, Phase, Step
from console.cluster.model import load_cluster
from console.ssh.loopback import LoopbackCluster, find_sshd
from console.ssh.pool import Pool

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("sudo") is None or shutil.which("useradd") is None
    or find_sshd() is None,
    reason="needs root, sudo, useradd and sshd (scripts/test installs sudo and openssh-server)")

PASSWORD = "Corr3ct-" + secrets.token_hex(6)
WRONG = "Wr0ng-" + secrets.token_hex(6)


class Users:
    """The test's users and sudoers file; ``root_dir`` is a directory only root may write."""

    def __init__(self, base: Path) -> None:
        tag = secrets.token_hex(3)
        self.pw, self.nopw, self.none = f"svs{tag}p", f"svs{tag}n", f"svs{tag}x"
        self.nosudo = f"svs{tag}m"  # its shell's PATH has no sudo: as on a node without it
        self.base = base
        self.sudo_log = base / "sudo.log"
        self.root_dir = base / "root-only"
        self.sudoers = Path(f"/etc/sudoers.d/svconsole-test-{tag}")
        self.made: list[str] = []

    def create(self) -> None:
        self.root_dir.mkdir(mode=0o755)
        for name in (self.pw, self.nopw, self.none, self.nosudo):
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
            self.made.append(name)
        subprocess.run(["usermod", "-p", "*", self.nosudo], check=True)
        home = Path(pwd.getpwnam(self.nosudo).pw_dir)
        tools = home / "bin"
        tools.mkdir()
        for tool in ("bash", "sh", "id", "cat", "python3", "test"):
            (tools / tool).symlink_to(shutil.which(tool))
        (home / ".bashrc").write_text(f"export PATH={tools}\n")  # read by sshd's bash
        subprocess.run(["chpasswd"], input=f"{self.pw}:{PASSWORD}\n{self.none}:{PASSWORD}\n",
                       text=True, check=True)
        subprocess.run(["usermod", "-p", "*", self.nopw], check=True)  # no password, not locked
        rules = (f"Defaults:{self.pw},{self.nopw},{self.none} logfile={self.sudo_log}, !lecture\n"
                 f"{self.pw} ALL=(ALL:ALL) ALL\n"
                 f"{self.nopw} ALL=(ALL:ALL) NOPASSWD: ALL\n")
        staged = self.base / "sudoers"
        staged.write_text(rules)
        subprocess.run(["visudo", "-c", "-q", "-f", str(staged)], check=True)
        staged.chmod(0o440)
        shutil.copy(staged, self.sudoers)
        self.sudoers.chmod(0o440)

    def remove(self) -> None:
        self.sudoers.unlink(missing_ok=True)
        for name in self.made:
            subprocess.run(["pkill", "-KILL", "-u", name], check=False)
            subprocess.run(["userdel", "-r", "-f", name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def users() -> Iterator[Users]:
    base = Path(tempfile.mkdtemp(prefix="svsudo-"))
    base.chmod(0o755)  # sshd reads authorized_keys as the user; sudo writes its log as root
    made = Users(base)
    try:
        made.create()
        yield made
    finally:
        made.remove()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def clusters(users: Users) -> Iterator[dict[str, LoopbackCluster]]:
    """A loopback cluster per user: the password user's has 2 nodes, node1 with a banner."""
    started: dict[str, LoopbackCluster] = {}
    try:
        for key, user, n, banner in (("pw", users.pw, 2, (1,)), ("nopw", users.nopw, 1, ()),
                                     ("none", users.none, 1, (0,)),
                                     ("nosudo", users.nosudo, 1, ())):
            cluster = LoopbackCluster(users.base / key, n, base_port=None, user=user,
                                      banner_nodes=banner, guard=True,
                                      user_rc=key == "nosudo")
            started[key] = cluster
            cluster.up()
            (users.base / key).chmod(0o755)
        yield started
    finally:
        for cluster in started.values():
            cluster.down()


def root_steps(users: Users, tag: str) -> list[Step]:
    """Two root steps of two commands each: a file only root may write (via the edits program
    on stdin), and a check that the command really ran as root."""
    target = users.root_dir / f"{tag}-{{node}}.conf"

    def apply(ctx):
        path = str(target).replace("{node}", ctx.node.name)
        return [edit("ensure-line", path, f"written by {tag}"), Command(f"test -s {path}")]

    def check(ctx):
        path = str(target).replace("{node}", ctx.node.name)
        return [edit("ensure-line", path, f"written by {tag}", check=True)]

    return [
        Step(f"{tag}-file", "root file", Phase.CONFIGURATION, needs_root=True,
             check=check, apply=apply, timeout=120),
        Step(f"{tag}-whoami", "root id", Phase.CONFIGURATION, needs_root=True,
             apply=lambda ctx: [Command('[ "$(id -u)" = 0 ]'), Command("id -un")],
             timeout=120),
    ]


class PsWatch:
    """Samples every process's command line (``ps``) while svconsole runs."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True)
            self.seen.append(out.stdout)
            self.samples += 1
            self._stop.wait(0.02)

    def __enter__(self) -> PsWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def cells(summary) -> dict[tuple[str, str], tuple[StepState, str]]:
    return {(c.step, c.node): (c.state, c.detail) for c in summary.cells}


def files_under(*roots: Path) -> Iterator[Path]:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                yield path


def test_password_sudo_wrong_then_right_on_a_banner_node(users, clusters, tmp_path,
                                                         caplog) -> None:
    caplog.set_level(logging.DEBUG)
    lb = clusters["pw"]
    cluster = load_cluster(lb.cluster_yaml)
    given = [WRONG]
    asked: list[str] = []

    def provider() -> str:
        asked.append("?")
        return given[0]

    with PsWatch() as ps, Pool(cluster, sudo_password=provider) as pool:
        assert pool.sudo_mode("node0") == "password"
        assert pool.sudo_mode("node1") == "password"  # the banner printed first
        wrong = Runner(pool, cluster, root_steps(users, "wrong"), state_dir=tmp_path).run()
        for (step, node), (state, detail) in cells(wrong).items():
            assert state == StepState.FAILED, (step, node, detail)
            assert f"sudo on {node}: wrong password" in detail and "not tried again" in detail
        attempts = users.sudo_log.read_text().count("incorrect password attempt")
        assert attempts == 2, users.sudo_log.read_text()  # one per node, never a loop
        given[0] = PASSWORD
        right = Runner(pool, cluster, root_steps(users, "right"), state_dir=tmp_path).run()
        assert {s for s, _ in cells(right).values()} == {StepState.DONE}, cells(right)
        again = Runner(pool, cluster, root_steps(users, "right")[:1], state_dir=tmp_path).run()
        assert {s for s, _ in cells(again).values()} == {StepState.ALREADY_DONE}
    for node in ("node0", "node1"):
        made = users.root_dir / f"right-{node}.conf"
        assert made.read_text() == "written by right\n" and made.stat().st_uid == 0
    assert not list(users.root_dir.glob("wrong-*"))
    log = (tmp_path / "runs" / right.run_id / "node1" / "right-whoami.log").read_text()
    assert "root" in log.splitlines() and "banner noise" in log
    assert users.sudo_log.read_text().count("incorrect password attempt") == attempts
    assert ps.samples > 5
    home = Path(pwd.getpwnam(users.pw).pw_dir)
    for text in ps.seen:
        assert PASSWORD not in text and WRONG not in text
    for path in files_under(tmp_path, lb.directory, home, users.base):
        data = path.read_bytes()
        assert PASSWORD.encode() not in data and WRONG.encode() not in data, path
    assert PASSWORD not in caplog.text and WRONG not in caplog.text


def test_password_sudo_output_is_streamed_live(users, clusters, tmp_path) -> None:
    """The step waits for a gate that the test opens only once it saw the step's first line:
    it ends only if its output arrives while it runs."""
    cluster = load_cluster(clusters["pw"].cluster_yaml)
    gate = users.base / f"gate-{secrets.token_hex(3)}"
    step = Step("live", "root, live", Phase.CONFIGURATION, needs_root=True, timeout=60,
                apply=lambda ctx: [Command(f"id -u; echo first; while [ ! -e {gate} ]; do "
                                           f"sleep 0.1; done; echo second")])
    with Pool(cluster, sudo_password=lambda: PASSWORD) as pool:
        runner = Runner(pool, cluster, [step], state_dir=tmp_path, nodes=["node1"])
        runner.subscribe(lambda e: gate.touch() if getattr(e, "text", "") == "first" else None)
        summary = runner.run()
    assert summary.state("live", "node1") == StepState.DONE, summary.cell("live", "node1")
    log = Path(summary.cell("live", "node1").log).read_text().splitlines()
    assert "0" in log and log.index("first") < log.index("second")


def root_run(users: Users, lb: LoopbackCluster, tag: str, password: str | None, state: Path
             ) -> tuple[str, dict, list[str], str]:
    """On ``lb`` as its user: the mode the probe finds on node0, the cells of a run of
    :func:`root_steps`, how often the pool asked for ``password``, and ``id -un`` run plainly."""
    cluster = load_cluster(lb.cluster_yaml)
    asked: list[str] = []
    with Pool(cluster, sudo_password=lambda: asked.append("?") or password) as pool:
        mode = pool.sudo_mode("node0")
        summary = Runner(pool, cluster, root_steps(users, tag), state_dir=state).run()
        plain = pool.run("node0", "id -un")
    assert plain.ok, plain  # ordinary commands still work
    return mode, cells(summary), asked, plain.stdout.strip()


def test_nopasswd_sudo_runs_root_steps_without_asking(users, clusters, tmp_path) -> None:
    mode, done, asked, _ = root_run(users, clusters["nopw"], "nopw", None, tmp_path)
    assert mode == "nopass"
    assert {s for s, _ in done.values()} == {StepState.DONE}, done
    assert (users.root_dir / "nopw-node0.conf").stat().st_uid == 0
    assert asked == []


def test_user_without_sudo_is_told_so(users, clusters, tmp_path) -> None:
    mode, failed, _, whoami = root_run(users, clusters["none"], "none", PASSWORD, tmp_path)
    assert mode == "password"  # only sudo, given a password, can tell
    for state, detail in failed.values():
        assert state == StepState.FAILED
        assert "sudo on node0: the SSH user may not use sudo there" in detail, detail
        assert "not in the sudoers file" in detail
    assert whoami.endswith(users.none)
    assert not list(users.root_dir.glob("none-*"))


async def test_setup_screen_asks_again_after_sudo_refused_the_password(users, clusters, tmp_path,
                                                                       monkeypatch) -> None:
    from console.bringup import SetupOptions
    from screens.app import SVConsoleApp
    from screens.setup import SetupScreen
    from screens.setup_widgets import PasswordModal

    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    cluster = load_cluster(clusters["pw"].cluster_yaml)
    steps = root_steps(users, "tui")
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    before = (users.sudo_log.read_text().count("incorrect password attempt")
              if users.sudo_log.exists() else 0)

    async def modal(pilot) -> None:
        for _ in range(300):
            await pilot.pause(0.1)
            if isinstance(app.screen, PasswordModal):
                return
        raise AssertionError(f"no password dialog: {status(screen)}")

    try:
        async with app.run_test(size=(100, 30)) as pilot:
            screen = SetupScreen(options=SetupOptions(), steps=steps)
            await app.push_screen(screen)
            await settle(pilot, screen)
            screen._check_sudo(screen._runner(steps))  # as after the operator confirmed
            await modal(pilot)
            await pilot.press(*WRONG, "enter")
            await settle(pilot, screen, timeout=60)
            assert {screen.standing.state(s.id, n) for s in steps for n in cluster.names()} \
                == {StepState.FAILED}
            assert "wrong password" in pane_text(screen)
            screen._check_sudo(screen._runner(steps))
            await modal(pilot)  # asked again: the refused password is not sent a second time
            assert "refused the password on node0, node1: type it again" in status(screen)
            await pilot.press(*PASSWORD, "enter")
            await settle(pilot, screen, timeout=60)
            assert {screen.standing.state(s.id, n) for s in steps for n in cluster.names()} \
                == {StepState.DONE}
            assert PASSWORD not in pane_text(screen) and WRONG not in pane_text(screen)
    finally:
        pool.close()
    assert users.sudo_log.read_text().count("incorrect password attempt") == before + 2
    assert (users.root_dir / "tui-node1.conf").stat().st_uid == 0


def test_node_without_sudo_is_told_so(users, clusters, tmp_path) -> None:
    mode, failed, asked, whoami = root_run(users, clusters["nosudo"], "nosudo", PASSWORD,
                                           tmp_path)
    assert mode == "missing"
    for state, detail in failed.values():
        assert state == StepState.FAILED
        assert "node0: the SSH user is not root and sudo is not installed there" in detail
    assert whoami == users.nosudo
    assert asked == []  # nobody is asked for a password sudo could never take


def test_an_unattended_sudo_never_asks_for_the_password(users, clusters) -> None:
    """The run's watch reads a SIGKILLed rank's kernel log with sudo only where sudo needs
    no password: ``ask=False`` never calls the password provider (a toast or prompt while the
    operator is away), and says why it did not run; passwordless sudo runs."""
    asked: list[str] = []

    def provider() -> str:
        asked.append("?")
        return PASSWORD

    with Pool(load_cluster(clusters["pw"].cluster_yaml), sudo_password=provider) as pool:
        result = pool.run("node0", "id -u", sudo=True, ask=False)
        assert result.error == "sudo on node0 needs a password (not asked: unattended)"
        assert asked == []
        assert pool.run("node0", "id -u", sudo=True).stdout.strip() == "0" and asked == ["?"]
    with Pool(load_cluster(clusters["nopw"].cluster_yaml), sudo_password=provider) as pool:
        assert pool.run("node0", "id -u", sudo=True, ask=False).stdout.strip() == "0"
    assert asked == ["?"]
