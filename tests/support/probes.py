"""Measurements the chaos scenarios take of the processes they run: resident memory from /proc
(current and peak), and a background sampler that keeps the largest value seen."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path


def _status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass  # gone between the listing and the read: nothing to add
    return 0


def rss_kib(pid: int) -> int:
    return _status_kib(pid, "VmRSS")


def peak_rss_kib(pid: int) -> int:
    """The process's high-water mark (VmHWM): the peak over its whole life, not a sample."""
    return _status_kib(pid, "VmHWM")


class RssWatch:
    """Samples the resident memory of whatever processes `pids()` names, every `every` s, in the
    background; `peak_kib` is the largest VmHWM seen (so a peak between samples still counts),
    `series` the (t, summed RSS) samples."""

    def __init__(self, pids: Callable[[], Iterable[int]], every: float = 1.0) -> None:
        self.pids = pids
        self.every = every
        self.peak_kib = 0
        self.series: list[tuple[float, int]] = []
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> int:
        total = 0
        for pid in self.pids():
            total += rss_kib(pid)
            self.peak_kib = max(self.peak_kib, peak_rss_kib(pid))
        return total

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            self.series.append((loop.time() - start, self.sample()))
            await asyncio.sleep(self.every)

    def __enter__(self) -> RssWatch:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(Exception):
                self.sample()
