"""The container tests' profiles; kept apart from conftest.py so test modules can import them by name."""

from __future__ import annotations

from pathlib import Path

MOUNT_TARGET = "/hpcvod-data"  # the test profiles' bind mount inside the container (the image has the folder)


def container_profile(folder: Path, name: str, extends: str, mounts: list[str] | None = None,
                      **container: str) -> Path:
    """A profile file ``folder/name.yaml``: site ``extends`` with ranks in a charliecloud container."""
    lines = [f"extends: {extends}", f"description: {extends} with each rank in ch-run (tests/containers)",
             "container:", "  runtime: charliecloud", "  python: /opt/hpcvod/bin/python"]
    lines += [f"  {key}: {value}" for key, value in container.items()]
    if mounts:
        lines += ["  mounts:"] + [f"    - {m}" for m in mounts]
    path = folder / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path
