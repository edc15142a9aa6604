"""sites check's interconnect judgement: the transport MPI and NCCL took (their own lines, the settings), the
interfaces the profile names (hpcvod/jobs/sitecheck_interconnect.py)."""

from __future__ import annotations

import pytest

from hpcvod.jobs import sitecheck_interconnect, sitecheck_model
from sitecheck_helpers import record, statuses


@pytest.mark.parametrize("settings, tcp", [
    ({"FI_PROVIDER": "tcp"}, "FI_PROVIDER=tcp"),
    ({"FI_PROVIDER": "tcp;ofi_rxm"}, "FI_PROVIDER=tcp;ofi_rxm"),
    ({"FI_PROVIDER": "verbs"}, None),
    ({"UCX_TLS": "tcp,sm"}, "UCX_TLS=tcp,sm"),
    ({"UCX_TLS": "rc,sm"}, None),
    ({"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,sm,tcp"}, "OMPI_MCA_pml=ob1, OMPI_MCA_btl=self,sm,tcp"),
    ({"OMPI_MCA_pml": "ucx"}, None),
    ({}, None),
])
def test_tcp_transport_is_read_from_the_settings(settings, tcp) -> None:
    assert sitecheck_interconnect.tcp_transport(settings) == tcp


def test_a_profile_saying_infiniband_with_mpi_on_tcp_fails(sandbox) -> None:
    ranks = [record(r, "n1" if r < 2 else "n2", transport={"settings": {"FI_PROVIDER": "tcp"}, "device": "ch4:ofi"})
             for r in range(4)]
    request = sitecheck_model.Request(nodes=2, tasks_per_node=2)
    assert statuses(sitecheck_interconnect.interconnect_checks(sandbox, request, ranks)) == {
        "interconnect.mpi_transport": "pass", "interconnect.nccl": "skip", "interconnect.interfaces": "skip"}
    ib = infiniband(sandbox)
    check = sitecheck_interconnect.interconnect_checks(ib, request, ranks)[0]
    assert check.status == "fail" and "says infiniband but FI_PROVIDER=tcp" in check.evidence
    assert "source: the MPI's settings; it printed no line" in check.evidence


def infiniband(site):
    import dataclasses

    return dataclasses.replace(site, profile=dataclasses.replace(
        site.profile, interconnect=dataclasses.replace(site.profile.interconnect, kind="infiniband")))


# the lines each wheel printed on this machine (MPICH OFI netmod, Intel MPI, UCX, Open MPI ob1), and their readings
OFI_TCP = "libfabric provider: tcp - 10.251.0.0/24"
UCX_IB = "ucp_context_0 inter-node cfg#2 tag(rc_mlx5/mlx5_0:1 sysv/memory)  rma(rc_mlx5/mlx5_0:1)"
UCX_INTRA = "ucp_context_0 intra-node cfg#1 tag(sysv/memory cma/memory)  rma(sysv/memory posix/memory)"
BTL_TCP = "mca: bml: Using tcp btl for send to [[6397,1],2] on node n2"
BTL_SM = "mca: bml: Using sm btl for send to [[6397,1],1] on node n1"


@pytest.mark.parametrize("name, cls", [("tcp", "tcp"), ("tcp;ofi_rxm", "tcp"), ("verbs;ofi_rxm", "rdma"),
                                       ("mlx", "rdma"), ("psm3", "rdma"), ("rc_mlx5/mlx5_0:1", "rdma"),
                                       ("tcp/eth0", "tcp"), ("sysv/memory", "shared memory"), ("sm", "shared memory"),
                                       ("uct", None), ("cuda_ipc/cuda", None)])
def test_transport_names_classified(name, cls) -> None:
    assert sitecheck_interconnect.transport_class(name) == cls


def test_the_mpis_own_report_decides_the_transport_and_is_quoted(sandbox) -> None:
    request = sitecheck_model.Request(nodes=2, tasks_per_node=2)

    def ranks(lines, settings=None):
        return [record(r, "n1" if r < 2 else "n2", transport={"settings": settings or {}, "device": None,
                                                              "reported": lines if r == 0 else []})
                for r in range(4)]
    ib = infiniband(sandbox)
    # no setting says TCP, but the MPI did: the fail quotes its line
    check = sitecheck_interconnect.interconnect_checks(ib, request, ranks([OFI_TCP]))[0]
    assert check.status == "fail"
    assert f"says infiniband but the MPI reported TCP for traffic between nodes: '{OFI_TCP}'" in check.evidence
    assert "source: the MPI's own report" in check.evidence
    # Open MPI's btl to a rank on the other node is TCP: fail; to a rank on the same node (sm): not evidence
    assert sitecheck_interconnect.interconnect_checks(ib, request, ranks([BTL_SM, BTL_TCP]))[0].status == "fail"
    assert sitecheck_interconnect.mpi_reported(ranks([BTL_SM])) == []
    # a setting that says TCP loses against the MPI's own report of RDMA
    good = sitecheck_interconnect.interconnect_checks(ib, request, ranks([UCX_INTRA, UCX_IB], {"FI_PROVIDER": "tcp"}))[0]
    assert good.status == "pass" and "between nodes: rdma" in good.evidence and "rc_mlx5" in good.evidence
    # ethernet profile: TCP reported is what it promised
    assert sitecheck_interconnect.interconnect_checks(sandbox, request, ranks([OFI_TCP]))[0].status == "pass"


