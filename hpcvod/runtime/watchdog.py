"""Liveness over the control channel (channel.py), and the stall inspector's clock (stall.py).

MPI itself usually hangs when a peer dies (kill -9, OOM killer, node loss) and srun does not, by default,
kill the surviving tasks. hvd.init() therefore connects every rank to rank 0 with one TCP socket:

* A process that dies loses its socket at once (the kernel closes it), so rank 0 sees EOF within milliseconds,
  tells every other rank, and all of them exit non-zero naming the dead rank. Ranks that lose rank 0 do the
  same. Each side also sends a heartbeat every second and declares a peer dead after
  ``HPCVOD_HEARTBEAT_TIMEOUT_SECONDS`` of silence (a hung node, a cut network).
* A rank whose main thread dies of an uncaught exception reports it before exiting; the others abort
  instead of waiting for it forever.
* Every rank reports the collectives it has been waiting on; rank 0's stall inspector compares the reports
  (stall.py).

A clean shutdown says goodbye first, so a rank that finished is never taken for a dead one; its goodbye says how
far it got, so the others' collectives that need it fail instead of waiting. Without the
channel (``HPCVOD_WATCHDOG=0``, or when no rank can reach rank 0), the stall inspector still warns about
this rank's own waiting collectives, and dead ranks are left to the launcher.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
import threading
import time
from typing import Any, Callable

from .channel import ControlChannel, Peer
from .stall import StallInspector

HEARTBEAT_SECONDS = 1.0


class Watchdog:
    """The liveness protocol of one rank, run by its thread over the :class:`ControlChannel`.

    Hooks into the world: ``pending()`` and ``set_members(set_id)`` for the stall inspector, ``abort(reason,
    kind)`` (never returns normally) and ``left(rank, "pid P on HOST", {set_id: negotiations})`` when a rank
    finished cleanly.
    """

    def __init__(self, rank: int, size: int, settings: Any,
                 pending: Callable[[], list[tuple[int, str, int, float]]],
                 set_members: Callable[[int], list[int] | None],
                 abort: Callable[[str, str], None],
                 left: Callable[[int, str, dict], None] | None = None) -> None:
        self.rank = rank
        self.size = size
        self.settings = settings
        self.channel = ControlChannel(rank, size)
        self.stalls = StallInspector(rank, size, settings, pending, set_members)
        self._abort = abort
        self._left = left
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None   # finish() wakes the thread through it
        self._closing = False
        # after this rank's clean shutdown: how the job ended ("" = every rank finished), once rank 0 says
        self._final = threading.Event()
        self._final_word = ""

    def connect(self, comm: Any, identities: list[tuple[str, int]]) -> str | None:
        """Collective over ``comm``: build the channel (ControlChannel.connect). Returns a warning or None."""
        if self.size == 1 or not self.settings.watchdog:
            return None
        return self.channel.connect(comm, identities)

    def start(self) -> None:
        if self.channel.is_up or self.stalls.enabled():
            self._wake = socket.socketpair()
            self._thread = threading.Thread(target=self._main, name="hpcvod-watchdog", daemon=True)
            self._thread.start()

    # --------------------------------------------------------------------------------- the thread
    def _main(self) -> None:
        selector = selectors.DefaultSelector()
        if self.rank == 0:
            for peer in self.channel.peers.values():
                selector.register(peer.sock, selectors.EVENT_READ, peer)
        elif self.channel.up is not None:
            selector.register(self.channel.up, selectors.EVENT_READ, None)
        if self._wake is not None:
            selector.register(self._wake[0], selectors.EVENT_READ, self._wake)
        next_beat = time.monotonic()
        try:
            while not self._stop.is_set():
                timeout = max(0.0, next_beat - time.monotonic())
                for key, _ in selector.select(timeout=min(timeout, HEARTBEAT_SECONDS)):
                    if key.data is self._wake:
                        continue                 # finish(): _stop is set
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

    def _read_peer(self, peer: Peer, selector: selectors.BaseSelector) -> None:
        try:
            chunk = peer.sock.recv(65536)
        except OSError:  # reset, timeout...: the peer is as gone as with a clean EOF
            chunk = b""
        if not chunk:
            selector.unregister(peer.sock)
            peer.sock.close()
            if not peer.said_bye:
                del self.channel.peers[peer.rank]
                self._rank_failed(f"rank {peer.rank} (pid {peer.pid} on {peer.host}) died: its control "
                                  f"connection closed without a clean shutdown", "failure")
            return
        peer.last_heard = time.monotonic()
        messages, peer.buf = self.channel.messages(peer.buf + chunk, f"rank {peer.rank}")
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
        channel = self.channel
        assert channel.up is not None
        try:
            chunk = channel.up.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            selector.unregister(channel.up)
            channel.up.close()
            channel.up = None
            self._job_failed("rank 0 died: its control connection closed without a clean shutdown", "failure")
            return
        channel.up_heard = time.monotonic()
        messages, channel.up_buf = channel.messages(channel.up_buf + chunk, "rank 0")
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
        self.channel.tell_peers({"t": "left", "rank": rank, "who": who, "agreed": agreed})
        if self._left is not None and not self._closing:
            self._left(rank, who, agreed)

    def _rank_failed(self, reason: str, kind: str) -> None:
        """Rank 0: tell every other rank, then abort this one."""
        self.channel.tell_peers({"t": "abort", "reason": reason, "kind": kind})
        self._abort(reason, kind)

    def _beat(self, now: float) -> None:
        timeout = self.settings.heartbeat_timeout_seconds
        channel = self.channel
        if self.rank == 0:
            for peer in list(channel.peers.values()):
                if peer.said_bye:
                    continue
                if timeout and now - peer.last_heard > timeout:
                    self._rank_failed(f"rank {peer.rank} (pid {peer.pid} on {peer.host}) has not been heard "
                                      f"from for {now - peer.last_heard:.0f} s", "failure")
                channel.send_peer(peer, {"t": "hb"})
            self._inspect_stalls(now)
        elif channel.up is not None:
            mine = self.stalls.report()
            channel.send_up({"t": "pending", "items": mine} if mine else {"t": "hb"})
            if timeout and now - channel.up_heard > timeout and not self._final.is_set():
                self._job_failed(f"rank 0 has not been heard from for {now - channel.up_heard:.0f} s", "failure")
        elif self.stalls.enabled():
            self._inspect_local(now)

    def _inspect_stalls(self, now: float) -> None:
        if not self.stalls.enabled():
            return
        if not self.channel.is_up:
            self._inspect_local(now)
            return
        reason = self.stalls.inspect(now, self.channel.peers, self._closing)
        if reason is not None:
            self._rank_failed(reason, "stall")

    def _inspect_local(self, now: float) -> None:
        reason = self.stalls.inspect_local(now)
        if reason is not None:
            self._abort(reason, "stall")

    # ----------------------------------------------------------------------------------- shutdown
    def report_failure(self, reason: str) -> None:
        """This rank is dying of an uncaught exception: make the others abort instead of hanging."""
        self._closing = True
        if self.rank == 0:
            self.channel.tell_peers({"t": "abort", "kind": "failure", "reason": f"rank 0 failed: {reason}"})
        else:
            self.channel.send_up({"t": "fail", "reason": reason})

    def report_world_failed(self, reason: str) -> None:
        """This rank leaves a failed world to build the next one (an elastic reset): the others must see a
        failure, not a rank that finished cleanly (they would take that for their own mistake and leave). Said
        only where the channel still reaches them; unlike report_failure, it leaves close() to do as it does."""
        if self.rank == 0:
            if self.channel.is_up:
                self.channel.tell_peers({"t": "abort", "kind": "failure", "reason": f"rank 0 failed: {reason}"})
        elif self.channel.up is not None:
            self.channel.send_up({"t": "fail", "reason": reason})

    @property
    def closed(self) -> bool:
        """Whether close() has said goodbye (or the channel was never up)."""
        return self._closing or not self.channel.is_up

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
        if self.rank == 0 or not self.channel.is_up or self._thread is None:
            return ""
        while not self._final.wait(0.5):
            if not self._thread.is_alive():
                return ""
        self._stop.set()
        return self._final_word

    def close(self, agreed: dict[int, int] | None = None) -> None:
        """Clean shutdown. ``agreed``: negotiations this rank completed, per process set (the others' later
        collectives with it fail). Rank 0 keeps watching until every other rank has said goodbye or died;
        the others keep their thread to hear how the job ends (wait_final, then finish)."""
        agreed = {str(k): v for k, v in (agreed or {}).items()}
        channel = self.channel
        if self.rank == 0 and channel.is_up and self._thread is not None:
            self._closing = True
            self._relay_left(0, f"pid {os.getpid()} on {socket.gethostname()}", agreed)
            while any(not p.said_bye for p in list(channel.peers.values())) and self._thread.is_alive():
                time.sleep(0.01)
            for peer in list(channel.peers.values()):
                channel.send_peer(peer, {"t": "bye"})
        elif channel.up is not None:
            self._closing = True
            channel.send_up({"t": "bye", "agreed": agreed})
            return
        self.finish()

    def finish(self) -> str:
        """Stop the thread and close the channel; after close() on a rank other than 0, first wait until rank 0
        says how the job ended. Returns that word ("" when every rank finished)."""
        word = self.wait_final() if self._closing else ""
        self._stop.set()
        if self._wake is not None:
            try:
                self._wake[1].send(b"x")
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        self.channel.close()
        if self._wake is not None and (self._thread is None or not self._thread.is_alive()):
            for end in self._wake:
                end.close()
            self._wake = None
        return word
