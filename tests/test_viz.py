"""Visualization: attention extraction and rollout, UMAP of centroids, the measured dual effect, the explorer."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")

import ipywidgets as widgets
import numpy as np
import pytest
import torch
from open_clip.modified_resnet import ModifiedResNet

from cglib.config import ModelParams
from cglib.encoding import encode_images, encode_texts, pixels_to_tensor
from cglib.models import ClipModel, build_model
from cglib.viz.attention import (
    attention_rollout,
    choose_attention_images,
    extract_attention,
    plot_attention_grid,
    plot_attention_heads,
    vision_transformer,
)
from cglib.viz.explorer import ConceptExplorer, build_explorer
from cglib.viz.umap_centroids import (
    GroupEmbeddings,
    UmapPanel,
    dual_effect_summary,
    dual_effect_table,
    embed_groups,
    group_centroids,
    group_texts,
    plot_measured_dual_effect,
    plot_umap_panels,
    procrustes_align,
    readable_labels,
    spread_and_separation,
    trust_score,
    umap_layout,
)
from tests.factories import tiny_magic


@pytest.fixture(scope="module")
def data():
    return tiny_magic()


@pytest.fixture(scope="module")
def tiny_clip() -> ClipModel:
    torch.manual_seed(0)
    return build_model(ModelParams(name="cglib-tiny-clip", text_tower="open_clip"))


@pytest.fixture(scope="module")
def tiny_vit() -> ClipModel:
    torch.manual_seed(1)
    return build_model(ModelParams(name="cglib-tiny-vit", text_tower="minilm"))


def _pixels(n: int = 3, size: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)


# ------------------------------------------------------------------------------------------ attention
@pytest.mark.parametrize("which", ["tiny_clip", "tiny_vit"])
def test_extraction_leaves_model_outputs_unchanged(which, request):
    """Reading attention through hooks changes nothing: the tower's output and encode_images are bit-identical."""
    bundle = request.getfixturevalue(which)
    pixels = _pixels()
    before = encode_images(bundle, pixels)
    with torch.no_grad():
        bundle.model.eval()
        reference = bundle.model.visual(pixels_to_tensor(pixels, bundle))
    maps = extract_attention(bundle, pixels)
    after = encode_images(bundle, pixels)
    assert torch.equal(maps.image_embeddings, reference)
    assert np.array_equal(before, after)
    assert not bundle.model.visual.transformer.resblocks[0].ln_1._forward_hooks  # hooks removed


def test_per_head_attention_matches_torch_multihead_attention(tiny_clip):
    """Recomputed per-head weights equal nn.MultiheadAttention(need_weights=True, average_attn_weights=False) on
    the same ln_1 input, for every layer; every row is a probability distribution."""
    pixels = _pixels(4)
    visual = tiny_clip.model.visual
    inputs: list[torch.Tensor] = []
    handles = [b.ln_1.register_forward_hook(lambda _m, _i, out: inputs.append(out.detach()))
               for b in visual.transformer.resblocks]
    maps = extract_attention(tiny_clip, pixels)
    for h in handles:
        h.remove()
    assert maps.attentions.shape == (2, 4, 2, 17, 17)  # layers, images, heads, tokens, tokens
    assert torch.allclose(maps.attentions.sum(-1), torch.ones(()), atol=1e-5)
    for layer, block in enumerate(visual.transformer.resblocks):
        x = inputs[layer]
        with torch.no_grad():
            _, weights = block.attn(x, x, x, need_weights=True, average_attn_weights=False)
        assert torch.allclose(maps.attentions[layer], weights, atol=1e-6), layer


def test_patch_projection_is_the_class_token_path(tiny_vit):
    """Patch tokens go through ln_post and proj exactly as the class token: the class token so projected is the
    model's image embedding; text maps are cosines of those patches with the text."""
    pixels = _pixels(2)
    maps = extract_attention(tiny_vit, pixels)
    assert torch.allclose(maps.class_embeddings, maps.image_embeddings, atol=1e-5)
    text = torch.randn(maps.patch_embeddings.shape[-1])
    heat = maps.text_maps(text)
    manual = torch.nn.functional.cosine_similarity(maps.patch_embeddings[1], text[None], dim=-1)
    assert heat.shape == (2, *maps.grid)
    assert torch.allclose(heat[1].flatten(), manual, atol=1e-5)
    with pytest.raises(ValueError, match="do not fit"):
        maps.text_maps(torch.randn(3, 7))


