"""YAML text the toolkit renders (cloud-init, Helm values, the GCE autoscaler's kube-env).

Through libyaml's emitter (`CSafeDumper`): the same documents as PyYAML's pure-Python emitter about 15x
faster, which is most of what a GPU pool costs a plan on k3s. The two wrap long lines differently, so the
rendered text (user data, whose change starts new nodes) must not depend on which one a machine has: PyYAML's
wheels on PyPI ship libyaml, and without it this module refuses to load instead of rendering other bytes.
"""

from __future__ import annotations

from typing import Any

import yaml

if not yaml.__with_libyaml__:
    raise ImportError(
        "PyYAML was built without libyaml, so rendered YAML would differ from the plans'; "
        "reinstall it from a wheel: pip install --force-reinstall --only-binary pyyaml pyyaml"
    )


class _LiteralDumper(yaml.CSafeDumper):
    """Multi-line strings as literal blocks (`|`): a script reads as itself, and takes fewer bytes than
    quoted with escapes. libyaml falls back to quoting a string a literal block cannot hold (trailing spaces,
    control characters)."""


def _literal_multi_line(dumper: yaml.CSafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_LiteralDumper.add_representer(str, _literal_multi_line)


def yaml_text(
    document: Any, *, sort_keys: bool = False, width: int = 80, literal_blocks: bool = False
) -> str:
    """`document` as block YAML (the `yaml.safe_dump` defaults, keys kept in order unless `sort_keys`);
    `literal_blocks`: multi-line strings as `|` blocks."""
    dumper = _LiteralDumper if literal_blocks else yaml.CSafeDumper
    return yaml.dump(document, Dumper=dumper, sort_keys=sort_keys, width=width)
