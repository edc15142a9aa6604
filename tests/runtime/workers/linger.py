"""Run one rank as a child and, if it dies of a signal, report that to the launcher only after a delay.

Hydra (MPICH, Intel MPI) notices a rank's death through its own child and, even with -disable-auto-cleanup,
sometimes SIGKILLs the survivors within a millisecond (seen with the MPICH 5 wheel in about half the runs).
That races hpcvod's watchdog, which is what the killed-rank test is about. Behind this wrapper the launcher
learns of the death late, as srun (which leaves survivors running by default) or a hung node would, so the
test sees what hpcvod itself does. usage: linger.py SECONDS PYTHON SCRIPT ARGS...
"""

import subprocess
import sys
import time

delay = float(sys.argv[1])
code = subprocess.call(sys.argv[2:], close_fds=False)   # the PMI socket (PMI_FD) must reach the rank
if code < 0:                       # killed by a signal: keep the launcher unaware for a while
    time.sleep(delay)
    code = 128 - code
sys.exit(code)
