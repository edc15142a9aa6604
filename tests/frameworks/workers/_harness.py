"""Runs named checks inside an MPI worker and reports every rank's outcome to one JSON file.

A check is a function that raises (usually AssertionError) when something is wrong and may return a short detail
string. Checks must issue the same collectives on every rank (assert after communicating), so that one rank's
failure does not leave the others waiting.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import hpcvod.runtime as rt

# A hung worker prints every thread's stack and exits before the test's own timeout kills it silently.
if os.environ.get("HPCVOD_TEST_WORKER_TIMEOUT"):
    faulthandler.dump_traceback_later(float(os.environ["HPCVOD_TEST_WORKER_TIMEOUT"]), exit=True)


class Checks:
    def __init__(self) -> None:
        self.results: dict[str, dict] = {}

    def __call__(self, fn: Callable[[], object]) -> Callable[[], object]:
        """Decorator: runs ``fn`` now, under its own name."""
        start = time.perf_counter()
        try:
            detail = fn()
            outcome = {"ok": True, "detail": "" if detail is None else str(detail)}
        except Exception:  # noqa: BLE001 - reported, not swallowed
            outcome = {"ok": False, "detail": traceback.format_exc(limit=6)}
            # Printed at once: if the other ranks now wait in a collective this rank skipped, the log says why.
            rank = rt.rank() if rt.is_initialized() else "?"   # checks may run after hvd.shutdown()
            print(f"[rank {rank}] check {fn.__name__} FAILED:\n{outcome['detail']}", file=sys.stderr, flush=True)
        outcome["seconds"] = round(time.perf_counter() - start, 3)
        self.results[fn.__name__] = outcome
        return fn

    def expect_raises(self, case: str, expected: type, misuse: Callable[[], object]) -> None:
        """Runs check ``case``: ``misuse()`` must raise an ``expected`` (the type Horovod raises for that misuse)."""
        def body() -> str:
            try:
                misuse()
            except Exception as exc:  # noqa: BLE001 - the type is what is checked
                assert isinstance(exc, expected), \
                    f"raised {type(exc).__name__} ({exc}); Horovod raises {expected.__name__}"
                return f"{type(exc).__name__}: {str(exc)[:200]}"
            raise AssertionError(f"did not raise; Horovod raises {expected.__name__}")
        body.__name__ = case
        self(body)

    def expect_set_and_shutdown_misuses(self, hvd: Any, collectives: dict[str, Callable[..., object]],
                                        expected: Callable[[str, str], type],
                                        without_this_rank: bool = True) -> None:
        """The misuses every framework shares, for each collective ``collectives[c](process_set=...)``: a registered
        set without this rank (``without_this_rank``; rank 0, its member, passes), a set never registered, a call
        after ``hvd.shutdown()`` (then ``hvd.init()`` again). ``expected(collective, kind)`` is Horovod's type,
        kind one of "without_this_rank", "unregistered", "after_shutdown"."""
        if without_this_rank:
            only_rank_0 = hvd.add_process_set([0])
            for c, call in collectives.items():
                case = f"{c}_on_a_set_without_this_rank"
                if hvd.rank() == 0:
                    self.results[case] = {"ok": True, "detail": "rank 0 is a member"}
                else:
                    self.expect_raises(case, expected(c, "without_this_rank"),
                                       lambda call=call: call(process_set=only_rank_0))
            hvd.remove_process_set(only_rank_0)
        unregistered = hvd.ProcessSet([0])
        for c, call in collectives.items():
            self.expect_raises(f"{c}_on_an_unregistered_process_set", expected(c, "unregistered"),
                               lambda call=call: call(process_set=unregistered))
        hvd.shutdown()
        for c, call in collectives.items():
            self.expect_raises(f"{c}_after_shutdown", expected(c, "after_shutdown"), call)
        hvd.init()

    def report(self, path: str) -> None:
        everyone = rt.allgather_object(self.results)
        if rt.rank() == 0:
            merged = {name: [ranks[name] for ranks in everyone] for name in everyone[0]}
            with open(path, "w") as f:
                json.dump({"size": rt.size(), "checks": merged}, f, indent=1)


def output_path() -> str:
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} RESULTS.json")
    return sys.argv[1]
