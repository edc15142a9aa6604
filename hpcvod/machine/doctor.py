"""``hpcvod doctor``: what this machine offers a job, checked for real.

The MPI launcher and its flavour, mpi4py and the thread level it gets, NCCL through CuPy, and each framework
with its version. Every probe runs in its own Python process (in parallel, with a time limit), so a framework
that crashes or hangs on import shows up as a line instead of taking the doctor down, and the CLI itself
still imports none of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import IO, TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from hpcvod.sites.loader import Site

from hpcvod import __version__
from hpcvod.machine.flavour import MpiNotFound, detect_mpi

PROBE_TIMEOUT = 180

# Each probe prints one JSON object: {"ok": bool, "text": "..."}.
PROBES = {
    "mpi4py": """
import mpi4py
from mpi4py import MPI
names = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled", MPI.THREAD_SERIALIZED: "serialized",
         MPI.THREAD_MULTIPLE: "multiple"}
lib = " ".join(MPI.Get_library_version().split())[:70]
text = (f"mpi4py {mpi4py.__version__}; {lib}; thread level {names.get(MPI.Query_thread(), '?')} "
        f"(asked for {mpi4py.rc.thread_level}); world size {MPI.COMM_WORLD.Get_size()} as a singleton")
out = {"ok": True, "text": text}
""",
    "hpcvod runtime": """
import hpcvod.runtime as hvd
out = {"ok": True, "text": "importable (" + ", ".join(n for n in ("init", "allreduce", "rank", "size")
                                                        if hasattr(hvd, n)) + ")"}
""",
    "NCCL (CuPy)": """
import cupy
try:
    gpus = cupy.cuda.runtime.getDeviceCount()
except Exception as err:  # no driver: CuPy imports but cannot see a GPU
    gpus, why = 0, str(err).splitlines()[0][:60]
else:
    why = ""
def cuda_version(get):
    try:
        v = get()
    except Exception:
        return "?"
    return f"{v // 1000}.{v % 1000 // 10}"
cuda_text = (f"CUDA runtime {cuda_version(cupy.cuda.runtime.runtimeGetVersion)}, "
             f"driver {cuda_version(cupy.cuda.runtime.driverGetVersion)}")
try:
    from cupy.cuda import nccl
    version = nccl.get_version()
    nccl_text = f"NCCL {version // 10000}.{version // 100 % 100}.{version % 100}"
    if gpus > 0:   # what runtime/nccl.py runs on the device when every rank has its own GPU
        nccl_text += ("; on NCCL: allreduce, allgather, broadcast, alltoall, reducescatter (and grouped forms); "
                      + ("bfloat16 natively (ncclBfloat16)" if version >= 21000 else
                         "bfloat16 needs NCCL >= 2.10: use HPCVOD_GPU_OPERATIONS=mpi"))
except Exception as err:
    nccl_text = "NCCL unavailable (" + str(err).splitlines()[0][:60] + ")"
out = {"ok": gpus > 0, "text": f"cupy {cupy.__version__}; {cuda_text}; {gpus} GPU(s)"
                              f"{' (' + why + ')' if why else ''}; {nccl_text}"}
""",
    "torch": """
import torch
cuda = torch.cuda.is_available()
extra = f"; NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}" if cuda else ""
out = {"ok": True, "text": f"torch {torch.__version__}; CUDA {'available, ' + str(torch.cuda.device_count()) + ' GPU(s)' if cuda else 'not available'}{extra}"}
""",
    "tensorflow": """
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
out = {"ok": True, "text": f"tensorflow {tf.__version__}; keras {tf.keras.__version__}; {len(gpus)} GPU(s)"}
""",
    "mxnet": """
import numpy as np
shim = not hasattr(np, "bool")
if shim:
    np.bool = bool  # MXNet 1.9 still uses np.bool, which numpy >= 1.24 removed (docs/measured.md)
import mxnet as mx
out = {"ok": True, "text": f"mxnet {mx.__version__}" + (" (with the np.bool shim)" if shim else "")}
""",
}

_WRAPPER = """
import json, sys
try:
{body}
except ImportError as err:
    out = {{"ok": False, "text": "not installed (" + str(err).splitlines()[0][:80] + ")"}}
