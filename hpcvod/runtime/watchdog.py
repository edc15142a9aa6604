"""Liveness and the stall inspector, over a small TCP control channel beside MPI.

MPI itself usually hangs when a peer dies (kill -9, OOM killer, node loss) and srun does not, by default,
kill the surviving tasks. hvd.init() therefore connects every rank to rank 0 with one TCP socket:

* A process that dies loses its socket at once (the kernel closes it), so rank 0 sees EOF within milliseconds,
  tells every other rank, and all of them exit non-zero naming the dead rank. Ranks that lose rank 0 do the
  same. Each side also sends a heartbeat every second and declares a peer dead after
  ``HPCVOD_HEARTBEAT_TIMEOUT_SECONDS`` of silence (a hung node, a cut network).
* A rank whose main thread dies of an uncaught exception reports it before exiting; the others abort
  instead of waiting for it forever.
* Every rank reports the collectives it has been waiting on for more than half a second; rank 0 compares the
  reports and, after ``HPCVOD_STALL_CHECK_TIME_SECONDS``, prints which tensors wait and which ranks never
  submitted them. After ``HPCVOD_STALL_SHUTDOWN_TIME_SECONDS`` (if set) it aborts the job.

Only the job's ranks get in: rank 0 listens on the ranks' addresses only and a hello must carry a per-job
token that went out over MPI and the pid and host MPI reported for that rank; lines are bounded and a
malformed one is ignored, never fatal (docs/runtime.md, "Trust model of the control channel").

A clean shutdown says goodbye first, so a rank that finished is never taken for a dead one; its goodbye says how
far it got, so the others' collectives that need it fail instead of waiting. Without the
channel (``HPCVOD_WATCHDOG=0``, or when no rank can reach rank 0), the stall inspector still warns about
this rank's own waiting collectives, and dead ranks are left to the launcher.
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
from typing import Any, Callable, Optional

from . import handles as K

HEARTBEAT_SECONDS = 1.0
REPORT_AFTER_SECONDS = 0.5      # a collective waiting longer than this is reported to rank 0
REPORT_STALE_SECONDS = 3.5      # a report older than this no longer counts as "this rank has it pending"
MAX_LINE = 64 * 1024            # no message of the channel is longer; a longer line is dropped
MAX_REPORTED = 100              # pending collectives a rank reports at most (keeps its lines short)


def _interface_addresses() -> list[str]:
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


class _Peer:
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


class Watchdog:
    """The control channel and stall inspector of one rank (see the module docstring)."""

    def __init__(self, rank: int, size: int, settings: Any,
                 pending: Callable[[], list[tuple[int, str, int, float]]],
                 set_members: Callable[[int], Optional[list[int]]],
                 abort: Callable[[str, str], None],
                 left: Optional[Callable[[int, str, dict], None]] = None) -> None:
        self.rank = rank
        self.size = size
        self.settings = settings
        self._pending = pending            # () -> [(set_id, name, kind, age)]
        self._set_members = set_members    # set_id -> global ranks (None if unknown)
        self._abort = abort                # (reason, kind) -> never returns normally
        self._left = left                  # (rank, "pid P on HOST", {set_id: negotiations}) a rank finished
        self._peers: dict[int, _Peer] = {}
        self._up: Optional[socket.socket] = None     # non-zero ranks: the socket to rank 0
        self._up_buf = b""
        self._up_heard = time.monotonic()
        self._channel = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._closing = False
        self._send_lock = threading.Lock()
        self._warned: dict[tuple[int, str], float] = {}
        # after this rank's clean shutdown: how the job ended ("" = every rank finished), once rank 0 says
        self._final = threading.Event()
        self._final_word = ""
        self._local_warned: dict[tuple[int, str], float] = {}
        self._reported: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------------------------- setup
    def connect(self, comm: Any, identities: list[tuple[str, int]]) -> Optional[str]:
        """Collective over ``comm`` (the init communicator): build the channel. ``identities``: (host, pid) of
        every rank as MPI gathered them; a hello must match its rank's. Returns a warning or None."""
        if self.size == 1 or not self.settings.watchdog:
            return None
        from mpi4py import MPI
        listeners: list[socket.socket] = []
        if self.rank == 0:
            # only the addresses the ranks will use, never 0.0.0.0; the token travels over MPI, not the network
            one_host = len({host for host, _ in identities}) == 1
            addresses = ["127.0.0.1"] if one_host else _interface_addresses()
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
            ok = len(self._peers) == self.size - 1 and not failed[0]
            if not ok:
                problem = (f"{int(failed[0])} rank(s) could not connect to rank 0 at {addresses} port {port}"
                           if failed[0] else f"only {len(self._peers)} of {self.size - 1} ranks connected")
        else:
            error = None
            for address in addresses:
                try:
                    sock = socket.create_connection((address, port), timeout=5.0)
                    sock.settimeout(5.0)
                    self._up = sock
                    self._send_up({"t": "hello", "rank": self.rank, "pid": os.getpid(),
                                   "host": identities[self.rank][0], "token": token})
                    break
                except OSError as exc:
                    error = exc
            failed = __import__("numpy").array([0 if self._up is not None else 1], "i8")
            comm.Iallreduce(MPI.IN_PLACE, [failed, MPI.INT64_T], MPI.SUM).Wait()
            ok = self._up is not None
            if not ok:
                problem = f"could not connect to rank 0 at {addresses} port {port}: {error}"
        everyone_ok = comm.allreduce(1 if ok else 0, op=MPI.MIN)
        if not everyone_ok:
            for peer in self._peers.values():
                peer.sock.close()
            self._peers.clear()
            if self._up is not None:
                self._up.close()
                self._up = None
            return ("hpcvod: the control channel to rank 0 could not be set up"
                    + (f" ({problem})" if problem else "") +
                    "; dead ranks will be left to the launcher to detect (HPCVOD_WATCHDOG=0 silences this)")
        self._channel = True
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
            while len(self._peers) < self.size - 1 and time.monotonic() < deadline:
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
                    peer = _Peer(hello["rank"], conn, hello["pid"], hello["host"])
                    peer.buf = bytes(buf[line_end + 1:])
                    self._peers[peer.rank] = peer
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

    def _check_hello(self, line: bytes, token: str, identities: list[tuple[str, int]]) -> tuple[Optional[str], Any]:
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
        if rank in self._peers:
            return f"rank {rank} already connected", None
        host, pid = identities[rank]
        if hello.get("pid") != pid or hello.get("host") != host:
            return f"rank {rank} from pid {str(hello.get('pid'))[:12]} on {str(hello.get('host'))[:64]!r}, " \
                   f"where MPI has pid {pid} on {host!r}", None
        return None, hello

    def start(self) -> None:
        if self._channel or self._stall_enabled():
            self._thread = threading.Thread(target=self._main, name="hpcvod-watchdog", daemon=True)
            self._thread.start()

    def _stall_enabled(self) -> bool:
        s = self.settings
        return not s.stall_check_disable and (s.stall_check_time_seconds > 0 or s.stall_shutdown_time_seconds > 0)

    # ------------------------------------------------------------------------------------ messages
    @staticmethod
    def _encode(msg: dict) -> bytes:
        return (json.dumps(msg, separators=(",", ":")) + "\n").encode()

    def _messages(self, buf: bytes, source: str) -> tuple[list[dict], bytes]:
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

    def _send_up(self, msg: dict) -> bool:
        if self._up is None:
            return False
        try:
            with self._send_lock:
                self._up.sendall(self._encode(msg))
            return True
        except OSError:
            return False

    def _send_peer(self, peer: _Peer, msg: dict) -> bool:
        try:
            with self._send_lock:
                peer.sock.sendall(self._encode(msg))
            return True
        except OSError:
            return False

    # --------------------------------------------------------------------------------- the thread
    def _main(self) -> None:
        selector = selectors.DefaultSelector()
        if self.rank == 0:
            for peer in self._peers.values():
                selector.register(peer.sock, selectors.EVENT_READ, peer)
        elif self._up is not None:
            selector.register(self._up, selectors.EVENT_READ, None)
        next_beat = time.monotonic()
        try:
            while not self._stop.is_set():
                timeout = max(0.0, next_beat - time.monotonic())
                for key, _ in selector.select(timeout=min(timeout, HEARTBEAT_SECONDS)):
                    if self.rank == 0:
                        self._read_peer(key.data, selector)
                    else:
                        self._read_up(selector)
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + HEARTBEAT_SECONDS
                    self._beat(now)
        except Exception as exc:  # the watchdog must never take the job down by itself
            print(f"hpcvod: watchdog thread stopped: {exc!r}", file=sys.stderr, flush=True)
        finally:
            selector.close()

    def _read_peer(self, peer: _Peer, selector: selectors.BaseSelector) -> None:
        try:
            chunk = peer.sock.recv(65536)
        except OSError:  # reset, timeout...: the peer is as gone as with a clean EOF
            chunk = b""
        if not chunk:
            selector.unregister(peer.sock)
            peer.sock.close()
            if not peer.said_bye:
                del self._peers[peer.rank]
                self._rank_failed(f"rank {peer.rank} (pid {peer.pid} on {peer.host}) died: its control "
                                  f"connection closed without a clean shutdown", "failure")
            return
        peer.last_heard = time.monotonic()
        messages, peer.buf = self._messages(peer.buf + chunk, f"rank {peer.rank}")
        for msg in messages:
            t = msg.get("t")
            if t == "bye":
                peer.said_bye = True
                agreed = msg.get("agreed")
                self._relay_left(peer.rank, f"pid {peer.pid} on {peer.host}",
                                 agreed if isinstance(agreed, dict) else {})
            elif t == "pending" and isinstance(msg.get("items"), list):
                peer.report = [i for i in msg["items"] if isinstance(i, list) and len(i) == 4]
                peer.report_time = time.monotonic()
            elif t == "fail":
                peer.said_bye = True
                self._rank_failed(f"rank {peer.rank} (pid {peer.pid} on {peer.host}) failed: "
                                  f"{str(msg.get('reason'))[:2000]}", "failure")

    def _read_up(self, selector: selectors.BaseSelector) -> None:
        assert self._up is not None
        try:
            chunk = self._up.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            selector.unregister(self._up)
            self._up.close()
            self._up = None
            self._job_failed("rank 0 died: its control connection closed without a clean shutdown", "failure")
            return
        self._up_heard = time.monotonic()
        messages, self._up_buf = self._messages(self._up_buf + chunk, "rank 0")
        for msg in messages:
            if msg.get("t") == "abort":
                self._job_failed(str(msg.get("reason"))[:4000], "stall" if msg.get("kind") == "stall" else "failure")
            elif msg.get("t") == "left" and isinstance(msg.get("rank"), int) and \
                    isinstance(msg.get("agreed") or {}, dict):
                if self._left is not None:
                    self._left(msg["rank"], str(msg.get("who", "")), msg.get("agreed") or {})
            elif msg.get("t") == "bye":
                self._closing = True   # rank 0 finished cleanly; its EOF is no failure
                self._final.set()

    def _relay_left(self, rank: int, who: str, agreed: dict) -> None:
        """Rank 0: ``rank`` finished cleanly; tell the ranks still running (and this one), so that collectives
        that need it fail instead of waiting for ever."""
        note = {"t": "left", "rank": rank, "who": who, "agreed": agreed}
        for peer in list(self._peers.values()):
            if not peer.said_bye:
                self._send_peer(peer, note)
        if self._left is not None and not self._closing:
            self._left(rank, who, agreed)

    def _rank_failed(self, reason: str, kind: str) -> None:
        """Rank 0: tell every other rank, then abort this one."""
        for peer in list(self._peers.values()):
            if not peer.said_bye:
                self._send_peer(peer, {"t": "abort", "reason": reason, "kind": kind})
        self._abort(reason, kind)

    def _beat(self, now: float) -> None:
        timeout = self.settings.heartbeat_timeout_seconds
        if self.rank == 0:
            for peer in list(self._peers.values()):
                if peer.said_bye:
                    continue
                if timeout and now - peer.last_heard > timeout:
                    self._rank_failed(f"rank {peer.rank} (pid {peer.pid} on {peer.host}) has not been heard "
                                      f"from for {now - peer.last_heard:.0f} s", "failure")
                self._send_peer(peer, {"t": "hb"})
            self._inspect_stalls(now)
        else:
            if self._up is not None:
                mine = [list(item) for item in self._pending() if item[3] > REPORT_AFTER_SECONDS][:MAX_REPORTED]
                self._send_up({"t": "pending", "items": mine} if mine else {"t": "hb"})
                if timeout and now - self._up_heard > timeout and not self._final.is_set():
                    self._job_failed(f"rank 0 has not been heard from for {now - self._up_heard:.0f} s", "failure")
            elif self._stall_enabled():
                self._inspect_local(now)

    # ---------------------------------------------------------------------------- stall inspector
    def _inspect_stalls(self, now: float) -> None:
        if not self._stall_enabled():
            return
        if not self._channel:
            self._inspect_local(now)
            return
        holders: dict[tuple[int, str], dict] = {}
        for set_id, name, kind, age in self._pending():
            if age > REPORT_AFTER_SECONDS:
                d = holders.setdefault((set_id, name), {"kind": kind, "age": 0.0, "ranks": set()})
                d["ranks"].add(0)
                d["age"] = max(d["age"], age)
        for peer in self._peers.values():
            if now - peer.report_time > REPORT_STALE_SECONDS:
                continue
            for set_id, name, kind, age in peer.report:
                d = holders.setdefault((set_id, name), {"kind": kind, "age": 0.0, "ranks": set()})
                d["ranks"].add(peer.rank)
                d["age"] = max(d["age"], age + (now - peer.report_time))
        check = self.settings.stall_check_time_seconds
        shutdown = self.settings.stall_shutdown_time_seconds
        lines = []
        worst = 0.0
        for key, d in sorted(holders.items(), key=lambda kv: -kv[1]["age"]):
            age = d["age"]
            if check and age >= check and now - self._warned.get(key, -1e18) >= check:
                self._warned[key] = now
                lines.append(self._describe(key, d))
            worst = max(worst, age)
        for key in list(self._warned):
            if key not in holders:
                del self._warned[key]
        if lines:
            print(f"hpcvod stall inspector (rank 0): {len(lines)} collective(s) waiting for more than "
                  f"{check:g} s:\n" + "\n".join(lines) + "\n  One or more ranks may be stuck, skipped a "
                  f"collective, or submitted collectives with different names.", file=sys.stderr, flush=True)
        if shutdown and worst >= shutdown:
            stalled = [self._describe(k, d) for k, d in holders.items() if d["age"] >= shutdown]
            self._rank_failed(f"stalled for more than HPCVOD_STALL_SHUTDOWN_TIME_SECONDS={shutdown:g} s:\n"
                              + "\n".join(stalled), "stall")

    def _describe(self, key: tuple[int, str], d: dict) -> str:
        set_id, name = key
        members = self._set_members(set_id) or list(range(self.size))
        missing = [r for r in members if r not in d["ranks"]]
        gone = [r for r in missing if r in self._peers and self._peers[r].said_bye]
        if self.rank == 0 and self._closing and 0 in missing:
            gone.append(0)
        note = f" (ranks {sorted(gone)} have already shut down)" if gone else ""
        return (f"  {K.KIND_NAMES.get(d['kind'], '?')} {name!r} (process set {set_id}) waited {d['age']:.0f} s: "
                f"submitted by ranks {sorted(d['ranks'])}; never submitted by ranks {missing}{note}")

    def _inspect_local(self, now: float) -> None:
        check = self.settings.stall_check_time_seconds
        shutdown = self.settings.stall_shutdown_time_seconds
        lines = []
        worst = 0.0
        for set_id, name, kind, age in self._pending():
            key = (set_id, name)
            worst = max(worst, age)
            if check and age >= check and now - self._local_warned.get(key, -1e18) >= check:
                self._local_warned[key] = now
                lines.append(f"  {K.KIND_NAMES.get(kind, '?')} {name!r} (process set {set_id}) waited {age:.0f} s")
        if lines:
            print(f"hpcvod stall inspector (rank {self.rank}): collectives waiting for other ranks (the control "
                  f"channel is off, so which ranks are missing is unknown):\n" + "\n".join(lines),
                  file=sys.stderr, flush=True)
        if shutdown and worst >= shutdown:
            self._abort(f"stalled for more than HPCVOD_STALL_SHUTDOWN_TIME_SECONDS={shutdown:g} s", "stall")

    # ----------------------------------------------------------------------------------- shutdown
    def report_failure(self, reason: str) -> None:
        """This rank is dying of an uncaught exception: make the others abort instead of hanging."""
        if self.rank == 0:
            self._closing = True
            for peer in list(self._peers.values()):
                if not peer.said_bye:
                    self._send_peer(peer, {"t": "abort", "kind": "failure",
                                           "reason": f"rank 0 failed: {reason}"})
        else:
            self._closing = True
            self._send_up({"t": "fail", "reason": reason})

    @property
    def closed(self) -> bool:
        """Whether close() has said goodbye (or the channel was never up)."""
        return self._closing or not self._channel

    def _job_failed(self, reason: str, kind: str) -> None:
        """A rank other than 0 learns that the job failed: abort, or, once this rank has finished cleanly,
        record it for its exit (see wait_final) and leave the rank running."""
        if not self._closing:
            self._abort(reason, kind)
        elif not self._final.is_set():
            self._final_word = reason
            self._final.set()

    def wait_final(self) -> str:
        """After close(), on a rank other than 0: wait until rank 0 says how the job ended; "" when every rank
        finished, else why it failed (then MPI_Finalize would wait for failed ranks for ever)."""
        if self.rank == 0 or not self._channel or self._thread is None:
            return ""
        while not self._final.wait(0.5):
            if not self._thread.is_alive():
                return ""
        self._stop.set()
        return self._final_word

    def close(self, agreed: Optional[dict[int, int]] = None) -> None:
        """Clean shutdown. ``agreed``: negotiations this rank completed, per process set (the others' later
        collectives with it fail). Rank 0 keeps watching until every other rank has said goodbye or died."""
        agreed = {str(k): v for k, v in (agreed or {}).items()}
        if self.rank == 0 and self._channel and self._thread is not None:
            self._closing = True
            self._relay_left(0, f"pid {os.getpid()} on {socket.gethostname()}", agreed)
            while any(not p.said_bye for p in list(self._peers.values())) and self._thread.is_alive():
                time.sleep(0.01)
            for peer in list(self._peers.values()):
                self._send_peer(peer, {"t": "bye"})
        elif self._up is not None:
            self._closing = True
            self._send_up({"t": "bye", "agreed": agreed})
            return   # the thread stays to hear how the job ends (wait_final, at exit)
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        for peer in self._peers.values():
            try:
                peer.sock.close()
            except OSError:
                pass
        self._peers.clear()
        if self._up is not None:
            try:
                self._up.close()
            except OSError:
                pass
            self._up = None
