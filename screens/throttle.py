"""Redraw a live screen at most every so often, and never while it is hidden.

The screens that follow fast streams (GPU samples, training log lines) do not draw per message:
news arms one one-shot timer, so a burst of messages costs one redraw, and a hidden screen (another
mode shown, a modal on top) arms nothing until it is shown again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.screen import Screen
from textual.timer import Timer


class RedrawThrottle:
    """``schedule()`` on news; the screen's ``redraw`` runs at most every ``every`` seconds.

    The screen calls :meth:`show`/:meth:`hide` from its resume/suspend handlers and
    :meth:`drawn` whenever it draws (also when it draws at once, for a key)."""

    def __init__(self, screen: Screen, redraw: Callable[[], None], every: float) -> None:
        self.screen = screen
        self.redraw = redraw
        self.every = every
        self.shown = False
        self._last = 0.0
        self._timer: Timer | None = None
        self._due = 0.0  # when the armed timer fires (monotonic)

    def schedule(self, delay: float | None = None) -> None:
        """Arm the timer: ``every`` after the last draw (news), or ``delay`` seconds from now
        (a ticking age); an armed timer that fires sooner is kept."""
        if not self.shown:
            return
        now = time.monotonic()
        if delay is None:
            delay = self._last + self.every - now
        delay = max(delay, 0.02)  # (a zero-interval timer divides by zero in Textual)
        if self._timer is not None:
            if self._due <= now + delay:
                return
            self._timer.stop()
        self._due = now + delay
        self._timer = self.screen.set_timer(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.redraw()

    def drawn(self) -> None:
        self._last = time.monotonic()

    def show(self) -> None:
        self.shown = True

    def hide(self) -> None:
        self.shown = False
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
