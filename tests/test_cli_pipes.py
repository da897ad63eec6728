"""The CLI in pipes and under Ctrl-C, as an operator uses it against real loopback sshd nodes:
``| head -1`` and ``| grep -m1`` end it quietly (status 141, as SIGPIPE would), Ctrl-C ends it
quietly with status 130, and neither prints a traceback nor touches the run being followed."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_runs import dummy_plan, tagged

from console.cli import EXIT_INTERRUPTED, EXIT_PIPE
from console.cluster.model import load_cluster
from console.ssh.pool import Pool
from console.training import runs
from console.training.launch import launch

NOISE = ("Traceback", "BrokenPipeError", "Exception ignored", "KeyboardInterrupt")


def svconsole() -> list[str]:
    """The installed entry point next to this Python (the console script a user runs)."""
    script = Path(sys.executable).parent / "svconsole"
    return [str(script)] if script.exists() else [sys.executable, "-m", "console.cli"]


def piped(loopback, args: str, reader: str, *, timeout: float = 120) -> tuple[str, str, int, float]:
    """``svconsole ARGS 2>ERR | READER`` in bash: (what the reader printed, svconsole's stderr,
    svconsole's exit status, seconds the pipeline took)."""
    err = Path(os.environ["SVCONSOLE_STATE_DIR"]) / f"stderr-{uuid.uuid4().hex[:6]}"
    command = " ".join(shlex.quote(a) for a in svconsole())
    script = (f"{command} --config {shlex.quote(str(loopback.cluster_yaml))} {args} "
              f"2>{shlex.quote(str(err))} | {reader}; echo \"status=${{PIPESTATUS[0]}}\"")
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - started
    out, _, status = done.stdout.rpartition("status=")
    return out, err.read_text(), int(status), seconds


def assert_quiet(stderr: str) -> None:
    for word in NOISE:
        assert word not in stderr, f"{word} in svconsole's stderr:\n{stderr}"


@pytest.fixture
def pool(loopback) -> Iterator[Pool]:
    pool = Pool(load_cluster(loopback.cluster_yaml))
    yield pool
    pool.close()


@pytest.fixture
def live_run(loopback, pool, tmp_path) -> Iterator[runs.RunRecord]:
    """A run on every loopback node printing a step line every 0.1 s, held open by a gate until
    the test ends (then stopped)."""
    gate = tmp_path / "gate"
    gate.touch()
    out = loopback.shared_dir / f"pipes-{uuid.uuid4().hex[:8]}"
    plan = dummy_plan(loopback, pool.cluster, out, steps=100_000, gate=gate)
    record = launch(pool, plan, Path(os.environ["SVCONSOLE_STATE_DIR"]))
    try:
        yield record
    finally:
        gate.unlink()
        runs.stop_run(pool, record, grace=1)


def test_exec_into_head_ends_quietly(loopback):
    # every node prints far more than a pipe holds: the writes after head left must fail
    out, err, status, _ = piped(loopback, "exec -- seq 1 200000", "head -1")
    first = out.strip()   # the first node to answer; a banner node may answer with its banner
    assert first in {f"{n.name}: 1" for n in load_cluster(loopback.cluster_yaml).nodes} or (
        first.endswith("(banner noise)")), first
    assert_quiet(err)
    assert status == EXIT_PIPE, err


def test_runs_into_head_ends_quietly(loopback, live_run):
    # head -n 0 leaves before svconsole has asked the nodes: its very first write finds no reader
    out, err, status, _ = piped(loopback, "runs", "head -n 0")
    assert out == ""
    assert_quiet(err)
    assert status == EXIT_PIPE, err
    out, err, status, _ = piped(loopback, "runs", "head -1")
    assert live_run.id in out
    assert_quiet(err)
    assert status in (0, EXIT_PIPE), err  # the listing may fit the pipe before head leaves


def test_logs_follow_into_grep_m1_ends_quietly_and_leaves_the_run(loopback, live_run):
    out, err, status, seconds = piped(loopback, f"logs {live_run.id} --follow",
                                      "grep -m1 'step'", timeout=180)
    assert "step" in out and out.count("\n") == 1, out
    assert_quiet(err)
    assert status == EXIT_PIPE, err
    # the follower ended with the pipe, long before the run would have (100 000 steps)
    assert seconds < 120
    assert len(set(tagged(live_run.id).values())) == len(live_run.nodes), "the run was touched"


def interrupt_after_first_line(loopback, *args: str) -> tuple[str, int]:
    """Start ``svconsole ARGS``, wait for its first line, press Ctrl-C (SIGINT): (stderr, exit
    status), within a minute."""
    proc = subprocess.Popen([*svconsole(), "--config", str(loopback.cluster_yaml), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return err, proc.returncode


def test_ctrl_c_ends_a_follow_quietly_with_130(loopback, live_run):
    err, status = interrupt_after_first_line(loopback, "logs", live_run.id, "--follow")
    assert_quiet(err)
    assert status == EXIT_INTERRUPTED, err
    assert len(set(tagged(live_run.id).values())) == len(live_run.nodes), "the run was touched"


def test_ctrl_c_ends_exec_at_once_though_the_nodes_still_run_it(loopback):
    # the command threads wait on the nodes for 10 minutes: Ctrl-C must not wait with them
    started = time.monotonic()
    err, status = interrupt_after_first_line(loopback, "exec", "--", "echo up; sleep 600")
    assert_quiet(err)
    assert status == EXIT_INTERRUPTED, err
    assert time.monotonic() - started < 60
