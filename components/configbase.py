"""What every part of the config model shares: the strict base model, YAML paths and the error type.

Kept apart from `spec.py` so the modules that own a part of the config (sharing, driver compatibility)
can define their models and rules without importing the whole cluster spec.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import pulumi
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

# The namespace is the library's, not the project's: a user's own project (any name) reads the same key.
CONFIG_NAMESPACE = "gpu-k8s"
CONFIG_KEY = f"{CONFIG_NAMESPACE}:cluster"


class StrictModel(BaseModel):
    """camelCase keys, unknown keys refused, no type coercion, immutable."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True, strict=True
    )


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in the stack config, phrased for the person who wrote it."""

    path: str
    value: Any
    problem: str
    fix: str

    def __str__(self) -> str:
        found = "" if self.value is None else f"{shown_value(self.value)} - "
        # A key may hold a line break or control character (refused, but named in the message).
        path = self.path if self.path.isprintable() else self.path.encode("unicode_escape").decode("ascii")
        return f"{path}: {found}{self.problem}. Fix: {self.fix}"


def shown_value(value: Any, limit: int = 60) -> str:
    """A config value as JSON (what YAML and the Pulumi CLI show), invisible characters escaped, shortened."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    if not text.isprintable():
        text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ConfigError(pulumi.RunError):
    """Every problem found in the stack config; raised before any resource is registered.

    A RunError, so the Pulumi CLI prints the message alone instead of a Python traceback.
    """

    def __init__(self, issues: Iterable[ConfigIssue]):
        self.issues = tuple(issues)
        # A screenful: the first problems, and how many more (a list of 200 pools can hold hundreds).
        lines = [f"  - {issue}" for issue in self.issues[:SHOWN_ISSUES]]
        if len(self.issues) > SHOWN_ISSUES:
            lines.append(f"  ... and {len(self.issues) - SHOWN_ISSUES} more of the same kind or others")
        text = "\n".join(lines)
        super().__init__(f"invalid stack config ({len(self.issues)} problem(s)):\n{text}")


# How many problems a refusal prints; the rest are counted.
SHOWN_ISSUES = 20


def raise_if_any(*issue_groups: Iterable[ConfigIssue]) -> None:
    """Raise one ConfigError with the issues of every group, if there are any."""
    issues = [issue for group in issue_groups for issue in group]
    if issues:
        raise ConfigError(issues)


# Sizes, counts and disk sizes are 32-bit integers in the EC2, Auto Scaling, EKS and Compute Engine APIs.
MAX_API_INTEGER = 2**31 - 1


def raw_value_issues(value: Any, parts: tuple[str | int, ...] = ()) -> Iterator[ConfigIssue]:
    """Text and numbers no setting can mean, anywhere under `gpu-k8s:cluster`: invisible or non-ASCII
    characters (a pasted line break, a Unicode digit), surrounding spaces, integers beyond 32 bits."""
    path = config_path(*parts)
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _text_issues(config_path(*parts, key), key, "the key ")
            yield from raw_value_issues(item, (*parts, key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from raw_value_issues(item, (*parts, index))
    elif isinstance(value, str):
        yield from _text_issues(path, value, "")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_API_INTEGER:
        yield ConfigIssue(
            path,
            value,
            f"is beyond what the cloud APIs take (at most {MAX_API_INTEGER:,})",
            "use a smaller number",
        )


def _text_issues(path: str, text: str, which: str) -> Iterator[ConfigIssue]:
    if not text.isascii():
        yield ConfigIssue(
            path,
            text,
            f"{which}contains non-ASCII characters",
            "retype it with plain ASCII letters and digits",
        )
    elif not text.isprintable():
        yield ConfigIssue(
            path,
            text,
            f"{which}contains a line break, tab or control character",
            "write it on one line (a `|` block or a \\n in quotes adds a line break)",
        )
    elif text != text.strip():
        yield ConfigIssue(path, text, f"{which}starts or ends with spaces", "remove them")


def stack_cluster_config() -> Any:
    """The stack's `gpu-k8s:cluster` value as the Pulumi CLI hands it over (structured config is JSON)."""
    return stack_config_object(
        "cluster", "write the cluster's keys indented under it, as in stacks/Pulumi.aws-eks.yaml"
    )


# The keys of the `gpu-k8s:` config namespace; anything else there is a typo or someone else's key.
NAMESPACE_KEYS = ("cluster", "gpuLayer")


def namespace_key_issues(keys: Iterable[str]) -> list[ConfigIssue]:
    """Keys of the `gpu-k8s:` namespace that the library does not read (`gpu-k8s:clustr`), with the near
    miss. A project's own keys belong under its own name."""
    issues = []
    for key in sorted(keys):
        namespace, _, name = key.partition(":")
        if namespace == CONFIG_NAMESPACE and name not in NAMESPACE_KEYS:
            guess = difflib.get_close_matches(name.lower(), [k.lower() for k in NAMESPACE_KEYS], n=1)
            near = next((k for k in NAMESPACE_KEYS if guess and k.lower() == guess[0]), None)
            only = f"{CONFIG_NAMESPACE}: holds only {', '.join(NAMESPACE_KEYS)}"
            fix = (
                f"did you mean {CONFIG_NAMESPACE}:{near}?"
                if near
                else f"{only}; your keys go under your project"
            )
            issues.append(ConfigIssue(key, None, "is not a key of gpu-k8s", fix))
    return issues


def _stack_config_keys() -> set[str]:
    from pulumi.runtime import config as runtime_config

    return set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env() or {})


def stack_config_object(name: str, fix_when_text: str) -> Any:
    """The stack's `gpu-k8s:<name>` value; a ConfigError with `fix_when_text` when it is text, or naming
    any key of the namespace the library does not read."""
    unknown = namespace_key_issues(_stack_config_keys())
    if unknown:
        raise ConfigError(unknown)
    try:
        return pulumi.Config(CONFIG_NAMESPACE).get_object(name)
    except pulumi.ConfigTypeError as exc:
        raise ConfigError(
            [ConfigIssue(f"{CONFIG_NAMESPACE}:{name}", exc.value, "is text, not a mapping", fix_when_text)]
        ) from None


# The config key whose YAML paths the rules name: `gpu-k8s:cluster`, or another key validated with the same
# rules (the GPU layer on an existing cluster, `gpu-k8s:gpuLayer`).
_CONFIG_ROOT: ContextVar[str] = ContextVar("config_root", default=CONFIG_KEY)


@contextmanager
def config_root(key: str) -> Iterator[None]:
    """Name the YAML paths of the issues found inside the block under `key`."""
    token = _CONFIG_ROOT.set(key)
    try:
        yield
    finally:
        _CONFIG_ROOT.reset(token)


def config_key() -> str:
    return _CONFIG_ROOT.get()


def config_path(*parts: str | int) -> str:
    """`gpu-k8s:cluster.gpuPools[1].maxNodes` from ("gpuPools", 1, "maxNodes")."""
    path = config_key()
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


# Lowercase DNS label: usable as a Kubernetes label value, a node group name and a cloud resource name.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A Go-style duration limited to hours, minutes and seconds ("5m", "1h30m"); groups: h, m, s.
DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def duration_seconds(text: str) -> int | None:
    """Seconds of a DURATION ("90s", "1h30m"), or None when it is not one."""
    match = DURATION.fullmatch(text)
    if not text or match is None:
        return None
    hours, minutes, seconds = (int(group or 0) for group in match.groups())
    return hours * 3600 + minutes * 60 + seconds
