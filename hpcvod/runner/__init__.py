"""``hpcvod.run(fn, args, kwargs, np=..., hosts=...)``: Horovod's ``horovod.run``, a Python function on N ranks.

The caller pickles ``fn`` with its arguments (cloudpickle when installed: it carries functions of ``__main__``
and closures by value; else pickle, by reference) into a private folder (0700), starts the ranks with
``hpcvod run`` (hpcvod/cli/run.py: the same launch line, flavour detection and settings), and each rank runs
``python -m hpcvod.runner FOLDER``: it loads the function, calls it, and writes its outcome to FOLDER/rank.R
(the value, or the error it raised). The caller returns the values in rank order, or raises ``RunError`` naming
every rank that raised or ended without a result; MPI's launcher ends the other ranks when one fails, so a
failing rank never leaves the caller waiting.

``hpcvod.runner.common.util.env.get_env_rank_and_size()`` is Horovod's helper of that path (Horovod's tf.data
service example reads its rank and size with it before ``init()``).

Ranks on other hosts must see the folder: with remote hosts it is made in the current directory (on a cluster,
a shared file system) instead of the local temporary directory.
"""

from __future__ import annotations

import importlib
import os
import pickle
import shutil
import socket
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

FUNCTION_FILE = "function.pickle"
# hpcvod's framework modules the ranks import before loading the function, where the caller had imported them:
# hpcvod.mxnet must come before mxnet (it gives MXNet 1.9.1 NumPy's np.bool), and unpickling the function may
# import mxnet first
FRAMEWORK_MODULES = ("hpcvod.mxnet", "hpcvod.torch", "hpcvod.tensorflow", "hpcvod.keras")
_ELASTIC = "hpcvod.run starts a fixed world; elastic training runs inside it with hvd.elastic.run (docs/elastic.md)"


class RunError(RuntimeError):
    """One or more ranks of ``hpcvod.run`` raised or ended without a result; ``failed_ranks`` lists them."""

    def __init__(self, message: str, failed_ranks: list[int]) -> None:
        super().__init__(message)
        self.failed_ranks = failed_ranks


def _pickler() -> Any:
    try:
        import cloudpickle
        return cloudpickle
    except ImportError:
        return pickle


def _is_local(host: str) -> bool:
    return host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())


def _hosts_of(hosts: str | None, hostfile: str | None) -> list[str]:
    from hpcvod.cli.run import parse_hostfile, parse_hosts

    if hosts:
        return [name for name, _ in parse_hosts(hosts)]
    return [name for name, _ in parse_hostfile(hostfile)] if hostfile else []


