"""Progress counts as log lines worth reading.

Counters such as "episodes ended" are reported after every turn or every graded sample, far
more often than they change or than anyone reads: a long wave of episodes repeated
`episodes: 0/1024 ended` on every turn. `ProgressLines` keeps a line only when the count has
changed, at most one every few seconds, and always the final count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

EVERY_S = 5.0  # a line every few seconds shows movement without scrolling the rest away


class ProgressLines:
    """Called with (done, total) as often as the caller likes; logs `template` (formatted with
    `done` and `total`) for the first count, then for a changed count `every_s` seconds or more
    after the last line, and for the final count (done == total) at once, only once. One
    caller's counts: not shared between threads."""

    def __init__(self, log: Callable[[str], None], template: str, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self._log, self._template, self._every_s, self._clock = log, template, every_s, clock
        self._last: tuple[int, int] | None = None
        self._logged_at = -math.inf

    def __call__(self, done: int, total: int) -> None:
        now = self._clock()
        if (done, total) == self._last:
            return
        if done != total and now - self._logged_at < self._every_s:
            return
        self._log(self._template.format(done=done, total=total))
        self._last, self._logged_at = (done, total), now
