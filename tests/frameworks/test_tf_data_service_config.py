"""TfDataServiceConfig.read validates the config like a site profile (issue 23): a regular file of bounded size
(no FIFO, device or symbolic link), JSON of bounded depth with finite numbers, every key's type, range and choice
checked; each refusal one DataServiceError line naming the file, the key and what was expected."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from frameworks_helpers import require_framework

pytestmark = pytest.mark.frameworks

GOOD = {"dispatchers": 2, "workers_per_dispatcher": 1, "dispatcher_side": "compute",
        "addresses": ["grpc://10.0.0.1:5050", "grpc://n2.cluster:5051"], "rendezvous": "/scratch/job/CONFIG.d",
        "timeout": 60}


@pytest.fixture(scope="module")
def data_service() -> Any:
    require_framework("tensorflow")
    from hpcvod.frameworks.tensorflow import data_service
    return data_service


def _refused(data_service: Any, path: Path) -> str:
    with pytest.raises(data_service.DataServiceError) as err:
        data_service.TfDataServiceConfig.read(str(path))
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{path}: "), line
    return line


def test_a_good_config_round_trips(data_service: Any, tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(GOOD))
    config = data_service.TfDataServiceConfig.read(str(path))
    assert config.to_dict() == GOOD
    config.write(str(path))
    assert data_service.TfDataServiceConfig.read(str(path)) == config
    training = {**GOOD, "dispatcher_side": "training", "addresses": []}
    path.write_text(json.dumps(training))
    assert data_service.TfDataServiceConfig.read(str(path)).to_dict() == training


@pytest.mark.timeout(60)   # a FIFO blocked read() for ever
@pytest.mark.parametrize("kind, expected", [
    ("fifo", "cannot read the data service config: it is a FIFO, expected a regular file"),
    ("symlink", "cannot read the data service config: it is a symbolic link, expected a regular file"),
    ("folder", "it is a folder, expected a regular file"),
    ("huge", "larger than 1048576 bytes"),
    ("missing", "no such file"),
])
def test_only_a_small_regular_file_is_read(data_service: Any, tmp_path: Path, kind: str, expected: str) -> None:
    path = tmp_path / "c.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        (tmp_path / "real.json").write_text(json.dumps(GOOD))
        path.symlink_to(tmp_path / "real.json")
    elif kind == "folder":
        path.mkdir()
    elif kind == "huge":
        with open(path, "wb") as f:   # 2 MiB here; a 2 GiB file was read whole before (the cap is what counts)
            f.truncate(2 << 20)
    assert expected in _refused(data_service, path)


def test_dev_zero_is_refused(data_service: Any) -> None:
    with pytest.raises(data_service.DataServiceError, match=r"^/dev/zero: .*it is a character device"):
        data_service.TfDataServiceConfig.read("/dev/zero")


@pytest.mark.parametrize("text, expected", [
    ("[" * 100000 + "]" * 100000, "JSON nested more than 4 levels deep"),
    ('{"dispatchers": Infinity}', "Infinity is not a finite number"),
    ('{"dispatchers": 1e400}', "1e400 is not a finite number"),
    ('{"timeout": NaN}', "NaN is not a finite number"),
    ("{oops", "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got a JSON list"),
    (b"\xff\xfe{}", "not UTF-8 text"),
])
def test_json_that_is_too_deep_non_finite_or_not_an_object(data_service: Any, tmp_path: Path, text: Any,
                                                          expected: str) -> None:
    path = tmp_path / "c.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert expected in _refused(data_service, path)


@pytest.mark.parametrize("change, expected", [
    ({"addresses": "grpc://evil"}, 'addresses: expected a list of dispatcher addresses like "grpc://10.0.0.1:5050", '
                                   'got "grpc://evil"'),
    ({"addresses": ["grpc://a:1", "grpc://a b:2"]}, "addresses: expected a list of dispatcher addresses"),
    ({"addresses": ["grpc://a:1", "grpc://b:0"]}, "addresses: expected a list of dispatcher addresses"),
    ({"addresses": ["grpc://a:1"]}, "addresses: expected 2 (one per dispatcher on the compute side), got 1"),
    ({"dispatchers": -1}, "dispatchers: expected a whole number of dispatchers from 1 to 1048576, got -1"),
    ({"dispatchers": 2.5}, "dispatchers: expected a whole number"),
    ({"dispatchers": True}, "dispatchers: expected a whole number"),
    ({"workers_per_dispatcher": 0}, "workers_per_dispatcher: expected a whole number of workers from 1"),
    ({"dispatcher_side": "$(id)"}, 'dispatcher_side: expected one of "compute", "training", got "$(id)"'),
    ({"rendezvous": ""}, "rendezvous: expected the path of the CONFIG.d folder"),
    ({"rendezvous": ["/a"]}, "rendezvous: expected the path of the CONFIG.d folder"),
    ({"timeout": -5}, "timeout: expected a whole number of seconds from 1 to 2592000, got -5"),
    ({"timeout": 10 ** 30}, "timeout: expected a whole number of seconds"),
    ({"dispatcher": 1}, 'unknown key "dispatcher" (expected only dispatchers, workers_per_dispatcher'),
    ({"dispatchers": None}, "dispatchers: expected a whole number"),
])
def test_every_key_is_checked_naming_it(data_service: Any, tmp_path: Path, change: dict, expected: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**GOOD, **change}))
    assert expected in _refused(data_service, path)


def test_a_missing_key_is_named(data_service: Any, tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({k: v for k, v in GOOD.items() if k != "rendezvous"}))
    assert _refused(data_service, path) == f"{path}: rendezvous: missing (expected the path of the CONFIG.d folder)"
