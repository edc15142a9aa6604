"""Every line a rank prints, labelled with its rank and stream: ``[3]<stdout>: text``, ``[3]<stderr>: text``.

The launch line runs each rank as ``PYTHON -m hpcvod.launchers.label -- PROGRAM ARGS...`` (rendered scripts and
``hpcvod run`` alike). The launchers' own options do not serve: Hydra's ``-prepend-rank`` labels every read, not
every line (``[1] out[1] `` when a line arrives in two pieces), and neither it nor ``srun --label`` tells stderr
from stdout once both land in one output.log. This wrapper gives one form under every launcher.

The program runs as a child in its own process group, so a signal the launcher sends to the rank's group (srun,
a terminal's Ctrl-C) reaches it once, through the wrapper; if the wrapper is killed outright the kernel ends the
child too (PR_SET_PDEATHSIG). The wrapper exits as the program did, with its status or by the same signal.
File descriptors stay inherited: Hydra and srun's PMI-2 hand the rank its PMI connection as one (PMI_FD).

It needs only the standard library and starts in a few tens of milliseconds on every rank.

``--output-dir DIR --world-size N`` (``hpcvod run --output-filename DIR``) also copies the program's own output,
unlabelled, into ``DIR/rank.R/stdout`` and ``DIR/rank.R/stderr`` (R zero-padded to N - 1's width), the layout
horovodrun writes; folders 0700 and files 0600: nobody else reads a rank's output.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from typing import Sequence

# Where each launcher puts the rank (first match wins: SLURM_PROCID is inherited by an mpirun inside sbatch).
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGCONT)
MAX_LINE = 64 * 1024  # a longer line (a progress bar with \r only) is cut and labelled in pieces
DRAIN_SECONDS = 1.0  # after the program ends, how long a grandchild holding its pipes may keep them open

# What a labelled line looks like: used by `hpcvod logs --rank` and by tests.
LABELLED = re.compile(r"^\[(\d+)\]<(stdout|stderr)>: ?")


def rank_of(environ: dict[str, str] | os._Environ) -> str:
    for name in RANK_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit():
            return value
    return "?"


def label_prefix(rank: str, stream: str) -> bytes:
    return f"[{rank}]<{stream}>: ".encode()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            written = os.write(fd, data)
        except BrokenPipeError:
            return  # nobody reads any more: keep draining the program so it never blocks on a full pipe
        except InterruptedError:
            continue
        data = data[written:]


class _Stream:
    """Bytes from one of the program's pipes -> whole labelled lines on one of ours (and, unlabelled, into
    ``copy_fd``: --output-dir's file)."""

    def __init__(self, out_fd: int, prefix: bytes, copy_fd: int | None = None) -> None:
        self.out_fd, self.prefix, self.pending, self.copy_fd = out_fd, prefix, b"", copy_fd

    def feed(self, chunk: bytes) -> None:
        if self.copy_fd is not None:
            _write_all(self.copy_fd, chunk)
        data = self.pending + chunk
        lines = data.split(b"\n")
        self.pending = lines.pop()
        while len(self.pending) >= MAX_LINE:
            lines.append(self.pending[:MAX_LINE])
            self.pending = self.pending[MAX_LINE:]
        if lines:  # one write per batch: lines of one rank stay whole in a file other ranks append to
            _write_all(self.out_fd, b"".join(self.prefix + line + b"\n" for line in lines))

    def close(self) -> None:
        if self.pending:
            _write_all(self.out_fd, self.prefix + self.pending + b"\n")
            self.pending = b""


def _child_setup() -> None:
    os.setpgid(0, 0)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's own cleanup has to do
    if os.getppid() == 1:  # the wrapper died before prctl took effect
        os._exit(137)


def rank_output_files(folder: str, rank: str, world_size: int) -> tuple[int, int]:
    """(stdout, stderr) file descriptors of ``folder/rank.R/`` (R zero-padded as horovodrun pads it), created
    private: folders 0700, files 0600."""
    padded = rank.zfill(len(str(max(world_size - 1, 0)))) if rank.isdigit() else rank
    where = os.path.join(folder, f"rank.{padded}")
    os.makedirs(where, mode=0o700, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return (os.open(os.path.join(where, "stdout"), flags, 0o600),
            os.open(os.path.join(where, "stderr"), flags, 0o600))


def run_labelled(argv: Sequence[str], environ: dict[str, str] | None = None,
                 copies: tuple[int, int] | None = None) -> int:
    """Run ``argv`` with its output labelled (and copied, unlabelled, into ``copies``: stdout's and stderr's file
    descriptors); returns its exit status (negative: killed by that signal)."""
    rank = rank_of(os.environ if environ is None else environ)
    try:
        child = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=False,
                                 preexec_fn=_child_setup, env=environ)
    except OSError as err:
        _write_all(2, label_prefix(rank, "stderr") + f"cannot run {argv[0]}: {err.strerror}\n".encode())
        return 127
    for number in FORWARDED:
        signal.signal(number, lambda signum, _frame: _forward(child, signum))
    out_copy, err_copy = copies or (None, None)
    streams = {child.stdout.fileno(): _Stream(1, label_prefix(rank, "stdout"), out_copy),  # type: ignore[union-attr]
               child.stderr.fileno(): _Stream(2, label_prefix(rank, "stderr"), err_copy)}  # type: ignore[union-attr]
    selector = selectors.DefaultSelector()
    for fd in streams:
        selector.register(fd, selectors.EVENT_READ)
    ended_at = None
    while selector.get_map():
        if ended_at is None and child.poll() is not None:
            ended_at = time.monotonic()
        if ended_at is not None and time.monotonic() - ended_at > DRAIN_SECONDS:
            break  # a grandchild kept the pipes: the rank itself has ended
        for key, _ in selector.select(timeout=0.2):
            chunk = os.read(key.fd, 1 << 16)
            if chunk:
                streams[key.fd].feed(chunk)
            else:
                selector.unregister(key.fd)
    for stream in streams.values():
        stream.close()
    return child.wait()


def _forward(child: subprocess.Popen, signum: int) -> None:
    try:
        child.send_signal(signum)
    except ProcessLookupError:
        pass


USAGE = "usage: python -m hpcvod.launchers.label [--output-dir DIR --world-size N] -- PROGRAM [ARGS...]\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    copies = None
    if args[:1] == ["--output-dir"]:
        if len(args) < 4 or args[2] != "--world-size" or not args[3].isdigit():
            sys.stderr.write(USAGE)
            sys.exit(2)
        rank = rank_of(os.environ)
        try:
            copies = rank_output_files(args[1], rank, int(args[3]))
        except OSError as err:  # every rank says so, on its own labelled line, and none starts half-recorded
            _write_all(2, label_prefix(rank, "stderr") + f"--output-filename {args[1]}: {err.strerror}\n".encode())
            sys.exit(1)
        args = args[4:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.stderr.write(USAGE)
        sys.exit(2)
    status = run_labelled(args, copies=copies)
    if status < 0:  # die the way the program died, so the launcher reports the same signal ("Killed")
        try:
            signal.signal(-status, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP keep their default anyway
        os.kill(os.getpid(), -status)
    sys.exit(status if status >= 0 else 128 - status)


if __name__ == "__main__":
    main()
