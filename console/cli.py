"""``svconsole`` command line: the TUI by default, and headless subcommands that share one cluster
loader and one SSH session pool (``Context``).

Each subcommand lives in ``console/commands/<name>.py`` with ``register(subparsers)``; its handler
is ``handler(args, ctx) -> int``. Modules import their heavy dependencies (paramiko, deepspeed,
textual) inside the handler so that ``svconsole --version`` and ``--help`` stay fast.
"""

from __future__ import annotations

import argparse
import getpass
import importlib
import os
import sys
import threading
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from console import __version__

if TYPE_CHECKING:
    from console.cluster.model import Cluster
    from console.ssh.pool import Pool

#: Subcommand modules under ``console.commands``, in the order ``--help`` lists them.
COMMANDS = ("nodes", "exec", "check", "setup", "verify", "validate", "launch", "runs", "stop",
            "logs", "metrics", "plan", "gpus", "hostfile", "exporter", "stacks", "watch")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def state_dir() -> Path:
    """Where svconsole keeps its state (facts cache, run logs): ``$SVCONSOLE_STATE_DIR``, else
    ``$XDG_STATE_HOME/svconsole``, else ``~/.local/state/svconsole``."""
    explicit = os.environ.get("SVCONSOLE_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or "~/.local/state"
    return Path(base).expanduser() / "svconsole"


class Context:
    """What every command shares: the cluster (loaded once) and the pool (opened lazily, once)."""

    def __init__(self, config: str | None = None, out: TextIO | None = None,
                 interactive: bool | None = None) -> None:
        self.config = config
        self.out = out or sys.stdout
        self.interactive = sys.stdin.isatty() if interactive is None else interactive
        self._sudo_password: str | None = None
        #: ``--simulate-gpus``: the fixture the GPUs screen replays instead of real GPUs.
        self.gpu_simulate: Path | None = None
        self._sudo_lock = threading.Lock()

    @cached_property
    def cluster(self) -> Cluster:
        from console.cluster.model import load_or_default

        return load_or_default(self.config)

    @cached_property
    def pool(self) -> Pool:
        from console.ssh.pool import Pool

        return Pool(self.cluster, sudo_password=self.sudo_password)

    @property
    def state_dir(self) -> Path:
        return state_dir()

    def sudo_password(self) -> str | None:
        """Asked once on the terminal when a step needs it; kept in memory only."""
        with self._sudo_lock:
            if self._sudo_password is None and self.interactive:
                self._sudo_password = getpass.getpass("sudo password for the cluster nodes: ")
            return self._sudo_password

    def close(self) -> None:
        if "pool" in self.__dict__:
            self.pool.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="svconsole",
        description="Terminal console for multi-node SenseVoice training clusters. "
                    "Without a subcommand it opens the interactive console.",
    )
    parser.add_argument("--version", action="version", version=f"svconsole {__version__}")
    parser.add_argument("--config", metavar="PATH",
                        help="cluster.yaml (default: ./cluster.yaml, then "
                             "~/.config/svconsole/cluster.yaml; without one, this machine "
                             "as a one-node cluster)")
    from console.gpu.telemetry import SIMULATION_FIXTURE

    parser.add_argument("--simulate-gpus", metavar="FIXTURE", nargs="?", type=Path,
                        const=SIMULATION_FIXTURE,
                        help="interactive console: the GPUs screen replays an nvml.json "
                             "(default: real H200 readings shipped with svconsole), labelled "
                             "SIMULATED, instead of the nodes' GPUs")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"console.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"console.commands.{name}":
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--version"]:  # fast path: nothing heavy imported
        print(f"svconsole {__version__}")
        return EXIT_OK
    parser = build_parser()
    args = parser.parse_args(argv)
    ctx = Context(args.config)
    ctx.gpu_simulate = args.simulate_gpus
    from console.cluster.model import ClusterConfigError

    try:
        if args.command is None:
            return run_tui(ctx)
        return int(args.func(args, ctx) or 0)
    except ClusterConfigError as exc:
        print(f"svconsole: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    finally:
        ctx.close()


def run_tui(ctx: Context) -> int:
    """Open the interactive console.

    The engine does not import the UI: the UI registers itself under the entry point group
    ``svconsole.ui`` (``screens.app:run_app`` in pyproject.toml), so ``console`` stays importable
    and testable without Textual.
    """
    from importlib.metadata import entry_points

    cluster = ctx.cluster  # bad cluster.yaml: a message, not a half-drawn screen
    del cluster
    found = list(entry_points(group="svconsole.ui"))
    if not found:
        print("svconsole: the interactive console is not installed (entry point svconsole.ui); "
              "reinstall svconsole", file=sys.stderr)
        return EXIT_USAGE
    return int(found[0].load()(ctx) or 0)


if __name__ == "__main__":
    sys.exit(main())
