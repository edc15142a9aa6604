"""Runtime settings are finite and bounded, read through one helper (hpcvod/runtime/config.py): a bad value is
one HpcvodConfigError line on every rank at hvd.init(), never a dead engine thread, a silent deadline or a size
check quietly switched off."""

from __future__ import annotations

import math

import pytest

from hpcvod.runtime import config
from hpcvod.runtime.config import Settings
from hpcvod.runtime.errors import HpcvodConfigError
from hpcvod.runtime.gpu import pin_enabled
from hpcvod.runtime.mpi_flavour import check_mpi_flavour
from hpcvod.runtime.world import check_world_size, launcher_promises

from conftest import MpiFlavour

NUMBERS = ("FUSION_THRESHOLD", "CYCLE_TIME", "CACHE_CAPACITY", "STALL_CHECK_TIME_SECONDS",
           "STALL_SHUTDOWN_TIME_SECONDS", "HEARTBEAT_TIMEOUT_SECONDS", "INIT_TIMEOUT")


@pytest.mark.parametrize("name", sorted(NUMBERS))
@pytest.mark.parametrize("value", ["inf", "-inf", "Infinity", "nan", "NaN", "1e400", "1e30", "-1", "9" * 5000])
def test_every_numeric_setting_refuses_non_finite_and_out_of_range_values(name: str, value: str) -> None:
    with pytest.raises(HpcvodConfigError) as err:
        Settings.from_env({f"HPCVOD_{name}": value})
    line = str(err.value)
    assert line.startswith(f"HPCVOD_{name}=") and ": expected " in line and "at most" in line, line
    assert "\n" not in line and len(line) < 300, line   # one line, a huge value shown cut


@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_the_bounds_themselves_are_accepted(name: str) -> None:
    setting = next(v for v in vars(config).values() if isinstance(v, config.Setting) and v.name == name)
    spec = setting.bounds
    for value in (spec.low, spec.high):
        text = str(int(value)) if float(value).is_integer() else repr(value)
        assert Settings.from_env({f"HOROVOD_{name}": text}) is not None


def test_cycle_and_init_timeouts_keep_working_values() -> None:
    s = Settings.from_env({"HPCVOD_CYCLE_TIME": "2.5", "HPCVOD_INIT_TIMEOUT": "0", "HPCVOD_FUSION_THRESHOLD": "1e6",
                           "HPCVOD_CACHE_CAPACITY": "16"})
    assert (s.cycle_time_ms, s.init_timeout_seconds, s.fusion_threshold, s.cache_capacity) == (2.5, 0.0, 10**6, 16)
    assert all(math.isfinite(v) for v in (s.cycle_time_ms, s.init_timeout_seconds))


@pytest.mark.parametrize("value", ["abc", "0", "-2", "2.5", "inf", "nan", "1e30"])
def test_world_size_of_the_job_script_is_checked_not_ignored(value: str) -> None:
    with pytest.raises(HpcvodConfigError, match=rf"^HPCVOD_WORLD_SIZE='{value}': expected a whole number of ranks"):
        launcher_promises({"HPCVOD_WORLD_SIZE": value})
    with pytest.raises(HpcvodConfigError):
        check_world_size(2, "MPICH Version: 5.0.2", {"HPCVOD_WORLD_SIZE": value})


def test_blank_world_size_and_flavour_are_no_promise() -> None:
    assert launcher_promises({"HPCVOD_WORLD_SIZE": " "}) == []
    check_mpi_flavour("MPICH Version: 5.0.2", {"HPCVOD_MPI_FLAVOUR": ""})


def test_flavour_and_pin_gpu_go_through_the_same_helper() -> None:
    with pytest.raises(HpcvodConfigError, match=r"^HPCVOD_MPI_FLAVOUR='\$\(id\)': expected one of openmpi, "):
        check_mpi_flavour("MPICH Version: 5.0.2", {"HPCVOD_MPI_FLAVOUR": "$(id)"})
    with pytest.raises(HpcvodConfigError, match=r"^HOROVOD_PIN_GPU='maybe': expected 0 or 1"):
        pin_enabled({"HOROVOD_PIN_GPU": "maybe"})
    with pytest.raises(HpcvodConfigError, match=r"^HPCVOD_PIN_GPU="):
        Settings.from_env({"HPCVOD_PIN_GPU": "2"})
    assert pin_enabled({}) and not pin_enabled({"HPCVOD_PIN_GPU": "off"})


@pytest.mark.mpi
@pytest.mark.timeout(180)
@pytest.mark.parametrize("variable, value", [("HPCVOD_CYCLE_TIME", "inf"), ("HPCVOD_INIT_TIMEOUT", "inf"),
                                             ("HPCVOD_WORLD_SIZE", "abc")])
def test_a_bad_setting_is_one_line_on_every_rank(mpich: MpiFlavour, variable: str, value: str) -> None:
    ranks = mpich.run(2, "w_setting_bounds.py", env={variable: value}, timeout=60)
    assert ranks.returncode != 0, ranks.explain()
    for rank in (0, 1):
        lines = [line for line in ranks.stdout.splitlines() if line.startswith(f"rank {rank} refused: ")]
        assert len(lines) == 1 and f"{variable}='{value}': expected " in lines[0], ranks.explain()
    assert "passed init()" not in ranks.stdout and "Traceback" not in ranks.stderr, ranks.explain()
