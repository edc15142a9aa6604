"""Every collective, op and dtype against NumPy on 2 and 4 real ranks, under every MPI flavour."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcvod.jobs.timeline_summary import Tally, read_events, spans_of

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]


def timeline_rows(path: Path) -> dict[str, list[dict]]:
    """tensor row (Horovod's name: ``allreduce.<name>``) -> its spans' names and args, B/E pairs matched by the
    reader of ``hpcvod timeline summary``."""
    rows: dict[str, list[dict]] = {}
    for span in spans_of(str(path), read_events(str(path), 1 << 30, []), Tally()):
        rows.setdefault(span.tensor, []).append({"name": span.name, "args": span.args})
    return rows


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_collective_matches_numpy(mpi, ranks: int, tmp_path: Path) -> None:
    timeline = tmp_path / "timeline.json"
    api_timeline = tmp_path / "api-timeline.json"
    run = mpi.run(ranks, "w_collectives.py", str(api_timeline), env={"HPCVOD_TIMELINE": str(timeline)})
    assert run.returncode == 0, run.explain()
    assert f"ALL OK" in run.stdout and f"on {ranks} ranks" in run.stdout, run.explain()

    rows = timeline_rows(timeline)
    # one row per tensor, with the phases of its life
    for name in ("allreduce.order.0", "allreduce.order.3", "allgather.order.1", "broadcast.order.2",
                 "allreduce.grp.0", "allreduce.ar.float32.Sum"):
        assert name in rows, f"no timeline row for {name}; rows: {sorted(rows)[:20]}"
    phases = {e["name"] for e in rows["allreduce.order.0"]}
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "MPI_ALLREDUCE"} <= phases, phases
    assert "MPI_ALLGATHERV" in {e["name"] for e in rows["allgather.order.1"]}
    assert "MPI_BCAST" in {e["name"] for e in rows["broadcast.order.2"]}
    # grouped_allreduce submits its six tensors together: they are fused into one buffer
    fused = [e for e in rows["allreduce.grp.0"] if e["name"] == "MEMCPY_IN_FUSION_BUFFER"]
    assert fused and fused[0]["args"]["fused"] == 6, rows["allreduce.grp.0"]
    assert any(e["name"] == "MEMCPY_OUT_FUSION_BUFFER" for e in rows["allreduce.grp.0"])
    # start_timeline() replaced the HPCVOD_TIMELINE one (completing it) and stop_timeline() completed its own
    api_rows = timeline_rows(api_timeline)
    assert set(api_rows) == {"allreduce.timeline.api.tensor"}, sorted(api_rows)


def test_without_fusion_and_without_the_response_cache(mpi, tmp_path: Path) -> None:
    check_without_fusion(mpi, 2, tmp_path)


def test_without_fusion_and_cache_on_four_ranks(mpich, tmp_path: Path) -> None:
    check_without_fusion(mpich, 4, tmp_path)     # once (MPICH): keeps the suite short


def check_without_fusion(mpi, ranks: int, tmp_path: Path) -> None:
    timeline = tmp_path / "timeline.json"
    run = mpi.run(ranks, "w_collectives.py",
                  env={"HPCVOD_FUSION_THRESHOLD": "0", "HPCVOD_CACHE_CAPACITY": "0", "HPCVOD_TIMELINE": str(timeline)})
    assert run.returncode == 0, run.explain()
    assert "ALL OK" in run.stdout and "fusion threshold 0, cache 0" in run.stdout, run.explain()
    rows = timeline_rows(timeline)
    assert not any(e["name"] == "MEMCPY_IN_FUSION_BUFFER" for events in rows.values() for e in events), \
        "fusion happened with HPCVOD_FUSION_THRESHOLD=0"


def test_tiny_fusion_threshold_and_cache_evictions(mpich) -> None:
    """A 100-byte fusion buffer and a 3-entry cache: constant eviction and re-negotiation, same results."""
    run = mpich.run(3, "w_collectives.py", env={"HOROVOD_FUSION_THRESHOLD": "100", "HOROVOD_CACHE_CAPACITY": "3"})
    assert run.returncode == 0, run.explain()
    assert "ALL OK" in run.stdout and "on 3 ranks" in run.stdout, run.explain()


def test_hierarchical_allreduce_algorithm_equals_flat(mpi) -> None:
    """Four ranks split into two "nodes" two ways: node-local reduce-scatter, cross allreduce, local allgather."""
    run = mpi.run(4, "w_hierarchical.py", timeout=120)
    assert run.returncode == 0, run.explain()
    assert "HIERARCHICAL OK 224" in run.stdout, run.explain()

