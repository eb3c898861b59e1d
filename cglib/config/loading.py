"""Reading a params file: YAML, validation errors one line per key with the fix, paths checked and resolved."""

from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from cglib.config.base import HUB_ID_PATTERN, SHIPPED_TAXONOMY_NAMES, ParamsError
from cglib.config.params import Params
from cglib.strict_yaml import DuplicateKeyError, NotTextError, load_yaml, read_text


def _section_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Valid keys of the section at `loc` (for 'did you mean')."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        ann = field.annotation
        inner = getattr(ann, "__args__", None)
        candidates = [ann, *(inner or [])]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return list(model.model_fields)


def _format_error(err: dict[str, Any]) -> str:
    loc = tuple(err["loc"])
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        valid = _section_keys(Params, loc)
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
        hint = f"did you mean '{close[0]}'?" if close else f"valid keys here: {', '.join(valid)}"
        return f"{key}: unknown key; {hint}"
    if kind == "missing":
        return f"{key}: required key is missing; add it"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    return f"{key}: {msg}{shown}"


def _check_paths(params: Params, root: Path) -> list[tuple[str, str]]:
    """Input paths the chosen profile reads must exist: (key, message with the fix) per problem."""
    d = params.data
    needed: list[tuple[str, Path | None]] = []
    if d.source == "coco":
        needed += [("data.coco_captions", d.coco_captions), ("data.coco_images", d.coco_images)]
    if d.source == "hierarcaps" or params.eval.hierarcaps:
        needed += [("data.hierarcaps_csv", d.hierarcaps_csv), ("data.hierarcaps_images", d.hierarcaps_images)]
    for entry in params.train.runs:  # files an objective reads (re on the HierarCaps train hierarchies)
        needed += [f for f in entry.objective_spec().input_files(params, entry) if f not in needed]
    if params.model.checkpoint is not None:
        needed.append(("model.checkpoint", params.model.checkpoint))
    if params.model.hf_state_dict is not None:
        needed.append(("model.hf_state_dict", params.model.hf_state_dict))
    taxonomy = params.llm.offline_taxonomy
    if params.llm.backend == "offline" and taxonomy is not None and taxonomy not in SHIPPED_TAXONOMY_NAMES:
        needed.append(("llm.offline_taxonomy", Path(taxonomy)))
    errors = []
    source = params.magic.source
    if source != "build":
        local = Path(source).expanduser()
        local = local if local.is_absolute() else root / local
        if not local.is_dir() and not re.match(HUB_ID_PATTERN, source):
            errors.append(("magic.source", (f"magic.source: {local} is not a folder and {source!r} is not a Hugging Face dataset id "
                          "(owner/name); point it at a folder written by `cglib export-magic` or a Hub id, or set "
                          "build")))
    for key, path in needed:
        if path is None:
            errors.append((key, f"{key}: required by this profile but not set; set it to an existing path"))
            continue
        resolved = path if path.is_absolute() else root / path
        if not resolved.exists():
            errors.append((key, (f"{key}: path does not exist: {resolved}; fix the path, or pass --no-check-paths "
                          "to validate before the data is in place")))
    return errors


def resolve_paths(params: Params, root: Path) -> Params:
    """Return a copy whose relative input paths are resolved against `root` (the params file's repo root)."""
    data = params.model_dump()
    for key in ("coco_captions", "coco_images", "hierarcaps_csv", "hierarcaps_images", "hierarcaps_train_csv"):
        p = data["data"][key]
        if p is not None and not Path(p).is_absolute():
            data["data"][key] = root / p
    for section, key in (("model", "checkpoint"), ("model", "hf_state_dict"), ("llm", "cache_path"),
                         ("llm", "offline_taxonomy")):
        p = data[section][key]
        if p is not None and not Path(p).is_absolute() and str(p) not in SHIPPED_TAXONOMY_NAMES:
            data[section][key] = str(root / p) if isinstance(p, str) else root / p
    for model in [data["model"], *(z["model"] for z in data["eval"]["zoo"])]:
        for key in ("checkpoint", "hf_state_dict"):
            if model is not data["model"] and model[key] is not None and not Path(model[key]).is_absolute():
                model[key] = root / model[key]
        name = model["name"]
        if model["source"] == "hf" and not Path(name).is_absolute() and (root / name).is_dir():
            model["name"] = str(root / name)  # a local CLIP directory relative to the repo root
    for run in data["train"]["runs"]:  # an objective's file options (re's released weights)
        for key, value in run["options"].items():
            if isinstance(value, Path) and not value.is_absolute():
                run["options"][key] = root / value
    source = data["magic"]["source"]
    if source != "build" and not Path(source).is_absolute() and (root / source).is_dir():
        data["magic"]["source"] = str(root / source)  # an export folder relative to the repo root
    if not Path(data["run"]["output_dir"]).is_absolute():
        data["run"]["output_dir"] = root / data["run"]["output_dir"]
    return Params.model_validate(data)


def params_root(path: Path) -> Path:
    """Relative paths in a params file are relative to the repo root: the parent of its `params/` folder."""
    path = Path(path).resolve()
    return path.parent.parent if path.parent.name == "params" else path.parent


