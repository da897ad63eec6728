"""The README's "Try it without a cluster" (docs/walkthrough.md), run as a new user would.

Every marked command block of the document runs, in its order, in bash from the repository root;
the console part runs the real ``svconsole`` in tmux against the same loopback cluster, and the
screen text is read after each step: the nodes up on the Nodes screen, the Setup grid after the
bring-up steps, the Config screen's summary line, the run with its progress on the Training
screen, "no NVIDIA GPU" on the GPUs screen, the help. The real tiny SenseVoice trains on CPU
(FunASR's train_ds.py, torchrun, DeepSpeed ZeRO-1 over gloo); the loss falls, the run is stopped
and resumed from its checkpoint. Whatever happens, the run is stopped, tmux killed and the cluster
taken down.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import time
import uuid
from pathlib import Path

import pytest
from svconsole_scripts import screenshots
from tmux import Tmux
from walk import (
    REPO,
    Shell,
    isolate_node_names,
    needs_training_and_tmux,
    run_pids,
    screen_where,
    svg_text,
    terminal_env,
    wait_until,
    walkthrough_blocks,
)

from console.cluster.model import load_cluster
from console.ssh.loopback import LoopbackCluster, LoopbackError
from console.ssh.pool import Pool
from console.training import runs
from console.training.logparse import TrainStep, parse_file

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _grid_row(screen: str, step: str, nodes: int = 3) -> list[str]:
    """The state symbols of one step's row in the Setup grid (a scrollbar may follow them)."""
    for line in screen.splitlines():
        match = re.search(rf"\s{re.escape(step)}\s+(.*)$", line)
        if match:
            return match.group(1).split()[:nodes]
    return []


def _loss_by_epoch(record: runs.RunRecord) -> dict[int, float]:
    """Train loss averaged over every rank's steps, per epoch, read from the run's log files."""
    losses: dict[int, list[float]] = {}
    for node in record.nodes:
        for event in parse_file(node.log):
            if event.offset >= node.log_offset and isinstance(event, TrainStep):
                losses.setdefault(event.epoch, []).append(event.loss)
    return {epoch: sum(v) / len(v) for epoch, v in sorted(losses.items())}


def _epoch_on_screen(screen: str) -> int:
    match = re.search(r"epoch (\d+)/20\b", screen)
    return int(match[1]) if match else 0