def test_rollout_rows_sum_to_one_and_follow_abnar_zuidema():
    """Rollout rows sum to one; it equals the product of (mean-head attention + I)/2 from the first layer up."""
    g = torch.Generator().manual_seed(0)
    att = torch.softmax(torch.randn(3, 2, 4, 5, 5, generator=g), dim=-1)  # layers, n, heads, L, L
    rollout = attention_rollout(att)
    assert torch.allclose(rollout.sum(-1), torch.ones(2, 5), atol=1e-6)
    eye = torch.eye(5)
    a = [(att[k].mean(1) + eye) / 2 for k in range(3)]  # rows of A sum to one, so renormalising halves
    assert torch.allclose(rollout, a[2] @ a[1] @ a[0], atol=1e-6)
    self_only = attention_rollout(torch.eye(5).expand(1, 1, 1, 5, 5).clone())
    assert torch.allclose(self_only[0], eye)  # attending only to oneself keeps every token its own


def test_maps_of_extraction_have_grid_shapes(tiny_clip):
    """Class-token maps per layer/head and the rollout map have the patch grid's shape and are distributions."""
    maps = extract_attention(tiny_clip, _pixels(2))
    assert maps.cls_attention().shape == (2, 2, 2, 4, 4)
    rollout = maps.rollout()
    assert rollout.shape == (2, 4, 4)
    assert (rollout > 0).all() and (rollout.flatten(1).sum(-1) < 1).all()  # the class token keeps some mass


