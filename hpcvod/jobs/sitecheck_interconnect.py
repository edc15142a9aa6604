"""``hpcvod sites check``'s interconnect judgement: which transport MPI and NCCL really took (from their own
reports and the settings), and whether the network interfaces the profile names exist on every node."""

from __future__ import annotations

import re
from typing import Sequence

from hpcvod.jobs.sitecheck_model import FAIL, PASS, SKIP, WARN, Check, Request
from hpcvod.sites.loader import Site


def tcp_transport(settings: dict[str, str]) -> str | None:
    """The setting that sends MPI's traffic over TCP sockets, if one does."""
    low = {k: v.lower() for k, v in settings.items()}
    for key in ("FI_PROVIDER", "I_MPI_OFI_PROVIDER"):
        if low.get(key, "").split(";")[0] in ("tcp", "sockets"):
            return f"{key}={settings[key]}"
    if low.get("UCX_TLS") and not any(t in low["UCX_TLS"] for t in ("rc", "ud", "dc", "ib", "all")):
        return f"UCX_TLS={settings['UCX_TLS']}"
    if low.get("OMPI_MCA_pml") == "ob1" and "tcp" in low.get("OMPI_MCA_btl", "tcp"):
        return f"OMPI_MCA_pml=ob1, OMPI_MCA_btl={settings.get('OMPI_MCA_btl', '(default: tcp among others)')}"
    return None


TCP, RDMA, SHM = "tcp", "rdma", "shared memory"
_TCP_NAMES = ("tcp", "sockets", "udp", "net")
_SHM_NAMES = ("shm", "sm", "vader", "smcuda", "self", "sysv", "posix", "cma", "xpmem", "knem", "memory")
_RDMA_PREFIXES = ("verbs", "mlx", "psm", "opx", "cxi", "efa", "rc", "ud", "dc", "ib", "openib", "gni", "bgq")


def transport_class(name: str) -> str | None:
    """tcp, rdma or shared memory for a libfabric provider ("verbs;ofi_rxm"), a UCX transport ("rc_mlx5/mlx5_0:1")
    or an Open MPI btl ("tcp"); None for names that say neither (Open MPI's uct or ofi btl, GPU copies)."""
    base = name.split(";")[0].split("/")[0].strip().lower()
    if base in _TCP_NAMES:
        return TCP
    if base in _SHM_NAMES:
        return SHM
    return RDMA if base.startswith(_RDMA_PREFIXES) else None


def mpi_reported(records: list[dict]) -> list[tuple[str | None, str]]:
    """(transport class, the MPI's own line) for each line in which an MPI named what carries traffic between
    nodes: the libfabric provider (MPICH's OFI netmod, Intel MPI), UCX's inter-node configuration, Open MPI's btl
    for a peer on another node."""
    found: dict[str, str | None] = {}
    for record in records:
        for line in record.get("transport", {}).get("reported", []):
            if "libfabric provider:" in line:
                words = line.split("libfabric provider:", 1)[1].split()
                found.setdefault(line, transport_class(words[0]) if words else None)
            elif " inter-node cfg#" in line:
                tag = re.search(r"tag\(([^)]*)\)", line)
                classes = {transport_class(t) for t in tag.group(1).split()} if tag else set()
                found.setdefault(line, RDMA if RDMA in classes else TCP if TCP in classes else None)
            else:
                btl = re.search(r"Using (\S+) btl for send to \S+ on node (\S+)", line)
                if btl and btl.group(2) != record.get("hostname"):
                    found.setdefault(line, transport_class(btl.group(1)))
    return list((cls, line) for line, cls in found.items())


