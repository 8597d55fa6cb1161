"""Stack files read as the Pulumi CLI reads them, or refused with one readable message naming where.

The CLI parses YAML 1.2 and refuses duplicate keys; PyYAML's defaults are YAML 1.1: they read `yes`, `on`,
`1:30` and `2024-01-01` as a boolean, a number and a date, keep the last of two equal keys without a word,
and expand aliases without limit (a few lines can stand for billions of values). So the file is parsed in
bounded steps: its size and encoding, then its events (nesting depth), then its node graph, which is walked
once with a budget of values, every scalar resolved by YAML 1.2's JSON-compatible rules and every path
remembered for the message.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gpu_k8s.components.configbase import ConfigError, ConfigIssue

MAX_FILE_BYTES = 1_000_000
# Stack files nest about six levels deep; the CLI has no such limit, but a deeper file is a mistake here.
MAX_DEPTH = 32
# Values after alias expansion: a whole stack file holds a few hundred.
MAX_VALUES = 20_000

# YAML 1.2 core schema scalars, the ones the CLI reads as numbers, booleans and null (ASCII digits only).
_INT = re.compile(r"[-+]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?", re.ASCII)
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_NULL = {"", "~", "null", "Null", "NULL"}
_STR_TAG = "tag:yaml.org,2002:str"
_TAG_NAMES = {
    "tag:yaml.org,2002:timestamp": "a date",
    "tag:yaml.org,2002:binary": "binary data",
    "tag:yaml.org,2002:set": "a set",
    "tag:yaml.org,2002:omap": "an ordered map",
    "tag:yaml.org,2002:pairs": "a list of pairs",
    "tag:yaml.org,2002:merge": "a merge key (<<)",
}
# Keys the Pulumi CLI reads itself, with the shape it expects.
_PULUMI_LIST_KEYS = ("pulumi:disable-default-providers",)


def _where(path: tuple[str | int, ...]) -> str:
    """`config.gpu-k8s:cluster.gpuPools[0]` -> `gpu-k8s:cluster.gpuPools[0]`, the program's own paths."""
    if path[:1] == ("config",) and len(path) > 1:
        path = path[1:]
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "the file"


class _Refusal(Exception):
    def __init__(
        self, path: tuple[str | int, ...], node: yaml.Node | None, value: Any, problem: str, fix: str
    ):
        line = f" (line {node.start_mark.line + 1})" if node is not None else ""
        super().__init__(ConfigIssue(_where(path) + line, value, problem, fix))


class _Reader:
    """Walks a composed node graph into plain JSON values within a budget."""

    def __init__(self) -> None:
        self.values = 0

    def read(self, node: yaml.Node, path: tuple[str | int, ...], ancestors: frozenset[int]) -> Any:
        self.values += 1
        if self.values > MAX_VALUES:
            raise _Refusal(
                path,
                node,
                None,
                f"its aliases expand to more than {MAX_VALUES:,} values",
                "write the values out instead of repeating aliases (*name)",
            )
        if id(node) in ancestors:
            raise _Refusal(path, node, None, "an alias that contains itself", "remove the recursive alias")
        if node.tag in _TAG_NAMES:
            raise _Refusal(
                path,
                node,
                None,
                f"YAML reads this as {_TAG_NAMES[node.tag]}, which a stack setting cannot be",
                "quote it to make it a string, or write it as a plain value",
            )
        if isinstance(node, yaml.ScalarNode) and node.tag.startswith("tag:yaml.org,2002:"):
            return self.scalar(node, path)
        inside = ancestors | {id(node)}
        if isinstance(node, yaml.SequenceNode) and node.tag == "tag:yaml.org,2002:seq":
            return [self.read(item, (*path, i), inside) for i, item in enumerate(node.value)]
        if isinstance(node, yaml.MappingNode) and node.tag == "tag:yaml.org,2002:map":
            return self.mapping(node, path, inside)
        raise _Refusal(path, node, node.tag, "has a YAML tag no stack setting takes", "remove the tag")

    def mapping(self, node: yaml.MappingNode, path: tuple[str | int, ...], inside: frozenset[int]) -> dict:
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise _Refusal(path, key_node, None, "has a key that is not a plain string", "write a name")
            key = key_node.value
            if key_node.tag in _TAG_NAMES:
                raise _Refusal(
                    (*path, key),
                    key_node,
                    None,
                    f"YAML reads this as {_TAG_NAMES[key_node.tag]}, which a stack setting cannot be",
                    "write the keys out in this mapping",
                )
            if key in result:
                raise _Refusal(
                    (*path, key),
                    key_node,
                    key,
                    "is set twice in the same mapping (the Pulumi CLI refuses the file)",
                    "keep one of the two",
                )
            result[key] = self.read(value_node, (*path, key), inside)
        return result

    @staticmethod
    def scalar(node: yaml.ScalarNode, path: tuple[str | int, ...]) -> Any:
        text = node.value
        if node.style or node.tag == _STR_TAG:  # quoted, a block, or plain text both YAMLs read as a string
            return text
        # Plain text YAML 1.1 resolved to something else: keep only what YAML 1.2 agrees on.
        if text in _NULL:
            return None
        if text in _BOOL:
            return _BOOL[text]
        if _INT.fullmatch(text):
            return int(text)
        if _FLOAT.fullmatch(text):
            return float(text)
        kind = {"tag:yaml.org,2002:bool": "a boolean", "tag:yaml.org,2002:null": "null"}.get(
            node.tag, "a number"
        )
        raise _Refusal(
            path,
            node,
            text,
            f"YAML readers disagree on this plain value (PyYAML reads {kind}, others text)",
            "write true/false or a plain decimal number, or quote it to mean the text",
        )


