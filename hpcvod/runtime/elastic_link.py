"""A rank's side of ``hpcvod run``'s elastic driver (hpcvod/launchers/elastic_driver.py), and the variables
horovodrun's elastic workers see.

The driver starts the world with ``HPCVOD_ELASTIC_DRIVER=host:port`` and a secret ``HPCVOD_ELASTIC_TOKEN``. Each
rank inside ``hvd.elastic.run`` keeps one TCP connection to it (newline-delimited JSON): the driver pushes
``{"op": "hosts_updated", "ts": T, "result": R}`` when discovery finds hosts added or removed (they reach the
states as Horovod's ``HostsUpdatedInterrupt`` at the next ``commit()``), and at a reset the new world's rank 0
asks for the hosts to use (``{"op": "plan", ...}``, answered ``{"op": "plan", "hosts": [[host, slots], ...],
"max_np": N}`` or ``{"op": "plan", "error": LINE}``). When the driver restarts worlds instead (an MPI
without ULFM, runtime/elastic_restart.py) each rank says why its world ends (``{"op": "bye", "why": ...}``).
Without a driver (a plain ``mpirun --with-ft ulfm``) there is no link and the world only shrinks.

Only the standard library: this runs on every rank and must not import the submission side.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
from typing import Any, Callable, Sequence

DRIVER_VARIABLE = "HPCVOD_ELASTIC_DRIVER"
TOKEN_VARIABLE = "HPCVOD_ELASTIC_TOKEN"
SLOTS_VARIABLE = "HPCVOD_ELASTIC_SLOTS"      # the first world's hosts in rank order: h1:2,h2:1
COMMAND_VARIABLE = "HPCVOD_ELASTIC_COMMAND"  # JSON list: the program every rank runs (spawned ranks too)
RESTART_VARIABLE = "HPCVOD_ELASTIC_RESTART"  # the world's generation when the driver restarts worlds
JOIN_VARIABLE = "HPCVOD_ELASTIC_JOIN"        # set in a rank spawned into a running world: merge with it at init
CONNECT_SECONDS = 30.0
# Horovod's words (horovod/runner/elastic/constants.py), since scripts and tests match them; printed by the runtime
# (ULFM resets) and by the driver (restarted worlds)
RESET_LIMIT_EXCEEDED_MESSAGE = "Horovod was shutdown because number of resets during elastic job exceeded limit: {}"
joined_world_hosts: list[str] = []   # in a spawned rank: each rank's host in the world it joined


def join_running_world(MPI: Any) -> Any:
    """In a rank spawned at a reset (``HPCVOD_ELASTIC_JOIN``), ``hvd.init()``'s communicator: this rank merged
    with the ranks that spawned it, after them (the other side of ``elastic._spawn``), and each rank's host in it.
    Here rather than in elastic.py, so that context.py, below elastic.py, can call it."""
    global joined_world_hosts
    os.environ.pop(JOIN_VARIABLE, None)
    parent = MPI.Comm.Get_parent()
    merged = parent.Merge(high=True)
    parent.Disconnect()
    joined_world_hosts = merged.allgather(os.environ.get("HOROVOD_HOSTNAME", ""))
    return merged


def expand_slots(text: str) -> list[str]:
    """``h1:2,h2:1`` -> ``[h1, h1, h2]``: the host of each rank, in rank order."""
    hosts = []
    for item in text.split(","):
        name, _, slots = item.partition(":")
        hosts += [name] * int(slots or 1)
    return hosts


def horovod_variables(rank: int, rank_hosts: Sequence[str]) -> dict[str, str]:
    """What horovodrun's elastic workers see (Horovod's names): this rank, size, host, its place among the ranks
    on its host (local) and among the ranks with its local rank on other hosts (cross)."""
    host = rank_hosts[rank]
    local = [r for r, h in enumerate(rank_hosts) if h == host]
    local_rank = local.index(rank)
    peers: list[str] = []   # hosts, in rank order, with a rank of this local rank
    for r, h in enumerate(rank_hosts):
        if h not in peers and [x for x, y in enumerate(rank_hosts) if y == h].index(r) == local_rank:
            peers.append(h)
    return {"HOROVOD_HOSTNAME": host, "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(len(rank_hosts)),
            "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(len(local)),
            "HOROVOD_CROSS_RANK": str(peers.index(host)), "HOROVOD_CROSS_SIZE": str(len(peers)),
            "HOROVOD_ELASTIC": "1"}


class DriverLink:
    """This rank's connection to the driver. ``on_hosts_updated(timestamp, result)`` is called from the reader
    thread for each push; :meth:`plan` is a request of the world's rank 0."""

    def __init__(self, address: str, token: str, host: str,
                 on_hosts_updated: Callable[[float, int], None]) -> None:
        names, _, port = address.rpartition(":")   # the driver's addresses, tried in turn
        deadline = time.monotonic() + CONNECT_SECONDS
        while True:
            try:
                self._sock = _connect(names.split(","), int(port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self._sock.settimeout(None)
        self._lock = threading.Lock()
        self._replies: queue.Queue = queue.Queue()
        self._on_hosts_updated = on_hosts_updated
        self._send({"op": "hello", "token": token, "host": host, "pid": os.getpid()})
        threading.Thread(target=self._read, name="hpcvod-elastic-link", daemon=True).start()

    def _send(self, message: dict[str, Any]) -> None:
        with self._lock:
            self._sock.sendall(json.dumps(message).encode() + b"\n")

    def _read(self) -> None:
        stream = self._sock.makefile("rb")
        for line in stream:
            message = json.loads(line)
            if message.get("op") == "hosts_updated":
                self._on_hosts_updated(float(message["ts"]), int(message["result"]))
            else:
                self._replies.put(message)
        self._replies.put({"op": "plan", "error": "the elastic driver (hpcvod run) is gone"})

    def plan(self, hosts: list[str], failed: list[str]) -> dict[str, Any]:
        """The hosts the next world may use, given this world's ranks' ``hosts`` (one entry per rank that stays)
        and the hosts of ranks that died or failed (``failed``: the driver blacklists them). May wait as long as
        the driver's elastic timeout for enough hosts."""
        self._send({"op": "plan", "hosts": hosts, "failed": failed})
        return self._replies.get()

    def say(self, why: str, detail: str) -> None:
        """Why this rank's world ends, for a driver that restarts worlds: ``done`` (training finished),
        ``restart`` (hosts changed), ``peer`` (another rank died or failed) or ``failed`` (this rank's own
        error). A rank that says nothing died: the driver blacklists its host."""
        try:
            self._send({"op": "bye", "why": why, "detail": detail[:500]})
        except OSError:   # the driver is gone: the world's end will say so
            pass

    def report_failed(self, failed: list[str]) -> None:
        """The hosts of ranks that died or failed when no rank is left to plan for (the driver blacklists them)."""
        self._send({"op": "failed", "failed": failed})


def _connect(names: list[str], port: int) -> socket.socket:
    """The first of the driver's addresses that answers (a short try each: an address of another network does
    not answer at all)."""
    error: OSError = OSError("no address of the elastic driver given")
    for name in names:
        try:
            return socket.create_connection((name, port), timeout=2.0)
        except OSError as exc:
            error = exc
    raise error


_link: DriverLink | None = None


def driver_link(host: str, on_hosts_updated: Callable[[float, int], None]) -> DriverLink | None:
    """The process's link to the driver, opened on first use; None without a driver."""
    global _link
    address = os.environ.get(DRIVER_VARIABLE)
    if _link is None and address:
        _link = DriverLink(address, os.environ.get(TOKEN_VARIABLE, ""), host, on_hosts_updated)
    return _link


def current_link() -> DriverLink | None:
    """The link opened by :func:`driver_link`, if any."""
    return _link
