"""The rank side of ``hpcvod sites check`` (docs/sites.md): what one acceptance job measures on every rank.

``probe(request)`` runs on every rank of an ordinary hpcvod job (through the Python API). It records what the rank
sees (host, launcher variables, the environment the profile promised, the frameworks it can import), starts the
runtime (``hvd.init()``: an MPI flavour that does not match the profile, or a launcher that forms one-rank worlds,
shows here), and measures point-to-point latency/bandwidth and allreduce bus bandwidth. Rank 0 also writes the
link table as JSON into the job folder. Only the runtime is imported: the submission side judges the records.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import re
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from .world import hostname, launcher_rank

LINKS_FILE = "links.json"
RECORDS_DIR = "sitecheck"   # each rank's record, <rank>.json, in the job folder
ENDED_IN_MPI = "ended_in_mpi"   # marks the early record: still there, the process ended inside the MPI part
KIB = 1024
MIB = 1024 * KIB
PING_REPS = 100              # 8-byte round trips for the latency figure
LATENCY_BYTES = 8
# the settings that choose the MPI's transport (what the library reports of itself comes from its version text)
TRANSPORT_VARIABLES = ("MPIR_CVAR_CH4_NETMOD", "MPIR_CVAR_NEMESIS_NETMOD", "FI_PROVIDER", "UCX_TLS", "UCX_NET_DEVICES",
                       "OMPI_MCA_pml", "OMPI_MCA_btl", "OMPI_MCA_mtl", "I_MPI_FABRICS", "I_MPI_OFI_PROVIDER")
# what makes each MPI say which transport it picked, set only where the job did not set it already (measured with
# the three wheels: MPICH's OFI netmod prints "libfabric provider: tcp - 10.0.0.0/24", Intel MPI "MPI startup():
# libfabric provider: tcp" once it uses its network, UCX (MPICH's default netmod, Open MPI's pml ucx) "ucp_context_0
# inter-node cfg#2 tag(tcp/eth0 ...)", Open MPI's ob1 "mca: bml: Using tcp btl for send to [[..],2] on node n2")
REPORTING_VARIABLES = {"MPIR_CVAR_DEBUG_SUMMARY": "1", "I_MPI_DEBUG": "5", "OMPI_MCA_btl_base_verbose": "1",
                       "UCX_LOG_LEVEL": "info"}
REPORTED_PATTERNS = (re.compile(r"libfabric provider: .*"),
                     re.compile(r"ucp_context_\d+ +(?:self|intra-node|inter-node) cfg#\d+ .*"),
                     re.compile(r"mca: bml: Using \S+ btl for send to \S+ on node \S+"))
MAX_REPORTED_LINES = 40
# with GPUs: NCCL says at INFO level which network it took ("Using network IB" / "Socket" / a plugin's name) and,
# for IB, each card's link layer ("NET/IB : Using [0]mlx5_0:1/IB" or ".../RoCE"); forced for the check's job
NCCL_REPORTING = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
NCCL_PATTERNS = (re.compile(r"NCCL INFO Using network .*"), re.compile(r"NCCL INFO NET/IB ?: ?Using .*"),
                 re.compile(r"NCCL INFO NET/Socket ?: ?Using .*"), re.compile(r"NCCL INFO NET/IB ?: ?No device found.*"))
# the settings that name network interfaces or HCAs: each must exist on every node
INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "GLOO_SOCKET_IFNAME", "FI_TCP_IFACE", "UCX_NET_DEVICES",
                       "OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include", "I_MPI_HYDRA_IFACE")
# what a container runtime leaves inside: apptainer/singularity set the first two, podman/systemd-nspawn `container`
CONTAINER_VARIABLES = ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "APPTAINER_NAME", "SINGULARITY_NAME",
                       "container", "PYXIS_CONTAINER_IMAGE", "CH_RUNNING")  # ch-run sets CH_RUNNING
CONTAINER_FILES = ("/.singularity.d", "/.dockerenv", "/run/.containerenv")


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


def interfaces() -> dict[str, list[str]]:
    """This node's network interfaces and InfiniBand HCAs (the names a profile's settings may use)."""
    try:
        nets = sorted(name for _, name in socket.if_nameindex())
    except OSError:
        nets = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
    hcas = sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else []
    return {"net": nets, "ib": hcas}


def container_markers() -> dict[str, Any]:
    """What says this process runs inside a container, and the OS it sees (the image's, inside one)."""
    found: dict[str, Any] = {k: os.environ[k] for k in CONTAINER_VARIABLES if os.environ.get(k)}
    found.update({path: "exists" for path in CONTAINER_FILES if os.path.exists(path)})
    try:
        release = Path("/etc/os-release").read_text()
        found["os"] = next((line.split("=", 1)[1].strip('"') for line in release.splitlines()
                            if line.startswith("PRETTY_NAME=")), "?")
    except OSError:
        found["os"] = "?"
    return found


def reported_lines(text: str, patterns: tuple = REPORTED_PATTERNS) -> list[str]:
    """The lines in which the MPI (or, with NCCL_PATTERNS, NCCL) named the transport it picked (each once, at most
    MAX_REPORTED_LINES)."""
    found: list[str] = []
    for line in text.splitlines():
        for pattern in patterns:
            match = pattern.search(line)
            if match and match.group(0).strip() not in found:
                found.append(match.group(0).strip())
    return found[:MAX_REPORTED_LINES]


class CapturedOutput:
    """File descriptors 1 and 2 of this process sent to ``path`` (a temporary file without one) while the MPI starts
    and talks: MPI libraries print their transport choice through C stdio, which Python's sys.stdout never sees.
    On an exception the captured text goes back to stderr, so the job's output still explains the failure."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.text = path, ""

    def __enter__(self) -> "CapturedOutput":
        sys.stdout.flush()
        sys.stderr.flush()
        self.file = open(self.path, "w+b") if self.path else tempfile.TemporaryFile()
        self.saved = (os.dup(1), os.dup(2))
        os.dup2(self.file.fileno(), 1)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            ctypes.CDLL(None).fflush(None)   # what the MPI printf'ed into C's buffer lands in the file, not later
        except (OSError, AttributeError):
            pass
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)
        self.file.seek(0)
        self.text = self.file.read().decode(errors="replace")
        self.file.close()
        if kind is not None:
            os.write(2, self.text[-20000:].encode())


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


def _p2p(comm: Any, peer: int | None, me: int, max_bytes: int) -> dict[str, Any] | None:
    if peer is None:
        return None
    latency = _pingpong(comm, peer, me, LATENCY_BYTES, PING_REPS)
    points = []
    for nbytes in sizes(max_bytes, start=64 * KIB):
        seconds = _pingpong(comm, peer, me, nbytes, _reps(nbytes))
        points.append({"bytes": nbytes, "seconds": seconds, "gbps": nbytes * 8 / seconds / 1e9 if seconds else 0.0})
    comm.Barrier()
    return {"peer": peer, "latency_us": latency * 1e6, "points": points}


def _allreduce(hvd: Any, comm: Any, max_bytes: int, xp: Any = None) -> list[dict[str, Any]]:
    """Allreduce bus bandwidth from 4 KiB to ``max_bytes``: host buffers, or device buffers with ``xp`` CuPy."""
    import numpy as np
    from mpi4py import MPI

    xp = xp or np
    where = "host" if xp is np else "device"
    n = hvd.size()
    points = []
    for nbytes in sizes(max_bytes):
        data = xp.ones(nbytes // 4, dtype=xp.float32)
        name = f"sitecheck.allreduce.{where}.{nbytes}"
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


def _device_allreduce(hvd: Any, comm: Any, max_bytes: int, links: dict[str, Any]) -> dict[str, Any]:
    """With GPUs asked for: the allreduce bus bandwidth of device buffers (NCCL, or MPI staging where NCCL cannot
    run) into ``links``; what this rank's GPU path is (collective: every rank agrees before measuring)."""
    from . import gpu

    cupy, nccl, why = gpu.probe()
    usable = comm.allgather(why if cupy is None else "")
    problem = next((f"rank {r}: {w}" for r, w in enumerate(usable) if w), "")
    if problem:
        return {"device_buffers": False, "why": problem}
    links["allreduce_device"] = _allreduce(hvd, comm, max_bytes, cupy)
    links["buffers"] = "host and device"
    ops = hvd.global_process_set._lane.executors.device_ops
    return {"device_buffers": True, "backend": ops.backend if ops is not None else "?",
            "why": ops.why_not_nccl if ops is not None else ""}


def _peers(hosts: list[str]) -> tuple[int | None, int | None]:
    """Rank 0's partner inside its node and across nodes (None where the layout has none)."""
    intra = next((r for r, h in enumerate(hosts) if r and h == hosts[0]), None)
    inter = next((r for r, h in enumerate(hosts) if h != hosts[0]), None)
    return intra, inter


def probe(request: dict[str, Any], before_mpi: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Everything one rank can tell about the site; rank 0's record also carries the link measurements.
    ``before_mpi`` gets the record as it stands before MPI starts: an MPI that aborts the process (a wrong
    interface setting) leaves no Python exception, and that early record is then the only evidence."""
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
    record["interfaces"] = interfaces()
    record["interface_settings"] = {k: os.environ[k] for k in INTERFACE_VARIABLES if k in os.environ}
    record["container"] = container_markers()
    if before_mpi is not None:
        before_mpi(record)
    import hpcvod.runtime as hvd

    for key, value in REPORTING_VARIABLES.items():   # before MPI_Init, where the libraries read them
        os.environ.setdefault(key, value)
    if request.get("gpus_per_node"):
        os.environ.update(NCCL_REPORTING)            # before the first device collective creates the communicator
    out = request.get("out_dir") or os.environ.get("HPCVOD_JOB_DIR")
    records = Path(out, RECORDS_DIR) if out else None
    capture = CapturedOutput(records / f"{launcher_rank() or 0}.mpi.log"
                             if records is not None and records.is_dir() else None)
    with capture:
        started = _start_and_measure(hvd, request, record, out)
    if "transport" in record:
        record["transport"]["reported"] = reported_lines(capture.text)
    if request.get("gpus_per_node"):
        record.setdefault("gpu", {})["nccl_reported"] = reported_lines(capture.text, NCCL_PATTERNS)
    if started:
        hvd.shutdown()
    return record


def _start_and_measure(hvd: Any, request: dict[str, Any], record: dict[str, Any], out: str | None) -> bool:
    """hvd.init() (its error kept as evidence: False), the world as this rank sees it, and the link measurements."""
    try:
        hvd.init()
    except Exception as err:  # the evidence the check needs (flavour mismatch, world size), not a crash
        record["init_error"] = f"{type(err).__name__}: {err}"
        record["init_traceback"] = traceback.format_exc()[-2000:]
        return False
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
            if request.get("gpus_per_node"):
                record["gpu"] = _device_allreduce(hvd, comm, max_bytes, links)
            if hvd.rank() == 0:
                record["links"] = links
                if out:
                    Path(out, LINKS_FILE).write_text(json.dumps(links, indent=2) + "\n")
        hvd.barrier()
    finally:
        comm.Free()
    return True
