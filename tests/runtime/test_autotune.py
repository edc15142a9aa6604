"""Autotune (HOROVOD_AUTOTUNE=1, hpcvod/runtime/autotune.py): the search, and real ranks that agree on every
trial, log them as Horovod does and settle on the best."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from hpcvod.runtime.autotune import CSV_HEADER, MARGIN, MIB, Autotuner, Params, Search
from hpcvod.runtime.config import Settings

from conftest import MpiFlavour

START = Params(128 * MIB, 0.0, True, False)
FIELDS = ("fusion_threshold", "cycle_time_ms", "cache_enabled", "hierarchical_allreduce")   # w_autotune.py's order


def test_the_search_tries_one_knob_at_a_time_and_keeps_the_best_of_each() -> None:
    search = Search(START, (), multi_node=False)
    tried = [START]
    # fusion scores: 4 MiB is best; cycle scores: 2.5 ms is best; the cache off is worse
    score = {128: 1.0, 64: 2.0, 16: 3.0, 4: 5.0, 1: 4.0, 0: 0.5}
    current, proposal = START, None
    while True:
        fusion = score[current.fusion_threshold // MIB]
        cycle = {0.0: 0.0, 1.0: 1.0, 2.5: 2.0, 5.0: 0.5, 10.0: -1.0}[current.cycle_time_ms]
        proposal = search.next(current, fusion + cycle - (0 if current.cache_enabled else 9))
        if proposal is None:
            break
        tried.append(proposal)
        current = proposal
    assert [p.fusion_threshold // MIB for p in tried[:6]] == [128, 64, 16, 4, 1, 0]
    assert {p.fusion_threshold for p in tried[6:]} == {4 * MIB}          # the best threshold kept
    assert [p.cycle_time_ms for p in tried[6:10]] == [1.0, 2.5, 5.0, 10.0]   # 0 ms measured already
    assert tried[-1] == Params(4 * MIB, 2.5, False, False)                  # the cache tried last
    assert all(not p.hierarchical_allreduce for p in tried)              # one node: never tried
    assert search.best == Params(4 * MIB, 2.5, True, False)
    assert len(set(tried)) == len(tried)                                 # nothing measured twice


def test_a_setting_must_beat_the_best_by_the_margin_to_replace_it() -> None:
    search = Search(START, (), multi_node=False)
    proposal = search.next(START, 100.0)
    assert search.next(proposal, 104.0) is not None and search.best == START      # 4% better: noise
    search.next(Params(16 * MIB, 0.0, True, False), 106.0)
    assert search.best == Params(16 * MIB, 0.0, True, False)


def test_knobs_the_job_set_stay_fixed_and_hierarchical_is_tried_on_several_nodes() -> None:
    search = Search(START, ("fusion_threshold", "cache_enabled"), multi_node=True)
    assert [name for name, _ in search.stages] == ["cycle_time_ms", "hierarchical_allreduce"]
    settings = Settings.from_env({"HOROVOD_AUTOTUNE": "1", "HOROVOD_FUSION_THRESHOLD": "1048576",
                                  "HPCVOD_CYCLE_TIME": "2"})
    assert settings.autotune and settings.autotune_fixed == ("fusion_threshold", "cycle_time_ms")


class _Tensor:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class _Req:
    dummy = False

    def __init__(self, key: str) -> None:
        self.key = key
        self.tensor = _Tensor(1000)


def test_a_trial_is_decided_after_the_warmup_and_the_samples_and_logged(tmp_path: Path) -> None:
    log = (tmp_path / "log.csv").open("w")
    tuner = Autotuner(START, Search(START, (), False), warmup_samples=2, steps_per_sample=3, log=log)
    steps = [[_Req("a"), _Req("b")] for _ in range(100)]
    decided_at = None
    for i, step in enumerate(steps):
        if tuner.record(step):
            decided_at = i
            break
    # a sample ends on the step where a name comes round for the 4th time (3 steps per sample): samples end at
    # steps 3, 6, 9, ...; 2 warmup samples, then 3 counted ones: the 5th sample ends at step 15
    assert decided_at == 15
    assert tuner.pending == Params(64 * MIB, 0.0, True, False) and not tuner.final
    assert tuner.record(steps[0]) is False          # nothing more is decided until every rank applied it
    tuner.close()
    rows = (tmp_path / "log.csv").read_text().splitlines()
    assert len(rows) == 1 and rows[0].startswith("0,0,0,1,0,128,")


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_every_rank_applies_the_same_trials_the_log_has_horovods_columns_and_it_settles_on_the_best(
        mpich: MpiFlavour, tmp_path: Path) -> None:
    log = tmp_path / "autotune.csv"
    env = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(log), "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
           "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2"}
    ranks = mpich.run(2, "w_autotune.py", "150", env=env, timeout=200)
    assert ranks.returncode == 0, ranks.explain()
    said = {r["rank"]: r for r in (json.loads(line[len("TUNED "):]) for line in ranks.stdout.splitlines()
                                   if line.startswith("TUNED "))}
    assert sorted(said) == [0, 1], ranks.explain()
    tuned = [dict(zip(FIELDS, setting)) for setting in said[0]["tuned"]]
    assert tuned and said[1]["tuned"] == said[0]["tuned"], ranks.explain()     # the same trials, in the same order
    assert said[0]["settled"], ranks.explain()
    with log.open() as f:
        rows = list(csv.reader(f))
    assert ",".join(rows[0]) == CSV_HEADER
    trials = rows[1:]
    assert len(trials) == len(tuned) and all(len(row) == 7 for row in trials)
    # each logged trial is the setting applied before it (the first: the defaults)
    applied = [{"fusion_threshold": 128 * MIB, "cycle_time_ms": 0.0, "cache_enabled": True,
                "hierarchical_allreduce": False}] + tuned[:-1]
    for row, setting in zip(trials, applied):
        assert [int(row[0]), int(row[3]), float(row[4]), float(row[5])] == [
            int(setting["hierarchical_allreduce"]), int(setting["cache_enabled"]), setting["cycle_time_ms"],
            setting["fusion_threshold"] / MIB], (row, setting)
    # settled on a measured trial that no other beat by more than the margin (autotune.MARGIN: noise)
    settled = applied.index(tuned[-1])
    assert max(float(row[6]) for row in trials) <= float(trials[settled][6]) * (1 + MARGIN) * (1 + 1e-5)
    assert oct(log.stat().st_mode & 0o777) == "0o600"


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_a_log_that_cannot_be_written_is_one_line_on_every_rank(mpich: MpiFlavour, tmp_path: Path) -> None:
    path = tmp_path / "missing" / "autotune.csv"
    ranks = mpich.run(2, "w_setting_bounds.py", env={"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(path)},
                      timeout=90)
    assert ranks.returncode != 0, ranks.explain()
    for rank in (0, 1):
        lines = [line for line in ranks.stdout.splitlines() if line.startswith(f"rank {rank} refused: ")]
        assert lines == [f"rank {rank} refused: HOROVOD_AUTOTUNE_LOG={str(path)!r}: cannot write the autotune log "
                         f"there: No such file or directory (expected a writable file path)"], ranks.explain()
    assert "Traceback" not in ranks.stderr, ranks.explain()
    assert not path.parent.exists()


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_a_large_tensor_is_reduced_alone_not_packed_with_the_small_ones(mpich: MpiFlavour, tmp_path: Path) -> None:
    """executors.ALONE_BYTES: a 1 MiB tensor between two small ones of one grouped allreduce gets its own MPI
    call on its own buffer (packing it would copy it into the fusion buffer and back); the small ones fuse."""
    timeline = tmp_path / "tl.json"
    ranks = mpich.run_single("w_fusion_alone.py", env={"HPCVOD_TIMELINE": str(timeline), "HPCVOD_WATCHDOG": "0"})
    assert ranks.returncode == 0, ranks.explain()
    events = json.loads(timeline.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    calls = sorted((e["args"] for e in events if e.get("name") == "MPI_ALLREDUCE" and e.get("ph") == "B"),
                   key=lambda args: args["bytes"])
    assert calls == [{"fused": 2, "bytes": 2048}, {"fused": 2, "bytes": 2048}, {"bytes": 1 << 20}], calls


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_knobs_the_job_set_are_never_changed_on_real_ranks(mpich: MpiFlavour) -> None:
    env = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2",
           "HOROVOD_FUSION_THRESHOLD": str(2 * MIB), "HPCVOD_CACHE_CAPACITY": "512"}
    ranks = mpich.run(2, "w_autotune.py", "120", env=env, timeout=200)
    assert ranks.returncode == 0, ranks.explain()
    said = [json.loads(line[len("TUNED "):]) for line in ranks.stdout.splitlines() if line.startswith("TUNED ")]
    assert len(said) == 2 and said[0]["tuned"] == said[1]["tuned"] and said[0]["settled"], ranks.explain()
    tuned = [dict(zip(FIELDS, setting)) for setting in said[0]["tuned"]]
    assert len(tuned) == 5, tuned            # the cycle time's 5 candidates, the last one the setting it settled on
    assert all(s["fusion_threshold"] == 2 * MIB and s["cache_enabled"] for s in tuned), tuned
