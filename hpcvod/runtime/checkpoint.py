"""Checkpoint and resume for training scripts: survive time limits, preemption and requeues.

A job that is stopped (``scontrol requeue``, preemption, the warning signal before its time limit) and started
again must continue where it stopped: the same parameters, the same step, the same position in the data,
and no step applied twice. This module gives training scripts that without tying them to a framework:
the state is a dict of NumPy arrays (anything ``np.asarray`` takes: CPU tensors too) and plain Python values
(int, float, bool, str, None; nested dicts of them), so a NumPy generator's ``bit_generator.state`` fits.

    import hpcvod.runtime as hvd
    from hpcvod.runtime.checkpoint import Checkpoint

    hvd.init()
    ckpt = Checkpoint()                      # $HPCVOD_CHECKPOINT_DIR, else $HPCVOD_JOB_DIR/checkpoints
    state = ckpt.restore({"params": w0, "step": 0, "epoch": 0, "batch": 0})   # every rank
    while state["step"] < total_steps:
        ...one step from data position (state["epoch"], state["batch"])...
        state["step"] += 1
        # every rank; True everywhere if any rank got SIGUSR1/SIGTERM. Not after the last step: a stop there
        # would requeue a job with nothing left to do.
        stop = state["step"] < total_steps and ckpt.stop_requested()
        if stop or state["step"] % 100 == 0:
            ckpt.save(state)                 # every rank calls it; rank 0 writes
        if stop:
            sys.exit(0)                      # the job script requeues the job (docs/preemption.md)

Rank 0 writes each checkpoint to a temporary file, fsyncs it and renames it into place, so a checkpoint
file either is complete or does not exist; ``restore`` uses the newest readable one. Files are NumPy
``.npz`` archives loaded with ``allow_pickle=False``: loading a checkpoint never runs code.

Collective calls (``restore``, ``save``, ``stop_requested``) go through ``hpcvod.runtime`` when it is
initialised with more than one rank; without it (one process, a unit test) they work on this process alone.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from types import FrameType
from typing import Any, Mapping, Sequence

import numpy as np

from hpcvod.support.safe_read import Refused, json_kind, load_json, open_regular

from .errors import HpcvodConfigError, HpcvodInputError

State = dict[str, Any]
PathLike = str | os.PathLike[str]

FORMAT_VERSION = 1
_META_KEY = "__hpcvod_checkpoint__"
_SCALARS = (bool, int, float, str, type(None))
DEFAULT_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
# The files through which the job script and the ranks talk (docs/preemption.md), in $HPCVOD_JOB_DIR:
STOP_FILE = "stop-requested"        # the job script got the scheduler's warning: ranks, checkpoint and stop
REQUEUE_FILE = "requeue-requested"  # rank 0 saved because of a stop: the job script requeues the job
_STOP_FILE_POLL_SECONDS = 1.0       # stat() at most this often: cheap even on a parallel filesystem


def default_directory(env: Mapping[str, str] | None = None) -> Path:
    """Where checkpoints go: $HPCVOD_CHECKPOINT_DIR, else $HPCVOD_JOB_DIR/checkpoints (docs/contract.md).

    A job folder belongs to one submission and survives its requeues, so a requeued job resumes while a new
    submission starts fresh. Outside a job neither is set: the caller must say where.
    """
    env = os.environ if env is None else env
    if env.get("HPCVOD_CHECKPOINT_DIR"):
        return Path(env["HPCVOD_CHECKPOINT_DIR"])
    if env.get("HPCVOD_JOB_DIR"):
        return Path(env["HPCVOD_JOB_DIR"]) / "checkpoints"
    raise HpcvodConfigError(
        "Checkpoint(): no directory given and neither HPCVOD_CHECKPOINT_DIR nor HPCVOD_JOB_DIR is set "
        "(they are set inside jobs submitted by hpcvod); pass Checkpoint(directory=...)")


# ---- state <-> archive -------------------------------------------------------------------------------------

def _flatten(state: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """{'a': {'b': 1}} -> {('a', 'b'): 1}; validates keys and leaf types."""
    if not isinstance(state, Mapping):
        raise HpcvodInputError(f"checkpoint state{_where(prefix)} must be a dict, not {type(state).__name__}")
    flat: dict[tuple[str, ...], Any] = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise HpcvodInputError(f"checkpoint state{_where(prefix)}: key {key!r} is not a string")
        path = prefix + (key,)
        if isinstance(value, Mapping):
            if not value:
                raise HpcvodInputError(f"checkpoint state{_where(path)}: an empty dict cannot be stored")
            flat.update(_flatten(value, path))
        elif isinstance(value, _SCALARS):
            flat[path] = value
        elif isinstance(value, np.generic):  # np.int64(3) etc.: keep as a NumPy scalar of its dtype
            flat[path] = np.asarray(value)
        else:
            array = np.asarray(value)
            if array.dtype.hasobject:
                raise HpcvodInputError(
                    f"checkpoint state{_where(path)}: {type(value).__name__} is not storable (expected a NumPy "
                    f"array or CPU tensor, int, float, bool, str, None or a dict of them)")
            flat[path] = array
    return flat


def _unflatten(flat: Mapping[tuple[str, ...], Any]) -> State:
    out: State = {}
    for path, value in flat.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def _where(path: Sequence[str]) -> str:
    return "".join(f"[{k!r}]" for k in path)


def write_archive(path: Path, state: Mapping[str, Any], step: int) -> None:
    """Write `state` to `path` atomically: a temporary file in the same folder, fsync, rename, fsync folder."""
    flat = _flatten(state)
    arrays: dict[str, np.ndarray] = {}
    entries = []
    for i, (key_path, value) in enumerate(flat.items()):
        if isinstance(value, np.ndarray):
            arrays[f"a{i}"] = value
            entries.append({"path": list(key_path), "array": f"a{i}"})
        else:
            if isinstance(value, float) and not math.isfinite(value):
                entries.append({"path": list(key_path), "float": repr(value)})
            else:
                entries.append({"path": list(key_path), "value": value})
    meta = {"format": FORMAT_VERSION, "step": step, "time": time.time(), "entries": entries}
    arrays[_META_KEY] = np.array(json.dumps(meta))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash of the node
    finally:
        os.close(dir_fd)


class CheckpointUnreadable(HpcvodInputError):
    """A checkpoint file that cannot be restored: truncated, not a checkpoint, or with metadata that is not what
    write_archive writes. ``reason`` says why, without the path."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


