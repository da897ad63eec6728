"""Helpers of the walkthrough and drill tests: the walkthrough's shell blocks and a shell that
runs them as a user would, node names kept apart from other loopback clusters on this machine,
the processes of a training run, and the drill report.

The walkthrough (``docs/walkthrough.md``) marks every command block it wants run with an HTML
comment just above it, ``<!-- walk: NAME -->``; :func:`walkthrough_blocks` returns them in order.
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WALKTHROUGH = REPO / "docs" / "walkthrough.md"
TORCH_EXTENSIONS = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "svconsole"
                                        / "torch_extensions"))
"""DeepSpeed's op cache of the runs (tests/conftest.py sets one per Python environment)."""
"""DeepSpeed's JIT build cache, shared with tests/test_launch.py and the walkthrough."""

_BLOCK = re.compile(r"^<!-- walk: (?P<name>[\w-]+) -->\n```sh\n(?P<code>.*?)^```$",
                    re.MULTILINE | re.DOTALL)


def needs_training_and_tmux() -> None:
    """Skip unless the training stack (for the tiny SenseVoice), tmux and g++ (DeepSpeed's CPU
    op build) are installed."""
    for module in ("torch", "deepspeed", "funasr", "kaldi_native_fbank", "sentencepiece"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    for tool in ("tmux", "g++"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


@dataclass(frozen=True)
class Block:
    """One command block of the walkthrough."""

    name: str
    code: str
    line: int


def walkthrough_blocks(path: Path = WALKTHROUGH) -> list[Block]:
    """The walkthrough's marked ``sh`` blocks, in document order. A marker not followed by an
    ``sh`` block, or a name used twice, is an error of the document."""
    text = path.read_text()
    blocks = [Block(m["name"], m["code"], text.count("\n", 0, m.start()) + 1)
              for m in _BLOCK.finditer(text)]
    markers = re.findall(r"<!-- walk: ([\w-]+) -->", text)
    names = [b.name for b in blocks]
    if names != markers or len(set(names)) != len(names):
        raise ValueError(f"{path}: walk markers {markers} do not each precede one sh block "
                         f"(found {names})")
    return blocks


@dataclass
class Shell:
    """A user's terminal: bash in the repository root with the venv's bin first on PATH."""

    env: dict[str, str]
    transcript: list[str] = field(default_factory=list)

    @classmethod
    def for_user(cls, **extra: str) -> Shell:
        bin_dir = str(Path(sys.executable).parent)
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '')}", **extra)
        return cls(env)

    def run(self, code: str, *, timeout: float = 120, check: bool = True) -> str:
        """Run ``code`` with ``bash -eo pipefail``; return stdout+stderr. A failure raises
        AssertionError with the command and everything it printed."""
        started = time.monotonic()
        try:
            done = subprocess.run(["bash", "-eo", "pipefail", "-c", code], cwd=REPO, env=self.env,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"timed out after {timeout:g}s:\n{code}\n{exc.stdout or ''}"
                                 f"{exc.stderr or ''}") from None
        output = done.stdout + done.stderr
        self.transcript.append(f"$ {code.strip()}\n  ({time.monotonic() - started:.1f} s, "
                               f"exit {done.returncode})")
        if check and done.returncode != 0:
            raise AssertionError(f"exit {done.returncode}:\n{code}\n{output}")
        return output


def isolate_node_names(cluster_yaml: Path, tag: str) -> list[str]:
    """Rename the loopback nodes ``node<i>`` to ``node<i>-<tag>`` in ``cluster_yaml``.

    Loopback nodes share this machine's ``/proc``: a run is found on a node by its processes'
    ``SVCONSOLE_NODE`` tag, so two loopback clusters of teammates (or tests) running at once see
    each other's runs under the same node names. Distinct names keep a test's run its own."""
    text = cluster_yaml.read_text()
    text = re.sub(r"^(\s+- name: |  master: )(node\d+)$", rf"\1\2-{tag}", text, flags=re.MULTILINE)
    cluster_yaml.write_text(text)
    return re.findall(r"^\s+- name: (\S+)$", text, flags=re.MULTILINE)


def run_pids(run_id: str) -> list[int]:
    """Live (not zombie) processes on this machine tagged with the run's id."""
    tag = f"SVCONSOLE_RUN_ID={run_id}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and tag in env:
            found.append(int(entry))
    return sorted(found)


def rank_pid(run_id: str, rank: int) -> int:
    """The pid of the run's rank process ``rank`` on this machine (its parent is torchrun, which
    has no RANK in its environment)."""
    def env(pid: int) -> dict[str, str]:
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return {}
        return dict(v.decode(errors="replace").split("=", 1) for v in raw if b"=" in v)

    for pid in run_pids(run_id):
        mine = env(pid)
        if mine.get("RANK") != str(rank):
            continue
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if env(parent).get("RANK") != str(rank):
            return pid
    raise AssertionError(f"no process of rank {rank} of run {run_id}")


def terminal_env(width: int, height: int, **env: str) -> dict[str, str]:
    """Environment for a program in a :class:`tmux.Tmux` terminal of that size. A tmux server
    started from pytest passes ``COLUMNS=80 LINES=24`` to its programs, and Textual (through
    ``shutil.get_terminal_size``) believes them over the terminal: name the real size."""
    return {**env, "COLUMNS": str(width), "LINES": str(height)}


def screen_where(tui, predicate: Callable[[str], object], timeout: float, what: str) -> str:
    """Poll a :class:`tmux.Tmux` screen until ``predicate(screen)`` holds; return that screen."""
    seen = [""]

    def check() -> str | None:
        seen[0] = tui.screen()
        return seen[0] if predicate(seen[0]) else None

    try:
        return wait_until(check, timeout, what, interval=0.2)
    except AssertionError as exc:
        size = tui._tmux("display", "-p", "-t", tui.name, "#{window_width}x#{window_height}")
        raise AssertionError(f"{exc}; the screen ({size.strip()}):\n{seen[0]}") from None


def svg_text(svg: str) -> str:
    """The text of a Textual SVG screenshot, one line per terminal row (styles dropped)."""
    rows: dict[float, list[str]] = {}
    for match in re.finditer(r'<text[^>]*\by="([0-9.]+)"[^>]*>(.*?)</text>', svg, re.DOTALL):
        rows.setdefault(float(match[1]), []).append(html.unescape(re.sub(r"<[^>]+>", "",
                                                                         match[2])))
    return "\n".join("".join(parts).replace("\xa0", " ") for _, parts in sorted(rows.items()))


def wait_until(predicate: Callable[[], object], timeout: float, what: str,
               interval: float = 0.5) -> object:
    """Poll ``predicate`` until it returns something true; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
