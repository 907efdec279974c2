"""A rich progress bar for long work on a terminal, plain log lines elsewhere (CI, pipes, --quiet)."""

from __future__ import annotations

import os
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class StepProgress:
    def __init__(self, description: str, total: int, *, enabled: bool = True, start: int = 0, fields: tuple[str, ...] = ()):
        self.console = Console(stderr=True)
        self.fancy = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self.fields = fields
        self.total = total
        self._last_plain = 0.0
        self.description = description
        if self.fancy:
            cols = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn()]
            cols += [TextColumn(f"{f} {{task.fields[{f}]}}") for f in fields]
            cols += [TimeElapsedColumn(), TimeRemainingColumn()]
            self._progress = Progress(*cols, console=self.console)
            self._task = self._progress.add_task(description, total=total, completed=start, **{f: "-" for f in fields})
            self._progress.start()

    def update(self, completed: int, **values) -> None:
        shown = {k: (f"{v:.3g}" if isinstance(v, float) else str(v)) for k, v in values.items() if k in self.fields}
        if self.fancy:
            self._progress.update(self._task, completed=completed, **shown)
        elif self.enabled and (time.monotonic() - self._last_plain > 5 or completed == self.total):
            self._last_plain = time.monotonic()
            extras = " ".join(f"{k}={v}" for k, v in shown.items())
            print(f"[{self.description}] {completed}/{self.total} {extras}", file=sys.stderr, flush=True)

    def set_total(self, total: int) -> None:
        """For work whose size is known only once it starts (e.g. optimizer steps after the data is read)."""
        self.total = total
        if self.fancy:
            self._progress.update(self._task, total=total)

    def log(self, message: str) -> None:
        """Messages a user must see (resume point, skipped checkpoints) print even when the bar is off."""
        if self.fancy:
            self._progress.console.print(message)
        else:
            print(message, file=sys.stderr, flush=True)

    def note(self, message: str) -> None:
        """A stop under way (Ctrl-C, SIGTERM), said at once on the progress line. Called from a signal handler, which
        may have interrupted a print to stderr: the plain line goes out with os.write, not through sys.stderr's
        buffer (a reentrant write to it raises); the bar's own lock is reentrant. On the bar: a line above it, and
        the bar's name says "stopping" (the whole message there would crowd out the bar)."""
        if self.fancy:
            self._progress.console.print(message, highlight=False)
            self._progress.update(self._task, description=f"{self.description} [yellow](stopping)[/]")
        else:
            os.write(sys.stderr.fileno(), f"[{self.description}] {message}\n".encode())

    def close(self) -> None:
        if self.fancy:
            self._progress.stop()