def interconnect_checks(site: Site, request: Request, records: list[dict | None]) -> list[Check]:
    unseen = [rank for rank, r in enumerate(records) if r is None or "interfaces" not in r]
    checks = [interfaces_check(site, [r for r in records if r is not None and "interfaces" in r], unseen)]
    got = [r for r in records if r is not None and "transport" in r]
    if not got:
        return [Check("interconnect.mpi_transport", SKIP, "no rank got as far as MPI"), *checks]
    kind = site.profile.interconnect.kind
    transport = got[0]["transport"]
    settings = transport["settings"]
    said = ", ".join(f"{k}={v}" for k, v in sorted(settings.items())) or "no transport variables set"
    evidence = f"{said}; MPICH device {transport['device']}" if transport.get("device") else said
    reported = [(cls, line) for cls, line in mpi_reported(got) if cls in (TCP, RDMA)]
    fast = kind in ("infiniband", "roce")
    if request.nodes > 1 and reported:
        tcp = next((line for cls, line in reported if cls == TCP), None)
        if tcp and fast:
            check = Check("interconnect.mpi_transport", FAIL, f"the profile says {kind} but the MPI reported TCP for "
                          f"traffic between nodes: {tcp!r} (source: the MPI's own report; settings: {evidence})")
        else:
            classes = ", ".join(sorted({cls for cls, _ in reported}))
            check = Check("interconnect.mpi_transport", PASS, f"between nodes: {classes}, as the MPI reported: "
                          f"{reported[0][1]!r} (interconnect.kind {kind}; source: the MPI's own report; settings: "
                          f"{evidence})")
    else:
        source = ("one node: no traffic between nodes" if request.nodes == 1
                  else "source: the MPI's settings; it printed no line naming its transport between nodes")
        tcp = tcp_transport(settings)
        if tcp and fast and request.nodes > 1:
            check = Check("interconnect.mpi_transport", FAIL, f"the profile says {kind} but {tcp} sends MPI's "
                          f"traffic over TCP sockets ({evidence}; {source})")
        else:
            check = Check("interconnect.mpi_transport", PASS, f"{evidence} (interconnect.kind {kind}; {source})")
    checks.insert(0, check)
    checks.append(_nccl_check(site, request, got))
    return checks


def nccl_network(lines: list[str]) -> tuple[str | None, str]:
    """NCCL's network as its INFO lines say (``tcp`` for its sockets, ``infiniband`` / ``roce`` from the cards' link
    layer, ``rdma`` for an IB-class network or plugin whose link layer it did not print) and the line that says so;
    (None, "") when it said nothing."""
    network = next((line for line in lines if "Using network" in line), "")
    cards = next((line for line in lines if "NET/IB" in line and "Using" in line), "")
    if not network:
        return None, ""
    name = network.split("Using network", 1)[1].strip()
    if name.lower().startswith("socket"):
        return TCP, network
    if "/RoCE" in cards:
        return "roce", cards
    if "/IB" in cards:
        return "infiniband", cards
    return RDMA, network


def _nccl_check(site: Site, request: Request, got: list[dict]) -> Check:
    """With GPUs: whether device buffers ran on NCCL, and whether NCCL's network is the profile's interconnect."""
    if not request.gpus_per_node:
        return Check("interconnect.nccl", SKIP, "no GPUs in this check (--gpus-per-node): NCCL not started")
    gpus = [r["gpu"] for r in got if r.get("gpu")]
    path = next((g for g in gpus if "device_buffers" in g), None)
    if path is None:
        return Check("interconnect.nccl", SKIP, "no device collective ran (a world of one rank)")
    if not path["device_buffers"]:
        return Check("interconnect.nccl", FAIL, f"--gpus-per-node {request.gpus_per_node} asked, but the ranks "
                                                f"cannot use their GPUs: {path['why']}")
    if path["backend"] != "nccl":
        return Check("interconnect.nccl", WARN, f"device buffers were staged through host memory and MPI, not "
                                                f"NCCL: {path['why']}")
    lines = [line for g in gpus for line in g.get("nccl_reported", [])]
    kind = site.profile.interconnect.kind
    network, line = nccl_network(lines)
    if request.nodes == 1:
        return Check("interconnect.nccl", PASS, f"device collectives on NCCL; one node: no network between nodes"
                                                f"{' (NCCL: ' + repr(line) + ')' if line else ''}")
    if network is None:
        return Check("interconnect.nccl", WARN, "device collectives on NCCL, but NCCL printed no 'Using network' "
                                                "line with NCCL_DEBUG=INFO: its network is unknown")
    said = f"NCCL said {line!r} (interconnect.kind {kind})"
    if network == TCP and kind in ("infiniband", "roce"):
        return Check("interconnect.nccl", FAIL, f"the profile says {kind} but NCCL uses its TCP sockets between "
                                                f"nodes: {said}; check NCCL_IB_HCA / NCCL_IB_DISABLE and the cards")
    if network in ("infiniband", "roce") and kind in ("infiniband", "roce") and network != kind:
        return Check("interconnect.nccl", WARN, f"NCCL runs over {network}, the profile says {kind}: {said}")
    return Check("interconnect.nccl", PASS, f"between nodes: {network}; {said}")


