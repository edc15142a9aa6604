"""The scaling projection of ``hpcvod sites check``: the alpha-beta model of ring and hierarchical allreduce built
from the measured links, checked against the job's own allreduce, and the gradient sizes it projects
(``--model-mib`` or a saved torch model's parameters).

Pure functions of figures: the acceptance job, its records and the report live in ``hpcvod.jobs.sitecheck``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, BinaryIO

from hpcvod.runtime.sitecheck import MIB
from hpcvod.support.errors import UserError
from hpcvod.support.files import open_regular


def parse_model_mib(text: str) -> tuple[float, ...]:
    """``--model-mib 100,500``: gradient sizes in MiB, each > 0."""
    try:
        sizes = tuple(float(word) for word in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or not all(0 < s < float("inf") for s in sizes):
        raise UserError(f"--model-mib {text!r}: expected sizes in MiB separated by commas, e.g. 100,500")
    return sizes


STATE_KEYS = ("state_dict", "model_state_dict", "model")   # where checkpoints usually keep the model's tensors


def model_gradient_mib(path: str) -> tuple[float, int]:
    """``--model PATH``: (MiB, parameters) of the floating-point tensors of a saved torch model, the gradient an
    allreduce carries each step. Reads a state_dict (``torch.save(model.state_dict())``), a checkpoint dict holding
    one under state_dict/model_state_dict/model, or a TorchScript file; never unpickles a whole module (that runs
    its code). A regular file only (a FIFO would block, /dev/zero never end), read through one open descriptor.
    torch is imported here only: the rest of the submission side does not need it."""
    try:
        file = open_regular(Path(path), "the --model file")
    except FileNotFoundError:
        raise UserError(f"--model {path}: no such file") from None
    with file:
        try:
            import torch
        except ImportError:
            raise UserError(f"--model {path}: reading a torch model needs torch in this Python; give its size with "
                            f"--model-mib instead") from None
        tensors = _torchscript_parameters(torch, file, path)
        if tensors is None:
            file.seek(0)
            try:
                data = torch.load(file, map_location="cpu", weights_only=True)
            except Exception as err:  # a pickled module (weights_only refuses its classes) or not a torch file
                unsafe = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
                what = (f"a pickled {unsafe.group(1)}, which this check does not unpickle (it would run its code); "
                        f"save model.state_dict() or a TorchScript file instead" if unsafe
                        else f"not a torch file ({type(err).__name__})")
                raise UserError(f"--model {path}: {what}") from None
            tensors = _state_tensors(torch, data, path)
    floats = [t for t in tensors if t.is_floating_point()]
    if not floats:
        raise UserError(f"--model {path}: no floating-point tensors in it (expected a model's parameters)")
    nbytes = sum(t.numel() * t.element_size() for t in floats)
    return nbytes / MIB, sum(t.numel() for t in floats)


def _torchscript_parameters(torch: Any, file: BinaryIO, path: str) -> list | None:
    """A TorchScript archive's parameters (a zip with a code/ folder), or None for any other file; a zip with
    code/ that TorchScript cannot load is a UserError (it was a torch traceback)."""
    import zipfile

    try:
        with zipfile.ZipFile(file) as archive:
            if not any(name.split("/", 1)[-1].startswith("code/") for name in archive.namelist()):
                return None
    except zipfile.BadZipFile:   # not a zip, or a damaged one: torch.load then says it is no torch file
        return None
    file.seek(0)
    try:
        return list(torch.jit.load(file, map_location="cpu").parameters())
    except Exception as err:   # torch raises RuntimeError and others, with many lines of C++ context
        first = (str(err).strip().splitlines() or [""])[0][:120]
        raise UserError(f"--model {path}: a zip holding code/ but not a TorchScript file torch can load "
                        f"({type(err).__name__}: {first}); expected a state_dict, a checkpoint or a TorchScript "
                        f"file (torch.jit.save)") from None


def _state_tensors(torch: Any, data: Any, path: str) -> list:
    if isinstance(data, dict) and any(isinstance(v, torch.Tensor) for v in data.values()):
        return [v for v in data.values() if isinstance(v, torch.Tensor)]
    for key in STATE_KEYS:
        inner = data.get(key) if isinstance(data, dict) else None
        if isinstance(inner, dict) and any(isinstance(v, torch.Tensor) for v in inner.values()):
            return [v for v in inner.values() if isinstance(v, torch.Tensor)]
    keys = ", ".join(map(str, list(data)[:8])) if isinstance(data, dict) else type(data).__name__
    raise UserError(f"--model {path}: no state_dict in it (found {keys}; expected tensors by name, or one of "
                    f"{', '.join(STATE_KEYS)} holding them)")


@dataclasses.dataclass(frozen=True)
class Link:
    """An alpha-beta link: seconds per message and bytes per second."""

    alpha: float
    beta: float


def links_model(figures: dict[str, float]) -> tuple[Link | None, Link | None]:
    """(inside a node, between nodes) from the measured latency and peak bandwidth."""
    def one(path: str) -> Link | None:
        if not figures.get(f"{path}.gbps"):
            return None
        return Link(figures[f"{path}.latency_us"] * 1e-6, figures[f"{path}.gbps"] * 1e9 / 8)
    return one("intra_node"), one("inter_node")


def ring_seconds(nbytes: float, ranks: int, link: Link) -> float:
    """Ring allreduce of ``nbytes`` over ``ranks``: 2(n-1) steps of latency, 2(n-1)/n of the data per link."""
    if ranks < 2:
        return 0.0
    return 2 * (ranks - 1) * link.alpha + 2 * (ranks - 1) / ranks * nbytes / link.beta


def hierarchical_seconds(nbytes: float, nodes: int, per_node: int, intra: Link, inter: Link) -> float:
    """Reduce-scatter inside each node, a ring across nodes of each shard (the node's shards share its link, so
    the whole buffer crosses it), allgather inside the node: the two intra halves make one intra ring."""
    return ring_seconds(nbytes, per_node, intra) + ring_seconds(nbytes, nodes, inter)


def efficiency(step_ms: float, allreduce_ms: float, overlap: float = 0.0) -> float:
    """Scaling efficiency of one step: compute / (compute + the part of the allreduce not hidden behind the
    backward pass). overlap 0 is the lower bound (nothing hidden)."""
    return step_ms / (step_ms + (1 - overlap) * allreduce_ms)


def projection(figures: dict[str, float], model_mib: list[float], per_node: int, max_nodes: int,
               step_ms: float, overlap: float = 0.0) -> list[dict[str, Any]]:
    """Per gradient size and node count (1, 2, 4 ... max_nodes): the allreduce time per step of the ring over
    all ranks and of the hierarchical algorithm, and the scaling efficiency with ``overlap`` of the allreduce
    hidden behind computation (0: none, a lower bound: frameworks overlap some of it)."""
    intra, inter = links_model(figures)
    if inter is None:
        return []
    intra = intra or inter
    rows = []
    nodes = 1
    while nodes <= max_nodes:
        for mib in model_mib:
            nbytes = mib * MIB
            # the ring crosses a node boundary at every step once nodes > 1: the slowest link sets its pace
            ring = ring_seconds(nbytes, nodes * per_node, inter if nodes > 1 else intra)
            hier = hierarchical_seconds(nbytes, nodes, per_node, intra, inter)
            rows.append({"nodes": nodes, "ranks": nodes * per_node, "model_mib": mib,
                         "ring_ms": ring * 1e3, "hierarchical_ms": hier * 1e3,
                         "ring_efficiency": efficiency(step_ms, ring * 1e3, overlap),
                         "hierarchical_efficiency": efficiency(step_ms, hier * 1e3, overlap)})
        nodes *= 2
    return rows


def model_check(figures: dict[str, float], allreduce: list[dict[str, Any]], nodes: int,
                per_node: int) -> dict[str, Any] | None:
    """The model against a run's own allreduce measurements (``allreduce``: bytes and seconds per size, over
    ``nodes`` x ``per_node`` ranks): each size next to what both algorithms predict for it from the measured links
    (``figures``; error = model / measured - 1); the largest size's figures at the top."""
    intra, inter = links_model(figures)
    if not allreduce or (inter is None and intra is None):
        return None
    points = []
    for point in allreduce:
        ring = ring_seconds(point["bytes"], nodes * per_node, inter if nodes > 1 and inter else intra or inter)
        hier = hierarchical_seconds(point["bytes"], nodes, per_node, intra or inter, inter or intra)
        points.append({"bytes": point["bytes"], "measured_ms": point["seconds"] * 1e3, "ring_ms": ring * 1e3,
                       "hierarchical_ms": hier * 1e3, "ring_error": ring / point["seconds"] - 1,
                       "hierarchical_error": hier / point["seconds"] - 1})
    return {**points[-1], "ranks": nodes * per_node, "points": points}


