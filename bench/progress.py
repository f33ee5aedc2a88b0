"""A progress bar for the scripts' long runs, on stderr.

Lives here: ``Progress``, which redraws one line in place on a terminal and,
when stderr is a file or a pipe (a log, CI), writes a plain line at each
tenth of the way and at the end instead of carriage returns.
Must not know: what is being counted.
"""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    def __init__(self, total: int, width: int = 30, stream: TextIO | None = None) -> None:
        self.total = max(total, 1)
        self.width = width
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self._tenths = -1  #: the last tenth a plain line was written at

    def show(self, done: int, detail: str) -> None:
        """``done`` of the total, with ``detail`` after the bar."""
        filled = self.width * done // self.total
        bar = f"[{'#' * filled}{'.' * (self.width - filled)}] {detail}"
        if self.live:
            self.stream.write(f"\r{bar} ")
        elif (tenths := 10 * done // self.total) > self._tenths:
            self._tenths = tenths
            self.stream.write(f"{bar}\n")
        self.stream.flush()

    def note(self, line: str) -> None:
        """A line of its own, above the bar."""
        self.stream.write(f"\r{line}\n" if self.live else f"{line}\n")
        self.stream.flush()

    def end(self) -> None:
        if self.live:
            self.stream.write("\n")
            self.stream.flush()
