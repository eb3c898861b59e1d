"""Icon silhouettes and patterns of the synthetic world: each maps normalised coordinates x, y in [-1, 1] (y points
up) to a boolean mask; `SHAPES` and `PATTERNS` are what the object table of `cglib.data.render` may name."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from matplotlib.path import Path as _MplPath


# A shape maps normalised coordinates x, y in [-1, 1] (y points up) to a boolean mask.
def _disk(x, y, cx, cy, r):
    return (x - cx) ** 2 + (y - cy) ** 2 <= r * r


def _ellipse(x, y, cx, cy, rx, ry):
    return ((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 <= 1.0


def _box(x, y, x0, x1, y0, y1):
    return (x >= x0) & (x <= x1) & (y >= y0) & (y <= y1)


def _poly(x, y, points):
    inside = _MplPath(points).contains_points(np.column_stack([x.ravel(), y.ravel()]))
    return inside.reshape(x.shape)


def _band(x, y, x0, y0, x1, y1, width):
    """A thick line segment from (x0, y0) to (x1, y1)."""
    dx, dy = x1 - x0, y1 - y0
    t = np.clip(((x - x0) * dx + (y - y0) * dy) / (dx * dx + dy * dy), 0.0, 1.0)
    return (x - (x0 + t * dx)) ** 2 + (y - (y0 + t * dy)) ** 2 <= width * width


def _star_points(n, outer, inner, cy=0.0):
    angles = np.pi / 2 + np.arange(2 * n) * np.pi / n
    radii = np.where(np.arange(2 * n) % 2 == 0, outer, inner)
    return np.column_stack([radii * np.cos(angles), cy + radii * np.sin(angles)])


def _wheels(x, y):
    return _disk(x, y, -0.55, -0.6, 0.28) | _disk(x, y, 0.55, -0.6, 0.28)


SHAPES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "circle": lambda x, y: _disk(x, y, 0, 0, 0.9),
    "ring": lambda x, y: _disk(x, y, 0, 0, 0.92) & ~_disk(x, y, 0, 0, 0.55),
    "ellipse_tall": lambda x, y: _ellipse(x, y, 0, 0, 0.6, 0.95),
    "ellipse_wide": lambda x, y: _ellipse(x, y, 0, 0, 0.95, 0.55),
    "square": lambda x, y: _box(x, y, -0.8, 0.8, -0.8, 0.8),
    "rect_tall": lambda x, y: _box(x, y, -0.5, 0.5, -0.95, 0.95),
    "rect_wide": lambda x, y: _box(x, y, -0.95, 0.95, -0.55, 0.55),
    "bar": lambda x, y: _box(x, y, -0.2, 0.2, -0.95, 0.95),
    "stick": lambda x, y: _band(x, y, -0.8, -0.8, 0.8, 0.8, 0.18),
    "triangle": lambda x, y: _poly(x, y, [(-0.92, -0.8), (0.92, -0.8), (0, 0.92)]),
    "triangle_down": lambda x, y: _poly(x, y, [(-0.92, 0.8), (0.92, 0.8), (0, -0.92)]),
    "diamond": lambda x, y: np.abs(x) + np.abs(y) <= 0.95,
    "star": lambda x, y: _poly(x, y, _star_points(5, 0.98, 0.42, cy=-0.08)),
    "plus": lambda x, y: _box(x, y, -0.3, 0.3, -0.92, 0.92) | _box(x, y, -0.92, 0.92, -0.3, 0.3),
    "cross": lambda x, y: _band(x, y, -0.75, -0.75, 0.75, 0.75, 0.22) | _band(x, y, -0.75, 0.75, 0.75, -0.75, 0.22),
    "hexagon": lambda x, y: _poly(x, y, [(0.92 * np.cos(a), 0.92 * np.sin(a)) for a in np.arange(6) * np.pi / 3]),
    "heart": lambda x, y: ((1.25 * x) ** 2 + (1.25 * y - 0.15) ** 2 - 1) ** 3 - (1.25 * x) ** 2 * (1.25 * y - 0.15) ** 3
    <= 0,
    "crescent": lambda x, y: _disk(x, y, 0, 0, 0.9) & ~_disk(x, y, 0.42, 0.22, 0.72),
    "dome": lambda x, y: _disk(x, y, 0, -0.5, 0.95) & (y >= -0.5),
    "bowl": lambda x, y: (_disk(x, y, 0, 0.3, 0.92) & (y <= 0.3)) | _box(x, y, -0.3, 0.3, -0.85, -0.5),
    "bucket": lambda x, y: _poly(x, y, [(-0.85, 0.75), (0.85, 0.75), (0.55, -0.9), (-0.55, -0.9)]),
    "house": lambda x, y: _poly(x, y, [(-0.8, -0.92), (0.8, -0.92), (0.8, 0.15), (0, 0.92), (-0.8, 0.15)]),
    "figure": lambda x, y: _disk(x, y, 0, 0.58, 0.32) | _poly(x, y, [(-0.6, -0.95), (0.6, -0.95), (0.3, 0.22),
                                                                      (-0.3, 0.22)]),
    "tree": lambda x, y: _poly(x, y, [(-0.8, -0.45), (0.8, -0.45), (0, 0.95)]) | _box(x, y, -0.15, 0.15, -0.95, -0.4),
    "round_tree": lambda x, y: _disk(x, y, 0, 0.3, 0.65) | _box(x, y, -0.15, 0.15, -0.95, -0.2),
    "flat_tree": lambda x, y: _ellipse(x, y, 0, 0.5, 0.95, 0.32) | _box(x, y, -0.12, 0.12, -0.95, 0.3),
    "palm": lambda x, y: (_box(x, y, -0.12, 0.12, -0.95, 0.5) | _ellipse(x, y, -0.45, 0.6, 0.5, 0.16)
                          | _ellipse(x, y, 0.45, 0.6, 0.5, 0.16) | _ellipse(x, y, 0, 0.75, 0.16, 0.25)),
    "cup": lambda x, y: _box(x, y, -0.7, 0.35, -0.8, 0.6) | (_disk(x, y, 0.4, -0.1, 0.4) & ~_disk(x, y, 0.4, -0.1, 0.2)),
    "bottle": lambda x, y: _box(x, y, -0.42, 0.42, -0.95, 0.25) | _box(x, y, -0.16, 0.16, 0.2, 0.95),
    "glass": lambda x, y: (_poly(x, y, [(-0.6, 0.9), (0.6, 0.9), (0, 0.0)]) | _box(x, y, -0.08, 0.08, -0.8, 0.1)
                           | _box(x, y, -0.45, 0.45, -0.95, -0.75)),
    "flag": lambda x, y: _box(x, y, -0.85, -0.68, -0.95, 0.95) | _box(x, y, -0.7, 0.9, 0.15, 0.9),
    "sign": lambda x, y: _box(x, y, -0.1, 0.1, -0.95, 0.3) | _box(x, y, -0.85, 0.85, 0.2, 0.9),
    "wheel": lambda x, y: ((_disk(x, y, 0, 0, 0.92) & ~_disk(x, y, 0, 0, 0.72)) | (_disk(x, y, 0, 0, 0.75)
                           & ((np.abs(x) < 0.09) | (np.abs(y) < 0.09) | (np.abs(x - y) < 0.12) | (np.abs(x + y) < 0.12)))),
    "animal": lambda x, y: (_ellipse(x, y, -0.1, 0.05, 0.7, 0.38) | _disk(x, y, 0.68, 0.38, 0.27)
                            | _box(x, y, -0.65, -0.45, -0.9, 0) | _box(x, y, 0.2, 0.4, -0.9, 0)),
    "tall_animal": lambda x, y: (_ellipse(x, y, -0.25, -0.15, 0.55, 0.3) | _band(x, y, 0.1, -0.1, 0.5, 0.75, 0.13)
                                 | _ellipse(x, y, 0.62, 0.78, 0.24, 0.15) | _box(x, y, -0.65, -0.5, -0.95, -0.2)
                                 | _box(x, y, 0.0, 0.15, -0.95, -0.2)),
    "big_animal": lambda x, y: (_ellipse(x, y, -0.15, 0.1, 0.72, 0.52) | _disk(x, y, 0.6, 0.25, 0.35)
                                | _band(x, y, 0.85, 0.1, 0.85, -0.85, 0.1) | _box(x, y, -0.7, -0.4, -0.92, -0.1)
                                | _box(x, y, 0.05, 0.35, -0.92, -0.1)),
    "bird": lambda x, y: (_ellipse(x, y, -0.1, -0.1, 0.62, 0.4) | _disk(x, y, 0.5, 0.3, 0.27)
                          | _poly(x, y, [(0.7, 0.38), (0.98, 0.25), (0.7, 0.15)])
                          | _poly(x, y, [(-0.6, -0.05), (-0.98, 0.3), (-0.98, -0.35)])),
    "fish": lambda x, y: _ellipse(x, y, 0.15, 0, 0.75, 0.45) | _poly(x, y, [(-0.5, 0), (-0.95, 0.5), (-0.95, -0.5)]),
    "boat": lambda x, y: (_poly(x, y, [(-0.95, -0.25), (0.95, -0.25), (0.6, -0.85), (-0.6, -0.85)])
                          | _poly(x, y, [(-0.05, -0.2), (-0.05, 0.95), (0.75, -0.2)])),
    "ship": lambda x, y: (_poly(x, y, [(-0.95, -0.1), (0.95, -0.1), (0.7, -0.8), (-0.7, -0.8)])
                          | _box(x, y, -0.5, 0.35, -0.15, 0.45) | _box(x, y, -0.3, -0.05, 0.4, 0.85)),
    "vehicle": lambda x, y: _box(x, y, -0.95, 0.95, -0.45, 0.25) | _box(x, y, -0.5, 0.45, 0.2, 0.7) | _wheels(x, y),
    "long_vehicle": lambda x, y: _box(x, y, -0.95, 0.95, -0.5, 0.75) | _wheels(x, y),
    "truck": lambda x, y: _box(x, y, -0.95, 0.35, -0.45, 0.75) | _box(x, y, 0.4, 0.95, -0.45, 0.35) | _wheels(x, y),
    "boot": lambda x, y: _box(x, y, -0.55, 0.1, -0.3, 0.95) | _ellipse(x, y, 0.1, -0.6, 0.85, 0.35),
    "hat": lambda x, y: _ellipse(x, y, 0, -0.55, 0.95, 0.22) | _box(x, y, -0.5, 0.5, -0.6, 0.6),
    "cone": lambda x, y: _poly(x, y, [(-0.55, -0.7), (0.55, -0.7), (0, 0.95)]) | _box(x, y, -0.9, 0.9, -0.95, -0.7),
    "snowman": lambda x, y: _disk(x, y, 0, -0.4, 0.55) | _disk(x, y, 0, 0.45, 0.38),
    "candle": lambda x, y: _box(x, y, -0.28, 0.28, -0.95, 0.35) | _ellipse(x, y, 0, 0.68, 0.16, 0.28),
    "umbrella": lambda x, y: (_disk(x, y, 0, 0.0, 0.95) & (y >= 0.0)) | _box(x, y, -0.07, 0.07, -0.95, 0.1),
    "burst": lambda x, y: _disk(x, y, 0, 0, 0.25) | (_disk(x, y, 0, 0, 0.95) & (
        (np.abs(x) < 0.08) | (np.abs(y) < 0.08) | (np.abs(x - y) < 0.11) | (np.abs(x + y) < 0.11))),
    "flower": lambda x, y: (_disk(x, y, 0, 0, 0.3) | _disk(x, y, 0, 0.55, 0.35) | _disk(x, y, 0.52, 0.17, 0.35)
                            | _disk(x, y, -0.52, 0.17, 0.35) | _disk(x, y, 0.32, -0.45, 0.35)
                            | _disk(x, y, -0.32, -0.45, 0.35)),
    "racket": lambda x, y: _ellipse(x, y, 0, 0.35, 0.55, 0.6) | _box(x, y, -0.1, 0.1, -0.95, -0.2),
    "crown": lambda x, y: _poly(x, y, [(-0.9, -0.7), (0.9, -0.7), (0.9, 0.75), (0.45, 0.1), (0, 0.8), (-0.45, 0.1),
                                       (-0.9, 0.75)]),
    "tent": lambda x, y: _poly(x, y, [(-0.95, -0.85), (0.95, -0.85), (0, 0.85)]) & ~_poly(
        x, y, [(-0.25, -0.86), (0.25, -0.86), (0, -0.2)]),
    "shirt": lambda x, y: _poly(x, y, [(-0.5, -0.9), (0.5, -0.9), (0.5, 0.35), (0.95, 0.15), (0.95, 0.55), (0.35, 0.85),
                                       (-0.35, 0.85), (-0.95, 0.55), (-0.95, 0.15), (-0.5, 0.35)]),
    "lamp": lambda x, y: (_poly(x, y, [(-0.35, 0.9), (0.35, 0.9), (0.7, 0.2), (-0.7, 0.2)])
                          | _box(x, y, -0.07, 0.07, -0.8, 0.2) | _box(x, y, -0.45, 0.45, -0.95, -0.78)),
    "mitten": lambda x, y: _ellipse(x, y, 0.1, 0.05, 0.55, 0.8) | _ellipse(x, y, -0.55, -0.1, 0.22, 0.4),
    "screen": lambda x, y: _box(x, y, -0.95, 0.95, -0.35, 0.85) | _box(x, y, -0.1, 0.1, -0.8, -0.3)
    | _box(x, y, -0.5, 0.5, -0.95, -0.78),
    "bag": lambda x, y: _box(x, y, -0.85, 0.85, -0.9, 0.45) | (_box(x, y, -0.35, 0.35, 0.4, 0.85)
                                                              & ~_box(x, y, -0.2, 0.2, 0.4, 0.7)),
    "ladder": lambda x, y: _box(x, y, -0.65, -0.45, -0.95, 0.95) | _box(x, y, 0.45, 0.65, -0.95, 0.95)
    | (_box(x, y, -0.5, 0.5, -0.95, 0.95) & (np.mod(y + 1.0, 0.45) < 0.14)),
    "fence": lambda x, y: ((np.mod(x + 1.0, 0.5) < 0.22) & (y < 0.8) & (y > -0.95)) | _box(x, y, -0.95, 0.95, 0.2, 0.4)
    | _box(x, y, -0.95, 0.95, -0.55, -0.35),
    "tool": lambda x, y: _box(x, y, -0.08, 0.08, -0.95, 0.5) | _ellipse(x, y, 0, 0.6, 0.4, 0.35),
    "hammer": lambda x, y: _box(x, y, -0.08, 0.08, -0.95, 0.6) | _poly(x, y, [(-0.9, 0.5), (0.9, 0.5), (0.6, 0.9),
                                                                              (-0.6, 0.9)]),
    "cylinder": lambda x, y: _box(x, y, -0.75, 0.75, -0.6, 0.6) | _ellipse(x, y, 0, 0.6, 0.75, 0.25)
    | _ellipse(x, y, 0, -0.6, 0.75, 0.25),
    "guitar": lambda x, y: _disk(x, y, 0, -0.45, 0.48) | _disk(x, y, 0, 0.05, 0.36) | _box(x, y, -0.08, 0.08, 0, 0.95),
    "tower": lambda x, y: _poly(x, y, [(-0.5, -0.95), (0.5, -0.95), (0.25, 0.55), (-0.25, 0.55)])
    | _box(x, y, -0.35, 0.35, 0.5, 0.95),
    "crane": lambda x, y: _box(x, y, -0.6, -0.4, -0.95, 0.8) | _box(x, y, -0.9, 0.95, 0.65, 0.85)
    | _box(x, y, 0.6, 0.68, 0.0, 0.7) | _box(x, y, 0.5, 0.78, -0.15, 0.05),
    "airplane": lambda x, y: (_ellipse(x, y, 0, 0, 0.95, 0.2) | _poly(x, y, [(-0.2, 0), (0.25, 0), (-0.35, 0.85),
                                                                            (-0.5, 0.85)])
                              | _poly(x, y, [(-0.2, 0), (0.25, 0), (-0.35, -0.85), (-0.5, -0.85)])
                              | _poly(x, y, [(-0.95, 0), (-0.7, 0), (-0.9, 0.5)])),
    "crab": lambda x, y: (_ellipse(x, y, 0, -0.1, 0.6, 0.38) | _disk(x, y, -0.72, 0.45, 0.22) | _disk(x, y, 0.72, 0.45, 0.22)
                          | _band(x, y, -0.4, 0, -0.7, 0.4, 0.08) | _band(x, y, 0.4, 0, 0.7, 0.4, 0.08)
                          | _band(x, y, -0.4, -0.3, -0.9, -0.8, 0.07) | _band(x, y, 0.4, -0.3, 0.9, -0.8, 0.07)),
    "turtle": lambda x, y: (_disk(x, y, 0, -0.35, 0.75) & (y >= -0.35)) | _disk(x, y, 0.8, -0.2, 0.2)
    | _box(x, y, -0.6, -0.35, -0.7, -0.3) | _box(x, y, 0.3, 0.55, -0.7, -0.3),
    "jellyfish": lambda x, y: (_disk(x, y, 0, 0.1, 0.8) & (y >= 0.1)) | (_box(x, y, -0.65, 0.65, -0.95, 0.1)
                                                                         & (np.mod(x + 1.0, 0.4) < 0.12)),
    "microphone": lambda x, y: _disk(x, y, 0, 0.55, 0.4) | _box(x, y, -0.12, 0.12, -0.95, 0.3),
    "magnet": lambda x, y: (_disk(x, y, 0, -0.1, 0.85) & ~_disk(x, y, 0, -0.1, 0.42) & (y <= -0.1))
    | _box(x, y, -0.85, -0.42, -0.1, 0.9) | _box(x, y, 0.42, 0.85, -0.1, 0.9),
    "hourglass": lambda x, y: _poly(x, y, [(-0.8, 0.92), (0.8, 0.92), (0, 0)]) | _poly(x, y, [(-0.8, -0.92), (0.8, -0.92),
                                                                                            (0, 0)]),
    "pawn": lambda x, y: _disk(x, y, 0, 0.5, 0.3) | _poly(x, y, [(-0.6, -0.95), (0.6, -0.95), (0.15, 0.3), (-0.15, 0.3)]),
    "mask": lambda x, y: _ellipse(x, y, 0, 0, 0.85, 0.7) & ~_ellipse(x, y, -0.35, 0.15, 0.2, 0.14)
    & ~_ellipse(x, y, 0.35, 0.15, 0.2, 0.14),
    "easel": lambda x, y: _band(x, y, 0, 0.9, -0.7, -0.95, 0.08) | _band(x, y, 0, 0.9, 0.7, -0.95, 0.08)
    | _box(x, y, -0.6, 0.6, -0.2, 0.6),
    "sword": lambda x, y: _box(x, y, -0.1, 0.1, -0.4, 0.95) | _box(x, y, -0.5, 0.5, -0.55, -0.4)
    | _box(x, y, -0.08, 0.08, -0.95, -0.5),
    "headphones": lambda x, y: (_disk(x, y, 0, 0, 0.85) & ~_disk(x, y, 0, 0, 0.65) & (y >= 0))
    | _box(x, y, -0.95, -0.55, -0.55, 0.1) | _box(x, y, 0.55, 0.95, -0.55, 0.1),
    "anchor": lambda x, y: (_box(x, y, -0.1, 0.1, -0.8, 0.6) | (_disk(x, y, 0, 0.75, 0.22) & ~_disk(x, y, 0, 0.75, 0.1))
                            | _box(x, y, -0.45, 0.45, 0.3, 0.45)
                            | (_disk(x, y, 0, -0.2, 0.8) & ~_disk(x, y, 0, -0.2, 0.6) & (y <= -0.2))),
    "spectacles": lambda x, y: _disk(x, y, -0.5, 0, 0.42) | _disk(x, y, 0.5, 0, 0.42) | _box(x, y, -0.2, 0.2, 0.05, 0.2),
    "crescent_wide": lambda x, y: _ellipse(x, y, 0, 0, 0.95, 0.6) & ~_ellipse(x, y, 0.25, 0.1, 0.5, 0.32),
}

# -------------------------------------------------------------------------------------------- patterns
# A pattern marks the part of the icon drawn in the second colour (same coordinates as shapes).
PATTERNS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "solid": lambda x, y: np.zeros_like(x, dtype=bool),
    "hstripes": lambda x, y: np.mod(np.floor((y + 1.0) * 3.5), 2) == 1,
    "vstripes": lambda x, y: np.mod(np.floor((x + 1.0) * 3.5), 2) == 1,
    "dstripes": lambda x, y: np.mod(np.floor((x + y + 2.0) * 2.5), 2) == 1,
    "dots": lambda x, y: (np.mod(x + 1.0, 0.6) - 0.3) ** 2 + (np.mod(y + 1.0, 0.6) - 0.3) ** 2 < 0.14 ** 2,
    "checker": lambda x, y: np.mod(np.floor((x + 1.0) * 2.5) + np.floor((y + 1.0) * 2.5), 2) == 1,
    "center": lambda x, y: x * x + y * y < 0.36 ** 2,
    "tophalf": lambda x, y: y > 0.1,
    "lefthalf": lambda x, y: x < 0.0,
    "band": lambda x, y: np.abs(y) < 0.22,
    "cross_p": lambda x, y: (np.abs(x) < 0.12) | (np.abs(y) < 0.12),
}
