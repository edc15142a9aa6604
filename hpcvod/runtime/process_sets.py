"""Process sets: collectives among a subset of the ranks (Horovod's ``hvd.ProcessSet``)."""

from __future__ import annotations

from typing import Any, Sequence

from .errors import HpcvodInputError


class ProcessSet:
    """A set of global ranks that run collectives among themselves.

    Create it with a list of global ranks (or an mpi4py communicator whose members are the set), then
    register it on every rank with ``hvd.init(process_sets=[...])`` or ``hvd.add_process_set(...)``; pass it
    as ``process_set=`` to any collective. ``hvd.global_process_set`` (id 0) holds every rank.
    """

    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        self.process_set_id: int | None = None
        self.mpi_comm: Any = None
        if hasattr(ranks_or_comm, "Get_group"):
            self.mpi_comm = ranks_or_comm
            self.ranks: list[int] = []
        else:
            try:
                ranks = [int(r) for r in ranks_or_comm]
            except (TypeError, ValueError):
                raise HpcvodInputError(
                    f"ProcessSet expects a sequence of global ranks or an mpi4py communicator, "
                    f"got {ranks_or_comm!r}") from None
            if len(set(ranks)) != len(ranks):
                raise HpcvodInputError(f"ProcessSet ranks must be distinct, got {ranks}")
            self.ranks = sorted(ranks)
        self._lane: Any = None          # the engine lane on members, None elsewhere
        self._my_rank: int | None = None

    def _register(self, set_id: int, ranks: list[int], my_global_rank: int, lane: Any) -> None:
        self.process_set_id = set_id
        self.ranks = ranks
        self._lane = lane
        self._my_rank = ranks.index(my_global_rank) if my_global_rank in ranks else None

    def _invalidate(self) -> None:
        self.process_set_id = None
        self._lane = None
        self._my_rank = None

    def size(self) -> int | None:
        """Number of ranks in the set (None before it is registered)."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank inside the set (None if it is not a member or the set is not registered)."""
        return self._my_rank

    def included(self) -> bool | None:
        """Whether this process is a member (None before the set is registered)."""
        return None if self.process_set_id is None else self._my_rank is not None

    def __repr__(self) -> str:
        ident = "unregistered" if self.process_set_id is None else f"id={self.process_set_id}"
        return f"ProcessSet({ident}, ranks={self.ranks})"


global_process_set = ProcessSet([])