# each setting that names interfaces: how NCCL-style prefix lists (^ excludes, = exact) or exact lists read
_PREFIX_LISTS = {"NCCL_SOCKET_IFNAME": "net", "NCCL_IB_HCA": "ib"}
_EXACT_LISTS = ("GLOO_SOCKET_IFNAME", "FI_TCP_IFACE", "I_MPI_HYDRA_IFACE", "OMPI_MCA_btl_tcp_if_include",
                "OMPI_MCA_oob_tcp_if_include", "UCX_NET_DEVICES")
_PROFILE_KEYS = {"NCCL_SOCKET_IFNAME": "interconnect.socket_ifname", "NCCL_IB_HCA": "interconnect.ib_hca"}


def missing_interfaces(variable: str, value: str, have: dict[str, list[str]]) -> list[str]:
    """The names in ``variable=value`` that this node (``have``: its "net" interfaces and "ib" HCAs) cannot
    satisfy; [] when it can. NCCL lists match by prefix (``=`` exact; a ``^`` list only excludes, never fails);
    the MPI's lists name exact interfaces (Open MPI's subnets in CIDR form and UCX's ``all`` are not names)."""
    if variable in _PREFIX_LISTS:
        if value.startswith("^"):
            return []
        exact = value.startswith("=")
        names = [n.split(":")[0] for n in value.lstrip("=").split(",") if n]
        pool = have.get(_PREFIX_LISTS[variable], [])
        ok = any(i == n if exact else i.startswith(n) for n in names for i in pool)
        return [] if ok else names
    missing = []
    for name in (n.strip() for n in value.split(",")):
        if not name or name == "all" or "/" in name:
            continue
        if ":" in name:   # UCX's HCA:port
            if name.split(":")[0] not in have.get("ib", []):
                missing.append(name)
        elif name not in have.get("net", []):
            missing.append(name)
    return missing


def interfaces_check(site: Site, got: list[dict], unseen: Sequence[int] = ()) -> Check:
    """Each interface or HCA the job's settings name exists on every node. ``unseen``: the ranks that left no
    record of their interfaces (a launcher that kills the step once one rank aborts can end a slower rank before
    it looks); a failure names them rather than pass them off as nodes that were checked."""
    nodes: dict[str, dict] = {}
    for record in got:
        nodes.setdefault(record["hostname"], record)
    settings = {k: v for record in nodes.values() for k, v in record.get("interface_settings", {}).items()}
    if not got and unseen:
        return Check("interconnect.interfaces", SKIP, "no rank got as far as recording its interfaces")
    if not settings:
        return Check("interconnect.interfaces", SKIP, "no setting names an interface or HCA (interconnect."
                     "socket_ifname, ib_hca, FI_TCP_IFACE, UCX_NET_DEVICES, OMPI_MCA_btl_tcp_if_include ...)")
    problems = []
    for variable, value in sorted(settings.items()):
        if variable not in _PREFIX_LISTS and variable not in _EXACT_LISTS:
            continue
        bad = {host: missing_interfaces(variable, value, record["interfaces"]) for host, record in nodes.items()}
        bad = {host: names for host, names in bad.items() if names}
        if bad:
            host = next(iter(bad))
            kind = "HCAs" if _PREFIX_LISTS.get(variable) == "ib" or ":" in bad[host][0] else "interfaces"
            said = f" ({_PROFILE_KEYS[variable]})" if variable in _PROFILE_KEYS else ""
            there = nodes[host]["interfaces"].get("ib" if kind == "HCAs" else "net", [])
            problems.append(f"{variable}={value}{said}: no {', '.join(bad[host])} on {', '.join(bad)} "
                            f"({host} has {kind}: {', '.join(there) or 'none'})")
    named = ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))
    said = "; ".join(problems) if problems else f"{named}: present on {', '.join(sorted(nodes))}"
    if unseen:
        said += (f"; rank{'s' if len(unseen) > 1 else ''} {', '.join(map(str, unseen))} ended before recording "
                 f"{'their' if len(unseen) > 1 else 'its'} interfaces")
    return Check("interconnect.interfaces", FAIL if problems else PASS, said)
