"""Property-based: non-finite and out-of-range numbers in settings (issue 23). Whatever text a job script, a
user's shell or `hpcvod run`'s options put in a setting:

  - the runtime's one parsing helper (hpcvod/runtime/config.py) returns a finite value inside the setting's
    bounds, or raises one HpcvodConfigError line naming the variable and what was expected; nothing else;
  - `hpcvod run` refuses in one line exactly the option values the runtime would refuse on every rank, and
    what it passes on, the runtime accepts;
  - JSON read from files others hand us (hpcvod/safe_read.py: checkpoint metadata, the data service config)
    loads to finite numbers only, or is refused with a reason, never RecursionError or OverflowError.

Examples are derandomized and few, so the file runs the same everywhere in seconds.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hpcvod.cli import build_parser
from hpcvod.cli.run import runtime_settings
from hpcvod.runtime import config
from hpcvod.runtime.checkpoint import CheckpointUnreadable, read_archive
from hpcvod.runtime.config import Settings
from hpcvod.runtime.errors import HpcvodConfigError
from hpcvod.support.safe_read import Refused, load_json
from hpcvod.support.errors import UserError

SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
NUMERIC = [v for v in vars(config).values() if isinstance(v, config.Setting) and v.bounds is not None]

# every spelling of a non-finite number that Python's float() (or a careless int(float())) accepts, and the
# finite ones that overflow to infinity
NON_FINITE = st.builds(
    lambda sign, word, pad: f"{pad}{sign}{word}{pad}",
    st.sampled_from(["", "+", "-"]),
    st.one_of(st.sampled_from(["inf", "INF", "Inf", "infinity", "Infinity", "iNfInItY", "nan", "NaN", "NAN",
                               "1e400", "1e309", "9" * 400, "1_0e400"]),
              st.integers(309, 10**6).map(lambda e: f"1e{e}")),
    st.sampled_from(["", " ", "\t"]))
NUMBERS = st.one_of(NON_FINITE, st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.integers(-10**40, 10**40).map(str), st.floats(0, 10**7).map(lambda f: f"{f:g}"))


@settings(max_examples=300, **SETTINGS)
@given(setting=st.sampled_from(NUMERIC), text=NUMBERS, horovod=st.booleans())
@example(setting=config.CYCLE_TIME, text="inf", horovod=False)
@example(setting=config.INIT_TIMEOUT, text="inf", horovod=True)
@example(setting=config.WORLD_SIZE, text="nan", horovod=False)
def test_a_numeric_setting_is_finite_and_bounded_or_one_line(setting, text, horovod) -> None:
    var = ("HOROVOD_" if horovod and setting.horovod else "HPCVOD_") + setting.name
    try:
        value = setting.read(None, {var: text})
    except HpcvodConfigError as err:
        line = str(err)
        assert line.startswith(f"{var}=") and ": expected " in line and "\n" not in line and len(line) < 300, line
        return
    bounds = setting.bounds
    assert math.isfinite(value) and bounds.low <= value <= bounds.high, (text, value)
    assert not bounds.whole or isinstance(value, int), (text, value)


@settings(max_examples=100, **SETTINGS)
@given(text=NON_FINITE, name=st.sampled_from([s.name for s in NUMERIC if s.horovod]))
def test_no_non_finite_spelling_reaches_the_engine(text, name) -> None:
    try:
        Settings.from_env({f"HPCVOD_{name}": text})
    except HpcvodConfigError:
        return
    raise AssertionError(f"HPCVOD_{name}={text!r} was accepted")


RUN_OPTIONS = {"fusion_threshold_mb": config.FUSION_THRESHOLD, "cycle_time_ms": config.CYCLE_TIME,
               "cache_capacity": config.CACHE_CAPACITY, "stall_check_warning_time_seconds": config.STALL_CHECK_TIME,
               "stall_check_shutdown_time_seconds": config.STALL_SHUTDOWN_TIME, "start_timeout": config.INIT_TIMEOUT}
FLOAT_OPTIONS = ("fusion_threshold_mb", "cycle_time_ms")   # type=float in the CLI; the others are type=int


@settings(max_examples=200, **SETTINGS)
@given(option=st.sampled_from(sorted(RUN_OPTIONS)), text=NUMBERS)
@example(option="fusion_threshold_mb", text="inf")
@example(option="fusion_threshold_mb", text="nan")
@example(option="cycle_time_ms", text="1e400")
@example(option="cache_capacity", text="9" * 400)   # its error line once overflowed float() (found by this test)
def test_hpcvod_run_passes_on_only_what_the_runtime_accepts(option, text) -> None:
    try:   # what argparse's type= makes of the text; a value it refuses never reaches runtime_settings
        value = float(text) if option in FLOAT_OPTIONS else int(text)
    except ValueError:
        return
    args = build_parser().parse_args(["run", "-np", "1"])   # every other option at its default
    setattr(args, option, value)
    try:
        env = runtime_settings(args)
    except UserError as err:
        assert "\n" not in str(err) and str(err).startswith(f"--{option.replace('_', '-')} "), str(err)
        finite = isinstance(value, int) or math.isfinite(value)   # (a huge int overflows math.isfinite)
        assert not finite or not _inside(RUN_OPTIONS[option], value, option), (option, value)
        return
    Settings.from_env(env)   # the ranks accept every value hpcvod run passed on


def _inside(setting: config.Setting, value: float, option: str) -> bool:
    scale = 1024 * 1024 if option == "fusion_threshold_mb" else 1
    return setting.bounds.low <= value * scale <= setting.bounds.high


JSON_NUMBERS = st.one_of(NON_FINITE.map(str.strip), st.integers(-10**30, 10**30).map(str),
                         st.floats(allow_nan=False, allow_infinity=False).map(repr))


@st.composite
def json_texts(draw) -> str:
    """JSON-like text: objects and lists nested to a drawn depth, holding numbers spelled any way."""
    depth = draw(st.integers(0, 12))
    leaf = draw(st.one_of(JSON_NUMBERS, st.just('"x"'), st.just("null")))
    for _ in range(depth):
        leaf = draw(st.sampled_from(["[{}]", '{{"k": {}}}', "[1, {}]"])).format(leaf)
    return leaf


@settings(max_examples=300, **SETTINGS)
@given(text=json_texts(), limit=st.integers(1, 10))
@example(text="[" * 100000 + "]" * 100000, limit=8)
@example(text='{"a": Infinity}', limit=8)
@example(text='{"a": -1e400}', limit=8)
def test_json_from_others_is_finite_and_shallow_or_refused(text, limit) -> None:
    try:
        value = load_json(text, limit)
    except Refused as err:
        assert str(err) and "\n" not in str(err)
        return
    assert _depth(value) <= limit
    assert all(math.isfinite(n) for n in _numbers(value)), text
    assert json.loads(json.dumps(value)) == value   # plain JSON again: it round-trips


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _numbers(value):
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            yield from _numbers(item)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=False), st.text(max_size=8),
              st.sampled_from(["a0", "inf", "nan", "__hpcvod_checkpoint__"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(
        st.sampled_from(["format", "step", "entries", "path", "array", "float", "value", "x"]), inner, max_size=4)),
    max_leaves=12)
METADATA = st.one_of(
    JSON_VALUES.map(json.dumps),
    st.fixed_dictionaries({"format": st.one_of(st.just(1), JSON_VALUES), "step": st.one_of(st.just(3), JSON_VALUES),
                           "entries": st.one_of(st.lists(st.one_of(JSON_VALUES, st.fixed_dictionaries(
                               {"path": st.one_of(st.lists(st.sampled_from(["w", "step"]), max_size=2), JSON_VALUES),
                                "value": JSON_VALUES})), max_size=3), JSON_VALUES)}).map(json.dumps),
    json_texts())


@settings(max_examples=200, **SETTINGS)
@given(meta=METADATA)
@example(meta="[" * 100000 + "]" * 100000)
@example(meta='{"format": 1, "step": 1e400, "entries": []}')
def test_checkpoint_metadata_of_any_shape_is_read_or_unreadable(meta) -> None:
    """read_archive on any metadata: the state, or CheckpointUnreadable (which restore() skips), nothing else."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ckpt-000000000003.npz"
        with open(path, "wb") as f:
            np.savez(f, __hpcvod_checkpoint__=np.array(meta), a0=np.ones(2))
        try:
            state, step = read_archive(path)
        except CheckpointUnreadable as err:
            assert "\n" not in err.reason and str(path) in str(err)
            return
        assert isinstance(state, dict) and isinstance(step, int) and step >= 0
