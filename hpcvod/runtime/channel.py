"""The control channel beside MPI: one TCP socket from every rank to rank 0, carrying one JSON line per message.

Only the job's ranks get in: rank 0 listens on the ranks' addresses only and a hello must carry a per-job
token that went out over MPI and the pid and host MPI reported for that rank; lines are bounded and a
malformed one is ignored, never fatal (docs/runtime.md, "Trust model of the control channel"). What the
messages mean is the watchdog's business (watchdog.py); this module only connects, frames and sends.
"""

from __future__ import annotations

import collections
import hmac
import json
import os
import secrets
import selectors
import socket
import struct
import sys
import threading
import time
from typing import Any, Callable

MAX_LINE = 64 * 1024            # no message of the channel is longer; a longer line is dropped


def interface_addresses() -> list[str]:
    """IPv4 addresses of this host, loopback last (best effort, Linux ioctl with a getaddrinfo fallback)."""
    found: list[str] = []
    try:
        import fcntl
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for _, name in socket.if_nameindex():
                try:
                    packed = fcntl.ioctl(probe.fileno(), 0x8915,  # SIOCGIFADDR
                                         struct.pack("256s", name.encode()[:15]))
                    found.append(socket.inet_ntoa(packed[20:24]))
                except OSError:
                    continue
        finally:
            probe.close()
    except (ImportError, OSError):
        pass
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.append(str(info[4][0]))
    except OSError:
        pass
    unique = list(dict.fromkeys(found))
    return [a for a in unique if not a.startswith("127.")] + [a for a in unique if a.startswith("127.")]


class Peer:
    """Rank 0's view of one other rank: its socket, what it said last and its latest stall report."""

    __slots__ = ("rank", "sock", "buf", "last_heard", "said_bye", "pid", "host", "report", "report_time")

    def __init__(self, rank: int, sock: socket.socket, pid: int, host: str) -> None:
        self.rank = rank
        self.sock = sock
        self.buf = b""
        self.last_heard = time.monotonic()
        self.said_bye = False
        self.pid = pid
        self.host = host
        self.report: list = []
        self.report_time = 0.0


