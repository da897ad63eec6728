"""Drive a real terminal program in tmux, as a person would: type keys, read the screen."""

from __future__ import annotations

import shlex
import subprocess
import time
import uuid


class Tmux:
    """One detached tmux session running ``command`` in a terminal of the given size."""

    def __init__(self, command: str, *, width: int = 80, height: int = 24, env: dict | None = None,
                 cwd: str | None = None) -> None:
        self.name = f"svc-{uuid.uuid4().hex[:8]}"
        self.socket = f"/tmp/{self.name}.sock"
        # pytest's environment may carry COLUMNS/LINES of another terminal, and Textual trusts
        # them over the real size: give the program the size of this one
        env = {"COLUMNS": str(width), "LINES": str(height), **(env or {})}
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        shell = f"cd {shlex.quote(cwd)} && " if cwd else ""
        shell += f"env {exports} {command}; echo '[exited' $? ']'; sleep 600"
        self._tmux("new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height),
                   "bash", "-c", shell)

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.socket, *args], check=True,
                              capture_output=True, text=True).stdout

    def send(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.name, *keys)

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.name)

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{text!r} not on screen after {timeout}s:\n{screen}")

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True)

    def __enter__(self) -> Tmux:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
