"""Figures and tables of an abstraction run for notebook 02 (the numbers come from cglib.llm.engine)."""

from __future__ import annotations

from collections import Counter

import pandas as pd
from matplotlib.figure import Figure

from cglib.figure_data import replottable
from cglib.llm.cache import rebuilt_message
from cglib.llm.chains import chain_agreement, level_counts
from cglib.llm.engine import AbstractionResult


def abstraction_figure(chains: dict[str, list[str]], l_max: int, ground_truth: dict[str, list[str]] | None = None,
                       top: int = 15) -> Figure:
    """Distinct concepts per level (beside the ground truth's), the most common l1 concepts, and, with ground
    truth, the agreement per level."""
    counts = pd.DataFrame(level_counts(chains, l_max))
    agreement = pd.DataFrame(chain_agreement(chains, ground_truth, l_max)) if ground_truth is not None else None
    l1 = pd.DataFrame(Counter(c[0] for c in chains.values() if c).most_common(top), columns=["concept", "images"])
    return draw_abstraction(counts, l1, agreement)


@replottable
def draw_abstraction(counts: pd.DataFrame, l1: pd.DataFrame, agreement: pd.DataFrame | None = None) -> Figure:
    """The figure of `abstraction_figure` from `level_counts`, the most common l1 concepts (concept, images) and,
    with ground truth, `chain_agreement`."""
    import matplotlib.pyplot as plt

    # two rows fit a 1,300 px page at 150 dpi: the per-level panels side by side, the l1 concepts under them
    fig = plt.figure(figsize=(8.4, 6.8))
    grid = fig.add_gridspec(2, 2, height_ratios=(1.0, 1.25))
    axes = [fig.add_subplot(grid[0, 0] if agreement is not None else grid[0, :]), fig.add_subplot(grid[1, :])]
    if agreement is not None:
        axes.append(fig.add_subplot(grid[0, 1]))
    levels = [f"l{k}" for k in counts["level"]]
    axes[0].bar(levels, counts["distinct_concepts"], label="chains")
    if agreement is not None:
        agree = agreement
        axes[0].plot(levels, agree["distinct_truth"], "o--", color="black", label="ground truth")
        axes[0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)  # under the data
    axes[0].set(title="distinct concepts per level", ylabel="concepts")
    axes[1].barh(l1["concept"].tolist()[::-1], l1["images"].tolist()[::-1])
    axes[1].set(title=f"most common l1 concepts (top {len(l1)})", xlabel="images")
    if agreement is not None:
        axes[2].bar(levels, agree["accuracy"])
        axes[2].set(title="agreement with ground truth", ylabel="accuracy", ylim=(0, 1.1))
        for x, y in zip(levels, agree["accuracy"]):
            axes[2].annotate(f"{y:.2f}", (x, y), ha="center", va="bottom")
    fig.tight_layout()
    return fig


def summary_table(result: AbstractionResult) -> pd.DataFrame:
    """The headline numbers of a run as a two-column table."""
    s = result.summary
    rows = [("backend / model", f"{s['backend']} / {s['model']}"), ("prompt version", s["prompt_version"]),
            ("images", s["images"]), ("chains", s["chains"]), ("failed images", s["failed_images"]),
            ("cache hits / misses", f"{s['cache']['hits']} / {s['cache']['misses']}"),
            ("requests (incl. retries)", s["requests"]), ("retries by reason", s["retries_by_reason"] or "-"),
            ("tokens in / out", f"{s['tokens']['input']:,} / {s['tokens']['output']:,}"),
            ("cost this run (USD)", s["cost_usd"]), ("wall time (s)", s["wall_s"])]
    account = s.get("account")
    if account:  # every item where it ended, counted as it happened (cglib.llm.engine.Stats.account)
        failed = ", ".join(f"{k}: {v}" for k, v in account["failed_by_reason"].items())
        rows += [("items (images x levels)", f"{account['items']:,}" + ("" if account["adds_up"] else
                                                                          " (the counts below DO NOT ADD UP)")),
                 ("cached: answers / failures", f"{account['cached']:,} / {account['cached_failures']:,}"),
                 ("sent: answered / failed", f"{account['answered']:,} / {account['failed']:,}"
                  + (f" ({failed})" if failed else "")),
                 ("never asked (stopped) / not needed (failed level)",
                  f"{account['never_asked']:,} / {account['not_needed']:,}")]
    if s.get("cache_rebuilt"):
        rows.append(("cache rebuilt", rebuilt_message(s["cache_rebuilt"])))
    estimate = s.get("estimate_before_run")
    if estimate:  # every request still to be made when the run started, LLM_gen included
        text = (f"{estimate['cost_usd']} ({estimate['requests']:,} requests, "
                f"{estimate['generalize']['requests']:,} of them LLM_gen)")
        rows.append(("estimate before run (USD)", text))
    if s.get("note"):
        rows.append(("note", s["note"]))
    return pd.DataFrame(rows, columns=["", "value"]).set_index("")


def sample_table(chains: dict[str, list[str]], captions: dict[str, list[str]], image_ids: list[str],
                 ground_truth: dict[str, list[str]] | None = None) -> pd.DataFrame:
    """One row per image: its first caption, its chain, and (synthetic world) its ground-truth l1."""
    rows = []
    for i in image_ids:
        chain = chains.get(i)
        row = {"image": i, "caption": captions[i][0]}
        row.update({f"l{k + 1}": c for k, c in enumerate(chain)} if chain else {"l1": "(failed)"})
        if ground_truth is not None:
            row["true l1"] = ground_truth.get(i, [None])[0]
        rows.append(row)
    return pd.DataFrame(rows).set_index("image")