class ControlChannel:
    """This rank's end of the channel: rank 0 holds a :class:`Peer` per other rank, the others one socket up.

    ``connect`` runs in the thread that calls init(); afterwards the watchdog thread reads, and any thread may
    send (one lock keeps lines whole).
    """

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size
        self.is_up = False                         # connect() succeeded on every rank
        self.peers: dict[int, Peer] = {}           # rank 0: the other ranks
        self.up: socket.socket | None = None       # other ranks: the socket to rank 0
        self.up_buf = b""
        self.up_heard = time.monotonic()
        self._send_lock = threading.Lock()
        self._reported: set[tuple[str, str]] = set()

    def connect(self, comm: Any, identities: list[tuple[str, int]]) -> str | None:
        """Collective over ``comm`` (the init communicator): build the channel. ``identities``: (host, pid) of
        every rank as MPI gathered them; a hello must match its rank's. Returns a warning or None."""
        from mpi4py import MPI
        listeners: list[socket.socket] = []
        if self.rank == 0:
            # only the addresses the ranks will use, never 0.0.0.0; the token travels over MPI, not the network
            one_host = len({host for host, _ in identities}) == 1
            addresses = ["127.0.0.1"] if one_host else interface_addresses()
            port = 0
            for address in addresses:
                try:
                    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    listener.bind((address, port))
                    listener.listen(min(self.size, 4096))
                    port = listener.getsockname()[1]
                    listeners.append(listener)
                except OSError:   # a second address on the same port may be taken: that address is skipped
                    listener.close()
            addresses = [l.getsockname()[0] for l in listeners]
            info = (addresses, port, secrets.token_hex(32))
        else:
            info = None
        addresses, port, token = comm.bcast(info, root=0)
        problem = ""
        if self.rank == 0:
            failed = __import__("numpy").zeros(1, "i8")
            req = comm.Iallreduce(MPI.IN_PLACE, [failed, MPI.INT64_T], MPI.SUM)
            done = self._accept_ranks(listeners, token, identities, lambda: req.Test(), failed)
            if not done:
                req.Wait()
            for listener in listeners:
                listener.close()
            ok = len(self.peers) == self.size - 1 and not failed[0]
            if not ok:
                problem = (f"{int(failed[0])} rank(s) could not connect to rank 0 at {addresses} port {port}"
                           if failed[0] else f"only {len(self.peers)} of {self.size - 1} ranks connected")
        else:
            error = None
            for address in addresses:
                try:
                    sock = socket.create_connection((address, port), timeout=5.0)
                    sock.settimeout(5.0)
                    self.up = sock
                    self.send_up({"t": "hello", "rank": self.rank, "pid": os.getpid(),
                                   "host": identities[self.rank][0], "token": token})
                    break
                except OSError as exc:
                    error = exc
            failed = __import__("numpy").array([0 if self.up is not None else 1], "i8")
            comm.Iallreduce(MPI.IN_PLACE, [failed, MPI.INT64_T], MPI.SUM).Wait()
            ok = self.up is not None
            if not ok:
                problem = f"could not connect to rank 0 at {addresses} port {port}: {error}"
        everyone_ok = comm.allreduce(1 if ok else 0, op=MPI.MIN)
        if not everyone_ok:
            self.close()
            return ("hpcvod: the control channel to rank 0 could not be set up"
                    + (f" ({problem})" if problem else "") +
                    "; dead ranks will be left to the launcher to detect (HPCVOD_WATCHDOG=0 silences this)")
        self.is_up = True
        return None

    def _accept_ranks(self, listeners: list[socket.socket], token: str, identities: list[tuple[str, int]],
                      test: Callable[[], bool], failed: Any) -> bool:
        """Rank 0: accept one hello per rank until every rank is in (or one reports that it cannot connect).
        Nothing a stranger sends can stop or slow this: connections are read without blocking, lines are
        bounded, and a hello without the job's token or with the wrong rank, pid or host is dropped, counted
        and named in one warning. Returns whether ``test`` (the ranks' own report) completed."""
        selector = selectors.DefaultSelector()
        for listener in listeners:
            listener.setblocking(False)
            selector.register(listener, selectors.EVENT_READ, None)
        refused: list[str] = []
        done = False
        deadline = time.monotonic() + 120.0
        try:
            while len(self.peers) < self.size - 1 and time.monotonic() < deadline:
                if not done:
                    done = test()
                    if done and failed[0]:
                        break
                for key, _ in selector.select(0.05):
                    if key.data is None:
                        try:
                            conn, _ = key.fileobj.accept()
                        except OSError:
                            continue
                        conn.setblocking(False)
                        selector.register(conn, selectors.EVENT_READ, bytearray())
                        continue
                    conn, buf = key.fileobj, key.data
                    try:
                        chunk = conn.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    buf += chunk
                    line_end = buf.find(b"\n")
                    why = ("closed before a hello" if not chunk else
                           f"a line longer than {MAX_LINE // 1024} KiB" if line_end < 0 and len(buf) > MAX_LINE
                           else None)
                    if why is None and line_end < 0:
                        continue
                    selector.unregister(conn)
                    if why is None:
                        why, hello = self._check_hello(bytes(buf[:line_end]), token, identities)
                    if why is not None:
                        refused.append(why)
                        conn.close()
                        continue
                    conn.setblocking(True)
                    conn.settimeout(5.0)
                    peer = Peer(hello["rank"], conn, hello["pid"], hello["host"])
                    peer.buf = bytes(buf[line_end + 1:])
                    self.peers[peer.rank] = peer
        finally:
            for key in list(selector.get_map().values()):
                if key.data is not None:
                    key.fileobj.close()
            selector.close()
        if refused:
            counts = collections.Counter(refused)
            shown = "; ".join(f"{n} x {why}" if n > 1 else why for why, n in list(counts.items())[:12])
            print(f"hpcvod: rank 0: the control channel refused {len(refused)} connection(s) that were not this "
                  f"job's ranks: {shown}", file=sys.stderr, flush=True)
        return done

    def _check_hello(self, line: bytes, token: str, identities: list[tuple[str, int]]) -> tuple[str | None, Any]:
        """(why a hello is refused, or None; the hello)."""
        try:
            hello = json.loads(line.decode())
        except (UnicodeDecodeError, ValueError):
            return "not a JSON hello line", None
        if not isinstance(hello, dict) or hello.get("t") != "hello":
            return f"a message of type {str(hello.get('t'))[:20]!r} before any hello" if isinstance(hello, dict) \
                else "not a hello", None
        if not isinstance(hello.get("token"), str) or not hmac.compare_digest(hello["token"], token):
            return "no or a wrong job token", None
        rank = hello.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 < rank < self.size:
            return f"rank {str(rank)[:20]} out of range", None
        if rank in self.peers:
            return f"rank {rank} already connected", None
        host, pid = identities[rank]
        if hello.get("pid") != pid or hello.get("host") != host:
            return f"rank {rank} from pid {str(hello.get('pid'))[:12]} on {str(hello.get('host'))[:64]!r}, " \
                   f"where MPI has pid {pid} on {host!r}", None
        return None, hello

    @staticmethod
    def _encode(msg: dict) -> bytes:
        return (json.dumps(msg, separators=(",", ":")) + "\n").encode()

    def messages(self, buf: bytes, source: str) -> tuple[list[dict], bytes]:
        """The complete messages in ``buf`` and what is left. A malformed line, or one over MAX_LINE, is
        dropped and reported once: it must never stop the watchdog (failure detection would be off)."""
        out = []
        lines = buf.split(b"\n")
        rest = lines.pop()
        if len(rest) > MAX_LINE:
            self._malformed(source, f"a line longer than {MAX_LINE // 1024} KiB")
            rest = b""
        for line in lines:
            try:
                msg = json.loads(line.decode())
            except (UnicodeDecodeError, ValueError):
                msg = None
            if isinstance(msg, dict) and isinstance(msg.get("t"), str):
                out.append(msg)
            else:
                self._malformed(source, "a line that is not a message")
        return out, rest

    def _malformed(self, source: str, what: str) -> None:
        if (source, what) not in self._reported:
            self._reported.add((source, what))
            print(f"hpcvod: rank {self.rank}: ignored {what} from {source} on the control channel",
                  file=sys.stderr, flush=True)

    def send_up(self, msg: dict) -> bool:
        return self.up is not None and self._send(self.up, msg)

    def send_peer(self, peer: Peer, msg: dict) -> bool:
        return self._send(peer.sock, msg)

    def _send(self, sock: socket.socket, msg: dict) -> bool:
        """One framed message on ``sock``; False when the connection is gone."""
        try:
            with self._send_lock:
                sock.sendall(self._encode(msg))
            return True
        except OSError:
            return False

    def tell_peers(self, msg: dict) -> None:
        """Rank 0: send ``msg`` to every rank that has not said goodbye."""
        for peer in list(self.peers.values()):
            if not peer.said_bye:
                self.send_peer(peer, msg)

    def close(self) -> None:
        """Close every socket (the channel is down afterwards)."""
        for peer in self.peers.values():
            try:
                peer.sock.close()
            except OSError:
                pass
        self.peers.clear()
        if self.up is not None:
            try:
                self.up.close()
            except OSError:
                pass
            self.up = None
