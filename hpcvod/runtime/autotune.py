"""Autotune (Horovod's ``HOROVOD_AUTOTUNE=1``): the global process set's engine tunes its own knobs while training.

What is tuned: the fusion threshold, the cycle time, the response cache (on/off) and hierarchical allreduce (only
where the job spans several nodes: on one node it runs flat anyway). A setting the job gives explicitly
(``HPCVOD_FUSION_THRESHOLD=...``, ``--fusion-threshold-mb``) is kept fixed, as in Horovod.

How: rank 0's :class:`Autotuner` measures the throughput of what the engine runs (bytes of every executed
collective per second of wall time over a sample of ``steps_per_sample`` steps; a step ends when some request
name comes round again). A *trial* is one setting: the first sample after a change is discarded, the median of
the next :data:`SAMPLES_PER_TRIAL` is its score. The search (:class:`Search`) goes through one knob at a time
(fusion threshold, then cycle time, then the cache, then hierarchical allreduce), keeping the best value of
each before moving to the next, and finally settles on the best setting it measured.

Agreement: rank 0 decides. When it has a new setting it sets the RETUNE flag in its next negotiation word
(negotiation.py); every member sees the flag in the same negotiation, and after running what that negotiation
agreed on, all receive rank 0's setting in one broadcast and apply it (engine.Lane.retune). The trials are
therefore the same on every rank, at the same point of the agreed order.

The log (``HOROVOD_AUTOTUNE_LOG``): rank 0 writes one CSV line per trial with Horovod's columns; the
threshold in MiB, the score in bytes per microsecond as Horovod writes it.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Iterable, TextIO

import numpy as np

CSV_HEADER = ("hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,cycle_time_ms,"
              "tensor_fusion_threshold,score")
MIB = 1 << 20
SAMPLES_PER_TRIAL = 3                                      # median of these is a trial's score
# A setting replaces the best one only when it scores this much higher: closer scores are within the noise of
# three samples (bench_autotune.py on the shared VM picked the cache off or a 10 ms cycle on noise without it).
MARGIN = 0.05
FUSION_MIB = (64.0, 16.0, 4.0, 1.0, 0.0)                   # candidates, besides the starting value
CYCLE_MS = (0.0, 1.0, 2.5, 5.0, 10.0)

_perf = time.perf_counter


@dataclass(frozen=True)
class Params:
    """One setting of the tuned knobs."""

    fusion_threshold: int          # bytes
    cycle_time_ms: float
    cache_enabled: bool
    hierarchical_allreduce: bool

    def encode(self, final: bool) -> np.ndarray:
        """As the broadcast carries it (float64: every value is exact; ``final``: tuning ends here)."""
        return np.array([self.fusion_threshold, self.cycle_time_ms, self.cache_enabled,
                         self.hierarchical_allreduce, final], np.float64)

    @staticmethod
    def decode(words: np.ndarray) -> tuple["Params", bool]:
        return (Params(int(words[0]), float(words[1]), bool(words[2]), bool(words[3])), bool(words[4]))

    def csv(self, score: float) -> str:
        """One line of the log, Horovod's columns (no hierarchical allgather or torus allreduce here: 0)."""
        return (f"{int(self.hierarchical_allreduce)},0,0,{int(self.cache_enabled)},{self.cycle_time_ms:g},"
                f"{self.fusion_threshold / MIB:g},{score:.6g}")


class Search:
    """One knob at a time, each over its candidates, keeping the best value of each (see the module docstring).

    ``fixed``: names of Params fields the job set explicitly (not tuned). ``multi_node``: whether hierarchical
    allreduce can make a difference.
    """

    def __init__(self, start: Params, fixed: Iterable[str], multi_node: bool) -> None:
        fixed = set(fixed)
        stages: list[tuple[str, list[Any]]] = [
            ("fusion_threshold", [start.fusion_threshold] + [int(m * MIB) for m in FUSION_MIB]),
            ("cycle_time_ms", [start.cycle_time_ms] + list(CYCLE_MS)),
            ("cache_enabled", [start.cache_enabled, not start.cache_enabled]),
        ]
        if multi_node:
            stages.append(("hierarchical_allreduce", [start.hierarchical_allreduce,
                                                      not start.hierarchical_allreduce]))
        # each stage's candidates once, the starting value first (it is measured already when the stage begins)
        self.stages = [(name, list(dict.fromkeys(values))) for name, values in stages if name not in fixed]
        self.scores: dict[Params, float] = {}
        self.best = start
        self._stage = 0
        self._index = 0

    def next(self, current: Params, score: float) -> Params | None:
        """Record ``current``'s score; the next setting to try, or None when the search is over."""
        self.scores[current] = score
        best = self.scores.get(self.best)
        if best is None or score > best * (1 + MARGIN):
            self.best = current
        while self._stage < len(self.stages):
            name, values = self.stages[self._stage]
            while self._index < len(values):
                candidate = replace(self.best, **{name: values[self._index]})
                self._index += 1
                if candidate not in self.scores:
                    return candidate
            self._stage += 1
            self._index = 0
        return None


