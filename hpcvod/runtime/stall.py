"""The stall inspector: which collectives wait too long, and on which ranks they were never submitted.

Every rank reports over the control channel the collectives it has waited on for more than
REPORT_AFTER_SECONDS; rank 0 compares the reports with its own and, after ``HPCVOD_STALL_CHECK_TIME_SECONDS``,
prints which tensors wait and which ranks never submitted them. After ``HPCVOD_STALL_SHUTDOWN_TIME_SECONDS``
(if set) it answers with the reason to abort the job. Without the channel each rank inspects only its own
waiting collectives. Only the watchdog thread calls it.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from . import handles as K
from .channel import Peer

REPORT_AFTER_SECONDS = 0.5      # a collective waiting longer than this is reported to rank 0
REPORT_STALE_SECONDS = 3.5      # a report older than this no longer counts as "this rank has it pending"
MAX_REPORTED = 100              # pending collectives a rank reports at most (keeps its lines short)


class StallInspector:
    """The stall inspector of one rank: ``pending()`` gives (set_id, name, kind, age) of this rank's waiting
    collectives, ``set_members(set_id)`` a process set's global ranks (None if unknown)."""

    def __init__(self, rank: int, size: int, settings: Any,
                 pending: Callable[[], list[tuple[int, str, int, float]]],
                 set_members: Callable[[int], list[int] | None]) -> None:
        self.rank = rank
        self.size = size
        self.settings = settings
        self._pending = pending
        self._set_members = set_members
        self._warned: dict[tuple[int, str], float] = {}
        self._local_warned: dict[tuple[int, str], float] = {}

    def enabled(self) -> bool:
        s = self.settings
        return not s.stall_check_disable and (s.stall_check_time_seconds > 0 or s.stall_shutdown_time_seconds > 0)

    def report(self) -> list[list]:
        """What this rank tells rank 0: its collectives waiting longer than REPORT_AFTER_SECONDS."""
        return [list(item) for item in self._pending() if item[3] > REPORT_AFTER_SECONDS][:MAX_REPORTED]

    def inspect(self, now: float, peers: dict[int, Peer], rank0_gone: bool) -> str | None:
        """Rank 0, with the channel up: warn about collectives that wait on some ranks; the reason to abort the
        job once one waited past the shutdown limit, else None. ``rank0_gone``: rank 0 has shut down."""
        holders: dict[tuple[int, str], dict] = {}
        for set_id, name, kind, age in self._pending():
            if age > REPORT_AFTER_SECONDS:
                d = holders.setdefault((set_id, name), {"kind": kind, "age": 0.0, "ranks": set()})
                d["ranks"].add(0)
                d["age"] = max(d["age"], age)
        for peer in peers.values():
            if now - peer.report_time > REPORT_STALE_SECONDS:
                continue
            for set_id, name, kind, age in peer.report:
                d = holders.setdefault((set_id, name), {"kind": kind, "age": 0.0, "ranks": set()})
                d["ranks"].add(peer.rank)
                d["age"] = max(d["age"], age + (now - peer.report_time))
        check = self.settings.stall_check_time_seconds
        shutdown = self.settings.stall_shutdown_time_seconds
        lines = []
        worst = 0.0
        for key, d in sorted(holders.items(), key=lambda kv: -kv[1]["age"]):
            age = d["age"]
            if check and age >= check and now - self._warned.get(key, -1e18) >= check:
                self._warned[key] = now
                lines.append(self._describe(key, d, peers, rank0_gone))
            worst = max(worst, age)
        for key in list(self._warned):
            if key not in holders:
                del self._warned[key]
        if lines:
            print(f"hpcvod stall inspector (rank 0): {len(lines)} collective(s) waiting for more than "
                  f"{check:g} s:\n" + "\n".join(lines) + "\n  One or more ranks may be stuck, skipped a "
                  f"collective, or submitted collectives with different names.", file=sys.stderr, flush=True)
        if shutdown and worst >= shutdown:
            stalled = [self._describe(k, d, peers, rank0_gone) for k, d in holders.items() if d["age"] >= shutdown]
            return (f"stalled for more than HPCVOD_STALL_SHUTDOWN_TIME_SECONDS={shutdown:g} s:\n"
                    + "\n".join(stalled))
        return None

    def _describe(self, key: tuple[int, str], d: dict, peers: dict[int, Peer], rank0_gone: bool) -> str:
        set_id, name = key
        members = self._set_members(set_id) or list(range(self.size))
        missing = [r for r in members if r not in d["ranks"]]
        gone = [r for r in missing if r in peers and peers[r].said_bye]
        if self.rank == 0 and rank0_gone and 0 in missing:
            gone.append(0)
        note = f" (ranks {sorted(gone)} have already shut down)" if gone else ""
        return (f"  {K.KIND_NAMES.get(d['kind'], '?')} {name!r} (process set {set_id}) waited {d['age']:.0f} s: "
                f"submitted by ranks {sorted(d['ranks'])}; never submitted by ranks {missing}{note}")

    def inspect_local(self, now: float) -> str | None:
        """Without the channel: warn about this rank's own waiting collectives; the reason to abort this rank
        once one waited past the shutdown limit, else None."""
        check = self.settings.stall_check_time_seconds
        shutdown = self.settings.stall_shutdown_time_seconds
        lines = []
        worst = 0.0
        for set_id, name, kind, age in self._pending():
            key = (set_id, name)
            worst = max(worst, age)
            if check and age >= check and now - self._local_warned.get(key, -1e18) >= check:
                self._local_warned[key] = now
                lines.append(f"  {K.KIND_NAMES.get(kind, '?')} {name!r} (process set {set_id}) waited {age:.0f} s")
        if lines:
            print(f"hpcvod stall inspector (rank {self.rank}): collectives waiting for other ranks (the control "
                  f"channel is off, so which ranks are missing is unknown):\n" + "\n".join(lines),
                  file=sys.stderr, flush=True)
        if shutdown and worst >= shutdown:
            return f"stalled for more than HPCVOD_STALL_SHUTDOWN_TIME_SECONDS={shutdown:g} s"
        return None
