"""Watches the rank processes of one run from outside: peak RSS and CPU time.

Both sides are watched the same way, by a thread of the driver that reads
/proc every POLL_S: each rank's VmHWM (the kernel's peak resident set size of
the process) and utime + stime (CPU seconds of all its threads, Gloo's and
the intra-op pool's included). VmHWM only grows, so the last value read
before a rank exits is its peak, give or take what it allocates in its last
POLL_S.
"""
import os
import threading
import time
from typing import Callable, Dict, Optional

POLL_S = 0.01
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list:
    """The direct children of `pid` (from every thread's `children` list)."""
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def rank_pids(launcher: int) -> Dict[int, int]:
    """RANK -> pid of the rank processes `launcher` (`pipeforge train --nproc N`) started."""
    found = {}
    for pid in children(launcher):
        rank = env_var(pid, "RANK")
        if rank is not None:
            found[int(rank)] = pid
    return found


def env_var(pid: int, name: str) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for entry in f.read().split(b"\0"):
                key, _, value = entry.partition(b"=")
                if key.decode(errors="replace") == name:
                    return value.decode(errors="replace")
    except OSError:
        pass
    return None


def peak_rss_kib(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def cpu_seconds(pid: int) -> Optional[float]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime (fields 14, 15)
    except (OSError, IndexError, ValueError):
        return None


class RankWatcher:
    """Polls the ranks that `find_ranks()` names ({rank: pid}) until stop().

    peak_kib[rank] is the last VmHWM read; cpu_s[rank] the last CPU time.
    `on_poll(now, watcher)` runs after every poll (the Pipeforge side uses it
    to timestamp new metrics records against the CPU times)."""

    def __init__(self, find_ranks: Callable[[], Dict[int, int]],
                 on_poll: Optional[Callable[[float, "RankWatcher"], None]] = None) -> None:
        self._find_ranks = find_ranks
        self._on_poll = on_poll
        self.pids: Dict[int, int] = {}
        self.peak_kib: Dict[int, int] = {}
        self.cpu_s: Dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "RankWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(POLL_S)
        self.poll()

    def poll(self) -> None:
        for rank, pid in self._find_ranks().items():
            self.pids.setdefault(rank, pid)
        for rank, pid in self.pids.items():
            rss = peak_rss_kib(pid)
            if rss is not None:
                self.peak_kib[rank] = max(rss, self.peak_kib.get(rank, 0))
            cpu = cpu_seconds(pid)
            if cpu is not None:
                self.cpu_s[rank] = cpu
        if self._on_poll is not None:
            self._on_poll(time.monotonic(), self)
