"""Related-work baselines and evaluations (issue #21)."""
