"""A small line-plot PNG writer (zlib + struct only): the bandwidth plot of ``hpcvod sites check``.

Matplotlib is not a dependency of hpcvod; a plot of a few lines on a log-x axis needs only pixels. The figure
has no text: report.md names each line's colour and the axes.
"""

from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path
from typing import Sequence

RGB = tuple[int, int, int]
COLOURS: tuple[tuple[str, RGB], ...] = (("blue", (31, 119, 180)), ("orange", (255, 127, 14)),
                                        ("green", (44, 160, 44)), ("red", (214, 39, 40)), ("purple", (148, 103, 189)))
WHITE, BLACK, GREY = (255, 255, 255), (0, 0, 0), (225, 225, 225)


def encode_png(pixels: Sequence[Sequence[RGB]]) -> bytes:
    """8-bit RGB PNG of rows of (r, g, b) pixels."""
    height, width = len(pixels), len(pixels[0])
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in pixels)  # filter type 0 per row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def _line(canvas: list[list[RGB]], x0: int, y0: int, x1: int, y1: int, colour: RGB, thick: int = 1) -> None:
    steps = max(abs(x1 - x0), abs(y1 - y0), 1)
    for i in range(steps + 1):
        x, y = round(x0 + (x1 - x0) * i / steps), round(y0 + (y1 - y0) * i / steps)
        for dx in range(-thick + 1, thick):
            for dy in range(-thick + 1, thick):
                if 0 <= y + dy < len(canvas) and 0 <= x + dx < len(canvas[0]):
                    canvas[y + dy][x + dx] = colour


def line_plot(series: dict[str, list[tuple[float, float]]], width: int = 640, height: int = 400,
              margin: int = 40) -> tuple[bytes, dict[str, str]]:
    """PNG bytes of ``series`` (name -> (x, y) points; x on a log2 axis, y linear from 0) and each name's colour.
    Grid lines: one vertical per power of 4 of x, five horizontal ones at fifths of the largest y."""
    canvas = [[WHITE] * width for _ in range(height)]
    points = [p for pts in series.values() for p in pts if p[0] > 0]
    legend: dict[str, str] = {}
    if not points:
        return encode_png(canvas), legend
    lo, hi = math.log2(min(p[0] for p in points)), math.log2(max(p[0] for p in points))
    top = max(p[1] for p in points) or 1.0
    span = (hi - lo) or 1.0

    def at(x: float, y: float) -> tuple[int, int]:
        px = margin + (math.log2(x) - lo) / span * (width - 2 * margin)
        py = height - margin - y / top * (height - 2 * margin)
        return round(px), round(py)

    for i in range(6):
        y = height - margin - i * (height - 2 * margin) // 5
        _line(canvas, margin, y, width - margin, y, GREY)
    step = 2
    for e in range(math.ceil(lo / step) * step, math.floor(hi) + 1, step):
        x = at(2.0 ** e, 0)[0]
        _line(canvas, x, margin, x, height - margin, GREY)
    _line(canvas, margin, height - margin, width - margin, height - margin, BLACK)
    _line(canvas, margin, margin, margin, height - margin, BLACK)
    for (name, pts), (colour_name, colour) in zip(series.items(), COLOURS):
        pts = sorted(p for p in pts if p[0] > 0)
        legend[name] = colour_name
        for a, b in zip(pts, pts[1:] or pts):
            _line(canvas, *at(*a), *at(*b), colour, thick=2)
    return encode_png(canvas), legend


def write_plot(path: Path, series: dict[str, list[tuple[float, float]]]) -> dict[str, str]:
    data, legend = line_plot(series)
    path.write_bytes(data)
    return legend
