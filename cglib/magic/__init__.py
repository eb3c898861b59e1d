"""MAGIC (Algorithm 1): the concept DAG built from abstraction chains, and the grouped dataset file it yields."""

from cglib.magic.build import build_magic, save_outputs
from cglib.magic.dag import ConceptDAG, DagError
from cglib.magic.export import to_networkx, write_graphml
from cglib.magic.files import load_magic, save_magic
from cglib.magic.invariants import MagicInvariantError, check_invariants
from cglib.magic.schema import SCHEMA_VERSION, MagicFile, node_id
from cglib.magic.stats import compute_stats, leakage, leakage_table, level_table, table1

__all__ = ["SCHEMA_VERSION", "ConceptDAG", "DagError", "MagicFile", "MagicInvariantError", "build_magic",
           "check_invariants", "compute_stats", "leakage", "leakage_table", "level_table", "load_magic", "node_id",
           "save_magic", "save_outputs", "table1", "to_networkx", "write_graphml"]
