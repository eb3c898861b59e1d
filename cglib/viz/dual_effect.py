"""The paper's "dual effect" (Fig. 2) in miniature: optimize a few dozen 3-D points with each loss and measure
how the groups tighten (within-group spread) and separate (distance between group centroids)."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from cglib.figure_data import replottable
from cglib.losses import centroid_group_loss, clip_loss, pairwise_group_loss
from cglib.train.objectives import OBJECTIVES, GroupFeatures, objective_with

# the paper's image-text objectives (no related method, no text-only one), in the registry's order
LOSS_NAMES = tuple(name for name, cls in OBJECTIVES.items() if cls.phase == "train" and not cls.related)


@dataclass
class DualEffect:
    """Unit-vector points before and after optimizing one loss, (M, N, D) per modality, and their geometry."""

    loss: str
    image_before: np.ndarray
    text_before: np.ndarray
    image_after: np.ndarray
    text_after: np.ndarray
    final_loss: float

    def geometry(self) -> dict[str, float]:
        """Geometry before and after, keys `<metric>_before` / `<metric>_after` (see `group_geometry`)."""
        before = group_geometry(self.image_before, self.text_before)
        after = group_geometry(self.image_after, self.text_after)
        return {**{f"{k}_before": v for k, v in before.items()}, **{f"{k}_after": v for k, v in after.items()}}


def group_geometry(image: np.ndarray, text: np.ndarray) -> dict[str, float]:
    """Geometry of unit vectors (M, N, D) per modality, images and texts of a group pooled: within-group spread
    (mean distance to the group's mean), mean distance between group means, their ratio (separation), and the
    mean image-text cosine of the pairs."""
    points = np.concatenate([image, text], axis=1)  # (M, 2N, D)
    centroids = points.mean(axis=1)  # not renormalized: a scattered group has a short mean
    spread = float(np.linalg.norm(points - centroids[:, None], axis=-1).mean())
    m = centroids.shape[0]
    gaps = np.linalg.norm(centroids[:, None] - centroids[None], axis=-1)[np.triu_indices(m, k=1)]
    gap = float(gaps.mean()) if m > 1 else 0.0
    return {"within_group_spread": spread, "centroid_distance": gap, "separation": gap / max(spread, 1e-12),
            "pair_cosine": float((image * text).sum(-1).mean())}


def _loss_fn(loss: str, tau: float, tau_inner: float, alpha: float, alpha_on: str, normalize_products: bool):
    """The objective `loss` of the registry as a function of (image, text) points."""
    if loss not in LOSS_NAMES:
        raise ValueError(f"loss must be one of {LOSS_NAMES}, got {loss!r}")
    objective = objective_with(loss, tau, tau_inner=tau_inner, alpha=alpha, alpha_on=alpha_on,
                               normalize_products=normalize_products)
    return lambda image, text: objective(GroupFeatures(image, text))["loss"]


def optimize_points(loss: str, *, groups: int = 4, pairs: int = 6, dim: int = 3, steps: int = 300, lr: float = 0.05,
                    start_spread: float = 0.7, tau: float = 0.1, tau_inner: float = 0.1, alpha: float = 0.7,
                    alpha_on: str = "inner", normalize_products: bool = False, seed: int = 0) -> DualEffect:
    """Start from random points around one pole (`start_spread`: noise scale; the same start for every loss
    given the seed), so that groups begin mixed, and run Adam on one loss for `steps` steps."""
    fn = _loss_fn(loss, tau, tau_inner, alpha, alpha_on, normalize_products)
    gen = torch.Generator().manual_seed(seed)
    pole = F.one_hot(torch.tensor(dim - 1), dim).float()
    image = (pole + start_spread * torch.randn(groups, pairs, dim, generator=gen)).requires_grad_()
    text = (pole + start_spread * torch.randn(groups, pairs, dim, generator=gen)).requires_grad_()
    before = [F.normalize(x.detach(), dim=-1).numpy().copy() for x in (image, text)]
    optimizer = torch.optim.Adam([image, text], lr=lr)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a few dozen points: threads only add synchronization, badly so on a busy machine
    try:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            value = fn(image, text)
            value.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    after = [F.normalize(x.detach(), dim=-1).numpy() for x in (image, text)]
    return DualEffect(loss, before[0], before[1], after[0], after[1], fn(image, text).item())


def geometry_table(results: list[DualEffect]) -> pd.DataFrame:
    """One row per loss: spread, centroid distance and pair cosine before and after optimization."""
    return pd.DataFrame([{"loss": r.loss, **r.geometry()} for r in results]).set_index("loss")


def geometry_takeaways(geometry: pd.DataFrame) -> list[str]:
    """One sentence per loss from `geometry_table`: how the within-group spread and the separation changed (as
    factors of their start) and the pair cosine, with the direction said in words."""
    out = []
    for loss, r in geometry.iterrows():
        spread = r["within_group_spread_after"] / r["within_group_spread_before"]
        separation = r["separation_after"] / r["separation_before"]
        out.append(f"{loss}: within-group spread x{spread:.2f} ({'tighter' if spread < 1 else 'looser'} groups), "
                   f"separation x{separation:.2f} (group means {'further apart' if separation > 1 else 'closer'} "
                   f"relative to the spread), image-text pair cosine {r['pair_cosine_before']:.2f} -> "
                   f"{r['pair_cosine_after']:.2f}.")
    return out


def equal_area_map(points: np.ndarray) -> np.ndarray:
    """Lambert azimuthal equal-area map of unit 3-D vectors centred on +z: the whole sphere onto a disc of radius 2
    (the equator at radius sqrt(2), -z on the rim), so no point hides behind the sphere."""
    x, y, z = points[..., 0], points[..., 1], points[..., 2]
    scale = np.sqrt(2.0 / np.clip(1.0 + z, 1e-9, None))
    return np.stack([scale * x, scale * y], axis=-1)


def _map_panel(ax, image: np.ndarray, text: np.ndarray, title: str) -> None:
    for radius, style in ((2.0, "-"), (np.sqrt(2.0), ":")):
        ax.add_patch(plt.Circle((0, 0), radius, fill=False, color="0.6", linestyle=style, linewidth=0.8))
    colors = sns.color_palette("colorblind", image.shape[0])
    for g, color in enumerate(colors):
        for points, marker in ((image[g], "o"), (text[g], "^")):
            xy = equal_area_map(points)
            ax.scatter(xy[:, 0], xy[:, 1], color=color, marker=marker, s=36, edgecolor="k", linewidth=0.4)
    ax.set_xlim(-2.1, 2.1)
    ax.set_ylim(-2.1, 2.1)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    ax.set_title(title, fontsize=10)


def plot_dual_effect(results: list[DualEffect]) -> Figure:
    """The shared start and the end state of each loss, 3-D unit vectors on an equal-area map of the sphere
    (colour = group, o image, ^ text; dotted circle = equator, solid = the opposite pole)."""
    if not results:
        raise ValueError("plot_dual_effect needs at least one DualEffect result")
    if results[0].image_before.shape[-1] != 3:
        raise ValueError(f"plot_dual_effect draws 3-D points, got dimension {results[0].image_before.shape[-1]}")
    panels = [("start", results[0].image_before, results[0].text_before)]
    panels += [(f"after {r.loss}", r.image_after, r.text_after) for r in results]
    rows = [{"panel": name, "modality": modality, "group": g, "pair": k, "x": p[0], "y": p[1], "z": p[2]}
            for name, image, text in panels for modality, points in (("image", image), ("text", text))
            for g, group in enumerate(points) for k, p in enumerate(group)]
    return draw_dual_effect(pd.DataFrame(rows))


def _points(rows: pd.DataFrame) -> np.ndarray:
    """(groups, pairs, 3) unit vectors of one panel and modality of `draw_dual_effect`'s table."""
    ordered = rows.sort_values(["group", "pair"])
    return ordered[["x", "y", "z"]].to_numpy(float).reshape(ordered["group"].nunique(), -1, 3)


@replottable
def draw_dual_effect(points: pd.DataFrame) -> Figure:
    """The figure of `plot_dual_effect` from one row per point (panel, modality, group, pair, x, y, z)."""
    names = list(dict.fromkeys(points["panel"]))
    panels = [(name, _points(points[(points["panel"] == name) & (points["modality"] == "image")]),
               _points(points[(points["panel"] == name) & (points["modality"] == "text")])) for name in names]
    # at most 3 panels a row, rows evenly filled (4 panels: 2 x 2), so the figure fits a 1,300 px page at 150 dpi
    nrows = -(-len(panels) // 3)
    ncols = -(-len(panels) // nrows)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.8 * ncols, 3.2 * nrows), squeeze=False)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    for ax, (name, image, text) in zip(axes.ravel(), panels):
        geometry = group_geometry(image, text)
        _map_panel(ax, image, text, f"{name}\nspread {geometry['within_group_spread']:.2f}, "
                                    f"separation {geometry['separation']:.2f}")
    handles = [plt.Line2D([], [], marker=m, linestyle="", color="0.3", label=lab)
               for m, lab in (("o", "image"), ("^", "text"))]
    fig.legend(handles=handles, loc="lower center", ncol=2, frameon=False, bbox_to_anchor=(0.5, -0.04))
    fig.tight_layout()
    return fig


def group_batch(groups: int, pairs: int, dim: int, noise: float = 1.0, seed: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """A toy (M, N, L) batch with group structure: every image and text of group g is g's direction plus noise."""
    gen = torch.Generator().manual_seed(seed)
    directions = torch.randn(groups, 1, dim, generator=gen)
    image = directions + noise * torch.randn(groups, pairs, dim, generator=gen)
    text = directions + noise * torch.randn(groups, pairs, dim, generator=gen)
    return image, text


def loss_variants_table(image: torch.Tensor, text: torch.Tensor, tau: float, tau_inner: float,
                        alpha: float) -> pd.DataFrame:
    """Loss, inner and outer terms of every loss variant (paper vs authors' options) on one batch."""
    rows = [{"loss": "clip", "alpha_on": "-", "normalize_products": "-", "loss_value": clip_loss(image, text, tau).item(),
             "inner": np.nan, "outer": np.nan}]
    for alpha_on in ("inner", "outer"):
        for normalize_products in (False, True):
            parts = pairwise_group_loss(image, text, tau, tau_inner, alpha, alpha_on=alpha_on,
                                        normalize_products=normalize_products, return_parts=True)
            rows.append({"loss": "pairwise", "alpha_on": alpha_on, "normalize_products": normalize_products,
                         "loss_value": parts["loss"].item(), "inner": parts["inner"].item(),
                         "outer": parts["outer"].item()})
    for alpha_on in ("inner", "outer"):
        parts = centroid_group_loss(image, text, tau, tau_inner, alpha, alpha_on=alpha_on, return_parts=True)
        rows.append({"loss": "centroid", "alpha_on": alpha_on, "normalize_products": "-",
                     "loss_value": parts["loss"].item(), "inner": parts["inner"].item(), "outer": parts["outer"].item()})
    return pd.DataFrame(rows)
