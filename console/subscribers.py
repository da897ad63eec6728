"""One way for engine objects to publish: callbacks subscribed and called on the engine's thread.

Screens subscribe through ``screens/bridge.py`` and turn each call into a Textual message; the
headless commands subscribe directly. A subscriber that raises is logged and never stops the
publisher (a pool, a collector, a runner or a follower must outlive a bug in what shows it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class Subscribers(Generic[T]):
    """The callbacks that want every ``T`` one publisher makes."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[T], None]] = []

    def subscribe(self, callback: Callable[[T], None]) -> Callable[[], None]:
        """Add ``callback``; returns the function that removes it (safe to call twice)."""
        with self._lock:
            self._callbacks.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return unsubscribe

    def publish(self, item: T) -> None:
        """Call every subscriber with ``item`` on this thread, in subscription order."""
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(item)
            except Exception:
                log.exception("%s subscriber %r failed on %r", self.what, callback, item)

    def __len__(self) -> int:
        with self._lock:
            return len(self._callbacks)