except Exception as err:
    out = {{"ok": False, "text": type(err).__name__ + ": " + str(err).splitlines()[0][:100] if str(err) else type(err).__name__}}
sys.stdout.flush()
print("\\nHPCVOD-DOCTOR " + json.dumps(out))
"""


def _probe_code(body: str) -> str:
    return _WRAPPER.format(body="\n".join("    " + line for line in body.strip().splitlines()))


def run_probes(env: dict[str, str]) -> dict[str, tuple[bool, str]]:
    procs = {name: subprocess.Popen([sys.executable, "-c", _probe_code(body)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env)
             for name, body in PROBES.items()}
    results = {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=PROBE_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            results[name] = (False, f"no answer after {PROBE_TIMEOUT} s (hangs on import?)")
            continue
        marker = [line for line in stdout.splitlines() if line.startswith("HPCVOD-DOCTOR ")]
        if marker:
            data = json.loads(marker[-1][len("HPCVOD-DOCTOR "):])
            results[name] = (bool(data["ok"]), data["text"])
        else:
            last = (stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            results[name] = (False, f"crashed: {last[:120]}")
    return results


def doctor(out: IO[str], find_site: "Callable[[str], Site]",
           job_check: "Callable[[Site], tuple[str, str]] | None" = None) -> int:
    """Print the report; exit status 1 when no working MPI was found (nothing could run) or the site's jobs would
    load another MPI than the site launches, else 0.
    ``find_site(hostname)`` is the site a job submitted from here would use (the CLI hands it over: launchers
    stand beside the schedulers, whose options a profile is validated against, and do not import them).
    ``job_check(site)`` is submit's comparison of the MPI the job's Python loads with the site's flavour:
    (its state: ok, FAIL, or -- where it could not be compared here; the comparison or the refusal). A row says
    "ok" only for what was checked."""
    from hpcvod.machine.host import detect_host
    from hpcvod.support.errors import UserError

    host = detect_host()
    rows: list[tuple[str, str, str]] = [("hpcvod", "ok", f"{__version__} (Python {sys.version.split()[0]}, "
                                                         f"{sys.executable})")]
    job_mpi_ok = True
    try:
        site = find_site(host.hostname)
        rows.append(("site", "ok", f"{site.name} ({site.profile.scheduler}; {site.source})"))
        if job_check is not None:
            state, text = job_check(site)
            job_mpi_ok = state != "FAIL"
            rows.append(("job's MPI", state, text))
    except UserError as err:
        rows.append(("site", "FAIL", str(err)))
    rows.append(("machine", "ok", f"{host.hostname}: {host.cpu_count} CPU(s), {host.gpu_count} GPU(s)"
                                  f"{', running as root' if host.is_root else ''}"))
    env = dict(os.environ)
    mpi_ok = False
    try:
        mpi = detect_mpi()
        rows.append(("MPI launcher", "ok", f"{mpi.launcher}: {mpi.flavour} ({mpi.evidence}); {mpi.version()}"))
        mpi_ok = True
        if mpi.flavour == "openmpi":
            env.setdefault("OMPI_MCA_pml", "ob1")
            env.setdefault("OMPI_MCA_btl", "self,sm")
            if host.is_root:
                env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    except MpiNotFound as err:
        rows.append(("MPI launcher", "FAIL", str(err)))
    results = run_probes(env)
    for name, (ok, text) in results.items():
        state = "ok" if ok else ("FAIL" if name == "mpi4py" else "--")
        rows.append((name, state, text))
    mpi_ok = mpi_ok and results["mpi4py"][0]
    width = max(len(r[0]) for r in rows)
    for name, state, text in rows:
        out.write(f"{name:<{width}}  {state:<4}  {text}\n")
    out.write("-- = optional and not usable here, or not checked here; FAIL = needed to run jobs\n")
    return 0 if mpi_ok and job_mpi_ok else 1