_META_DEPTH = 8   # {"entries": [{"path": [...], "value": scalar}]}: 3 levels; a little room, never thousands


def read_archive(path: Path) -> tuple[State, int]:
    """(state, step) from a checkpoint file written by write_archive; CheckpointUnreadable for anything else (a
    truncated zip, a FIFO, metadata of another shape, JSON nested thousands deep, a key stored twice)."""
    try:
        with open_regular(path) as f, np.load(f, allow_pickle=False) as npz:
            if _META_KEY not in npz.files:
                raise Refused("no hpcvod metadata in it (not a checkpoint written by hpcvod)")
            meta = load_json(str(npz[_META_KEY][()]), _META_DEPTH)
            step, entries = _meta_fields(meta)
            flat: dict[tuple[str, ...], Any] = {}
            for i, entry in enumerate(entries):
                key_path, value = _entry(entry, i, npz.files)
                if key_path in flat:
                    raise Refused(f"metadata entry {i}: {_where(key_path)} stored twice")
                flat[key_path] = npz[value] if "array" in entry else value
            clash = {p[:k] for p in flat for k in range(1, len(p))} & flat.keys()
            if clash:
                raise Refused(f"metadata stores {_where(min(clash))} both as a value and as a dict")
            return _unflatten(flat), step
    except FileNotFoundError:
        raise CheckpointUnreadable(path, "it no longer exists") from None
    except Refused as err:
        raise CheckpointUnreadable(path, str(err)) from None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:   # a damaged zip or member
        raise CheckpointUnreadable(path, f"damaged ({type(err).__name__}: {err})") from None


