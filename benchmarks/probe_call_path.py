"""Where the time of one blocking in-place allreduce goes: the call path built up one piece at a time.

    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/probe_call_path.py [--kib 1024] [--rounds 12] [--calls 300]

Each arm is timed in interleaved rounds of ``--calls`` calls (the slowest rank's view, medians), all on the same
2 MiB-aligned float32 array and op=Sum:

  raw             ``comm.Allreduce(IN_PLACE, a)``
  +negotiation    an 8-byte ``Iallreduce`` (BOR) polled with ``Test`` first: hpcvod's negotiation, by hand
  handle+neg      hpcvod builds the request (``reduction._allreduce_handle``), then the hand-written pair
  solo+executor   the request negotiated by the engine (``Negotiation.solo``) and run by the host executor
  lane.run        the same through ``Lane.run`` (the name claim, the lane's lock, the driver flag)
  allreduce_      ``hvd.allreduce_(a, op=hvd.Sum, name=...)``, the public call
and, off the chain, +negotiation after ``--spin`` loop iterations of pure-Python work (no NumPy, no memory of
note): what that much CPU alone costs in wall time.

The step from one arm to the next is what that piece costs in wall time; the CPU line says what some pieces
cost on rank 0 alone (on ``COMM_SELF``, where MPI is trivial). This reaches into the runtime's internals on
purpose; it is a measuring tool, not an API.
"""

from __future__ import annotations

import argparse
import statistics
import time

from mpi4py import MPI

import hpcvod.runtime as hvd
from bench_allreduce import buffer   # the same 2 MiB-aligned arrays as the benchmark (run from benchmarks/)
from hpcvod.runtime import reduction


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kib", type=int, default=1024, help="array size in KiB (default 1 MiB)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=300, help="calls per timed round")
    parser.add_argument("--spin", type=int, default=240, help="loop iterations of the +spin arm")
    args = parser.parse_args()

    hvd.init()
    ps = hvd.global_process_set
    lane = ps._lane
    comm = lane.comm                                   # the lane's communicator for every arm
    a = buffer(args.kib * 256)
    word = bytearray(8)
    sum_, in_place, byte, bor = MPI.SUM, MPI.IN_PLACE, MPI.BYTE, MPI.BOR
    host_one = lane.executors.host.allreduce_one
    build = reduction._allreduce_handle

    def negotiate_by_hand() -> None:
        req = comm.Iallreduce(in_place, [word, byte], bor)
        while not req.Test():
            pass

    def spin() -> int:
        x = 0
        for i in range(args.spin):
            x += i
        return x

    def raw() -> None:
        comm.Allreduce(in_place, a, sum_)

    def raw_neg() -> None:
        negotiate_by_hand()
        comm.Allreduce(in_place, a, sum_)

    def raw_neg_spin() -> None:
        spin()
        negotiate_by_hand()
        comm.Allreduce(in_place, a, sum_)

    def handle_neg() -> None:
        build(a, None, "probe.h", hvd.Sum, 1.0, 1.0, ps, True, None)
        negotiate_by_hand()
        comm.Allreduce(in_place, a, sum_)

    def solo_executor() -> None:
        h = build(a, None, "probe.s", hvd.Sum, 1.0, 1.0, ps, True, None)
        h.lane = lane
        if not lane.negotiation.solo(h):
            raise SystemExit("probe: the request was not agreed alone (another request pending?)")
        host_one(h, None)

    def lane_run() -> None:
        lane.run(build(a, None, "probe.l", hvd.Sum, 1.0, 1.0, ps, True, None))

    def public() -> None:
        hvd.allreduce_(a, op=hvd.Sum, name="probe.p")

    chain = ["raw", "+negotiation", "handle+neg", "solo+executor", "lane.run", "allreduce_"]
    arms = dict(zip(chain, (raw, raw_neg, handle_neg, solo_executor, lane_run, public)))
    arms["+negotiation+spin"] = raw_neg_spin
    for name in ("probe.s", "probe.l", "probe.p"):     # in the response cache: every later call is "solo"
        hvd.allreduce_(a, op=hvd.Sum, name=name)
    for fn in arms.values():
        for _ in range(20):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(args.rounds):
        order = list(arms.items()) if r % 2 == 0 else list(reversed(arms.items()))
        for k, fn in order:
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            samples[k].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) / args.calls)
    wall = {k: statistics.median(v) for k, v in samples.items()}

    # CPU of each piece: this rank alone (a one-rank communicator: the MPI calls are trivial there).
    cpu: dict[str, float] = {}
    if comm.Get_rank() == 0:
        solo_comm = MPI.COMM_SELF.Dup()
        t0 = time.thread_time()
        for _ in range(10000):
            spin()
        cpu["spin"] = (time.thread_time() - t0) / 10000
        for k, fn in (("raw", lambda: solo_comm.Allreduce(in_place, a, sum_)),
                      ("handle", lambda: build(a, None, "probe.c", hvd.Sum, 1.0, 1.0, ps, True, None))):
            t0 = time.thread_time()
            for _ in range(10000):
                fn()
            cpu[k] = (time.thread_time() - t0) / 10000
        solo_comm.Free()
        print(f"probe_call_path: {comm.Get_size()} ranks, {args.kib} KiB float32 in place, "
              f"{MPI.Get_library_version().splitlines()[0].strip()}; medians of {args.rounds} rounds x "
              f"{args.calls} calls")
        print(f"CPU on one rank: spin {cpu['spin'] * 1e6:.1f} us, building the request "
              f"{cpu['handle'] * 1e6:.1f} us, raw call on COMM_SELF {cpu['raw'] * 1e6:.1f} us")
        print(f"{'arm':>14s} {'us per call':>12s} {'step':>8s} {'x raw':>7s}")
        prev = None
        for k in chain:
            t = wall[k]
            step = "" if prev is None else f"{(t - prev) * 1e6:+8.1f}"
            print(f"{k:>14s} {t * 1e6:12.1f} {step:>8s} {t / wall['raw']:7.3f}")
            prev = t
        t = wall["+negotiation+spin"]
        print(f"off the chain: +negotiation after {cpu['spin'] * 1e6:.1f} us of pure-Python CPU: {t * 1e6:.1f} us "
              f"({(t - wall['+negotiation']) * 1e6:+.1f} over +negotiation), {t / wall['raw']:.3f}x raw")
    hvd.shutdown()


if __name__ == "__main__":
    main()
