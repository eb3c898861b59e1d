"""The params schema as a table (`cglib params`, notebook 00) and what a params file changes from it."""

from __future__ import annotations

import json
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from cglib.config.evaluation import ZooModelParams
from cglib.config.objectives import OBJECTIVE_SPECS
from cglib.config.params import Params
from cglib.config.training import TrainRunParams


def schema_table() -> list[dict[str, str]]:
    """Every params key with its type, default and meaning, generated from the schema (for docs and 00_overview)."""
    rows: list[dict[str, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}{name}"
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, key + ".")
                continue
            default = "(required)" if field.is_required() else json.dumps(
                _jsonable(field.get_default(call_default_factory=True)))
            rows.append({"key": key, "type": _type_name(ann), "default": default,
                         "meaning": field.description or ""})
            if name == "runs":
                walk(TrainRunParams, key + "[].")
                options: dict[tuple, list[str]] = {}  # an option several objectives share is one row
                for loss, objective in OBJECTIVE_SPECS.items():
                    for sub, f in objective.Options.model_fields.items():
                        default = "(required)" if f.is_required() else json.dumps(
                            _jsonable(f.get_default(call_default_factory=True)))
                        options.setdefault((sub, _type_name(f.annotation), default, f.description or ""),
                                           []).append(loss)
                for (sub, kind, default, meaning), losses in options.items():
                    rows.append({"key": f"{key}[].options.{sub}", "type": kind, "default": default,
                                 "meaning": f"loss: {', '.join(losses)}: {meaning}"})
            if name == "zoo":
                for sub, f in ZooModelParams.model_fields.items():
                    rows.append({"key": f"{key}[].{sub}", "type": "model section" if sub == "model" else "str",
                                 "default": "(required)", "meaning": f.description or ""})

    walk(Params, "")
    return rows


def _type_name(ann: Any) -> str:
    """Readable type: Literal choices joined by |, Optional as `X | None`, lists as list[X]."""
    origin, args = get_origin(ann), get_args(ann)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    return "None" if ann is type(None) else getattr(ann, "__name__", str(ann))


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def changed_keys(params: Params) -> list[dict[str, str]]:
    """Keys whose value differs from the schema default (resolved paths aside), for run summaries."""
    defaults = _flatten(Params().model_dump(mode="json"))
    current = _flatten(params.model_dump(mode="json"))
    return [{"key": k, "default": json.dumps(defaults.get(k)), "value": json.dumps(v)}
            for k, v in current.items() if v != defaults.get(k) and k != "run.output_dir"]