def _depth_issue(text: str) -> ConfigIssue | None:
    """Nesting deeper than MAX_DEPTH, found from the event stream before anything recursive runs."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                return ConfigIssue(
                    f"the file (line {event.start_mark.line + 1})",
                    None,
                    f"nests more than {MAX_DEPTH} levels deep",
                    "a stack file needs about six levels; check the indentation",
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return None


def _checked_levels(document: Any) -> Iterator[ConfigIssue]:
    if not isinstance(document, dict):
        yield ConfigIssue(
            "the file",
            None,
            f"is {_kind(document)}, not a mapping",
            "a stack file is a mapping with a `config:` mapping in it; see stacks/README.md",
        )
        return
    stray = sorted(key for key in document if isinstance(key, str) and ":" in key)
    if "config" not in document and stray:
        # A stack file whose settings sit at the top: Pulumi reads only what is under `config:`.
        yield ConfigIssue(
            "the file",
            None,
            f"has {', '.join(stray)} at its top level and no `config:` key, so Pulumi reads none of them",
            "put `config:` on the first line and indent the settings under it; see stacks/README.md",
        )
        return
    config = document.get("config", {})
    if not isinstance(config, dict):
        yield ConfigIssue(
            "config",
            None,
            f"is {_kind(config)}, not a mapping",
            "write `config:` followed by indented `key: value` lines; see stacks/README.md",
        )
        return


def config_key_issues(config: dict[str, Any]) -> Iterator[ConfigIssue]:
    """Keys left empty, and keys the Pulumi CLI reads itself with the shape it expects (after project defaults
    are merged)."""
    for key, value in config.items():
        if value is None:
            yield ConfigIssue(key, None, "is empty", "give it a value, or remove the line")
    for key in _PULUMI_LIST_KEYS:
        value = config.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            yield ConfigIssue(key, None, f"is {_kind(value)}", "list package names, e.g. [aws, kubernetes]")


def _kind(value: Any) -> str:
    if value is None:
        return "empty"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number"
    )


def load_stack_file(path: Path) -> dict[str, Any]:
    """The document of a stack (or project) file as the Pulumi CLI reads it; a ConfigError otherwise."""

    def refuse(issue: ConfigIssue) -> ConfigError:
        error = ConfigError([issue])
        error.args = (f"{path}: {error.args[0]}",)
        return error

    raw = path.read_bytes()
    if len(raw) > MAX_FILE_BYTES:
        raise refuse(
            ConfigIssue(
                "the file", None, f"is {len(raw):,} bytes", f"a stack file is far below {MAX_FILE_BYTES:,}"
            )
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise refuse(
            ConfigIssue(
                "the file",
                None,
                f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                "save it as UTF-8",
            )
        ) from None
    try:
        too_deep = _depth_issue(text)
        if too_deep is not None:
            raise refuse(too_deep)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        document = {} if node is None else _Reader().read(node, (), frozenset())
    except _Refusal as refusal:
        raise refuse(refusal.args[0]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"the file (line {mark.line + 1}, column {mark.column + 1})" if mark else "the file"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise refuse(
            ConfigIssue(where, None, f"is not valid YAML: {problem}", "fix the YAML there")
        ) from None
    issues = list(_checked_levels(document))
    if issues:
        raise refuse(issues[0])
    return document
