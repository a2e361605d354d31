"""A chaos storm as a picture (``benchmarks/chaos.py``): a PNG written with zlib alone (no matplotlib here).

x: seconds from the first step; y: the step. One dot per step line of each host (host 1 blue,
host 2 green, host 3 orange, host 4 purple): a host whose dots stop was out of the job. Each fault
is a vertical line in its class's colour (``COLOURS``; docs/benchmarks.md has the legend); the time
from a fault to the next step is shaded grey (its recovery); a membership change is a light-blue
band, a whole-job restart a light-red one. No text: the legend is in the docs, the figures in the JSON.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaos_schedule import CLASSES

W, H, PAD = 1600, 600, 20
HOSTS = [(31, 119, 180), (44, 160, 44), (255, 127, 14), (148, 103, 189)]
PALETTE = [
    (214, 39, 40), (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
    (0, 0, 0), (255, 152, 150), (197, 176, 213), (44, 160, 44), (255, 0, 0), (128, 0, 128), (0, 0, 128),
]  # fmt: skip
COLOURS = dict(zip(CLASSES, PALETTE, strict=False))


class Canvas:
    def __init__(self) -> None:
        self.pixels = bytearray(b"\xff" * (W * H * 3))

    def put(self, x: int, y: int, rgb: tuple[int, int, int]) -> None:
        if 0 <= x < W and 0 <= y < H:
            i = (y * W + x) * 3
            self.pixels[i : i + 3] = bytes(rgb)

    def band(self, x0: int, x1: int, rgb: tuple[int, int, int]) -> None:
        for x in range(max(0, x0), min(W, max(x0 + 1, x1))):
            for y in range(PAD, H - PAD):
                self.put(x, y, rgb)

    def png(self) -> bytes:
        rows = b"".join(b"\x00" + bytes(self.pixels[y * W * 3 : (y + 1) * W * 3]) for y in range(H))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

        header = struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b"")
        )


def draw(path: Path, events: Sequence[Any], faults: Sequence[dict[str, Any]], restarts: Sequence[dict]) -> None:
    steps = [(e.stamp, e.values[0], e.host) for e in events if e.kind == "step"]
    if not steps:
        return
    t0, t1 = min(s[0] for s in steps), max(s[0] for s in steps)
    top = max(s[1] for s in steps) or 1

    def x(t: float) -> int:
        return PAD + int((t - t0) / max(1e-9, t1 - t0) * (W - 2 * PAD))

    canvas = Canvas()
    times = sorted(s[0] for s in steps)
    for fault in faults:  # recovery: the fault → the next step line
        after = next((t for t in times if t > fault["stamp"]), t1)
        canvas.band(x(fault["stamp"]), x(after), (225, 225, 225))
    for e in events:
        if e.kind == "membership" and e.host == 0:
            canvas.band(x(e.stamp) - 2, x(e.stamp) + 2, (190, 220, 255))
    for r in restarts:
        canvas.band(x(r["stamp"]) - 3, x(r["stamp"]) + 3, (255, 200, 200))
    for fault in faults:
        colour = COLOURS.get(fault["kind"], (0, 0, 0))
        for y in range(PAD, H - PAD):
            canvas.put(x(fault["stamp"]), y, colour)
    for t, step, host in steps:
        px, py = x(t), H - PAD - int(step / top * (H - 2 * PAD))
        for dx in (0, 1):
            for dy in (0, 1):
                canvas.put(px + dx, py + dy + host, HOSTS[host % len(HOSTS)])
    path.write_bytes(canvas.png())