def _meta_fields(meta: Any) -> tuple[int, list]:
    if not isinstance(meta, dict):
        raise Refused(f"metadata is a JSON {json_kind(meta)}, expected an object")
    if meta.get("format") != FORMAT_VERSION:
        raise Refused(f"checkpoint format {meta.get('format')!r}, expected {FORMAT_VERSION}")
    step, entries = meta.get("step"), meta.get("entries")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise Refused(f"metadata step {step!r}, expected a whole number >= 0")
    if not isinstance(entries, list):
        raise Refused(f"metadata entries: a JSON {json_kind(entries)}, expected a list")
    return step, entries


def _entry(entry: Any, i: int, members: list[str]) -> tuple[tuple[str, ...], Any]:
    """One metadata entry as (key path, value), the value being the member's name for an array."""
    key_path = entry.get("path") if isinstance(entry, dict) else None
    if not isinstance(key_path, list) or not key_path or not all(isinstance(k, str) for k in key_path):
        raise Refused(f"metadata entry {i}: expected an object with a non-empty list of key names under 'path'")
    kinds = [kind for kind in ("array", "float", "value") if kind in entry]
    if len(kinds) != 1:
        raise Refused(f"metadata entry {i} {_where(key_path)}: expected exactly one of array, float, value")
    value = entry[kinds[0]]
    if kinds[0] == "array" and (not isinstance(value, str) or value == _META_KEY or value not in members):
        raise Refused(f"metadata entry {i} {_where(key_path)}: array {value!r} is not in the archive")
    if kinds[0] == "float":
        if value not in ("inf", "-inf", "nan"):   # what write_archive stores there: the non-finite floats
            raise Refused(f"metadata entry {i} {_where(key_path)}: float {value!r}, expected inf, -inf or nan")
        value = float(value)
    if kinds[0] == "value" and not isinstance(value, _SCALARS):
        raise Refused(f"metadata entry {i} {_where(key_path)}: a JSON {json_kind(value)}, expected a plain value")
    return tuple(key_path), value


def _check_compatible(restored: Mapping[str, Any], initial: Mapping[str, Any], source: Path) -> None:
    """A checkpoint must hold the same keys, array shapes and dtypes as the initial state of this script."""
    have, want = _flatten(restored), _flatten(initial)
    missing = sorted(_where(p) for p in want.keys() - have.keys())
    extra = sorted(_where(p) for p in have.keys() - want.keys())
    if missing or extra:
        raise HpcvodInputError(
            f"checkpoint {source} does not fit this script's state: missing {', '.join(missing) or 'nothing'}; "
            f"unexpected {', '.join(extra) or 'nothing'} (a checkpoint of another script or model version? "
            f"use another checkpoint directory)")
    for key_path, value in want.items():
        got = have[key_path]
        if isinstance(value, np.ndarray) and isinstance(got, np.ndarray):
            if value.shape != got.shape or value.dtype != got.dtype:
                raise HpcvodInputError(
                    f"checkpoint {source}{_where(key_path)}: {got.dtype}{list(got.shape)} but this script starts "
                    f"from {value.dtype}{list(value.shape)}")


# ---- the helper ------------------------------------------------------------------------------------------------

