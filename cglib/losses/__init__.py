r"""Contrastive losses of CLEAR GLASS (paper Sec. 3.2, Eqs. 1-8), the CLIP baseline and the textual pretraining loss.

Features come as `(M, N, L)` tensors: M groups (a MAGIC node and its hard negatives), N image-text pairs per
group, L embedding dimensions. Every loss L2-normalizes its inputs, so `s(a, b)` below is the cosine similarity.

- `pairwise_group_loss` (Eqs. 1-4): outer = InfoNCE whose positives are all N texts (images) of the anchor's
  group among all M*N; inner = each combined vector `I[g,i] * T[g,j]` (element-wise) classified among the M
  group centroids `mu_g = mean_ij I[g,i] * T[g,j]` with temperature tau'.
- `centroid_group_loss` (Eqs. 5-8): outer = CLIP InfoNCE between the M image centroids and the M text
  centroids; inner = each image (text) classified among the M image (text) centroids with tau'.
- `memory_centroid_loss`: the same against a memory of all G concepts' centroids (DCCL, Pu et al. CVPR 2023;
  the memory and its momentum update live in cglib/train/objectives/concept_memory.py): the batch's groups are live, the rest
  constant rows.
- `clip_loss`: standard symmetric InfoNCE over all pairs (the baseline); `text_alignment_loss`: the same between
  two sets of texts (textual alignment pretraining, Sec. 3.2.4).

Conventions shared by every loss here:
- Numerics: computed in float32 (float64 inputs stay float64) with autocast disabled, through log-sum-exp /
  cross-entropy, so they are finite for tau in [0.01, 10] and features of any scale. Each vector is divided
  by its largest absolute entry before `F.normalize`, so neither 1e-30 nor 1e30 under- or overflows. A zero
  feature vector is allowed: it normalizes to zero (F.normalize's eps), has similarity 0 to everything and a
  large but finite gradient.
- M = 1 is allowed: there is nothing to contrast, so every group term is exactly 0 (a cross-entropy over one
  class); the pairwise outer term over one group is 0 too.
- alpha: `alpha_on="inner"` weights `alpha * inner + (1 - alpha) * outer` (paper, Eqs. 4 and 8);
  `alpha_on="outer"` weights `alpha * outer + (1 - alpha) * inner` (the authors' code, whose default
  alpha = 1.2233 lies outside [0, 1]; any finite alpha is accepted).
- Identical texts (`text_ids`): every loss takes integer labels of the texts, shaped like the text features
  without their last axis ((M, N) for groups, (B,) for flat inputs); equal ids mean identical strings (or, as a
  caller decides, texts that must not be contrasted, e.g. two targets of one group in textual pretraining). Two
  texts with equal ids are never each other's negatives: their logits are removed from the softmax denominators
  (masked to -inf), positives are unchanged. Unmasked, two pairs sharing a caption put the same logit in the
  numerator and in a negative, so the CLIP loss of those anchors cannot go below ln 2. Term by term:
  * `clip_loss`, `text_alignment_loss`: anchor b and candidate b' != b with ids[b] == ids[b'] (both directions:
    the image of an identical text is not a negative of that text either).
  * pairwise outer (Eq. 2): a candidate (h, j) of another group h != g whose id equals the id of ANY text of the
    anchor's group g is removed from the denominators of every anchor of g (images and texts alike): group g's
    texts are all positives of its anchors, so a copy of one of them elsewhere is a positive in disguise.
  * group-vs-group terms (centroid outer Eq. 6, centroid inner Eq. 7, pairwise inner Eq. 3): they contrast
    centroids, means of whole groups, never an individual text. Two groups are each other's negatives unless
    they hold the same multiset of ids (then their text centroids are identical, the groups are the same group
    twice, and they are removed from each other's denominators). A shared caption between otherwise different
    groups does not mask: their centroids differ and separating those groups is what the loss is for.
  `text_ids=None`, or ids that are all distinct, give exactly the unmasked values (no other op changes).
- Distributed: when `torch.distributed` is initialized with world_size > 1, `gather_groups` concatenates every
  rank's features (and text ids) along the first axis (whole groups; every rank must pass the same shape) and
  each rank returns the loss of the whole global batch, equal to the single-process (masked) loss. Gradients flow back to every
  rank's shard through `torch.distributed.nn.functional.all_gather`, whose backward sums the gradient of all
  ranks' (identical) losses: the gradient w.r.t. a rank's local features is world_size times the
  single-process gradient, so that after DDP averages parameter gradients over ranks they equal the
  single-process gradient exactly (tested with 2 gloo processes in tests/test_losses_distributed.py).

Layout: the paper's losses in cglib/losses/paper.py, the related methods' (`memory_centroid_loss`, `clip_hn_loss`,
`mcc_loss`) in cglib/losses/related.py, the conventions below (checks, numerics, masks, the distributed gather) in
cglib/losses/conventions.py; every loss and `gather_groups` import from cglib.losses.
"""

from cglib.losses.conventions import gather_groups
from cglib.losses.paper import centroid_group_loss, clip_loss, pairwise_group_loss, text_alignment_loss
from cglib.losses.related import clip_hn_loss, mcc_loss, memory_centroid_loss

__all__ = ["centroid_group_loss", "clip_hn_loss", "clip_loss", "gather_groups", "mcc_loss", "memory_centroid_loss",
           "pairwise_group_loss", "text_alignment_loss"]
