"""Evaluation: the paper's forced choice (made sound), gallery retrieval, HierarCaps and COCO, with bootstrap CIs.

Public entry points: `evaluate_run(run) -> EvalResults` (writes every result file), `evaluate_base(run)` (the zero-shot
model alone, notebook 05) and `load_results(run_dir)`.
"""

from cglib.evaluate.pipeline import evaluate_base, evaluate_run
from cglib.evaluate.results import EvalResults, load_results, load_scores

__all__ = ["EvalResults", "evaluate_base", "evaluate_run", "load_results", "load_scores"]