def run(func: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
        num_proc: int | None = None, min_num_proc: int | None = None, max_num_proc: int | None = None,
        slots: int | None = None, reset_limit: int | None = None, cooldown_range: tuple[int, int] | None = None,
        hosts: str | None = None, hostfile: str | None = None, host_discovery_script: str | None = None,
        start_timeout: int | None = None, ssh_port: int | None = None, ssh_identity_file: str | None = None,
        disable_cache: bool | None = None, output_filename: str | None = None, verbose: bool | None = None,
        use_gloo: bool | None = None, use_mpi: bool | None = None, mpi_args: str | None = None,
        network_interface: str | None = None, network_interfaces: Sequence[str] | None = None,
        executable: str | None = None, np: int | None = None, min_np: int | None = None,
        max_np: int | None = None) -> list[Any]:
    """Runs ``func(*args, **kwargs)`` on ``num_proc`` (or ``np``, Horovod's older name) ranks started with the
    installed MPI, here or on ``hosts`` ("h1:2,h2:2") / ``hostfile``, and returns each rank's return value in
    rank order, as ``horovod.run`` does. Raises ``RunError`` naming the ranks that raised or died, ``ValueError``
    for arguments Horovod also refuses or hpcvod does not take (Gloo, the elastic ones)."""
    from hpcvod.cli import build_parser
    from hpcvod.cli import run as run_command
    from hpcvod.support.errors import UserError

    count = np if np is not None else num_proc if num_proc is not None else 1
    if hosts is not None and hostfile is not None:
        raise ValueError("hpcvod.run: give hosts or hostfile, not both")
    if use_gloo:
        raise ValueError("hpcvod.run: use_gloo=True: hpcvod runs over MPI only (drop use_gloo, or give use_mpi=True)")
    elastic = {"min_num_proc": min_num_proc, "max_num_proc": max_num_proc, "min_np": min_np, "max_np": max_np,
               "reset_limit": reset_limit, "cooldown_range": cooldown_range,
               "host_discovery_script": host_discovery_script}
    given = [name for name, value in elastic.items() if value is not None]
    if given:
        raise ValueError(f"hpcvod.run: {', '.join(given)}: {_ELASTIC}")
    if slots is not None and hosts is not None:   # Horovod's default slots for hosts given without them
        hosts = ",".join(h if ":" in h else f"{h}:{slots}" for h in hosts.split(","))
    elif slots is not None and hostfile is None:
        hosts = f"localhost:{slots}"
    try:
        remote = any(not _is_local(host) for host in _hosts_of(hosts, hostfile))
    except UserError as err:
        raise ValueError(f"hpcvod.run: {err}") from None
    nics = list(network_interfaces or []) + ([network_interface] if network_interface else [])

    options = ["run", f"-np={count}"]
    for flag, value in (("-H", hosts), ("--hostfile", hostfile), ("--start-timeout", start_timeout),
                        ("--ssh-port", ssh_port), ("--ssh-identity-file", ssh_identity_file),
                        ("--output-filename", output_filename), ("--mpi-args", mpi_args)):
        if value is not None:
            options.append(f"{flag}={value}")
    options += [f"--network-interface={nic}" for nic in nics]
    options += ["--verbose"] if verbose else []

    folder = tempfile.mkdtemp(prefix=".hpcvod-run-" if remote else "hpcvod-run-",
                              dir=os.getcwd() if remote else None)   # mkdtemp: 0700
    try:
        pickler = _pickler()
        try:
            payload = pickler.dumps(([name for name in FRAMEWORK_MODULES if name in sys.modules],
                                     pickler.dumps((func, tuple(args), dict(kwargs or {})))))
        except Exception as err:
            raise ValueError(f"hpcvod.run: cannot pickle the function or its arguments ({type(err).__name__}: "
                             f"{err}); {'' if pickler is not pickle else 'install cloudpickle, or '}define the "
                             f"function at the top level of an importable module") from None
        Path(folder, FUNCTION_FILE).write_bytes(payload)
        program = [executable or sys.executable, "-m", "hpcvod.runner", folder]
        parser = build_parser()
        parsed = parser.parse_args(options)
        try:
            status = run_command.run(parsed, program, options + program)
        except UserError as err:
            raise ValueError(f"hpcvod.run: {err}") from None
        return _results(folder, count, status)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _results(folder: str, count: int, status: int) -> list[Any]:
    """Every rank's value in rank order, or RunError naming each rank that raised or left no result."""
    values, raised, missing = [], [], []
    for rank in range(count):
        path = Path(folder, f"rank.{rank}")
        if not path.exists():
            missing.append(rank)
            continue
        ok, value = pickle.loads(path.read_bytes())
        if ok:
            values.append(value)
        else:
            raised.append((rank, value))
    if not raised and not missing and status == 0:
        return values
    # the cause first: a rank's own error, then ranks that died, then ranks that hpcvod stopped because of them
    causes = [f"rank {rank} raised {text}" for rank, text in raised if not text.startswith("Hpcvod")]
    stopped = [f"rank {rank} raised {text}" for rank, text in raised if text.startswith("Hpcvod")]
    parts = causes
    if missing:
        names = ", ".join(map(str, missing))
        parts.append(f"rank{'s' if len(missing) > 1 else ''} {names} ended without a result")
    parts += stopped
    if not parts:
        parts.append("every rank returned, but the launcher failed")
    message = f"hpcvod.run: {'; '.join(parts)} (launcher exit status {status}; each rank's output is above)"
    failed = sorted([rank for rank, _ in raised] + missing)
    raise RunError(message, failed)


def rank_main(folder: str) -> int:
    """On each rank: call the function, write its outcome to FOLDER/rank.R; exit 1 if it raised."""
    from hpcvod.launchers.label import rank_of

    rank = rank_of(os.environ)
    where = Path(folder)
    if not where.is_dir():
        print(f"hpcvod.run: rank {rank}: {folder} does not exist here: the hosts must share the caller's current "
              f"directory", file=sys.stderr)
        return 1
    try:
        modules, payload = pickle.loads(Path(folder, FUNCTION_FILE).read_bytes())
        for name in modules:
            importlib.import_module(name)
        func, args, kwargs = pickle.loads(payload)
        outcome = (True, func(*args, **kwargs))
        status = 0
    except SystemExit as err:
        if err.code in (None, 0):
            outcome, status = (True, None), 0
        else:
            outcome, status = (False, f"SystemExit({err.code!r})"), 1
    except Exception as err:
        traceback.print_exc()
        outcome, status = (False, f"{type(err).__name__}: {err}".splitlines()[0][:500]), 1
    try:
        data = _pickler().dumps(outcome)
    except Exception as err:
        data, status = pickle.dumps((False, f"an unpicklable return value ({type(err).__name__}: {err})")), 1
    partial = where / f".rank.{rank}.part"
    partial.write_bytes(data)
    partial.rename(where / f"rank.{rank}")   # whole or absent: the caller never reads half a result
    return status

