"""The per-rank line labeller (hpcvod.launchers.label) on its own: labels, exit status, death by signal, signals
forwarded to the program, a program that cannot start."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(120)


def _label(*program: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hpcvod.launchers.label", "--", *program], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin", **(env or {})}, **kw)


def test_lines_carry_rank_and_stream_and_the_exit_status_is_the_programs():
    proc = _label("sh", "-c", "echo out; echo err >&2; printf 'no newline'; exit 3", env={"PMI_RANK": "5"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert out.decode().splitlines() == ["[5]<stdout>: out", "[5]<stdout>: no newline"]
    assert err.decode().splitlines() == ["[5]<stderr>: err"]


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_program_killed_by_a_signal_ends_the_wrapper_by_the_same_signal(signum):
    """srun then says `task N: Killed`, as without the wrapper."""
    proc = _label("sh", "-c", f"kill -{signum.name.removeprefix('SIG')} $$", env={"SLURM_PROCID": "1"})
    proc.communicate(timeout=60)
    assert proc.returncode == -signum


def test_a_signal_to_the_wrapper_reaches_the_program_once():
    script = ("trap 'echo got TERM; exit 7' TERM; echo ready; "
              "while :; do sleep 0.1; done")
    proc = _label("sh", "-c", script, env={"OMPI_COMM_WORLD_RANK": "0"})
    assert proc.stdout.readline() == b"[0]<stdout>: ready\n"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 7 and out == b"[0]<stdout>: got TERM\n", out


def test_a_program_that_cannot_start_is_one_labelled_line_and_127():
    proc = _label("/no/such/program")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 127 and out == b""
    assert err.decode().startswith("[?]<stderr>: cannot run /no/such/program: ")
