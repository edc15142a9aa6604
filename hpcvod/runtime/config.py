"""Runtime settings from the environment, all read through one helper (:class:`Setting`).

Every setting is read from ``HPCVOD_<NAME>`` and, for drop-in use of Horovod job scripts, also from
``HOROVOD_<NAME>``; the ``HPCVOD_`` spelling wins when both are set. docs/contract.md and docs/runtime.md
list them. A malformed value raises :class:`~hpcvod.runtime.errors.HpcvodConfigError` naming the variable and
what was expected. Numbers must be finite and inside their bounds: an infinite cycle time would end the engine's
thread in ``time.sleep``, an infinite timeout would overflow the deadline watcher's ``select``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .errors import HpcvodConfigError, first_of

_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}

GIB = 1 << 30
MAX_SECONDS = 30 * 24 * 3600   # 30 days: longer than any batch job's time limit, far below select()'s limit


def lookup(name: str, env: Mapping[str, str] | None = None,
           horovod: bool = True) -> tuple[str | None, str | None]:
    """Return ``(variable, value)`` for setting ``name`` (``HPCVOD_<name>`` first, then ``HOROVOD_<name>``)."""
    env = os.environ if env is None else env
    for prefix in ("HPCVOD_", "HOROVOD_") if horovod else ("HPCVOD_",):
        var = prefix + name
        if var in env:
            return var, env[var]
    return None, None


@dataclass(frozen=True)
class Bounds:
    """The range of a numeric setting, in the unit its variable is given in."""

    low: float
    high: float
    whole: bool = False

    def parse(self, raw: str) -> float:
        value: float = float(raw)
        if self.whole:
            value = int(raw) if raw.lstrip("+-").isdigit() else int(value) if value.is_integer() else float("nan")
        if not self.low <= value <= self.high:   # NaN and the infinities fail here too
            raise ValueError(raw)
        return value


@dataclass(frozen=True)
class Setting:
    """One ``HPCVOD_<name>`` variable: how its text becomes a value and what it must be.

    ``parse`` raises ValueError for a value outside what ``expected`` says. ``horovod``: also read as
    ``HOROVOD_<name>``. ``blank_is_unset``: an empty value counts as not set (job scripts that export it empty).
    ``bounds``: a numeric setting's range (``hpcvod run`` checks its options against it).
    """

    name: str
    parse: Callable[[str], Any]
    expected: str
    horovod: bool = True
    blank_is_unset: bool = False
    bounds: Bounds | None = None

    def read(self, default: Any, env: Mapping[str, str] | None = None) -> Any:
        """The value in ``env`` (default: os.environ), or ``default`` when unset; HpcvodConfigError when bad."""
        var, raw = lookup(self.name, env, self.horovod)
        if var is None or raw is None or (self.blank_is_unset and not raw.strip()):
            return default
        try:
            return self.parse(raw.strip())
        except (ValueError, TypeError, OverflowError):
            shown = repr(raw) if len(raw) <= 80 else repr(raw[:60]) + f"... ({len(raw)} characters)"
            raise HpcvodConfigError(f"{var}={shown}: expected {self.expected}") from None


def number(name: str, low: float, high: float, unit: str, whole: bool = False, note: str = "",
           horovod: bool = True, blank_is_unset: bool = False) -> Setting:
    """A numeric setting that must lie in [low, high] (a whole number with ``whole``)."""
    bounds = Bounds(low, high, whole)
    kind = ("a non-negative" if low == 0 else "a") + (" whole" if whole else "")
    expected = f"{kind} number of {unit}{f' ({note})' if note else ''}, " + (
        f"at most {figure(high)}" if low == 0 else f"from {figure(low)} to {figure(high)}")
    return Setting(name, bounds.parse, expected, horovod, blank_is_unset, bounds)


def figure(value: float) -> str:
    """A bound or value as people write it: 1000, 2592000, 0.5 (not 1e+03); a whole number too long for a line
    (too large for a float, too) cut to its first digits."""
    if isinstance(value, int):
        text = str(value)
        return text if len(text) <= 24 else f"{text[:20]}... ({len(text)} digits)"
    return str(int(value)) if value.is_integer() else f"{value:g}"


def _bool(raw: str) -> bool:
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(raw)


def flag(name: str) -> Setting:
    return Setting(name, _bool, "0 or 1")


def choice(name: str, choices: tuple[str, ...], empty: str | None = None, horovod: bool = True,
           blank_is_unset: bool = False) -> Setting:
    """One of ``choices`` (case-insensitive); an empty value means ``empty`` when given."""
    def parse(raw: str) -> str:
        low = raw.lower() or (empty or "")
        if low not in choices:
            raise ValueError(raw)
        return low
    return Setting(name, parse, "one of " + ", ".join(choices), horovod, blank_is_unset)


# Every setting the runtime reads; nothing in hpcvod.runtime or hpcvod.frameworks reads another HPCVOD_ variable
# as a setting (HPCVOD_JOB_DIR and HPCVOD_CHECKPOINT_DIR are paths the job script gives).
FUSION_THRESHOLD = number("FUSION_THRESHOLD", 0, 64 * GIB, "bytes", whole=True, note="0 disables fusion")
CYCLE_TIME = number("CYCLE_TIME", 0, 1000, "milliseconds")
CACHE_CAPACITY = number("CACHE_CAPACITY", 0, 1 << 20, "entries", whole=True,
                        note="0 disables the response cache")
TIMELINE_MARK_CYCLES = flag("TIMELINE_MARK_CYCLES")
STALL_CHECK_DISABLE = flag("STALL_CHECK_DISABLE")
STALL_CHECK_TIME = number("STALL_CHECK_TIME_SECONDS", 0, MAX_SECONDS, "seconds")
STALL_SHUTDOWN_TIME = number("STALL_SHUTDOWN_TIME_SECONDS", 0, MAX_SECONDS, "seconds", note="0 = never")
HIERARCHICAL_ALLREDUCE = flag("HIERARCHICAL_ALLREDUCE")
GPU_OPERATIONS = choice("GPU_OPERATIONS", ("auto", "nccl", "mpi"), empty="auto")
WATCHDOG = flag("WATCHDOG")
HEARTBEAT_TIMEOUT = number("HEARTBEAT_TIMEOUT_SECONDS", 0, MAX_SECONDS, "seconds",
                           note="0 = only closed connections count")
INIT_TIMEOUT = number("INIT_TIMEOUT", 0, MAX_SECONDS, "seconds", note="0 = wait for ever")
PIN_GPU = flag("PIN_GPU")
AUTOTUNE = flag("AUTOTUNE")
AUTOTUNE_WARMUP_SAMPLES = number("AUTOTUNE_WARMUP_SAMPLES", 0, 1000, "samples", whole=True)
AUTOTUNE_STEPS_PER_SAMPLE = number("AUTOTUNE_STEPS_PER_SAMPLE", 1, 100000, "steps", whole=True)
# the knobs autotune tunes (autotune.Params field -> setting): one the job sets explicitly stays fixed
TUNABLE = {"fusion_threshold": FUSION_THRESHOLD, "cycle_time_ms": CYCLE_TIME, "cache_enabled": CACHE_CAPACITY,
           "hierarchical_allreduce": HIERARCHICAL_ALLREDUCE}
# What the job script promised (docs/contract.md); hpcvod's own, so no HOROVOD_ spelling
WORLD_SIZE = number("WORLD_SIZE", 1, 1 << 24, "ranks", whole=True, horovod=False, blank_is_unset=True)
MPI_FLAVOUR = choice("MPI_FLAVOUR", ("openmpi", "intelmpi", "mpich", "mvapich"), horovod=False,
                     blank_is_unset=True)


# Settings every rank's engine must share (field -> setting name): ranks that fuse, cache, time or route
# collectives differently pair the wrong data or wait for each other for ever. init() compares them.
SHARED_SETTINGS = {"fusion_threshold": "FUSION_THRESHOLD", "cycle_time_ms": "CYCLE_TIME",
                   "cache_capacity": "CACHE_CAPACITY", "hierarchical_allreduce": "HIERARCHICAL_ALLREDUCE",
                   "gpu_operations": "GPU_OPERATIONS", "watchdog": "WATCHDOG"}


def settings_disagreement(per_rank: list[tuple]) -> str | None:
    """One line naming every shared setting whose value differs between ranks (``Settings.shared()`` of each
    rank, in rank order), or None when they agree."""
    problems = []
    for i, name in enumerate(SHARED_SETTINGS.values()):
        ranks_of: dict[object, list[int]] = {}
        for rank, values in enumerate(per_rank):
            ranks_of.setdefault(values[i], []).append(rank)
        if len(ranks_of) > 1:
            where = "; ".join(f"{value!r} on {_span(ranks)}" for value, ranks in ranks_of.items())
            problems.append(f"HPCVOD_{name} ({where})")
    if not problems:
        return None
    return ("runtime settings differ between ranks: " + ", ".join(problems) +
            "; every rank must run with the same value (set it in the job's environment, not per rank)")


def _span(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + first_of([str(r) for r in ranks], 8)


@dataclass(frozen=True)
class Settings:
    """The engine's knobs, resolved once at ``init()``."""

    fusion_threshold: int = 128 * 1024 * 1024
    cycle_time_ms: float = 0.0
    cache_capacity: int = 1024
    timeline: str | None = None
    timeline_mark_cycles: bool = False
    stall_check_disable: bool = False
    stall_check_time_seconds: float = 60.0
    stall_shutdown_time_seconds: float = 0.0
    hierarchical_allreduce: bool = False
    gpu_operations: str = "auto"
    watchdog: bool = True
    heartbeat_timeout_seconds: float = 30.0
    init_timeout_seconds: float = 300.0
    pin_gpu: bool = True
    autotune: bool = False
    autotune_log: str | None = None
    autotune_warmup_samples: int = 3
    autotune_steps_per_sample: int = 10
    autotune_fixed: tuple[str, ...] = ()   # tunable knobs the job set explicitly (TUNABLE's keys)

    def shared(self) -> tuple:
        """The values of SHARED_SETTINGS, for comparison across ranks."""
        return tuple(getattr(self, field) for field in SHARED_SETTINGS)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        d = cls()
        _, timeline = lookup("TIMELINE", env)
        _, autotune_log = lookup("AUTOTUNE_LOG", env)
        return cls(
            fusion_threshold=FUSION_THRESHOLD.read(d.fusion_threshold, env),
            cycle_time_ms=CYCLE_TIME.read(d.cycle_time_ms, env),
            cache_capacity=CACHE_CAPACITY.read(d.cache_capacity, env),
            timeline=timeline or None,
            timeline_mark_cycles=TIMELINE_MARK_CYCLES.read(d.timeline_mark_cycles, env),
            stall_check_disable=STALL_CHECK_DISABLE.read(d.stall_check_disable, env),
            stall_check_time_seconds=STALL_CHECK_TIME.read(d.stall_check_time_seconds, env),
            stall_shutdown_time_seconds=STALL_SHUTDOWN_TIME.read(d.stall_shutdown_time_seconds, env),
            hierarchical_allreduce=HIERARCHICAL_ALLREDUCE.read(d.hierarchical_allreduce, env),
            gpu_operations=GPU_OPERATIONS.read(d.gpu_operations, env),
            watchdog=WATCHDOG.read(d.watchdog, env),
            heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT.read(d.heartbeat_timeout_seconds, env),
            init_timeout_seconds=INIT_TIMEOUT.read(d.init_timeout_seconds, env),
            pin_gpu=PIN_GPU.read(d.pin_gpu, env),
            autotune=AUTOTUNE.read(d.autotune, env),
            autotune_log=autotune_log or None,
            autotune_warmup_samples=AUTOTUNE_WARMUP_SAMPLES.read(d.autotune_warmup_samples, env),
            autotune_steps_per_sample=AUTOTUNE_STEPS_PER_SAMPLE.read(d.autotune_steps_per_sample, env),
            autotune_fixed=tuple(field for field, setting in TUNABLE.items()
                                 if lookup(setting.name, env)[0] is not None),
        )
