"""What ``hpcvod sites check`` asks for and what it judges: the request and one check's verdict."""

from __future__ import annotations

import dataclasses

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    status: str
    evidence: str


@dataclasses.dataclass(frozen=True)
class Request:
    """What the acceptance job asks for: the world the profile should form."""

    nodes: int
    tasks_per_node: int
    gpus_per_node: int = 0
    partition: str | None = None
    quick: bool = False
    frameworks: tuple[str, ...] = ()
    model_mib: tuple[float, ...] = (100.0,)
    step_ms: float = 100.0
    max_nodes: int = 2
    timeout: float | None = None   # seconds from submission to the job's end; then it is cancelled
    overlap: float = 0.0              # share of the allreduce hidden behind computation in the projection
    model: str | None = None       # --model: the torch file whose parameters gave a gradient size

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node
