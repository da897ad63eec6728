"""Where alerts go, each sink in its own worker thread so that a slow webhook never holds up
the console: a callback (the TUI's bell and toast), webhooks (generic JSON, Slack's
``{"text"}`` and Feishu/Lark's ``{"msg_type": "text"}``), command hooks (the alert as JSON on
stdin) and ``alerts.log`` (one JSON line per alert, mode 0600, in the state directory).

:class:`Dispatcher` fans each alert out to every sink under the rate limit (at most
``rate_limit`` messages per sink in any ten minutes); what is left out is counted and said in
the next message that goes. Webhook URLs never appear in a log line or an error: a sink is
named by its label (``webhook #1 (slack)``).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from console.alerts.engine import Alert
from console.alerts.rules import RATE_WINDOW_S, AlertRules, Webhook

log = logging.getLogger(__name__)

#: Seconds a webhook POST or a command hook may take.
SEND_TIMEOUT_S = 15.0


def payload(alert: Alert, fmt: str) -> dict[str, Any]:
    """The JSON body for a webhook of format ``generic``, ``slack`` or ``feishu``."""
    if fmt == "slack":
        return {"text": alert.summary}
    if fmt == "feishu":
        return {"msg_type": "text", "content": {"text": alert.summary}}
    return alert.to_dict()


class Sink:
    """One destination. :meth:`deliver` runs on the sink's own thread; an exception is logged
    (by label) and the next alert is still delivered."""

    label = "sink"

    def __init__(self) -> None:
        self._queue: queue.Queue[Alert | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, daemon=True,
                                        name=f"svconsole-alert-{self.label}")
        self._sent: deque[float] = deque()
        self.delivered = 0
        self.failures: list[str] = []
        self._thread.start()

    def deliver(self, alert: Alert) -> None:
        raise NotImplementedError

    def put(self, alert: Alert) -> None:
        self._queue.put(alert)

    def _work(self) -> None:
        while True:
            alert = self._queue.get()
            if alert is None:
                return
            try:
                self.deliver(alert)
                self.delivered += 1
            except Exception as exc:  # noqa: BLE001 - a sink's failure must not stop the others
                reason = f"{self.label}: {exc}"
                self.failures.append(reason)
                log.warning("alert not delivered to %s", reason)

    def close(self, timeout: float = SEND_TIMEOUT_S + 5) -> None:
        """Send what is queued, then stop (waits at most ``timeout``)."""
        self._queue.put(None)
        self._thread.join(timeout)


class CallbackSink(Sink):
    """Calls ``callback(alert)`` (the TUI posts a message that rings the bell and shows a
    toast)."""

    label = "console"

    def __init__(self, callback: Callable[[Alert], None]) -> None:
        self.callback = callback
        super().__init__()

    def deliver(self, alert: Alert) -> None:
        self.callback(alert)


class LogSink(Sink):
    """Appends the alert as one JSON line to ``alerts.log`` (created mode 0600)."""

    label = "alerts.log"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        super().__init__()

    def deliver(self, alert: Alert) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(json.dumps(alert.to_dict(), ensure_ascii=False) + "\n")


class WebhookSink(Sink):
    """POSTs the payload of the webhook's format as JSON."""

    def __init__(self, webhook: Webhook) -> None:
        self.webhook = webhook
        self.label = webhook.label
        super().__init__()

    def deliver(self, alert: Alert) -> None:
        body = json.dumps(payload(alert, self.webhook.format), ensure_ascii=False).encode()
        request = urllib.request.Request(self.webhook.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "User-Agent": "svconsole-alerts"})
        try:
            with urllib.request.urlopen(request, timeout=SEND_TIMEOUT_S) as reply:
                reply.read(65536)
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            # The reason only: the URL (a secret) stays out of the message.
            reason = getattr(exc, "reason", exc)
            raise RuntimeError(f"not sent: {reason}") from None


class ExecSink(Sink):
    """Runs ``command`` through the shell with the alert's JSON on stdin."""

    def __init__(self, command: str, index: int = 0) -> None:
        self.command = command
        self.label = f"exec #{index + 1}"
        super().__init__()

    def deliver(self, alert: Alert) -> None:
        done = subprocess.run(self.command, shell=True, input=json.dumps(alert.to_dict()),
                              text=True, capture_output=True, timeout=SEND_TIMEOUT_S,
                              env=dict(os.environ, SVCONSOLE_ALERT_STATE=alert.state,
                                       SVCONSOLE_ALERT_KIND=alert.condition.kind))
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"exit {done.returncode}: {tail[0][:200]}")


class Dispatcher:
    """Every alert to every sink, under the rate limit; :meth:`close` flushes them all."""

    def __init__(self, sinks: Sequence[Sink], rate_limit: int = 20,
                 window_s: float = RATE_WINDOW_S, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.sinks = list(sinks)
        self.rate_limit = rate_limit
        self.window_s = window_s
        self.clock = clock
        self._left_out = {id(s): 0 for s in self.sinks}
        self.sent: list[Alert] = []

    def send(self, alerts: Sequence[Alert]) -> None:
        for alert in alerts:
            self.sent.append(alert)
            for sink in self.sinks:
                now = self.clock()
                while sink._sent and now - sink._sent[0] > self.window_s:
                    sink._sent.popleft()
                if len(sink._sent) >= self.rate_limit:
                    self._left_out[id(sink)] += 1
                    continue
                sink._sent.append(now)
                left_out, self._left_out[id(sink)] = self._left_out[id(sink)], 0
                sink.put(replace(alert, suppressed=left_out) if left_out else alert)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

    def failures(self) -> list[str]:
        return [f for s in self.sinks for f in s.failures]


def sinks_for(rules: AlertRules, state_dir: Path, *,
              callback: Callable[[Alert], None] | None = None) -> list[Sink]:
    """The sinks the rules ask for: alerts.log always, the callback when ``bell`` is on (and
    given), each webhook and each command hook."""
    out: list[Sink] = [LogSink(Path(state_dir) / "alerts.log")]
    if callback is not None and rules.bell:
        out.append(CallbackSink(callback))
    out += [WebhookSink(w) for w in rules.webhooks]
    out += [ExecSink(c, i) for i, c in enumerate(rules.exec)]
    return out