@pytest.mark.parametrize("variable, value, missing", [
    ("NCCL_SOCKET_IFNAME", "ib0", ["ib0"]),
    ("NCCL_SOCKET_IFNAME", "eth", []),              # NCCL matches by prefix
    ("NCCL_SOCKET_IFNAME", "=eth", ["eth"]),        # = asks for the exact name
    ("NCCL_SOCKET_IFNAME", "ib,eth0", []),
    ("NCCL_SOCKET_IFNAME", "^lo,docker", []),       # an exclusion list never fails
    ("NCCL_IB_HCA", "mlx5_0:1", ["mlx5_0"]),
    ("FI_TCP_IFACE", "eth0", []),
    ("FI_TCP_IFACE", "eth1", ["eth1"]),
    ("OMPI_MCA_btl_tcp_if_include", "eth0,10.0.0.0/8,ens1", ["ens1"]),
    ("UCX_NET_DEVICES", "mlx5_0:1,eth0", ["mlx5_0:1"]),
    ("UCX_NET_DEVICES", "all", []),
])
def test_missing_interfaces(variable, value, missing) -> None:
    assert sitecheck_interconnect.missing_interfaces(variable, value, {"net": ["eth0", "lo"], "ib": []}) == missing


def test_a_socket_ifname_missing_on_a_node_fails_naming_it_and_the_node(sandbox) -> None:
    def ranks(n2_nets):
        return [record(r, "n1" if r < 2 else "n2", interface_settings={"NCCL_SOCKET_IFNAME": "ib0"},
                       interfaces={"net": ["eth0", "ib0", "lo"] if r < 2 else n2_nets, "ib": []}) for r in range(4)]
    check = sitecheck_interconnect.interfaces_check(sandbox, ranks(["eth0", "lo"]))
    assert check.status == "fail"
    assert check.evidence == ("NCCL_SOCKET_IFNAME=ib0 (interconnect.socket_ifname): no ib0 on n2 (n2 has "
                              "interfaces: eth0, lo)")
    ok = sitecheck_interconnect.interfaces_check(sandbox, ranks(["eth0", "ib0"]))
    assert ok.status == "pass" and "present on n1, n2" in ok.evidence


def test_ranks_that_left_no_interfaces_record_are_named_not_counted_as_checked(sandbox) -> None:
    # a launcher that kills the step once one rank aborts in MPI_Init can end a slower rank before it looks
    only_n1 = [record(0, "n1", interface_settings={"FI_TCP_IFACE": "ib0"}, interfaces={"net": ["eth0"], "ib": []})]
    check = sitecheck_interconnect.interfaces_check(sandbox, only_n1, [1])
    assert check.status == "fail"
    assert check.evidence == ("FI_TCP_IFACE=ib0: no ib0 on n1 (n1 has interfaces: eth0); rank 1 ended before "
                              "recording its interfaces")
    present = [record(0, "n1", interface_settings={"FI_TCP_IFACE": "eth0"}, interfaces={"net": ["eth0"], "ib": []})]
    check = sitecheck_interconnect.interfaces_check(sandbox, present, [1, 3])
    assert check.status == "pass"
    assert check.evidence == "FI_TCP_IFACE=eth0: present on n1; ranks 1, 3 ended before recording their interfaces"
    nobody = sitecheck_interconnect.interfaces_check(sandbox, [], [0, 1])
    assert nobody.status == "skip" and nobody.evidence == "no rank got as far as recording its interfaces"


def test_reported_lines_keep_what_the_mpi_said_about_its_transport() -> None:
    from hpcvod.runtime.sitecheck import reported_lines

    text = ("provider: tcp, score = 4, pref = 0, FI_SOCKADDR_IN [16] 10.251.0.1\n"
            f"==== Capability set configuration ====\n{OFI_TCP}\n{OFI_TCP}\n"
            f"[1795516190.124655] [vm:5730 :0]      ucp_worker.c:1912 UCX  INFO    {UCX_INTRA}\n"
            f"[vm:06348] {BTL_TCP}\n[0] MPI startup(): libfabric provider: psm3\n")
    assert reported_lines(text) == [OFI_TCP, UCX_INTRA, BTL_TCP, "libfabric provider: psm3"]