class Checkpoint:
    """Save and restore a training state; notice the scheduler's stop signals.

    ``directory``: where checkpoint files go (default: :func:`default_directory`).
    ``keep``: how many of the newest checkpoints to keep (older ones are deleted after a save).
    ``signals``: signals that mean "the job will be stopped soon: save and exit" -- SIGTERM (preemption,
    ``scontrol requeue``, scancel: Slurm's KillWait leaves time to save) and SIGUSR1. An empty tuple leaves
    signal handling alone. Handlers are installed in the main thread only.

    Inside a job submitted by hpcvod (``$HPCVOD_JOB_DIR`` set) it also works with the job script: the script
    gets Slurm's warning before the time limit and leaves ``stop-requested`` in the job folder, which
    ``stop_requested()`` notices; a ``save()`` made after a stop leaves ``requeue-requested``, and the script
    then requeues the job. docs/preemption.md describes the whole cycle.
    """

    def __init__(self, directory: PathLike | None = None, *, keep: int = 2,
                 signals: Sequence[int] = DEFAULT_SIGNALS, prefix: str = "ckpt") -> None:
        if keep < 1:
            raise HpcvodInputError(f"Checkpoint(keep={keep}): keep at least 1 checkpoint")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix):
            raise HpcvodInputError(f"Checkpoint(prefix={prefix!r}): use letters, digits, _ . -")
        self.directory = Path(directory) if directory is not None else default_directory()
        job_dir = os.environ.get("HPCVOD_JOB_DIR")
        self._job_dir = Path(job_dir) if job_dir else None
        self._next_poll = 0.0
        self._stopping = False
        self.keep = keep
        self.prefix = prefix
        self.resumed_from: int | None = None  # the step restore() found, None for a fresh start
        self._unreadable: set[int] = set()        # steps whose files restore() skipped (rank 0)
        self._pattern = re.compile(rf"{re.escape(prefix)}-(\d+)\.npz")
        self._signal: int | None = None
        self._previous: dict[int, Any] = {}
        for signum in signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    # -- signals -------------------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._signal is None:
            print(f"hpcvod checkpoint: rank {_rank()} got {signal.Signals(signum).name}; saving and stopping at "
                  f"the next stop_requested()", file=sys.stderr, flush=True)
        self._signal = signum

    @property
    def signalled(self) -> int | None:
        """The stop signal this process received (None if none); stop_requested() is the collective answer."""
        return self._signal

    def stop_requested(self) -> bool:
        """True on every rank when any rank received a stop signal, or the job script left
        ``$HPCVOD_JOB_DIR/stop-requested`` (collective: call it on every rank, e.g. once per step)."""
        local = np.array([1 if self._signal is not None or self._stop_file_seen() else 0], dtype=np.int32)
        stop = bool(_allreduce_max(local, self._name("stop"))[0])
        self._stopping = self._stopping or stop
        return stop

    def _stop_file_seen(self) -> bool:
        """Rank 0 looks for the job script's stop file (at most once a second); the allreduce tells the rest."""
        if self._job_dir is None or _rank() != 0:
            return False
        now = time.monotonic()
        if now < self._next_poll:
            return False
        self._next_poll = now + _STOP_FILE_POLL_SECONDS
        if (self._job_dir / STOP_FILE).exists():
            if self._signal is None:
                print("hpcvod checkpoint: the job script asks to stop (time limit near); saving and stopping",
                      file=sys.stderr, flush=True)
            return True
        return False

    def close(self) -> None:
        """Put back the signal handlers that were there before."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- files ---------------------------------------------------------------------------------------------

    def path_for(self, step: int) -> Path:
        return self.directory / f"{self.prefix}-{step:012d}.npz"

    def steps(self) -> list[int]:
        """Steps of the complete checkpoint files in the directory, oldest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(self._pattern.fullmatch, names) if m)

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    # -- collective operations -----------------------------------------------------------------------------

    def save(self, state: Mapping[str, Any], step: int | None = None) -> Path | None:
        """Save `state` as the checkpoint of `step` (default: state["step"]). Collective: every rank calls it,
        rank 0 writes, and when it returns on any rank the file is complete on disk. Returns the path on rank 0.
        """
        if step is None:
            step = state.get("step") if isinstance(state, Mapping) else None
            if not isinstance(step, (int, np.integer)) or isinstance(step, bool):
                raise HpcvodInputError("Checkpoint.save(): pass step=N or keep an int under state['step']")
        step = int(step)
        if step < 0:
            raise HpcvodInputError(f"Checkpoint.save(step={step}): steps are >= 0")
        written: Path | None = None
        error = ""
        if _rank() == 0:
            try:
                written = self.path_for(step)
                write_archive(written, state, step)
                self._unreadable.discard(step)
                # files restore() skipped as unreadable do not count as kept: they must not push out a good one
                for old in [s for s in self.steps() if s not in self._unreadable][:-self.keep]:
                    self.path_for(old).unlink(missing_ok=True)
                if self._stopping and self._job_dir is not None:
                    # saved because the job is being stopped: the job script puts it back in the queue
                    (self._job_dir / REQUEUE_FILE).write_text(f"{step}\n")
            except (OSError, HpcvodInputError, ValueError) as exc:
                error = f"{type(exc).__name__}: {exc}"
        # one collective both waits for the file and tells every rank whether rank 0 managed to write it
        error = _broadcast_object(error, self._name("saved"))
        if error:
            raise HpcvodInputError(f"Checkpoint.save(step={step}) failed on rank 0: {error}")
        return written

    def restore(self, initial: Mapping[str, Any]) -> State:
        """The newest checkpoint's state on every rank, or `initial` when there is none (collective).

        Rank 0 reads the file and broadcasts it, so other ranks need not see the same filesystem. A newest
        file that cannot be read is reported and the one before it is used. The checkpoint must hold the
        same keys, array shapes and dtypes as `initial` (HpcvodInputError otherwise).
        """
        initial_flat = _flatten(initial)  # validate the caller's state on every rank, before any collective
        payload: Any = None
        if _rank() == 0:
            try:
                payload = self._load_newest(initial)
            except Exception as exc:   # whatever it is, every rank must hear it: the others wait in the broadcast
                payload = f"Checkpoint.restore() failed on rank 0: {type(exc).__name__}: {exc}"
        payload = _broadcast_object(payload, self._name("restore"))
        if isinstance(payload, str):  # rank 0's error, raised on every rank
            raise HpcvodInputError(payload)
        if payload is None:
            self.resumed_from = None
            return _unflatten(dict(initial_flat))
        state, step = payload
        self.resumed_from = step
        return state

    def _load_newest(self, initial: Mapping[str, Any]) -> Any:
        """Rank 0: (state, step) of the newest checkpoint that can be read, None when there is none, or the
        error every rank raises (a checkpoint of another script; files that are all unreadable)."""
        steps = self.steps()
        newest_problem = ""
        for step in reversed(steps):
            path = self.path_for(step)
            try:
                state, saved_step = read_archive(path)
                if saved_step != step:
                    raise CheckpointUnreadable(path, f"it holds step {saved_step}, its name says {step}")
            except CheckpointUnreadable as exc:
                print(f"hpcvod checkpoint: cannot read {path}: {exc.reason}; skipping it, trying an older one",
                      file=sys.stderr, flush=True)
                self._unreadable.add(step)
                newest_problem = newest_problem or f"the newest, {path}: {exc.reason}"
                continue
            try:
                _check_compatible(state, initial, path)
            except HpcvodInputError as exc:
                return str(exc)
            print(f"hpcvod checkpoint: resuming from {path} (step {saved_step})", file=sys.stderr, flush=True)
            return state, saved_step
        if steps:   # starting afresh would bury them: a later save could delete the only good copy elsewhere
            return (f"Checkpoint.restore(): none of the {len(steps)} checkpoint(s) in {self.directory} can be read "
                    f"({newest_problem}); move them away to start afresh, or restore a copy")
        return None

    def _name(self, what: str) -> str:
        # the same name each time: the runtime's response cache then knows it after the first call
        return f"hpcvod.checkpoint.{self.prefix}.{what}"


# ---- the runtime, when there is one ----------------------------------------------------------------------------

def _distributed() -> bool:
    from . import context

    return context.is_initialized() and context.size() > 1


def _rank() -> int:
    from . import context

    return context.rank() if context.is_initialized() else 0


def _broadcast_object(obj: Any, name: str) -> Any:
    if not _distributed():
        return obj
    from . import collectives

    return collectives.broadcast_object(obj, root_rank=0, name=name)


def _allreduce_max(array: np.ndarray, name: str) -> np.ndarray:
    if not _distributed():
        return array
    from . import collectives

    return np.asarray(collectives.allreduce(array, name=name, op=collectives.Max))


__all__ = ["Checkpoint", "default_directory", "read_archive", "write_archive", "DEFAULT_SIGNALS", "STOP_FILE",
           "REQUEUE_FILE"]
