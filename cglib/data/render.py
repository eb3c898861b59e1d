"""Drawing the synthetic world: object icons (shape + colour + pattern) pasted on setting backgrounds, in numpy.

Every object named in the taxonomy has an `Icon` (`cglib.data.appearance`): one of ~50 silhouettes (`shapes`), a
main colour, a pattern (stripes, dots, checks, ...) in a second colour, and a thin dark edge so it stays visible on
any background. Icons are rasterised once per (object, size) with 4x4 supersampling and cached; a scene is then a
cached background plus a few alpha-blended pastes, so thousands of 64x64 images render in well under a second per
thousand.
Every setting has a `Setting`: a top and a bottom colour split at a horizon, each with a texture (`textures`:
planks, tiles, waves, grass, stars, ...), and the preposition captions use for it ("on a tennis court").
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from cglib.data.appearance import OBJECTS, SETTINGS
from cglib.data.shapes import PATTERNS, SHAPES
from cglib.data.textures import COLOURS, TEXTURES

SUPERSAMPLE = 4


# -------------------------------------------------------------------------------------------- drawing
def check_definitions() -> None:
    """Raise ValueError when an icon or setting names an unknown shape, pattern, colour or texture."""
    for name, icon in OBJECTS.items():
        for kind, value, table in (("shape", icon.shape, SHAPES), ("pattern", icon.pattern, PATTERNS),
                                   ("colour", icon.colour, COLOURS), ("colour", icon.secondary, COLOURS)):
            if value not in table:
                raise ValueError(f"object '{name}': unknown {kind} '{value}'; use one of {sorted(table)}")
    for name, setting in SETTINGS.items():
        for tex in (setting.top_texture, setting.bottom_texture):
            if tex not in TEXTURES:
                raise ValueError(f"setting '{name}': unknown texture '{tex}'; use one of {sorted(TEXTURES)}")


@lru_cache(maxsize=64)
def _supersampled_grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    n = size * SUPERSAMPLE
    coords = (np.arange(n, dtype=np.float32) + 0.5) / n * 2.0 - 1.0
    x, y = np.meshgrid(coords, -coords)  # y points up
    return x, y


@lru_cache(maxsize=2048)
def _shape_masks(shape: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Supersampled silhouette of `shape` and its interior without a rim of about one output pixel."""
    x, y = _supersampled_grid(size)
    mask = SHAPES[shape](x, y)
    rim, n = SUPERSAMPLE, mask.shape[0]
    padded = np.pad(mask, rim)
    inner = mask.copy()
    for dy, dx in ((rim, 0), (-rim, 0), (0, rim), (0, -rim)):
        inner &= padded[rim + dy:rim + dy + n, rim + dx:rim + dx + n]
    return mask, inner


@lru_cache(maxsize=1024)
def _pattern_mask(pattern: str, size: int) -> np.ndarray:
    return PATTERNS[pattern](*_supersampled_grid(size))


def _coverage(mask: np.ndarray, size: int) -> np.ndarray:
    """Fraction of each output pixel's SUPERSAMPLE x SUPERSAMPLE block covered by `mask`."""
    blocks = mask.reshape(size, SUPERSAMPLE, size, SUPERSAMPLE)
    return blocks.sum(axis=3, dtype=np.uint8).sum(axis=1, dtype=np.uint8) / np.float32(SUPERSAMPLE ** 2)


@lru_cache(maxsize=4096)
def icon_sprite(obj: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The object's icon at `size` px: premultiplied colour float32 (size, size, 3) and alpha float32 (size, size)."""
    if obj not in OBJECTS:
        raise KeyError(f"no icon for object '{obj}'; add it to cglib/data/appearance.py::_OBJECT_TABLE")
    icon = OBJECTS[obj]
    mask, inner = _shape_masks(icon.shape, size)
    pattern = _pattern_mask(icon.pattern, size)
    # Three colours: main, pattern, and a dark rim that keeps light icons visible on light backgrounds.
    main, second = np.array(COLOURS[icon.colour], np.float32), np.array(COLOURS[icon.secondary], np.float32)
    parts = [(inner & ~pattern, main), (inner & pattern, second), (mask & ~inner, main * 0.45)]
    premult = np.zeros((size, size, 3), dtype=np.float32)
    for part, colour in parts:
        premult += _coverage(part, size)[..., None] * colour
    alpha = _coverage(mask, size).astype(np.float32)
    return premult, alpha


@lru_cache(maxsize=512)
def background(setting: str, size: int) -> np.ndarray:
    """The setting's background at `size` px, uint8 (size, size, 3); the same for every image of the setting."""
    if setting not in SETTINGS:
        raise KeyError(f"no background for setting '{setting}'; add it to cglib/data/appearance.py::_SETTING_TABLE")
    s = SETTINGS[setting]
    rng = np.random.default_rng(zlib.crc32(setting.encode()))
    img = np.empty((size, size, 3), dtype=np.float32)
    split = round(s.horizon * size)
    img[:split] = s.top
    img[split:] = s.bottom
    if split > 0:
        TEXTURES[s.top_texture](img[:split], rng, size)
    if split < size:
        TEXTURES[s.bottom_texture](img[split:], rng, size)
    return np.clip(img, 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class Placement:
    """One drawn object instance: top-left corner, side in pixels, mirrored or not, brightness factor."""

    obj: str
    x: int
    y: int
    size: int
    flip: bool = False
    shade: float = 1.0


def render_scene(setting: str, placements: list[Placement] | tuple[Placement, ...], size: int,
                 brightness: float = 0.0) -> np.ndarray:
    """Draw `placements` in order over the setting's background; uint8 (size, size, 3)."""
    img = background(setting, size).astype(np.float32)
    if brightness:
        img += brightness
    for p in placements:
        if p.x < 0 or p.y < 0 or p.x + p.size > size or p.y + p.size > size:
            raise ValueError(f"placement of '{p.obj}' at ({p.x}, {p.y}) size {p.size} leaves the {size}px image")
        colour, alpha = icon_sprite(p.obj, p.size)
        if p.flip:
            colour, alpha = colour[:, ::-1], alpha[:, ::-1]
        region = img[p.y:p.y + p.size, p.x:p.x + p.size]
        region *= 1.0 - alpha[..., None]
        region += colour * p.shade
    return np.clip(img, 0, 255).astype(np.uint8)
