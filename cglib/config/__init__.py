"""Parameters: one YAML file per profile, validated by a pydantic schema with errors that name the key and the fix.

Each pipeline stage owns one section (`run`, `data`, `llm`, `magic`, `model`, `train`, `eval`, `viz`, `search`).
Unknown keys are errors (with the closest valid key suggested), so a typo never silently falls back to a
default. Secrets never live here: `llm.api_key_env` names the environment variable that holds the key.

One module per job: `base` (the shared model and error), the sections of the inputs and model (`inputs`), of
training (`training`: the runs and their objectives' options) and of what reads trained models (`evaluation`),
the whole file (`params`), reading one (`loading`) and the schema as a table (`schema`). Import from here.
"""

from __future__ import annotations

from cglib.config.base import HUB_ID_PATTERN, SHIPPED_TAXONOMY_NAMES, ParamsError, Section
from cglib.config.evaluation import (
    MINILM_CONFIGS,
    ZERO_SHOT_NAME,
    EvalParams,
    FloatRange,
    IntRange,
    SearchParams,
    SearchSpace,
    VizParams,
    ZooModelParams,
)
from cglib.config.inputs import (
    DataParams,
    LLMParams,
    MagicParams,
    ModelParams,
    NgramParams,
    RunParams,
    SyntheticParams,
)
from cglib.config.loading import (
    _format_error,
    deep_merge,
    load_params,
    params_root,
    parse_params,
    resolve_paths,
)
from cglib.config.params import Params
from cglib.config.schema import changed_keys, schema_table
from cglib.config.training import (
    MOVED_RUN_KEYS,
    MOVED_TO_OPTIONS,
    BaseTrainParams,
    TrainParams,
    TrainRunParams,
)

__all__ = ["HUB_ID_PATTERN", "MINILM_CONFIGS", "MOVED_RUN_KEYS", "MOVED_TO_OPTIONS", "SHIPPED_TAXONOMY_NAMES", "ZERO_SHOT_NAME", "BaseTrainParams", "DataParams", "EvalParams", "FloatRange", "IntRange", "LLMParams", "MagicParams", "ModelParams", "NgramParams", "Params", "ParamsError", "RunParams", "SearchParams", "SearchSpace", "Section", "SyntheticParams", "TrainParams", "TrainRunParams", "VizParams", "ZooModelParams", "_format_error", "changed_keys", "deep_merge", "load_params", "params_root", "parse_params", "resolve_paths", "schema_table"]