def test_walkthrough_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    needs_training_and_tmux()
    demo = tmp_path / "demo"
    shell = Shell.for_user(DEMO=str(demo))
    blocks = {b.name: b for b in walkthrough_blocks()}
    ran: list[str] = []
    notes: list[str] = []
    started = time.monotonic()

    def run(name: str, timeout: float = 180) -> str:
        ran.append(name)
        return shell.run(blocks[name].code, timeout=timeout)

    tui: Tmux | None = None
    try:
        # 1. the cluster
        out = run("cluster")
        assert [ln.split()[:2] for ln in out.splitlines() if ln.startswith("node")] == \
            [["node0", "up"], ["node1", "up"], ["node2", "up"]], out
        names = isolate_node_names(demo / "cluster.yaml", uuid.uuid4().hex[:4])

        # 2. the console, in a terminal of its own
        ran.append("console")
        env = terminal_env(120, 40, **{k: shell.env[k] for k in
                                       ("PATH", "DEMO", "SVCONSOLE_STATE_DIR", "HOME")})
        tui = Tmux(f"bash -c {shlex.quote(blocks['console'].code.strip())}", width=120,
                   height=40, env=env, cwd=str(REPO))
        screen = tui.wait_for("3/3 nodes up", 60)
        screen = screen_where(tui, lambda s: all(re.search(rf"{n}\s+up\b", s) for n in names),
                              60, "every node up")
        notes.append("Nodes: " + " | ".join(ln.strip() for ln in screen.splitlines()
                                             if any(n in ln for n in names)))

        # 3. bring-up steps that may run on this machine
        out = run("setup")
        assert "finished:" in out and "failed" not in out.splitlines()[-1], out
        tui.send("2")
        screen = screen_where(tui, lambda s: _grid_row(s, "nccl-env") == ["✓"] * 3, 30,
                              "nccl-env done on the Setup grid")
        assert _grid_row(screen, "python-env") == ["="] * 3, screen
        assert _grid_row(screen, "latency") == ["✓"] * 3, screen
        assert _grid_row(screen, "build-essential") == ["·"] * 3, screen  # not run here

        # 4-5. data, profile, validation
        run("data")
        out = run("validate", timeout=240)
        assert re.search(r"^0 errors / \d+ warnings / ready to launch$", out, re.MULTILINE), out
        tui.send("3")
        screen = tui.wait_for("ready to launch", 120)
        notes.append("Config: " + next(ln.strip() for ln in screen.splitlines()
                                       if "ready to launch" in ln))

        # 6. launch
        out = run("launch", timeout=240)
        match = re.search(r"launched run (\S+);", out)
        assert match, out
        state = Path(shell.env["SVCONSOLE_STATE_DIR"])
        first = runs.find_record(state, match[1])
        assert len(run_pids(first.id)) >= 3, "the run's processes are not alive"

        # 7. the loss falls, on the Training screen and in the logs
        tui.send("4")
        tui.wait_for(first.id, 60)
        out_dir = demo / "shared" / "exp"
        screen = screen_where(tui, lambda s: _epoch_on_screen(s) >= 4, 400,
                              "epoch 4/20 on the Training screen")
        notes.append("Training: " + next(ln.strip() for ln in screen.splitlines()
                                         if "epoch " in ln and "/20" in ln))
        assert (out_dir / "model.pt").exists()
        out = run("metrics")
        assert first.id in out and "running" in out, out
        losses = _loss_by_epoch(first)
        done = [e for e in losses if e < max(losses)]  # the last epoch may be incomplete
        assert len(done) >= 3 and losses[done[-1]] < losses[done[0]], losses
        notes.append("loss by epoch: " + ", ".join(f"{e}: {v:.1f}" for e, v in losses.items()))

        # 8. stop, resume
        out = run("stop")
        assert "none left" in out and not run_pids(first.id), out
        tui.wait_for("stopped", 60)
        out = run("resume", timeout=400)
        assert "Checkpoint loaded" in out, out
        second = runs.find_record(state, "latest")
        assert second.resumed_from == first.id
        tui.send("u")  # the Training screen looks for runs again and follows the live one
        tui.wait_for(second.id, 60)
        wait_until(lambda: not run_pids(second.id), 400, "the resumed run to finish")
        screen = tui.wait_for("finished", 60)
        resumed = _loss_by_epoch(second)
        trained = _loss_by_epoch(first)  # up to the stop
        # from the last checkpoint: after the first run's last complete epoch, not from 0
        assert resumed and 0 < min(resumed) <= max(trained) + 1, (trained, resumed)

        # 9. GPUs, help, quit
        tui.send("5")
        tui.wait_for("no NVIDIA GPU on this node", 60)
        tui.send("?")
        tui.wait_for("Keys", 20)
        tui.send("Escape")  # alone: an escape followed at once by q would read as alt+q
        screen_where(tui, lambda s: "Keys" not in s, 20, "the help closed")
        tui.send("q")
        tui.wait_for("[exited 0 ]", 20)

        # the documentation's pictures, taken the documented way from this very state
        shots = asyncio.run(screenshots.take(demo / "cluster.yaml", tmp_path / "shots",
                                             (120, 36), settle=2.0))
        seen = {p.stem: svg_text(p.read_text()) for p in shots}
        for name, text in (("nodes", names[0]), ("setup", "nccl-env"),
                           ("config", "train_micro_batch_size_per_gpu"),
                           ("training", second.id), ("gpus", "no NVIDIA GPU"),
                           ("help", "Keys")):
            assert text in seen[name], (name, text)

        # 10. clean up
        run("down")
        assert not any(entry["answers"] for entry in LoopbackCluster.load(demo).status())
        assert ran == list(blocks), ran
    finally:
        if tui is not None:
            tui.close()
        _leave_nothing(demo, shell)
    with capsys.disabled():
        print(f"\nwalkthrough: {len(ran)} steps in {time.monotonic() - started:.0f} s")
        for line in notes:
            print(f"  {line}")


def _leave_nothing(demo: Path, shell: Shell) -> None:
    """Stop every run this test launched and take the cluster down, whatever state it is in."""
    state = Path(shell.env["SVCONSOLE_STATE_DIR"])
    try:
        cluster = LoopbackCluster.load(demo)
    except LoopbackError:
        return
    pool = Pool(load_cluster(cluster.cluster_yaml))
    try:
        for record in runs.load_index(state):
            if run_pids(record.id):
                runs.stop_run(pool, record, grace=2)
    finally:
        pool.close()
        cluster.down()
