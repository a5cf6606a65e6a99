"""A solver phase's progress: a tqdm bar on a terminal, or the caller's callback.

Bars go to stderr only when it is a terminal: in a notebook, a log file or CI
they would print a line per refresh, so there a caller who wants progress
passes a function (the editor does, to drive its own bar).
"""

from __future__ import annotations

import sys
from typing import Callable

# progress(phase, done, total): a phase such as "profiling layers" reports each step done.
ProgressFn = Callable[[str, int, int], None]


class Progress:
    """One phase's progress, to a tqdm bar (`progress=True`, on a terminal) or to `progress(phase, done, total)`."""

    def __init__(self, progress: bool | ProgressFn, phase: str) -> None:
        self.phase, self.report, self.bar = phase, None, None
        if callable(progress):
            self.report = progress
        elif progress and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=None, desc=phase, leave=False)

    def tick(self, done: int, total: int) -> None:
        if self.report is not None:
            self.report(self.phase, done, total)
        elif self.bar is not None:
            if self.bar.total != total:
                self.bar.total = total
            self.bar.n = done
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
