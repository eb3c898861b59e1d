"""Abstraction engine (Algorithm 1, lines 2-11) and generalized captions (LLM_gen), behind one interface.

Backends (llm.backend): `openai` (any OpenAI-compatible server, live or Batch API), `offline` (MiniLM + the
shipped taxonomy, no network), `oracle` (the synthetic world's ground truth, controlled experiments only).
"""

from cglib.llm.base import ConceptTask, Failure, FatalBackendError, GroupRequest, QuotaExhaustedError
from cglib.llm.canonical import canonicalize
from cglib.llm.chains import chain_agreement, failure_table, few_shot_copies, level_counts, load_chains
from cglib.llm.cost import estimate_concept_requests, estimate_full_coco
from cglib.llm.engine import AbstractionResult, run_abstraction
from cglib.llm.generalize_requests import GeneralizeResult, generalize_groups
from cglib.llm.generalizers import offline_generalize
from cglib.llm.offline_backend import compare_offline_methods, taxonomy_fit

__all__ = [
    "AbstractionResult", "ConceptTask", "Failure", "FatalBackendError", "GeneralizeResult", "GroupRequest",
    "QuotaExhaustedError", "canonicalize", "chain_agreement", "compare_offline_methods", "estimate_concept_requests",
    "estimate_full_coco", "failure_table", "few_shot_copies", "generalize_groups", "level_counts", "load_chains",
    "offline_generalize", "run_abstraction", "taxonomy_fit",
]