class Autotuner:
    """Rank 0's measurements and decisions (the lane calls ``record`` after running requests, and ``applied``
    after every member applied a setting)."""

    def __init__(self, start: Params, search: Search, warmup_samples: int, steps_per_sample: int,
                 log: TextIO | None) -> None:
        self.current = start
        self.search = search
        self.steps_per_sample = steps_per_sample
        self.log = log
        self.pending: Params | None = None     # decided, not yet broadcast
        self.final = False                     # the pending setting ends the tuning
        self._skip = warmup_samples            # samples to discard before the next score counts
        self._samples: list[float] = []
        self._bytes = 0
        self._counts: dict[Any, int] = {}
        self._start = _perf()

    def record(self, handles: Iterable[Any]) -> bool:
        """Count what just ran; True when a new setting is decided (the lane then asks for a retune).

        A sample ends where a request name comes round for the (steps_per_sample + 1)-th time: that request
        is the first of the next sample."""
        counts = self._counts
        limit = self.steps_per_sample
        decided = False
        for h in handles:
            if h.dummy:
                continue
            key = h.key
            n = counts.get(key, 0) + 1
            if n > limit:
                decided = self._end_sample() or decided
                counts = self._counts
                n = 1
            counts[key] = n
            t = h.tensor
            if t is not None:
                self._bytes += t.nbytes
        return decided

    def _end_sample(self) -> bool:
        now = _perf()
        score = self._bytes / max(now - self._start, 1e-9) / 1e6     # bytes per microsecond, as Horovod
        self._restart(now)
        if self.pending is not None:           # decided, not yet applied everywhere: nothing to measure
            return False
        if self._skip > 0:
            self._skip -= 1
            return False
        self._samples.append(score)
        if len(self._samples) < SAMPLES_PER_TRIAL:
            return False
        score = statistics.median(self._samples)
        self._samples = []
        if self.log is not None:
            self.log.write(self.current.csv(score) + "\n")
            self.log.flush()
        proposal = self.search.next(self.current, score)
        self.final = proposal is None
        self.pending = self.search.best if proposal is None else proposal
        return True

    def applied(self, params: Params) -> None:
        """Every member applied ``params``: measure it from the next sample on (its first one discarded)."""
        self.current = params
        self.pending = None
        self._skip = 1
        self._samples = []
        self._restart(_perf())

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None

    def _restart(self, now: float) -> None:
        self._bytes = 0
        self._counts = {}
        self._start = now


def autotune_log(path: str) -> tuple[TextIO | None, str]:
    """(the trial log with Horovod's header written, "") or (None, the one line saying why it cannot be written).
    The file is the job user's alone (0600)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as err:
        return None, (f"HOROVOD_AUTOTUNE_LOG={path!r}: cannot write the autotune log there: "
                      f"{err.strerror or err} (expected a writable file path)")
    log = os.fdopen(fd, "w")
    log.write(CSV_HEADER + "\n")
    log.flush()
    return log, ""


def make_autotuner(settings: Any, multi_node: bool, log: TextIO | None) -> Autotuner:
    """Rank 0's tuner from the runtime settings (config.Settings), starting at the configured values."""
    start = Params(settings.fusion_threshold, settings.cycle_time_ms, settings.cache_capacity > 0,
                   settings.hierarchical_allreduce)
    return Autotuner(start, Search(start, settings.autotune_fixed, multi_node), settings.autotune_warmup_samples,
                     settings.autotune_steps_per_sample, log)
