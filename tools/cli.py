"""The `gpu-k8s` command: one entry point for the offline tools.

gpu-k8s plan STACK [--json] [--up]   the offline plan of a stack (what `pulumi up` would create)
gpu-k8s rent                         the "How many GPUs do I rent?" table
gpu-k8s bench [--stack S]            plan cost against the import floor and a flat replay
gpu-k8s upstream verify|fetch        the pinned upstream contract data (in a checkout)
gpu-k8s references check STACK...    every name the stacks' plans send exists by pinned public data
gpu-k8s references refresh           derive the reference tables again from their pinned sources
gpu-k8s --version                    the installed version
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata

COMMANDS = {
    "plan": "gpu_k8s.tools.plan",
    "rent": "gpu_k8s.tools.rent",
    "bench": "gpu_k8s.tools.bench",
    "upstream": "gpu_k8s.tools.upstream",
    "references": "gpu_k8s.tools.references",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in {"-h", "--help"}:
        print(__doc__.strip())
        return 0 if argv else 2
    command, *rest = argv
    if command == "--version":
        print(f"gpu-k8s {metadata.version('gpu-k8s')}")
        return 0
    if command not in COMMANDS:
        print(f"gpu-k8s: no command {command!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    tool_main = importlib.import_module(COMMANDS[command]).main
    return int(tool_main(rest))


if __name__ == "__main__":
    sys.exit(main())