def render_model_check(check: dict[str, Any] | None) -> str:
    if not check:
        return ""
    return (f"model against this run: allreduce of {check['bytes'] // 1024} KiB over {check['ranks']} ranks measured "
            f"{check['measured_ms']:.1f} ms; ring model {check['ring_ms']:.1f} ms ({check['ring_error']:+.0%}), "
            f"hierarchical model {check['hierarchical_ms']:.1f} ms ({check['hierarchical_error']:+.0%})")


def render_projection(rows: list[dict[str, Any]], step_ms: float, overlap: float = 0.0) -> str:
    if not rows:
        return ""
    hidden = f"{overlap:.0%} of the allreduce hidden behind it" if overlap else "no overlap"
    out = [f"projected allreduce per step (alpha-beta model from the measured links; efficiency = compute / "
           f"(compute + allreduce), {step_ms:g} ms compute, {hidden})", "",
           "| nodes | ranks | gradients MiB | ring ms | ring eff. | hierarchical ms | hierarchical eff. |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    out += [f"| {r['nodes']} | {r['ranks']} | {r['model_mib']:g} | {r['ring_ms']:.1f} | {r['ring_efficiency']:.0%} | "
            f"{r['hierarchical_ms']:.1f} | {r['hierarchical_efficiency']:.0%} |" for r in rows]
    return "\n".join(out)