def _dotted(loc: tuple) -> str:
    """A pydantic error location as the key a user reads: train.runs[0].loss."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _file_order(raw: dict) -> list[str]:
    """Every key of the file, dotted, in the order it is written (list entries as [i])."""
    keys: list[str] = []

    def walk(value: Any, prefix: str) -> None:
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for k, v in items:
            key = f"{prefix}[{k}]" if isinstance(k, int) else f"{prefix}.{k}".lstrip(".")
            keys.append(key)
            walk(v, key)

    walk(raw, "")
    return keys


def _position(key: str, order: list[str]) -> int:
    """Where a problem's key sits in the file: its own line, else its section's (a key the file leaves at its
    default is reported with its section); a section absent from the file comes last."""
    while key:
        if key in order:
            return order.index(key)
        key = key.rsplit(".", 1)[0] if "." in key else ""
    return len(order)


def _without(raw: dict, locs: list[tuple]) -> dict:
    """A copy of the file with the keys at `locs` removed (they fall back to their defaults)."""
    out = copy.deepcopy(raw)
    for loc in locs:
        node: Any = out
        for part in loc[:-1]:  # through sections and list entries (train.runs[0].tau)
            if isinstance(node, dict):
                node = node.get(part)
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            else:
                node = None
        if isinstance(node, dict):  # an entry of a list itself stays: removing it would renumber the others
            node.pop(loc[-1], None)
    return out


def _related(key: str, removed: list[str]) -> bool:
    """Whether `key` is, contains or lies inside one of the removed keys."""
    return any(key == r or key.startswith((r + ".", r + "[")) or r.startswith(key + ".")
               for r in removed)


MAX_PASSES = 5  # each pass sets aside the keys found bad and validates again; a file needs about two


def parse_params(raw: Any, root: Path, check_paths: bool = True) -> Params:
    """Validate an already-parsed YAML mapping; raise ParamsError with one line per problem, every problem of
    the file in one pass, in the order of the file.

    Keys with a bad value are reported first-hand; the file is then validated again with those keys left out (at
    their defaults), so that the checks they stopped (a section's own rules, the rules between sections, the input
    paths) report their problems too, unless they involve such a key (a rule checked against a default would be a
    guess). An unknown key is read by no rule: leaving it out guesses nothing."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(f"params must be a YAML mapping of sections (run, data, ...), got {type(raw).__name__}")
    problems: list[tuple[str, str]] = []  # (key, line)
    rules: list[tuple[tuple[str, ...], str]] = []
    left_out: list[tuple] = []  # the bad keys' locations, left out of the next pass
    guessed: list[str] = []  # the keys left out whose value a rule may read (defaults stand in for them)
    params: Params | None = None
    for _ in range(MAX_PASSES):
        rules = []
        try:
            params = Params.model_validate(_without(raw, left_out), context={"problems": rules})
            break
        except ValidationError as exc:
            new = [e for e in exc.errors() if not _related(_dotted(tuple(e["loc"])), guessed)
                   and (_dotted(tuple(e["loc"])), _format_error(e)) not in problems]
            problems += [(_dotted(tuple(e["loc"])), _format_error(e)) for e in new]
            fresh = [tuple(e["loc"]) for e in new if e["loc"] and tuple(e["loc"]) not in left_out]
            if not fresh:  # nothing more to leave out: the remaining checks wait until these keys are fixed
                break
            left_out += fresh
            guessed += [_dotted(tuple(e["loc"])) for e in new if e["loc"] and e["type"] != "extra_forbidden"]
    problems += [(keys[0], message) for keys, message in rules if not any(_related(k, guessed) for k in keys)]
    if check_paths and params is not None:
        problems += [(key, line) for key, line in _check_paths(params, root) if not _related(key, guessed)]
    if problems:
        order = _file_order(raw)
        ranked = sorted(enumerate(problems), key=lambda ip: (_position(ip[1][0], order), ip[0]))
        raise ParamsError("\n".join(line for _, (_, line) in ranked))
    return resolve_paths(params, root)


def load_params(path: str | Path, check_paths: bool = True, overrides: dict[str, Any] | None = None) -> Params:
    """Load and validate a params YAML file; relative paths resolve against the repo root."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file not found: {path}; pass an existing YAML file such as params/demo.yaml")
    try:
        text = read_text(path)
    except NotTextError as exc:
        raise ParamsError(f"{exc}; params files are UTF-8 YAML text (pass one such as params/demo.yaml, not a "
                          "data or checkpoint file)") from None
    except OSError as exc:
        raise ParamsError(f"params file {path} cannot be read ({exc.strerror}); check its permissions") from None
    try:
        raw = load_yaml(text)
    except DuplicateKeyError as exc:
        first, second = exc.lines
        raise ParamsError(f"{path}: duplicate key '{exc.key}' at lines {first} and {second}; keep one of them "
                          "(YAML would silently use the last)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ParamsError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}; fix the syntax") from None
    if overrides:
        raw = deep_merge(raw or {}, overrides)
    return parse_params(raw, params_root(path), check_paths=check_paths)


def deep_merge(base: dict, extra: dict) -> dict:
    """`base` with `extra` merged in, nested mappings merged key by key."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
