"""Reading YAML files strictly: a non-text file and a duplicated key are errors, not a traceback or a silent win.

PyYAML's SafeLoader keeps the last of two equal keys in a mapping (two `run:` sections, two `seed:` lines),
so a user who pasted a section twice runs with settings they did not read. `StrictSafeLoader` checks every
mapping, at any depth, before constructing anything, and names the key (dotted) and both lines. It changes
nothing else: scalars resolve exactly as with `yaml.SafeLoader` (YAML 1.1: `1e-5` is a string there, which the
params schema coerces).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.YAMLError):
    """A mapping holds the same key twice; `key` is its dotted path, `lines` the two 1-based line numbers."""

    def __init__(self, key: str, first_line: int, second_line: int) -> None:
        super().__init__(f"duplicate key '{key}' at lines {first_line} and {second_line}")
        self.key, self.lines = key, (first_line, second_line)


class NotTextError(ValueError):
    """A file that should be UTF-8 text holds binary data."""


class StrictSafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader that rejects duplicate keys at any depth (DuplicateKeyError)."""

    def construct_document(self, node: yaml.Node) -> Any:
        check_duplicate_keys(node)
        return super().construct_document(node)


def check_duplicate_keys(node: yaml.Node, path: tuple[str, ...] = (), seen_nodes: set[int] | None = None) -> None:
    """Raise DuplicateKeyError for the first mapping (depth first) that holds a key twice."""
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if id(node) in seen_nodes:  # an alias seen before (anchors may even be recursive)
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                check_duplicate_keys(value_node, path, seen_nodes)
                continue
            ident = (key_node.tag, key_node.value)
            line = key_node.start_mark.line + 1
            if ident in lines:
                raise DuplicateKeyError(".".join((*path, key_node.value)), lines[ident], line)
            lines[ident] = line
            check_duplicate_keys(value_node, (*path, key_node.value), seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            where = (*path[:-1], f"{path[-1]}[{i}]") if path else (f"[{i}]",)
            check_duplicate_keys(item, where, seen_nodes)


def read_text(path: Path) -> str:
    """The UTF-8 text of `path`; NotTextError when it holds NUL bytes or is not UTF-8 (a binary file)."""
    data = Path(path).read_bytes()
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):  # what some Windows editors write
        raise NotTextError(f"{path} is UTF-16 text, not UTF-8; save it as UTF-8")
    if data[:3] == b"\xef\xbb\xbf":  # a UTF-8 byte-order mark is harmless: drop it
        data = data[3:]
    nul = data.find(b"\x00")
    if nul >= 0:
        raise NotTextError(f"{path} is not a text file (a NUL byte at offset {nul})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotTextError(f"{path} is not a UTF-8 text file (byte {exc.start} is {data[exc.start]:#04x})") from None


def load_yaml(text: str) -> Any:
    """Parse YAML text like yaml.safe_load, rejecting duplicate keys."""
    return yaml.load(text, Loader=StrictSafeLoader)  # a SafeLoader subclass: safe
