"""What changed between two offline plans, per resource and per attribute: the diff a reviewer reads.

    gpu-k8s plan aws-eks --diff                      # against stacks/plans/aws-eks.json (the snapshot)
    gpu-k8s plan aws-eks --diff old-plan.json        # against any saved `--json` plan

Each resource is created (+), deleted (-) or updated (~), named by type and name, with the attributes that
changed (inputs, dependencies, options) as dotted paths, old -> new; a list shows the items that left it,
those that joined it, and the order of those it kept when that changed. Output values and the plan's warnings
are compared too. Whether the provider updates in place
or replaces is the provider's call on the live state; `pulumi preview --diff` says that.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

# A value longer than this is shortened in a diff line (the JSON plan has it whole).
SHOWN_VALUE = 200
COMPARED = ("inputs", "dependencies", "options", "parent")


def plan_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Lines of the per-resource diff from the plan document `before` to `after` (empty: no change)."""
    old = {resource["urn"]: resource for resource in before["resources"]}
    new = {resource["urn"]: resource for resource in after["resources"]}
    lines: list[str] = []
    for urn in sorted(old.keys() | new.keys(), key=lambda u: (_label(old.get(u) or new[u]), u)):
        if urn not in old:
            lines.append(f"+ create  {_label(new[urn])}")
        elif urn not in new:
            lines.append(f"- delete  {_label(old[urn])}")
        else:
            changes = [
                f"    {path}: {_shown(was)} -> {_shown(now)}"
                for key in COMPARED
                for path, was, now in _changes(key, old[urn].get(key), new[urn].get(key))
            ]
            if changes:
                lines.append(f"~ update  {_label(new[urn])}")
                lines.extend(changes)
    for path, was, now in _changes("outputs", before.get("outputs"), after.get("outputs")):
        lines.append(f"~ output  {path}: {_shown(was)} -> {_shown(now)}")
    # Warnings are what the plan tells its reader (a driver it cannot check, an API range nobody is in).
    old_warnings, new_warnings = before.get("warnings") or [], after.get("warnings") or []
    lines += [f"- warning  {text}" for text in old_warnings if text not in new_warnings]
    lines += [f"+ warning  {text}" for text in new_warnings if text not in old_warnings]
    return lines


def summary(lines: list[str]) -> str:
    counts = {verb: sum(line.startswith(sign) for line in lines) for verb, sign in _SIGNS.items()}
    outputs = sum(line.startswith("~ output") for line in lines)
    warnings = sum(line[2:].startswith("warning") for line in lines)
    parts = [f"{count} to {verb}" for verb, count in counts.items() if count]
    parts += [f"{outputs} output value(s) changed"] if outputs else []
    parts += [f"{warnings} warning(s) changed"] if warnings else []
    return ", ".join(parts) or "no changes"


# Not a name anything can have (names are DNS labels), so a pool named "order" cannot be mistaken for it.
REORDERED = "[~order]"
_SIGNS = {"create": "+ create", "update": "~ update", "delete": "- delete"}
_ABSENT = object()


def _label(resource: Mapping[str, Any]) -> str:
    return f"{resource['type']}  {resource['name']}"


def _changes(path: str, was: Any, now: Any) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(was, dict) and isinstance(now, dict):
        for key in sorted(was.keys() | now.keys()):
            yield from _changes(f"{path}.{key}", was.get(key, _ABSENT), now.get(key, _ABSENT))
    elif isinstance(was, list) and isinstance(now, list) and _named(was) and _named(now) and was != now:
        # Items with unique names (pools, flavors, containers) are compared by name, field by field.
        old_named, new_named = {i["name"]: i for i in was}, {i["name"]: i for i in now}
        for name in [*old_named, *(n for n in new_named if n not in old_named)]:
            yield from _changes(f"{path}[{name}]", old_named.get(name, _ABSENT), new_named.get(name, _ABSENT))
        kept_was, kept_now = (
            [n for n in old_named if n in new_named],
            [n for n in new_named if n in old_named],
        )
        if kept_was != kept_now:
            yield f"{path}{REORDERED}", kept_was, kept_now
    elif isinstance(was, list) and isinstance(now, list) and was != now:
        # A list shows the items that left it and the items that joined it (order changes: whole list).
        old_items = [json.dumps(item, sort_keys=True) for item in was]
        new_items = [json.dumps(item, sort_keys=True) for item in now]
        gone = [item for item in was if json.dumps(item, sort_keys=True) not in new_items]
        added = [item for item in now if json.dumps(item, sort_keys=True) not in old_items]
        yield from ((f"{path}[-]", item, _ABSENT) for item in gone)
        yield from ((f"{path}[+]", _ABSENT, item) for item in added)
        # The items both lists hold, in their old and new order (zone order, for one, places nodes).
        kept_was = [item for item, key in zip(was, old_items, strict=True) if key in new_items]
        kept_now = [item for item, key in zip(now, new_items, strict=True) if key in old_items]
        if kept_was != kept_now:
            yield f"{path}{REORDERED}", kept_was, kept_now
    elif was != now:
        yield path, was, now


def _named(items: list[Any]) -> bool:
    names = [item.get("name") for item in items if isinstance(item, dict)]
    return (
        len(names) == len(items) and all(isinstance(n, str) for n in names) and len(set(names)) == len(names)
    )


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= SHOWN_VALUE else text[: SHOWN_VALUE - 3] + "..."
