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
import signal
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
#: Ctrl-C, and the reader of the output gone (what a shell reports for a program SIGPIPE ended).
EXIT_INTERRUPTED, EXIT_PIPE = 130, 128 + signal.SIGPIPE
#: Seconds a command that ends early (Ctrl-C, closed pipe) may take to clean up.
STOP_GRACE = 5.0


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
        #: ``--read-only``: nothing that changes a node or a file (also cluster.read_only).
        self.read_only = False
        self._sudo_lock = threading.Lock()

    @cached_property
    def cluster(self) -> Cluster:
        from dataclasses import replace

        from console.cluster.model import load_or_default

        cluster = load_or_default(self.config)
        return replace(cluster, read_only=True) if self.read_only else cluster

    def check_writable(self, action: str) -> None:
        """Refuse ``action`` (ReadOnlyError, exit 1) in read-only mode: ``--read-only`` or
        ``cluster.read_only`` in cluster.yaml."""
        from console.cluster.model import ReadOnlyError

        if self.read_only or self.cluster.read_only:
            raise ReadOnlyError(action)

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
    parser.add_argument("--read-only", action="store_true",
                        help="change nothing: setup apply, launch, stop, save and every other "
                             "action that would change a node or a file are refused (also "
                             "read_only: true under cluster: in cluster.yaml)")
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


class _QuietEnding:
    """How a headless command ends early, quietly: on Ctrl-C (status 130), or when the reader
    of its output is gone (``svconsole runs | head -1``: status 141, as for a program that
    SIGPIPE ended).

    ``sys.stdout`` and ``sys.stderr`` are guarded while the command runs: the first write to a
    closed pipe points that stream at /dev/null and starts the ending. From then on nothing more
    is printed, the pool is closed in the background (so threads waiting on the nodes return),
    the main thread gets a KeyboardInterrupt, and if the cleanup takes longer than
    ``STOP_GRACE`` s the process ends anyway. A second Ctrl-C ends it at once. SIGPIPE itself
    stays ignored, as Python sets it: a dropped SSH socket must never kill the console."""

    def __init__(self) -> None:
        self.ctx: Context | None = None
        self.reason: str | None = None  # "interrupt" or "pipe", once ending
        self._lock = threading.Lock()
        self._saved: tuple[TextIO, TextIO, object] | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_PIPE if self.reason == "pipe" else EXIT_INTERRUPTED

    def install(self) -> None:
        handler: object = None
        if threading.current_thread() is threading.main_thread():
            handler = signal.signal(signal.SIGINT, self._on_sigint)
        self._saved = (sys.stdout, sys.stderr, handler)
        sys.stdout = _GuardedStream(sys.stdout, self)  # type: ignore[assignment]
        sys.stderr = _GuardedStream(sys.stderr, self)  # type: ignore[assignment]

    def uninstall(self) -> None:
        if self._saved is None:
            return
        sys.stdout, sys.stderr, handler = self._saved
        self._saved = None
        if handler is not None:
            signal.signal(signal.SIGINT, handler)  # type: ignore[arg-type]

    def flush(self) -> None:
        """Flush what the command printed (a closed pipe found here ends as any other)."""
        sys.stdout.flush()
        sys.stderr.flush()

    def begin(self, reason: str) -> bool:
        """Start ending (once): False when it had started already."""
        with self._lock:
            if self.reason is not None:
                return False
            self.reason = reason
        if self.ctx is not None:
            threading.Thread(target=self.ctx.close, name="close the pool", daemon=True).start()
        timer = threading.Timer(STOP_GRACE, os._exit, args=(self.exit_code,))
        timer.daemon = True
        timer.start()
        return True

    def _on_sigint(self, signum: int, frame: object) -> None:
        if not self.begin("interrupt") and self.reason == "interrupt":
            os._exit(EXIT_INTERRUPTED)  # the second Ctrl-C: no more waiting
        raise KeyboardInterrupt

    def pipe_closed(self) -> None:
        """A guarded stream found its pipe closed (on any thread)."""
        if not self.begin("pipe"):
            return
        if threading.current_thread() is threading.main_thread():
            raise KeyboardInterrupt  # unwinds the command, whatever it catches
        if self._saved is not None and self._saved[2] is not None:
            # wake the main thread wherever it waits; _on_sigint raises there
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


class _GuardedStream:
    """A text stream that a closed pipe ends quietly (see :class:`_QuietEnding`)."""

    def __init__(self, stream: TextIO, ending: _QuietEnding) -> None:
        self._stream = stream
        self._ending = ending

    def write(self, text: str) -> int:
        if self._ending.reason is None:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._closed()
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self._ending.reason is None:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._closed()

    def _closed(self) -> None:
        silence(self._stream)
        self._ending.pipe_closed()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def silence(stream: TextIO) -> None:
    """Point ``stream``'s file descriptor at /dev/null, so that what is still buffered for a
    closed pipe is flushed there at exit instead of raising again."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before a command started (imports, the parser)
        return EXIT_INTERRUPTED


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--version"]:  # fast path: nothing heavy imported
        print(f"svconsole {__version__}")
        return EXIT_OK
    parser = build_parser()
    args = parser.parse_args(argv)
    # the interactive console owns the terminal (and its keys) itself
    ending = _QuietEnding() if args.command is not None else None
    if ending is not None:
        ending.install()
    ctx = Context(args.config)
    ctx.gpu_simulate = args.simulate_gpus
    ctx.read_only = args.read_only
    from console.cluster.model import ClusterConfigError, ReadOnlyError

    try:
        if ending is None:
            return run_tui(ctx)
        ending.ctx = ctx
        code = int(args.func(args, ctx) or 0)
        ending.flush()
        return code
    except ClusterConfigError as exc:
        print(f"svconsole: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ReadOnlyError as exc:
        print(f"svconsole {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return ending.exit_code if ending is not None else EXIT_INTERRUPTED
    except BrokenPipeError:  # written past the guards (a stream's own buffer)
        silence(sys.stdout)
        return EXIT_PIPE
    finally:
        ctx.close()
        if ending is not None:
            ending.uninstall()


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
