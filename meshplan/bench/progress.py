"""A progress bar with a remaining-time estimate on rank 0 (silent elsewhere), plus skip notes."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


@dataclass
class Reporter:
    """Work is counted in estimated seconds, so the bar's remaining time is an estimate of wall time."""

    enabled: bool
    skipped: list[str] = field(default_factory=list)
    _progress: Progress | None = None
    _task: int | None = None

    def start(self, description: str, total_s: float) -> None:
        if not self.enabled:
            return
        self.stop()
        self._progress = Progress(
            TextColumn("[bold]{task.description:<26}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=Console(file=sys.stderr), transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(description, total=max(total_s, 1e-3))

    def advance(self, estimated_s: float) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, estimated_s)

    def stop(self) -> None:
        if self._progress is not None and self._task is not None:
            task = self._progress.tasks[0]
            self._progress.update(self._task, completed=task.total)
            self._progress.stop()
        self._progress, self._task = None, None

    def skip(self, what: str) -> None:
        """Record something left out for lack of time (printed at the end and stored in provenance)."""
        self.skipped.append(what)

    def say(self, text: str) -> None:
        if self.enabled:
            print(text, file=sys.stderr, flush=True)