def test_non_vit_towers_are_refused_with_a_clear_error():
    """A ResNet image tower has no token attention to read: the error names the tower and what to use."""
    class ResNetClip(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.visual = ModifiedResNet(layers=(1, 1, 1, 1), output_dim=32, heads=2, image_size=64, width=8)

    bundle = ClipModel(model=ResNetClip(), tokenizer=lambda t: t, name="RN-tiny", image_size=64, embed_dim=32,
                       mean=(0.5,) * 3, std=(0.5,) * 3, text_tower="open_clip")
    with pytest.raises(TypeError, match="ModifiedResNet.*ViT"):
        vision_transformer(bundle)


def test_attention_figures_render_headless(data, tiny_vit):
    """The grid has one row per image and image + rollout + l1..l4 columns; the per-head figure one row per layer."""
    magic, dataset = data
    ids = choose_attention_images(magic, 3)
    assert len(ids) == 3 and len({magic.images[i].node for i in ids}) == 3
    assert ids == choose_attention_images(magic, 3)
    pixels = dataset.subset(ids).pixels
    fig = plot_attention_grid(tiny_vit, pixels, [magic.chain_names(i) for i in ids], ids)
    assert len(fig.axes) == 3 * (2 + 4)
    assert fig.axes[2].get_title() == f"l1: {magic.chain_names(ids[0])[0]}"
    heads = plot_attention_heads(tiny_vit, pixels[0])
    assert len(heads.axes) == 2 * (2 + 1)  # 2 layers x (2 heads + mean)
    fig.savefig(io.BytesIO(), format="png")


def test_attention_comparison_puts_models_side_by_side_on_the_same_images(data, tiny_vit, tiny_clip):
    """One figure for several models: a row of the images with their l1 concept, then one row per model with its
    map of that concept on the same images (4 images: 4 panels a row); a chain shorter than `level` uses its
    most abstract concept; mismatched inputs are refused."""
    from cglib.viz.attention import plot_attention_models

    magic, dataset = data
    ids = choose_attention_images(magic, 4)
    pixels, chains = dataset.subset(ids).pixels, [magic.chain_names(i) for i in ids]
    fig = plot_attention_models({"zero-shot": tiny_vit, "clip": tiny_clip}, pixels, chains, ids, level=2)
    assert len(fig.axes) == 3 * 4 + 1  # and the shared colorbar
    assert fig.axes[0].get_title() == f"{ids[0]}\nl2: {chains[0][1]}"
    assert [fig.axes[4 * row].get_ylabel() for row in range(3)] == ["image", "zero-shot", "clip"]
    assert all(ax.get_xlabel().startswith("cos ") for ax in fig.axes[4:12])
    assert len({ax.images[1].get_clim() for ax in fig.axes[4:12]}) == 1  # one colour scale for every map
    short = plot_attention_models({"a": tiny_vit}, pixels[:1], [chains[0][:1]], ids[:1], level=3)
    assert short.axes[0].get_title().endswith(f"l3: {chains[0][0]}")
    with pytest.raises(ValueError, match="one of each per image"):
        plot_attention_models({"a": tiny_vit}, pixels, chains[:1], ids)


def test_umap_panels_wrap_at_four_a_row(data):
    """Five models: image rows then text rows, 4 panels a row (2 rows per modality), the short rows' spare panels
    hidden, every model's image panel above its text panel."""
    magic, _ = data
    groups = [n.id for n in magic.nodes_at(1)]
    rng = np.random.default_rng(0)
    models = [f"m{k}" for k in range(5)]
    panels = [UmapPanel(model=m, modality=mod, groups=groups, xy=rng.normal(size=(6, 2)), trust=0.9, trust_k=2,
                        seconds=0.0) for mod in ("image", "text") for m in models]
    fig = plot_umap_panels(panels, magic)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(fig.axes) == 16 and len(shown) == 10
    rows: dict[float, int] = {}
    for ax in shown:
        rows[round(ax.get_position().y0, 3)] = rows.get(round(ax.get_position().y0, 3), 0) + 1
    assert sorted(rows.values()) == [1, 1, 4, 4]
    height = {ax.get_title().split("\n")[0]: ax.get_position().y0 for ax in shown}  # "m0: image centroids"
    assert all(height[f"{m}: image centroids"] > height[f"{m}: text centroids"] for m in models)
    assert all(t.get_fontsize() >= 8.5 for ax in shown for t in ax.texts)


# ------------------------------------------------------------------------------------- centroids, UMAP
def test_group_texts_and_centroids(data):
    """Caption texts follow their images' groups; generalized ones come once per group; centroids are unit."""
    magic, _ = data
    ids = magic.split_ids("test")
    texts, groups = group_texts(magic, ids, "captions")
    assert len(texts) == sum(len(magic.images[i].captions) for i in ids)
    assert groups[0] == magic.images[ids[0]].node
    gen, gen_groups = group_texts(magic, ids, "generalized")
    assert len(gen) == 2 * len(set(gen_groups)) == 12
    with pytest.raises(ValueError, match="captions' or 'generalized"):
        group_texts(magic, ids, "names")
    x = np.random.default_rng(0).normal(size=(6, 4))
    names, cent = group_centroids(x, ["b", "a", "b", "a", "c", "c"])
    assert names == ["a", "b", "c"]
    assert np.allclose(np.linalg.norm(cent, axis=1), 1)
    assert np.allclose(cent[0], (x[1] + x[3]) / np.linalg.norm(x[1] + x[3]), atol=1e-6)


def test_embeddings_are_cached_and_shared_between_identical_text_towers(data, tiny_vit, tmp_path):
    """Two models with the same (frozen) text tower encode the texts once; a second store over the same folder
    (a later process) recomputes nothing; rows follow the images and their captions."""
    from cglib.evaluate.embeddings import EmbeddingStore

    magic, dataset = data
    ids = magic.split_ids("test")
    pixels = dataset.subset(ids).pixels
    store = EmbeddingStore(tmp_path)
    a = embed_groups(tiny_vit, "a", magic, ids, pixels, store)
    b = embed_groups(tiny_vit, "b", magic, ids, pixels, store)
    assert store.computed == {"a.viz-captions": ["images", "texts"], "b.viz-captions": ["images"]}
    assert np.array_equal(a.texts, b.texts) and np.array_equal(a.images, b.images)
    later = EmbeddingStore(tmp_path)
    c = embed_groups(tiny_vit, "a", magic, ids, pixels, later)
    assert later.computed == {"a.viz-captions": []} and np.array_equal(c.images, a.images)
    assert a.images.shape == (len(ids), 384) and a.image_groups[0] == magic.images[ids[0]].node
    caption = magic.images[ids[0]].captions[0]
    assert np.allclose(a.texts[0], encode_texts(tiny_vit, [caption])[0], atol=1e-5)


def test_spread_and_separation_on_known_geometry():
    """Two groups of two unit vectors at +-10 degrees around orthogonal axes: within = 1 - cos 10 deg, between
    = 1 (orthogonal centroids), ratio their quotient; singleton groups are counted, not averaged."""
    t = np.deg2rad(10)
    x = np.array([[np.cos(t), np.sin(t), 0], [np.cos(t), -np.sin(t), 0],
                  [0, np.cos(t), np.sin(t)], [0, np.cos(t), -np.sin(t)], [0, 0, 1.0]])
    out = spread_and_separation(x, ["a", "a", "b", "b", "c"])
    assert out["within"] == pytest.approx(1 - np.cos(t))
    assert out["singleton_groups"] == 1 and out["groups"] == 3
    assert out["between"] == pytest.approx(1.0)
    assert out["ratio"] == pytest.approx(out["within"] / out["between"])


def test_dual_effect_table_sees_tighter_groups(data):
    """A model whose images sit closer to their group centroids shows a smaller within/between ratio."""
    magic, _ = data
    ids = magic.split_ids("test")
    groups = [magic.images[i].node for i in ids]
    rng = np.random.default_rng(0)
    centres = {g: rng.normal(size=16) for g in sorted(set(groups))}

    def model(name: str, noise: float) -> GroupEmbeddings:
        x = np.stack([centres[g] + noise * rng.normal(size=16) for g in groups])
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return GroupEmbeddings(name, x, groups, x, groups, ids)

    table = dual_effect_table([model("loose", 1.0), model("tight", 0.1)], magic)
    assert set(table["level"]) == {1, 2, 3, 4}
    l1 = table[(table["level"] == 1) & (table["modality"] == "image")].set_index("model")
    assert l1.loc["tight", "within"] < l1.loc["loose", "within"]
    assert l1.loc["tight", "ratio"] < l1.loc["loose", "ratio"]
    fig = plot_measured_dual_effect(table)
    assert len(fig.axes) == 2
    (line,) = dual_effect_summary(table, baseline="loose")
    assert line.startswith("tight: within-group spread") and "-" in line.split("(")[1]  # spread went down


def test_procrustes_alignment_recovers_a_rotated_scaled_copy():
    """A rotated, scaled, shifted copy of a layout is mapped back onto it exactly."""
    ref = np.random.default_rng(0).normal(size=(10, 2))
    angle = 1.1
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    moved = ref @ rot * 3.0 + np.array([5.0, -2.0])
    assert np.allclose(procrustes_align(moved, ref), ref, atol=1e-9)


def test_umap_figure_renders_with_more_classes_than_colours(data):
    """Panels with more colour classes than palette entries render (markers take over), labels within limit."""
    magic, _ = data
    groups = [n.id for n in magic.nodes_at(1)]
    rng = np.random.default_rng(0)
    panels = [UmapPanel(model=m, modality=mod, groups=groups, xy=rng.normal(size=(6, 2)), trust=0.9, trust_k=2,
                        seconds=0.0) for m in ("zero-shot", "clip") for mod in ("image", "text")]
    fig = plot_umap_panels(panels, magic, color_level=2)
    assert len(fig.axes) == 4
    assert "trustworthiness 0.90" in fig.axes[0].get_title()
    with matplotlib.pyplot.rc_context({"axes.prop_cycle": matplotlib.cycler(color=["k", "r"])}):
        fig = plot_umap_panels(panels, magic, color_level=2, label_max=0)  # 3 classes, 2 colours
    assert not fig.axes[0].texts


def test_labels_are_kept_only_where_readable():
    """Far-apart points are all labelled; a point on top of a labelled one is not; the limit caps the count."""
    xy = np.array([[0.0, 0.0], [10.0, 0.0], [0.1, 0.1], [0.0, 10.0]])
    assert readable_labels(xy, limit=10) == [0, 1, 3]
    assert readable_labels(xy, limit=2) == [0, 1]
    assert readable_labels(xy, limit=0) == []


@pytest.mark.slow
def test_umap_keeps_well_separated_clusters_apart():
    """Five well-separated Gaussian clusters in 64-d stay separated in the 2-d UMAP (every point's nearest
    neighbour is of its cluster, silhouette > 0.5), trustworthiness is high, and the same seed gives the same map."""
    from sklearn.metrics import silhouette_score
    from sklearn.neighbors import NearestNeighbors

    rng = np.random.default_rng(0)
    centres = rng.normal(size=(5, 64)) * 5
    labels = np.repeat(np.arange(5), 20)
    x = centres[labels] + rng.normal(size=(100, 64))
    xy = umap_layout(x, seed=0, n_neighbors=15)
    trust, k = trust_score(x, xy, 5)
    assert trust > 0.9 and k == 5
    _, nn = NearestNeighbors(n_neighbors=2).fit(xy).kneighbors(xy)
    assert (labels[nn[:, 1]] == labels).mean() == 1.0
    assert silhouette_score(xy, labels) > 0.5
    assert np.array_equal(xy, umap_layout(x, seed=0, n_neighbors=15))
    with pytest.raises(ValueError, match="at least 4"):
        umap_layout(x[:3], seed=0)


# -------------------------------------------------------------------------------------------- explorer
def test_explorer_builds_headless_and_retrieves(data, tiny_vit, tiny_clip):
    """Live, the builder wraps a widget; picking a level and concept retrieves top-k images per model, marks hits
    by the DAG chain, and shows the attention of a chosen image."""
    magic, dataset = data
    ids = magic.split_ids("test")
    # tiny_clip's own text tower and tiny_vit's MiniLM tower live in different spaces: each model queries its own
    explorer = build_explorer({"vit": tiny_vit, "clip": tiny_clip}, magic, ids, dataset.subset(ids).pixels, top_k=3,
                              interactive=True)
    assert isinstance(explorer.widget, widgets.Widget) and isinstance(explorer, ConceptExplorer)
    assert explorer.concept == explorer.concept_box.options[0][1]  # first concept shown at build
    explorer.level.value = 2
    assert explorer.concept.startswith("l2:")
    assert set(explorer.results) == {"vit", "clip"} and all(len(r) == 3 for r in explorer.results.values())
    for image_id, _, hit in explorer.results["vit"]:
        assert hit == (magic.ancestor(magic.images[image_id].node, 2) == explorer.concept)
    scores = [s for _, s, _ in explorer.results["clip"]]
    assert scores == sorted(scores, reverse=True)
    fig = explorer.show_attention("clip", ids[0])
    assert fig.axes[2].get_title() == f"'{magic.nodes[explorer.concept].name}'"
    assert len(explorer.image_box.options) == 6
    bundle = explorer._repr_mimebundle_()  # live: the widget view for front ends, HTML for every other reader
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == explorer.widget.model_id
    assert bundle["text/html"].count("data:image/png;base64,") == 2


def test_explorer_static_mode_builds_no_widget_and_renders_images(data, tiny_vit, monkeypatch):
    """Headless (forced by CGLIB_HEADLESS=1), the explorer creates no widget at all, yet shows the first concept:
    its retrieval grid and the first image's attention maps inlined as PNG in HTML, with no widget view."""
    magic, dataset = data
    ids = magic.split_ids("test")
    created: list[widgets.Widget] = []
    monkeypatch.setattr(widgets.Widget, "_widget_construction_callback", staticmethod(created.append))
    monkeypatch.setenv("CGLIB_HEADLESS", "1")
    explorer = build_explorer({"vit": tiny_vit}, magic, ids, dataset.subset(ids).pixels, top_k=3)
    assert explorer.widget is None and not created
    assert explorer.concept == explorer.concepts(1)[0][1] and len(explorer.results["vit"]) == 3
    bundle = explorer._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/html"].count("data:image/png;base64,") == 2
    assert magic.nodes[explorer.concept].id in bundle["text/html"]


@pytest.mark.slow
def test_vit_b32_attention_extraction_is_exact():
    """On the paper's ViT-B/32 architecture (random weights: no download), extraction leaves the image embedding
    bit-identical and its per-head weights match nn.MultiheadAttention's; 7x7 patches, 12 layers, 12 heads."""
    torch.manual_seed(0)
    bundle = build_model(ModelParams(name="ViT-B-32", text_tower="open_clip", freeze_text=False))
    pixels = _pixels(2, size=224)
    before = encode_images(bundle, pixels)
    inputs: list[torch.Tensor] = []
    blocks = bundle.model.visual.transformer.resblocks
    handles = [b.ln_1.register_forward_hook(lambda _m, _i, out: inputs.append(out.detach())) for b in blocks]
    maps = extract_attention(bundle, pixels)
    for h in handles:
        h.remove()
    assert np.array_equal(before, encode_images(bundle, pixels))
    assert maps.attentions.shape == (12, 2, 12, 50, 50) and maps.grid == (7, 7)
    with torch.no_grad():
        _, weights = blocks[11].attn(inputs[11], inputs[11], inputs[11], need_weights=True,
                                     average_attn_weights=False)
    assert torch.allclose(maps.attentions[11], weights, atol=1e-5)
    assert torch.allclose(attention_rollout(maps.attentions).sum(-1), torch.ones(2, 50), atol=1e-5)
