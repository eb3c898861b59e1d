"""MAGIC figures, merge log and the ipywidgets explorer, all headless."""

from __future__ import annotations

import matplotlib.pyplot as plt
from factories import tiny_magic
from test_magic import _built

from cglib.magic.plots import draw_subtree, merge_log, plot_level_distributions, subtree
from cglib.viz.magic_explorer import describe_node, magic_explorer, node_html


def test_level_plot_and_subtree_drawing_build_headless():
    """The per-level figure has one panel per level plus the node counts; the subtree holds the root's primary
    descendants with their edges, and draws."""
    magic, _ = tiny_magic()
    fig = plot_level_distributions(magic, size_min=5)
    assert len(fig.axes) == magic.l_max + 1
    plt.close(fig)
    graph = subtree(magic, "l3:leisure")
    assert set(graph.nodes) == {"l3:leisure", "l2:sport", "l1:tennis match", "l1:ski trip"}
    assert graph.edges["l1:ski trip", "l2:sport"]["primary"]
    graph = subtree(magic, "l4:human activity", max_per_node=1)
    assert sum(1 for _, lvl in graph.nodes(data="level") if lvl == 1) == 1
    fig = draw_subtree(magic, "l4:human activity")
    plt.close(fig)


def test_merge_log_lists_merges_and_removals():
    """The merge log has one row per merge and per removal, with the similarity that decided it."""
    magic = _built()
    log = merge_log(magic)
    assert len(log) == len(magic.merges) + len(magic.removals)
    assert set(log["action"]) == {"merge", "remove"}
    assert log.loc[log["action"] == "merge", "into"].tolist() == [m.target for m in magic.merges]


def test_explorer_shows_chain_negatives_and_generalized_captions_headless():
    """describe_node gathers chain, parents, images, generalized captions and negatives; the widget builds
    without a browser, switching level refills the node list, and show() renders the summary."""
    magic, dataset = tiny_magic()
    info = describe_node(magic, "l1:wedding")
    assert info["chain"] == ["wedding", "celebration", "social gathering", "human activity"]
    assert info["hard_negatives"] == [("l1:birthday party", 0.9)]
    assert info["n_train"] + info["n_test"] == info["n_images"] == 8
    text = node_html(info)
    assert "celebration" in text and "birthday party" in text and "a scene with wedding things" in text
    explorer = magic_explorer(magic, dataset, max_images=3)
    assert explorer.node.value.startswith("l1:")
    explorer.level.value = 3
    assert {v for _, v in explorer.node.options} == {"l3:leisure", "l3:social gathering"}
    assert "l3:" in explorer.summary.value
    shown = explorer.show("l2:meal")
    assert shown["children"] == ["l1:breakfast", "l1:picnic"] and len(shown["images"]) == 3


def test_example_tables_show_generalized_captions_and_negatives():
    """The notebook's tables: original vs generalized captions of the largest groups; negatives with cosines."""
    from cglib.magic.plots import generalized_examples, negatives_table

    magic, _ = tiny_magic()
    examples = generalized_examples(magic, n_nodes=2, n_captions=2)
    assert len(examples) == 4 and examples["generalized caption"].str.len().gt(0).all()
    table = negatives_table(magic, level=1, n_nodes=6)
    assert table.set_index("node").loc["wedding", "hard negatives"] == "birthday party (0.90)"
