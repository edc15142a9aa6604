"""The rank side of ``hpcvod sites check`` (docs/sites.md): what one acceptance job measures on every rank.

``probe(request)`` runs on every rank of an ordinary hpcvod job (through the Python API). It records what the rank
sees (host, launcher variables, the environment the profile promised, the frameworks it can import), starts the
runtime (``hvd.init()``: an MPI flavour that does not match the profile, or a launcher that forms one-rank worlds,
shows here), and measures point-to-point latency/bandwidth and allreduce bus bandwidth. Rank 0 also writes the
link table as JSON into the job folder. Only the runtime is imported: the submission side judges the records.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

from .world import hostname, launcher_rank

LINKS_FILE = "links.json"
RECORDS_DIR = "sitecheck"   # each rank's record, <rank>.json, in the job folder
KIB = 1024
MIB = 1024 * KIB
PING_REPS = 100              # 8-byte round trips for the latency figure
LATENCY_BYTES = 8
# the settings that choose the MPI's transport (what the library reports of itself comes from its version text)
TRANSPORT_VARIABLES = ("MPIR_CVAR_CH4_NETMOD", "MPIR_CVAR_NEMESIS_NETMOD", "FI_PROVIDER", "UCX_TLS", "UCX_NET_DEVICES",
                       "OMPI_MCA_pml", "OMPI_MCA_btl", "OMPI_MCA_mtl", "I_MPI_FABRICS", "I_MPI_OFI_PROVIDER")


def sizes(max_bytes: int, start: int = 4 * KIB, step: int = 4) -> list[int]:
    """4 KiB, 16 KiB, ... up to ``max_bytes``: the message sizes measured."""
    out = []
    size = start
    while size <= max_bytes:
        out.append(size)
        size *= step
    return out


def _reps(nbytes: int) -> int:
    """Enough repetitions to average out noise without letting 256 MiB dominate the job's time."""
    return max(2, min(20, (16 * MIB) // max(nbytes, 1)))


def _frameworks(names: list[str]) -> dict[str, dict[str, str]]:
    found = {}
    for name in names:
        try:
            module = importlib.import_module(name)
            found[name] = {"ok": "yes", "version": str(getattr(module, "__version__", "?")),
                           "file": str(getattr(module, "__file__", ""))}
        except Exception as err:  # an ImportError or a broken install: either way the user's job would fail
            found[name] = {"ok": "no", "error": f"{type(err).__name__}: {err}".splitlines()[0][:300]}
    return found


def _pingpong(comm: Any, peer: int, me: int, nbytes: int, reps: int) -> float:
    """Seconds of one one-way trip between ranks 0 and ``peer`` (half the mean round trip); 0 elsewhere."""
    import numpy as np

    buf = np.zeros(max(nbytes, 1), dtype=np.uint8)
    if me not in (0, peer):
        return 0.0
    other = peer if me == 0 else 0
    for i in range(reps + 1):        # the first round trip sets up the connection: not timed
        if i == 1:
            start = time.perf_counter()
        if me == 0:
            comm.Send(buf, dest=other, tag=7)
            comm.Recv(buf, source=other, tag=7)
        else:
            comm.Recv(buf, source=other, tag=7)
            comm.Send(buf, dest=other, tag=7)
    return (time.perf_counter() - start) / reps / 2


def _p2p(comm: Any, peer: Optional[int], me: int, max_bytes: int) -> Optional[dict[str, Any]]:
    if peer is None:
        return None
    latency = _pingpong(comm, peer, me, LATENCY_BYTES, PING_REPS)
    points = []
    for nbytes in sizes(max_bytes, start=64 * KIB):
        seconds = _pingpong(comm, peer, me, nbytes, _reps(nbytes))
        points.append({"bytes": nbytes, "seconds": seconds, "gbps": nbytes * 8 / seconds / 1e9 if seconds else 0.0})
    comm.Barrier()
    return {"peer": peer, "latency_us": latency * 1e6, "points": points}


def _allreduce(hvd: Any, comm: Any, max_bytes: int) -> list[dict[str, Any]]:
    import numpy as np
    from mpi4py import MPI

    n = hvd.size()
    points = []
    for nbytes in sizes(max_bytes):
        data = np.ones(nbytes // 4, dtype=np.float32)
        name = f"sitecheck.allreduce.{nbytes}"
        hvd.allreduce(data, op=hvd.Sum, name=name)        # warm-up: negotiation cache and connections
        reps = _reps(nbytes)
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(reps):
            hvd.allreduce(data, op=hvd.Sum, name=name)
        seconds = comm.allreduce((time.perf_counter() - start) / reps, op=MPI.MAX)
        # bus bandwidth as nccl-tests define it: what each link carries in a ring, 2(n-1)/n of the data
        bus = nbytes * 2 * (n - 1) / n / seconds if seconds else 0.0
        points.append({"bytes": nbytes, "seconds": seconds, "bus_gbps": bus * 8 / 1e9})
    return points


def _peers(hosts: list[str]) -> tuple[Optional[int], Optional[int]]:
    """Rank 0's partner inside its node and across nodes (None where the layout has none)."""
    intra = next((r for r, h in enumerate(hosts) if r and h == hosts[0]), None)
    inter = next((r for r, h in enumerate(hosts) if h != hosts[0]), None)
    return intra, inter


def probe(request: dict[str, Any]) -> dict[str, Any]:
    """Everything one rank can tell about the site; rank 0's record also carries the link measurements."""
    if not isinstance(request, dict):
        raise TypeError(f"probe(request): expected a mapping, got {type(request).__name__}")
    record: dict[str, Any] = {
        "hostname": hostname(), "launcher_rank": launcher_rank(), "python": sys.executable,
        "python_version": sys.version.split()[0], "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in request.get("env_expect", {})},
        "launcher_env": {k: v for k, v in os.environ.items()
                         if k.startswith(("SLURM_STEP", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
                                          "PMI_", "OMPI_COMM_WORLD", "PMIX_RANK", "HPCVOD_MPI_FLAVOUR"))},
        "frameworks": _frameworks(list(request.get("frameworks", []))),
    }
    import hpcvod

    record["hpcvod"] = {"file": hpcvod.__file__, "version": getattr(hpcvod, "__version__", "?")}
    import hpcvod.runtime as hvd

    try:
        hvd.init()
    except Exception as err:  # the evidence the check needs (flavour mismatch, world size), not a crash
        record["init_error"] = f"{type(err).__name__}: {err}"
        record["init_traceback"] = traceback.format_exc()[-2000:]
        return record
    from mpi4py import MPI

    record.update(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                  cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(),
                  thread_level={MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                                MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}.get(
                                    MPI.Query_thread(), str(MPI.Query_thread())),
                  mpi_library=" ".join(MPI.Get_library_version().split())[:200])
    from .world import mpi_flavour

    record["mpi_flavour"] = mpi_flavour(MPI.Get_library_version())
    device = [line.split(":", 1)[1].strip() for line in MPI.Get_library_version().splitlines()
              if line.strip().startswith("MPICH Device")]
    record["transport"] = {"settings": {k: os.environ[k] for k in TRANSPORT_VARIABLES if k in os.environ},
                           "device": device[0] if device else None}
    hosts = hvd.allgather_object(record["hostname"])
    record["hosts"] = hosts
    comm = MPI.COMM_WORLD.Dup()       # the runtime has its own duplicate; these ping-pongs never meet its traffic
    try:
        if hvd.size() > 1:
            max_bytes = int(request.get("max_bytes", 4 * MIB))
            intra, inter = _peers(hosts)
            links: dict[str, Any] = {
                "world_size": hvd.size(), "nodes": len(set(hosts)), "buffers": "host",
                "intra_node": _p2p(comm, intra, hvd.rank(), max_bytes),
                "inter_node": _p2p(comm, inter, hvd.rank(), max_bytes),
                "allreduce": _allreduce(hvd, comm, max_bytes),
            }
            if hvd.rank() == 0:
                record["links"] = links
                out = request.get("out_dir") or os.environ.get("HPCVOD_JOB_DIR")
                if out:
                    Path(out, LINKS_FILE).write_text(json.dumps(links, indent=2) + "\n")
        hvd.barrier()
    finally:
        comm.Free()
    hvd.shutdown()
    return record
