"""The synthetic world's palette and its background textures (planks, tiles, waves, grass, stars, ...).

A texture paints over one region (float32 (h, w, 3), values 0-255) of a background, in place; `TEXTURES` maps
each name a setting may use (`cglib.data.render`'s setting table) to its function.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 38, 38), "dark red": (130, 20, 30), "orange": (245, 135, 25), "yellow": (248, 214, 40),
    "gold": (205, 165, 45), "beige": (222, 200, 160), "light green": (150, 225, 100), "green": (40, 160, 60),
    "dark green": (25, 90, 45), "teal": (25, 155, 150), "light blue": (135, 195, 245), "blue": (40, 85, 215),
    "navy": (25, 35, 105), "purple": (135, 55, 185), "pink": (245, 135, 185), "brown": (125, 75, 35),
    "black": (28, 28, 28), "grey": (130, 130, 135), "silver": (195, 198, 205), "white": (248, 248, 248),
}


# A texture paints over one region (float32 (h, w, 3), values 0-255) of a background, in place. `rng` is seeded
# from the setting's name, so a setting always looks the same; `size` is the full image side.
def _shade(region: np.ndarray, mask: np.ndarray, amount: float) -> None:
    region[mask] = region[mask] * (1.0 + amount) if amount < 0 else region[mask] + (255.0 - region[mask]) * amount


def _grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    return np.mgrid[0:h, 0:w].astype(np.float32)


def _tex_plain(region, rng, size):
    pass


def _tex_noise(region, rng, size):
    region += rng.normal(0.0, 9.0, region.shape[:2])[..., None]


def _tex_speckle(region, rng, size):
    mask = rng.random(region.shape[:2]) < 0.12
    _shade(region, mask, -0.25)


def _tex_grass(region, rng, size):
    h, w = region.shape[:2]
    ticks = (rng.random((h, w)) < 0.18) & (np.arange(h)[:, None] % 2 == 0)
    _shade(region, ticks | np.roll(ticks, 1, axis=0), -0.3)


def _tex_planks(region, rng, size):
    _, xx = _grid(*region.shape[:2])
    _shade(region, np.mod(xx, max(3, size // 8)) == 0, -0.35)


def _tex_boards(region, rng, size):
    yy, _ = _grid(*region.shape[:2])
    _shade(region, np.mod(yy, max(3, size // 10)) == 0, -0.3)


def _tex_tiles(region, rng, size):
    yy, xx = _grid(*region.shape[:2])
    step = max(4, size // 8)
    _shade(region, (np.mod(yy, step) == 0) | (np.mod(xx, step) == 0), -0.2)


def _tex_checker(region, rng, size):
    yy, xx = _grid(*region.shape[:2])
    step = max(3, size // 10)
    _shade(region, np.mod(yy // step + xx // step, 2) == 1, -0.25)


def _tex_vstripes(region, rng, size):
    _, xx = _grid(*region.shape[:2])
    _shade(region, np.mod(xx // max(2, size // 16), 2) == 1, -0.2)


def _tex_waves(region, rng, size):
    yy, xx = _grid(*region.shape[:2])
    crest = np.mod(yy + 1.5 * np.sin(xx * 12.0 / size * np.pi), max(4, size // 10)) < 1.0
    _shade(region, crest, 0.35)


def _tex_stars(region, rng, size):
    _shade(region, rng.random(region.shape[:2]) < 0.025, 0.9)


def _tex_bubbles(region, rng, size):
    yy, xx = _grid(*region.shape[:2])
    mask = np.zeros(region.shape[:2], dtype=bool)
    for cy, cx in rng.random((10, 2)) * np.array(region.shape[:2]):
        r = size / 40
        ring = np.abs(np.hypot(yy - cy, xx - cx) - r) < 0.7
        mask |= ring
    _shade(region, mask, 0.5)
    region[:] = region * (0.75 + 0.25 * (1 - yy / max(1, region.shape[0])))[..., None]


def _tex_dashes(region, rng, size):
    yy, xx = _grid(*region.shape[:2])
    mid = region.shape[0] / 2
    mask = (np.abs(yy - mid) < max(1, size / 40)) & (np.mod(xx, max(6, size // 5)) < max(3, size // 10))
    region[mask] = (235, 225, 120)


def _tex_centerline(region, rng, size):
    yy, xx = _grid(*region.shape[:2])
    mid = region.shape[0] / 2
    mask = (np.abs(yy - mid) < max(1, size / 32)) & (np.mod(xx, max(8, size // 4)) < max(5, size // 7))
    region[mask] = (250, 250, 250)


def _tex_lines(region, rng, size):
    h, w = region.shape[:2]
    yy, xx = _grid(h, w)
    mask = (np.abs(xx - w * 0.1) < 1) | (np.abs(xx - w * 0.9) < 1) | (np.abs(yy - h * 0.5) < 1) | (yy > h - 2)
    region[mask] = (240, 240, 240)


def _tex_mowing(region, rng, size):
    _, xx = _grid(*region.shape[:2])
    _shade(region, np.mod(xx // max(3, size // 8), 2) == 1, 0.15)


def _tex_slope(region, rng, size):
    yy, xx = _grid(*region.shape[:2])
    _shade(region, np.mod(xx + yy, max(6, size // 5)) < 1, -0.08)


def _tex_scratches(region, rng, size):
    yy, xx = _grid(*region.shape[:2])
    _shade(region, np.mod(xx - 2 * yy + rng.integers(0, 3, yy.shape), max(7, size // 4)) < 1, 0.5)


def _tex_peaks(region, rng, size):
    h, w = region.shape[:2]
    yy, xx = _grid(h, w)
    ridge = h * (0.35 + 0.4 * np.abs(np.mod(xx / (w / 2.5), 2.0) - 1.0))
    _shade(region, yy > ridge, -0.3)
    _shade(region, (yy > ridge) & (yy < ridge + h * 0.12), 0.7)


def _tex_blocks(region, rng, size):
    h, w = region.shape[:2]
    yy, xx = _grid(h, w)
    heights = rng.uniform(0.2, 0.8, 6) * h
    tops = heights[np.minimum((xx / (w / 6)).astype(int), 5)]
    building = yy > h - tops
    region[building] = (120, 112, 110)
    windows = building & (np.mod(yy, 4) < 2) & (np.mod(xx, 4) < 2)
    region[windows] = (235, 220, 140)


def _tex_windows(region, rng, size):
    yy, xx = _grid(*region.shape[:2])
    step = max(5, size // 6)
    _shade(region, (np.mod(yy, step) > 1) & (np.mod(xx, step) > 1) & (yy < region.shape[0] - 2), 0.4)


def _tex_grid(region, rng, size):
    yy, xx = _grid(*region.shape[:2])
    step = max(4, size // 6)
    _shade(region, (np.mod(yy, step) == 0) | (np.mod(xx, step) == 0), -0.15)


def _tex_arches(region, rng, size):
    h, w = region.shape[:2]
    yy, xx = _grid(h, w)
    period = w / 3
    local = np.mod(xx, period) - period / 2
    arch = (np.abs(local) < period * 0.28) & (yy > h * 0.25) & ((yy - h * 0.45) ** 2 + local ** 2 < (period * 0.28) ** 2
                                                               + (yy > h * 0.45) * 1e9)
    region[arch] = (150, 190, 230)


def _tex_trunks(region, rng, size):
    h, w = region.shape[:2]
    _, xx = _grid(h, w)
    centres = rng.uniform(0, w, 7)
    widths = rng.uniform(1.0, max(1.5, size / 30), 7)
    trunk = np.zeros((h, w), dtype=bool)
    for c, wd in zip(centres, widths):
        trunk |= np.abs(xx - c) < wd
    region[trunk] = (80, 55, 30)
    _shade(region, rng.random((h, w)) < 0.15, 0.25)


def _tex_crowd(region, rng, size):
    h, w = region.shape[:2]
    colours = np.array([COLOURS[c] for c in ("red", "white", "blue", "yellow", "black")], dtype=np.float32)
    dots = rng.random((h, w)) < 0.35
    region[dots] = colours[rng.integers(0, len(colours), int(dots.sum()))]


def _tex_flowers(region, rng, size):
    h, w = region.shape[:2]
    colours = np.array([COLOURS[c] for c in ("pink", "yellow", "white", "purple")], dtype=np.float32)
    dots = rng.random((h, w)) < 0.06
    region[dots] = colours[rng.integers(0, len(colours), int(dots.sum()))]


def _tex_rows(region, rng, size):
    yy, xx = _grid(*region.shape[:2])
    _shade(region, (np.mod(yy, 4) < 2) & (np.mod(xx, 3) < 2), -0.35)


def _tex_rails(region, rng, size):
    h, w = region.shape[:2]
    yy, xx = _grid(h, w)
    mask = (np.abs(yy - h * 0.55) < 0.8) | (np.abs(yy - h * 0.8) < 0.8)
    sleepers = (yy > h * 0.5) & (yy < h * 0.85) & (np.mod(xx, max(4, size // 10)) < 1.5)
    region[sleepers] = (95, 70, 50)
    region[mask] = (60, 60, 65)


def _tex_edge(region, rng, size):
    yy, _ = _grid(*region.shape[:2])
    region[yy < max(2, size / 20)] = (240, 205, 40)


def _tex_reeds(region, rng, size):
    h, w = region.shape[:2]
    cols = rng.random(w) < 0.3
    heights = rng.uniform(0.2, 0.7, w) * h
    yy, _ = _grid(h, w)
    reed = cols[None, :] & (yy < heights[None, :])
    region[reed] = (95, 120, 50)
    _shade(region, (yy > h * 0.6) & (np.mod(yy, 3) == 0), 0.2)


def _tex_straw(region, rng, size):
    yy, xx = _grid(*region.shape[:2])
    _shade(region, np.mod(xx + rng.integers(0, 2, yy.shape), 3) == 0, -0.2)


def _tex_rowsdots(region, rng, size):
    yy, _ = _grid(*region.shape[:2])
    _shade(region, np.mod(yy, max(4, size // 8)) < 1.5, -0.3)


def _tex_scaffold(region, rng, size):
    h, w = region.shape[:2]
    yy, xx = _grid(h, w)
    step = max(5, size // 6)
    mask = ((np.mod(xx, step) < 1) | (np.mod(yy, step) < 1)) & (xx > w * 0.45) & (yy > h * 0.2)
    region[mask] = (200, 120, 40)


def _tex_dots(region, rng, size):
    yy, xx = _grid(*region.shape[:2])
    step = max(4, size // 8)
    _shade(region, (np.mod(yy, step) < 1.5) & (np.mod(xx + (yy // step) % 2 * step / 2, step) < 1.5), 0.35)


def _tex_spot(region, rng, size):
    h, w = region.shape[:2]
    yy, xx = _grid(h, w)
    beam = np.abs(xx - w / 2) < (yy / max(1, h)) * w * 0.3 + 2
    _shade(region, beam, 0.25)


def _tex_spatter(region, rng, size):
    h, w = region.shape[:2]
    colours = np.array([COLOURS[c] for c in ("red", "blue", "yellow", "green")], dtype=np.float32)
    dots = rng.random((h, w)) < 0.03
    region[dots] = colours[rng.integers(0, len(colours), int(dots.sum()))]


TEXTURES: dict[str, Callable[[np.ndarray, np.random.Generator, int], None]] = {
    name.removeprefix("_tex_"): fn for name, fn in globals().items() if name.startswith("_tex_")
}
