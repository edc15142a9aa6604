"""The elastic driver: horovodrun's elastic mode over MPI (``hpcvod run --min-np/--host-discovery-script``,
docs/elastic.md). Interface (also for batch jobs)::

    run_elastic(hosts: HostSource, settings: ElasticSettings, program: list[str],
                start_world: WorldStarter, env: dict[str, str]) -> int   # the job's exit status

``HostSource``: a function returning the hosts usable now, ``[(host, slots), ...]`` (``script_hosts``: a
discovery script as horovodrun runs it; ``fixed_hosts``: a fixed list). ``WorldStarter(hosts, np, env)``: starts
the first world of ``np`` ranks, filling ``hosts``' slots in order, each rank running ``env``'s
``HPCVOD_ELASTIC_COMMAND`` through ``python -m hpcvod.runtime.elastic_start`` (``openmpi_world``: mpirun --with-ft
ulfm), and returns its process.

What it does: waits until the hosts offer ``start_np`` slots (at most ``elastic_timeout``), starts the world, then
runs the discovery every ``discovery_interval`` seconds and tells every rank when hosts were added or removed
(they raise Horovod's ``HostsUpdatedInterrupt`` at the next ``commit()``). At each reset the world's rank 0 asks it
which hosts to use (hpcvod/runtime/elastic_link.py); hosts of ranks that died or failed are blacklisted, for a time
in ``cooldown_range`` if given (horovodrun's --blacklist-cooldown-range), else for good. Fewer slots than
``min_np`` for longer than ``elastic_timeout`` ends the job with one line. The ranks that stay keep their state in
memory; new ranks are spawned by them into the world (MPI_Comm_spawn) and get the state from ``state.sync()``.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, IO

from hpcvod.runtime.elastic_link import RESET_LIMIT_EXCEEDED_MESSAGE
from hpcvod.support.errors import UserError

HostSlots = list[tuple[str, int]]
HostSource = Callable[[], HostSlots]
WorldStarter = Callable[[HostSlots, int, dict[str, str]], subprocess.Popen]

# horovodrun's bounds of --blacklist-cooldown-range (horovod/runner/elastic/discovery.py)
COOLDOWN_LOWEST, COOLDOWN_HIGHEST = 1, 3600
DISCOVERY_TIMEOUT = 60.0   # one run of the discovery script
EXIT_INTERRUPTED = 130     # Ctrl-C
LINK_GRACE_SECONDS = 2.0   # after a world ends: a rank link still open then is of an unreachable host
# horovodrun's default --elastic-timeout
DEFAULT_ELASTIC_TIMEOUT = 600.0
ADDED, REMOVED = 2, 1      # HostUpdateResult's flags (hpcvod/runtime/elastic.py)


@dataclass(frozen=True)
class ElasticSettings:
    min_np: int
    max_np: int | None = None              # None: as many ranks as the hosts have slots
    start_np: int | None = None            # -np: slots needed before the first world starts (default min_np)
    elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT
    reset_limit: int | None = None
    cooldown_range: tuple[int, int] | None = None
    discovery_interval: float = 1.0


def elastic_timeout_from(env: Mapping[str, str]) -> float:
    """``HOROVOD_ELASTIC_TIMEOUT`` (seconds, horovodrun's default for --elastic-timeout), else 600 s."""
    text = env.get("HOROVOD_ELASTIC_TIMEOUT")
    if text is None:
        return DEFAULT_ELASTIC_TIMEOUT
    try:
        return float(text)
    except ValueError:
        raise UserError(f"HOROVOD_ELASTIC_TIMEOUT={text!r}: expected a time in seconds") from None


def check_settings(settings: ElasticSettings) -> None:
    """One line (UserError) for settings horovodrun would refuse or that cannot start a job."""
    if settings.min_np < 1:
        raise UserError(f"--min-np {settings.min_np}: expected a number of ranks from 1")
    if settings.max_np is not None and settings.max_np < settings.min_np:
        raise UserError(f"--max-np {settings.max_np}: expected at least --min-np ({settings.min_np})")
    start = settings.start_np
    if start is not None and not settings.min_np <= start <= (settings.max_np or start):
        raise UserError(f"-np {start}: expected from --min-np ({settings.min_np}) to --max-np "
                        f"({settings.max_np})")
    if not settings.elastic_timeout > 0:
        raise UserError(f"--elastic-timeout {settings.elastic_timeout:g}: expected a time in seconds above 0")
    if settings.reset_limit is not None and settings.reset_limit < 1:
        raise UserError(f"--reset-limit {settings.reset_limit}: expected a number of resets from 1")
    if settings.cooldown_range is not None:
        low, high = settings.cooldown_range
        if not COOLDOWN_LOWEST <= low <= high <= COOLDOWN_HIGHEST:
            raise UserError(f"--blacklist-cooldown-range {low} {high}: expected MIN MAX seconds with "
                            f"{COOLDOWN_LOWEST} <= MIN <= MAX <= {COOLDOWN_HIGHEST}")


def parse_discovered(text: str, default_slots: int, origin: str) -> HostSlots:
    """A discovery script's output as horovodrun reads it: one ``host`` or ``host:slots`` a line (empty lines
    skipped; a host without slots gets ``default_slots``)."""
    hosts: dict[str, int] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        name, colon, slots = line.partition(":")
        if not name or any(c.isspace() for c in name) or (colon and not (slots.isdigit() and int(slots) > 0)):
            raise UserError(f"{origin}: expected `host` or `host:slots` a line, got {line[:80]!r}")
        hosts[name] = int(slots) if colon else default_slots
    return list(hosts.items())


def script_hosts(script: str, default_slots: int) -> HostSource:
    """horovodrun's --host-discovery-script: run it (through the shell, as horovodrun does) each time."""
    def discover() -> HostSlots:
        try:
            done = subprocess.run(script, shell=True, capture_output=True, text=True, timeout=DISCOVERY_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise UserError(f"--host-discovery-script {script}: no answer within {DISCOVERY_TIMEOUT:g} s") from None
        if done.returncode != 0:
            raise UserError(f"--host-discovery-script {script}: exit status {done.returncode}"
                            + (f": {done.stderr.strip().splitlines()[-1][:200]}" if done.stderr.strip() else ""))
        return parse_discovered(done.stdout, default_slots, f"--host-discovery-script {script}")
    return discover


def fixed_hosts(hosts: HostSlots) -> HostSource:
    """A host list that never changes (horovodrun -H with --min-np): fault tolerance without discovery."""
    return lambda: list(hosts)


def rank_argv(env: dict[str, str]) -> list[str]:
    """What each rank of a world runs: the job's program (``env``'s HPCVOD_ELASTIC_COMMAND) through
    hpcvod.runtime.elastic_start, which sets Horovod's worker variables and becomes the program."""
    return [sys.executable, "-m", "hpcvod.runtime.elastic_start", "--", *json.loads(env["HPCVOD_ELASTIC_COMMAND"])]


def openmpi_world(mpirun: str, extra_args: list[str], is_root: bool, folder: str) -> WorldStarter:
    """Start the first world with Open MPI's mpirun and its fault tolerance (ULFM), filling the hosts' slots in
    order (the hostfile names each host once per slot, so that names of one machine add up)."""
    def start(hosts: HostSlots, np: int, env: dict[str, str]) -> subprocess.Popen:
        hostfile = os.path.join(folder, "elastic-hostfile")
        with open(hostfile, "w") as out:
            out.write("".join(f"{host}\n" * slots for host, slots in hosts))
        argv = [mpirun, "--with-ft", "ulfm", "-n", str(np), "--hostfile", hostfile, "--map-by", "slot:OVERSUBSCRIBE",
                "--bind-to", "none", *(["--allow-run-as-root"] if is_root else [])]
        for name in sorted(env):
            if name.startswith(("HPCVOD_", "HOROVOD_")):
                argv += ["-x", name]
        argv += [*extra_args, *rank_argv(env)]
        # spawned ranks read these too: fault tolerance for every job of this mpirun, and a finalize that does not
        # wait for dead ranks (hpcvod/jobs/elastic.py measured it: survivors hang in MPI_Finalize's fence)
        return subprocess.Popen(argv, env={**env, "OMPI_MCA_mpi_ft_enable": "1", "OMPI_MCA_async_mpi_finalize": "1"})
    return start


class _Blacklist:
    """Hosts whose ranks died or failed, each with the end of its cooldown (horovodrun's HostState)."""

    def __init__(self, cooldown_range: tuple[int, int] | None) -> None:
        self._range = cooldown_range
        self._until: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def add(self, host: str, now: float) -> None:
        if host in self._until and self._until[host] > now:
            return
        self._count[host] = self._count.get(host, 0) + 1
        if self._range is None:
            self._until[host] = float("inf")
            return
        low, high = self._range   # horovodrun's back-off: doubles with each blacklisting, within the range
        delay = low * (1 << self._count[host]) + random.uniform(0, 1) * low
        self._until[host] = now + max(low, min(high, delay))

    def blocked(self, host: str, now: float) -> bool:
        return self._until.get(host, 0) > now

    def names(self, now: float) -> list[str]:
        return [host for host in self._until if self.blocked(host, now)]


class _Driver:
    def __init__(self, source: HostSource, settings: ElasticSettings, err: IO[str]) -> None:
        self.source = source
        self.settings = settings
        self.err = err
        self.token = secrets.token_hex(16)
        self.lock = threading.Lock()
        self.blacklist = _Blacklist(settings.cooldown_range)
        self.discovered: HostSlots = []
        self.told: HostSlots = []      # the hosts the ranks last heard of (at the start, a push or a reset)
        self.links: list[socket.socket] = []
        self.ranks: list[dict] = []    # restarting worlds: each rank of this world that said hello, and its bye
        self.ended: str | None = None  # the one line the job ended with, from a reset
        self.server = socket.create_server(("", 0))
        self.server.settimeout(None)

    @property
    def address(self) -> str:
        """``ADDRESS,ADDRESS,...:PORT``: this machine's IPv4 addresses (a rank on another node tries each)."""
        from hpcvod.runtime.channel import interface_addresses   # the watchdog's own choice of addresses
        return f"{','.join(interface_addresses())}:{self.server.getsockname()[1]}"

    def discover(self) -> HostSlots:
        try:
            found = self.source()
        except UserError as err:
            if not self.discovered:    # the first run's failure ends the job, later ones keep the last answer
                raise
            print(f"hpcvod run: {err}; keeping the last hosts", file=self.err, flush=True)
            found = self.discovered
        with self.lock:
            self.discovered = found
        return found

    def usable(self) -> HostSlots:
        now = time.time()
        with self.lock:
            return [(host, slots) for host, slots in self.discovered if not self.blacklist.blocked(host, now)]

    def wait_for(self, slots: int) -> HostSlots | None:
        """The usable hosts once they offer ``slots``; None after the elastic timeout."""
        deadline = time.monotonic() + self.settings.elastic_timeout
        while True:
            self.discover()
            hosts = self.usable()
            if sum(s for _, s in hosts) >= slots:
                return hosts
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(self.settings.discovery_interval, max(0.0, deadline - time.monotonic())))

    def too_few(self, needed: int) -> str:
        hosts = self.usable()
        blacklisted = self.blacklist.names(time.time())
        return (f"elastic: fewer than --min-np {needed} slots for longer than --elastic-timeout "
                f"{self.settings.elastic_timeout:g} s (usable: {', '.join(f'{h}:{s}' for h, s in hosts) or 'none'}"
                + (f"; blacklisted: {', '.join(blacklisted)}" if blacklisted else "") + ")")

    def every_host_blacklisted(self) -> str:
        return (f"hpcvod run: elastic: every host is blacklisted ({', '.join(self.blacklist.names(time.time()))}): "
                f"no rank is left to train")

    # ----------------------------------------------------------------------------- the ranks' links
    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:   # closed at the end
                return
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        stream = conn.makefile("rb")
        rank = None
        try:
            hello = json.loads(stream.readline() or b"{}")
            if hello.get("op") != "hello" or not secrets.compare_digest(str(hello.get("token", "")), self.token):
                return   # not one of this job's ranks
            rank = {"host": str(hello.get("host", "")), "why": None, "detail": "", "closed": None}
            with self.lock:
                self.links.append(conn)
                self.ranks.append(rank)
            for line in stream:
                request = json.loads(line)
                if request.get("op") == "bye":
                    rank.update(why=str(request.get("why")), detail=str(request.get("detail", ""))[:500])
                elif request.get("op") == "plan":
                    self._send(conn, self._plan(request.get("failed", [])))
                elif request.get("op") == "failed":
                    self._blacklist(request.get("failed", []))
        except (OSError, ValueError):
            pass
        finally:
            with self.lock:
                if conn in self.links:
                    self.links.remove(conn)
                if rank is not None:
                    rank["closed"] = time.monotonic()
            conn.close()

    def _send(self, conn: socket.socket, message: dict) -> None:
        try:
            conn.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass

    def _blacklist(self, failed: list[str]) -> None:
        now = time.time()
        with self.lock:
            for host in failed:
                self.blacklist.add(host, now)
        if failed:
            print(f"hpcvod run: elastic: blacklisted {', '.join(sorted(set(failed)))}"
                  + (f" for {self.settings.cooldown_range[0]}-{self.settings.cooldown_range[1]} s"
                     if self.settings.cooldown_range else ""), file=self.err, flush=True)

    def _plan(self, failed: list[str]) -> dict:
        self._blacklist(failed)
        hosts = self.wait_for(self.settings.min_np)
        if hosts is None:
            line = self.too_few(self.settings.min_np)
            with self.lock:
                self.ended = line
            return {"op": "plan", "error": line}
        with self.lock:
            self.told = hosts
        return {"op": "plan", "hosts": hosts, "max_np": self.settings.max_np}

    def push_changes(self) -> None:
        """One discovery; tell every rank when the usable hosts differ from what they last heard."""
        self.discover()
        hosts = self.usable()
        with self.lock:
            before, self.told = dict(self.told), hosts
            links = list(self.links)
        after = dict(hosts)
        result = (ADDED if any(after[h] > before.get(h, 0) for h in after) else 0) | \
                 (REMOVED if any(before[h] > after.get(h, 0) for h in before) else 0)
        if result:
            print(f"hpcvod run: elastic: hosts now {', '.join(f'{h}:{s}' for h, s in hosts) or 'none'}",
                  file=self.err, flush=True)
            for conn in links:
                self._send(conn, {"op": "hosts_updated", "ts": time.time(), "result": result})


def hydra_world(mpiexec: str, extra_args: list[str]) -> WorldStarter:
    """Start a world with MPICH's or Intel MPI's ``mpiexec`` (Hydra), filling the hosts' slots in order. Without
    ULFM every world is started anew (``restart=True`` in :func:`run_elastic`). Hydra ends the other ranks when
    one dies; the first to see it tells the driver which rank it was (``-disable-auto-cleanup`` would keep them
    alive, but MPICH 5.0.2's Hydra then signals SIGUSR1 to the others whenever a rank exits, even after
    MPI_Finalize, and exited 141 or 243 in about one run in three where every rank had finished: measured)."""
    def start(hosts: HostSlots, np: int, env: dict[str, str]) -> subprocess.Popen:
        argv = [mpiexec, "-n", str(np), "-hosts",
                ",".join(f"{host}:{slots}" for host, slots in hosts), *extra_args, *rank_argv(env)]
        return subprocess.Popen(argv, env=env)
    return start


def state_folder(env: dict[str, str]) -> str:
    """Where the ranks of restarted worlds keep the last commit: a new folder name under the node-local temporary
    folder (TMPDIR, else /tmp), made by each host's ranks, 0700 (runtime/elastic_restart.py)."""
    base = env.get("HPCVOD_ELASTIC_STATE_BASE") or env.get("TMPDIR") or "/tmp"
    return os.path.join(base, f"hpcvod-elastic-{os.getuid()}-{secrets.token_hex(6)}")


def _world_slots(hosts: HostSlots, max_np: int | None) -> tuple[HostSlots, int]:
    """The hosts' slots a world fills (in order, at most ``max_np``) and its number of ranks."""
    np = min(sum(s for _, s in hosts), max_np or sum(s for _, s in hosts))
    rank_hosts = [host for host, slots in hosts for _ in range(slots)][:np]
    return [(h, rank_hosts.count(h)) for h in dict.fromkeys(rank_hosts)], np


def _supervise(driver: "_Driver", world: subprocess.Popen) -> int:
    """Wait for ``world`` to end, running the discovery (and telling the ranks of host changes) meanwhile; its
    exit status, or EXIT_INTERRUPTED after Ctrl-C (the world is ended first)."""
    try:
        while world.poll() is None:
            try:
                world.wait(timeout=driver.settings.discovery_interval)
            except subprocess.TimeoutExpired:
                driver.push_changes()
    except KeyboardInterrupt:
        world.terminate()
        world.wait()
        return EXIT_INTERRUPTED
    return world.returncode


def _failed_hosts(ranks: list[dict], rank_hosts: list[str]) -> list[str]:
    """The hosts to blacklist after a world ended, in rank order: those of ranks that failed on their own (they
    said so), of ranks whose link is still open when their world has ended (their host is unreachable), and of the
    rank whose link closed first without a word (it died; the launcher then ends the others, whose links close
    later: measured with Intel MPI's Hydra, which can end a rank before it has seen the death). Only when no rank
    went silent: the ranks other ranks saw die (``peer``: the runtime's line names it, ``rank N ...``)."""
    failed = [rank["host"] for rank in ranks if rank["why"] == "failed"]
    silent = [rank for rank in ranks if rank["why"] is None]
    failed += [rank["host"] for rank in silent if rank["closed"] is None]
    closed = sorted((rank for rank in silent if rank["closed"] is not None), key=lambda rank: rank["closed"])
    failed += [rank["host"] for rank in closed[:1]]
    if not silent:
        for rank in ranks:
            seen = re.match(r"rank (\d+)\b", rank["detail"]) if rank["why"] == "peer" else None
            if seen and int(seen.group(1)) < len(rank_hosts):
                failed.append(rank_hosts[int(seen.group(1))])
    order = {host: i for i, host in reversed(list(enumerate(rank_hosts)))}
    return sorted(set(failed), key=lambda host: (order.get(host, len(order)), host))


def _run_restarting(driver: "_Driver", settings: ElasticSettings, hosts: HostSlots, start_world: WorldStarter,
                    world_env: dict[str, str], err: IO[str]) -> int:
    """Worlds one after the other, each started anew on the usable hosts, until one finishes (docs/elastic.md,
    "Restarting the world"). Between worlds: the hosts of ranks that died (said nothing) or failed are
    blacklisted, the reset limit and the minimum are checked; the ranks of the next world resume from the newest
    commit a host kept on node-local storage (runtime/elastic_restart.py)."""
    world_env = dict(world_env)
    world_env.pop("HPCVOD_ELASTIC_RESET_LIMIT", None)   # counted here: each world is a new process
    generation, unexplained = 0, 0
    while True:
        used, np = _world_slots(hosts, settings.max_np)
        with driver.lock:
            driver.ranks = []
            driver.told = hosts
        env = {**world_env, "HPCVOD_ELASTIC_RESTART": str(generation),
               "HPCVOD_ELASTIC_SLOTS": ",".join(f"{h}:{n}" for h, n in used)}
        code = _supervise(driver, start_world(used, np, env))
        if code == EXIT_INTERRUPTED:
            return code
        deadline = time.monotonic() + LINK_GRACE_SECONDS   # the last words and closes still in flight
        while time.monotonic() < deadline:
            with driver.lock:
                ranks = [dict(rank) for rank in driver.ranks]
            if all(rank["closed"] is not None for rank in ranks):
                break
            time.sleep(0.02)
        whys = [rank["why"] for rank in ranks]
        if code == 0 and "restart" not in whys or ranks and all(why == "done" for why in whys):
            return code   # trained (a non-zero status after every rank finished training is the program's)
        failed = _failed_hosts(ranks, [h for h, n in used for _ in range(n)])
        if not failed and "restart" not in whys:
            unexplained += 1
            if unexplained >= 2 or not ranks:   # nothing says which host to leave out: starting again won't help
                print(f"hpcvod run: elastic: world {generation} ended with status {code} before "
                      f"{'its ranks reached hvd.elastic.run' if not ranks else 'any rank said why'}; ending the job",
                      file=err, flush=True)
                return code or 1
        else:
            unexplained = 0
        generation += 1
        if settings.reset_limit and generation > settings.reset_limit:
            print(RESET_LIMIT_EXCEEDED_MESSAGE.format(settings.reset_limit), file=err, flush=True)
            return code or 1
        driver._blacklist(failed)
        forever = settings.cooldown_range is None and driver.discovered and not driver.usable()
        hosts = None if forever else driver.wait_for(settings.min_np)
        if hosts is None:
            if driver.discovered and not driver.usable():
                print(driver.every_host_blacklisted(), file=err, flush=True)
            else:
                print(f"hpcvod run: {driver.too_few(settings.min_np)}", file=err, flush=True)
            return code or 1
        print(f"hpcvod run: elastic: starting world {generation} on {', '.join(f'{h}:{s}' for h, s in hosts)}",
              file=err, flush=True)


def run_elastic(source: HostSource, settings: ElasticSettings, program: list[str], start_world: WorldStarter,
                env: dict[str, str], err: IO[str] = sys.stderr, restart: bool = False) -> int:
    """Run ``program`` as an elastic job (module docstring); returns its exit status. ``restart``: the MPI has no
    ULFM, so each reset starts a new world (:func:`_run_restarting`) instead of shrinking and spawning."""
    check_settings(settings)
    driver = _Driver(source, settings, err)
    needed = settings.start_np or settings.min_np
    hosts = driver.wait_for(needed)
    if hosts is None:
        print(f"hpcvod run: {driver.too_few(needed)}", file=err, flush=True)
        return 1
    used, np = _world_slots(hosts, settings.max_np)
    driver.told = hosts
    threading.Thread(target=driver.serve, name="hpcvod-elastic-driver", daemon=True).start()
    world_env = {**env, "HPCVOD_ELASTIC_DRIVER": driver.address, "HPCVOD_ELASTIC_TOKEN": driver.token,
                 "HPCVOD_ELASTIC_SLOTS": ",".join(f"{h}:{n}" for h, n in used),
                 "HPCVOD_ELASTIC_COMMAND": json.dumps(program)}
    if settings.reset_limit:
        world_env["HPCVOD_ELASTIC_RESET_LIMIT"] = str(settings.reset_limit)
    if restart:
        world_env["HPCVOD_ELASTIC_STATE_DIR"] = state_folder(world_env)
        try:
            return _run_restarting(driver, settings, hosts, start_world, world_env, err)
        finally:
            driver.server.close()
            # this node's copies (every host's, on one machine); other nodes' are removed by their ranks at the end
            shutil.rmtree(world_env["HPCVOD_ELASTIC_STATE_DIR"], ignore_errors=True)
    try:
        code = _supervise(driver, start_world(hosts, np, world_env))
    finally:
        driver.server.close()
    if code == EXIT_INTERRUPTED:
        return code
    if driver.ended:
        print(f"hpcvod run: {driver.ended}", file=err, flush=True)
        return code or 1
    if code != 0 and driver.discovered and not driver.usable():
        print(driver.every_host_blacklisted(), file=err, flush=True)
    return code