# NCCL's own INFO lines, as NCCL 2.4 to 2.19 print them in public logs (NVIDIA/nccl issues 676, 1357, 1412; nccl-tests
# 182, 185): the network it took, and for IB each card's link layer
NCCL_IB = ["dgx1:91:120 [0] NCCL INFO NET/Socket : Using [0]ib0:192.168.11.1<0>",
           "dgx1:91:120 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB ibs65:10.10.10.101<0>",
           "dgx1:91:120 [0] NCCL INFO Using network IB"]
NCCL_ROCE = ["h100-4:460770:460842 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB "
             "enp220s0np0:11.1.128.136<0>", "h100-4:460770:460842 [0] NCCL INFO Using network IB"]
NCCL_SOCKET = ["gpu01:35:35 [0] NCCL INFO NET/IB : No device found.",
               "gpu01:35:35 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>",
               "gpu01:35:35 [0] NCCL INFO Using network Socket"]
NCCL_PLUGIN = ["q19:49355:49414 [1] NCCL INFO Using network IBext"]


@pytest.mark.parametrize("lines, network", [(NCCL_IB, "infiniband"), (NCCL_ROCE, "roce"), (NCCL_SOCKET, "tcp"),
                                            (NCCL_PLUGIN, "rdma"), ([], None)])
def test_nccl_network_read_from_its_info_lines(lines, network) -> None:
    from hpcvod.runtime.sitecheck import NCCL_PATTERNS, reported_lines

    kept = reported_lines("\n".join(["NCCL INFO cudaDriverVersion 12030", *lines, "unrelated"]), NCCL_PATTERNS)
    assert kept == [line[line.index("NCCL INFO"):] for line in lines]
    assert sitecheck_interconnect.nccl_network(kept)[0] == network


def gpu_ranks(nccl_lines, backend="nccl", device_buffers=True, why=""):
    gpu = {"device_buffers": device_buffers, "backend": backend, "why": why, "nccl_reported": nccl_lines}
    return [record(r, "n1" if r < 2 else "n2", gpu=gpu if r == 0 else {"nccl_reported": []},
                   transport={"settings": {}, "device": None, "reported": []}) for r in range(4)]


def test_nccl_network_is_judged_against_the_profiles_interconnect(sandbox) -> None:
    gpus = sitecheck_model.Request(nodes=2, tasks_per_node=2, gpus_per_node=2)

    def nccl(site, ranks, request=gpus):
        checks = sitecheck_interconnect.interconnect_checks(site, request, ranks)
        return next(c for c in checks if c.name == "interconnect.nccl")
    ib, roce = infiniband(sandbox), dataclasses_replace_kind(sandbox, "roce")
    assert nccl(ib, gpu_ranks(NCCL_IB)).status == "pass"
    failed = nccl(ib, gpu_ranks(NCCL_SOCKET))
    assert failed.status == "fail" and "says infiniband but NCCL uses its TCP sockets" in failed.evidence
    assert "Using network Socket" in failed.evidence
    assert nccl(roce, gpu_ranks(NCCL_ROCE)).status == "pass"
    assert nccl(roce, gpu_ranks(NCCL_IB)).status == "warn"            # IB link layer where RoCE was declared
    assert nccl(sandbox, gpu_ranks(NCCL_SOCKET)).status == "pass"      # ethernet: sockets are what it promised
    assert nccl(ib, gpu_ranks([])).status == "warn"                    # NCCL said nothing
    staged = nccl(ib, gpu_ranks([], backend="mpi", why="ranks 0 and 1 share GPU 0000:01:00.0 on n1"))
    assert staged.status == "warn" and "share GPU" in staged.evidence
    no_gpu = nccl(ib, gpu_ranks([], device_buffers=False, why="rank 2: CuPy sees no GPU"))
    assert no_gpu.status == "fail" and "rank 2: CuPy sees no GPU" in no_gpu.evidence
    one_node = nccl(ib, gpu_ranks(NCCL_SOCKET), sitecheck_model.Request(nodes=1, tasks_per_node=2, gpus_per_node=2))
    assert one_node.status == "pass" and "one node" in one_node.evidence
    assert nccl(ib, gpu_ranks(NCCL_IB), sitecheck_model.Request(nodes=2, tasks_per_node=2)).status == "skip"


def dataclasses_replace_kind(site, kind):
    import dataclasses

    return dataclasses.replace(site, profile=dataclasses.replace(
        site.profile, interconnect=dataclasses.replace(site.profile.interconnect, kind=kind, gid_index=None)))
