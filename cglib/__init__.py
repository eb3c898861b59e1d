"""CLEAR GLASS reference implementation: MAGIC concept hierarchy, group contrastive losses, training, evaluation."""

__version__ = "0.1.0"
