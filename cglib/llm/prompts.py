"""The versioned prompt sets (`cglib/llm/prompts/<version>.yaml`) and the chat messages built from them.

Level 1 sees all captions of one image; level k sees the captions and the chain so far (Algorithm 1, lines
2-11). Few-shot examples are earlier user/assistant turns; `few_shot_chains` gives them to the engine so it
can count how many generated chains copy an example verbatim.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from cglib.llm.canonical import canonicalize

PROMPT_DIR = Path(__file__).with_name("prompts")
IMAGE_PROMPT_DIR = PROMPT_DIR / "generalize_image"
LEVEL_PROMPT_DIR = PROMPT_DIR / "generalize_level"

CONCEPT_SCHEMA: dict = {
    "type": "object",
    "properties": {"concept": {"type": "string", "description": "the concept, 1-3 lower-case words"}},
    "required": ["concept"],
    "additionalProperties": False,
}
GENERALIZE_SCHEMA: dict = {
    "type": "object",
    "properties": {"captions": {"type": "array", "items": {"type": "string"}}},
    "required": ["captions"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class FewShot:
    """One few-shot example: an image's captions and its chain from l1 upwards."""

    captions: tuple[str, ...]
    chain: tuple[str, ...]


@dataclass(frozen=True)
class PromptSet:
    """The templates and few-shot examples of one prompt version."""

    version: str
    system: str
    l1: str
    level: str
    generalize: str
    few_shot: tuple[FewShot, ...]


@dataclass(frozen=True)
class ImagePrompt:
    """A generalized-caption prompt of one version: per image (llm.generalize_image_prompt_version) or per image
    and level (llm.generalize_level_prompt_version). `temperature`, when the file sets one, replaces
    llm.temperature for these requests (the authors' per-level script sampled at 0.7)."""

    version: str
    system: str
    user: str
    temperature: float | None = None


def available_versions() -> list[str]:
    """Prompt versions shipped with the package."""
    return sorted(p.stem for p in PROMPT_DIR.glob("*.yaml"))


@lru_cache(maxsize=8)
def load_prompts(version: str) -> PromptSet:
    """Load prompt set `version` (llm.prompt_version); a clear error names the available versions."""
    path = PROMPT_DIR / f"{version}.yaml"
    if not path.is_file():
        raise ValueError(f"llm.prompt_version '{version}' not found in {PROMPT_DIR}; "
                         f"available: {', '.join(available_versions())}")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    try:
        shots = tuple(FewShot(tuple(s["captions"]), tuple(s["chain"])) for s in raw["few_shot"])
        prompts = PromptSet(version=str(raw["version"]), system=raw["system"].strip(), l1=raw["l1"].strip(),
                            level=raw["level"].strip(), generalize=raw["generalize"].strip(), few_shot=shots)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: malformed prompt set ({exc!r}); it needs version, system, l1, level, "
                         "generalize and few_shot (captions, chain)") from None
    if prompts.version != version:
        raise ValueError(f"{path} declares version '{prompts.version}', expected '{version}'; fix the file")
    return prompts


def _load_caption_prompt(folder: Path, key: str, version: str) -> ImagePrompt:
    path = folder / f"{version}.yaml"
    if not path.is_file():
        have = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        raise ValueError(f"llm.{key} '{version}' not found in {folder}; available: {have}")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    try:
        temperature = raw.get("temperature")
        prompt = ImagePrompt(version=str(raw["version"]), system=raw["system"].strip(), user=raw["user"].strip(),
                             temperature=None if temperature is None else float(temperature))
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"{path}: malformed prompt ({exc!r}); it needs version, system and user (and, if "
                         "set, a numeric temperature)") from None
    if prompt.version != version:
        raise ValueError(f"{path} declares version '{prompt.version}', expected '{version}'; fix the file")
    return prompt


@lru_cache(maxsize=8)
def load_image_prompt(version: str) -> ImagePrompt:
    """Load the per-image LLM_gen prompt `version`; a clear error names the available versions."""
    return _load_caption_prompt(IMAGE_PROMPT_DIR, "generalize_image_prompt_version", version)


@lru_cache(maxsize=8)
def load_level_prompt(version: str) -> ImagePrompt:
    """Load the per-image-and-level LLM_gen prompt `version` (magic.generalize: level)."""
    return _load_caption_prompt(LEVEL_PROMPT_DIR, "generalize_level_prompt_version", version)


def _bullets(captions: list[str] | tuple[str, ...]) -> str:
    return "\n".join(f"- {c.strip()}" for c in captions)


def concept_prompt(prompts: PromptSet, captions: list[str] | tuple[str, ...], chain: list[str] | tuple[str, ...],
                   l_max: int) -> str:
    """The user message asking for concept number len(chain)+1 of an image."""
    if not chain:
        return prompts.l1.format(captions=_bullets(captions))
    return prompts.level.format(captions=_bullets(captions), chain=" -> ".join(chain), level=len(chain) + 1,
                                l_max=l_max, last=chain[-1])


def concept_messages(prompts: PromptSet, captions: list[str], chain: list[str], l_max: int) -> list[dict]:
    """Chat messages (system, few-shot turns, question) for level len(chain)+1 of one image."""
    level = len(chain) + 1
    messages = [{"role": "system", "content": prompts.system}]
    for shot in prompts.few_shot:
        if len(shot.chain) < level:  # an example shorter than the requested level cannot show it
            continue
        messages.append({"role": "user", "content": concept_prompt(prompts, shot.captions, shot.chain[:level - 1],
                                                                   l_max)})
        messages.append({"role": "assistant", "content": json.dumps({"concept": shot.chain[level - 1]})})
    messages.append({"role": "user", "content": concept_prompt(prompts, captions, chain, l_max)})
    return messages


def generalize_messages(prompts: PromptSet, concept: str, parents: list[str], captions: list[str],
                        n: int) -> list[dict]:
    """Chat messages asking for `n` generalized captions of one concept node."""
    text = prompts.generalize.format(n_shown=len(captions), concept=concept, parents=", ".join(parents) or "none",
                                     captions=_bullets(captions), n=n)
    return [{"role": "system", "content": prompts.system}, {"role": "user", "content": text}]


def generalize_image_messages(prompt: ImagePrompt, concept: str, parents: list[str], captions: list[str],
                              n: int) -> list[dict]:
    """Chat messages asking for `n` generalized captions of one image from its own captions and its chain (or,
    with a per-level prompt, from its captions and one level's concept: that prompt leaves out {parents})."""
    text = prompt.user.format(concept=concept, parents=", ".join(parents) or "none", captions=_bullets(captions), n=n)
    return [{"role": "system", "content": prompt.system}, {"role": "user", "content": text}]


def few_shot_chains(prompts: PromptSet, l_max: int) -> list[list[str]]:
    """The few-shot chains cut to l_max levels, canonicalized (what a verbatim copy would look like)."""
    return [[canonicalize(c) for c in shot.chain[:l_max]] for shot in prompts.few_shot]
