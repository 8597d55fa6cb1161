"""The `gpu-k8s` command: one entry point for the offline tools.

gpu-k8s plan STACK [--full|--json]   the offline plan of a stack (what `pulumi up` would create, its cost)
gpu-k8s plan STACK --diff [PLAN]     what changed against the stack's snapshot (or a saved --json plan)
gpu-k8s rent [--region R|--stack S]  slots per node and per dollar under each sharing mode
gpu-k8s bench [--stack S]            plan cost against the import floor and a flat replay
gpu-k8s upstream verify|fetch        the pinned upstream contract data (in a checkout)
gpu-k8s references check STACK...    every name the stacks' plans send exists by pinned public data
gpu-k8s references refresh           derive the reference tables again from their pinned sources
gpu-k8s --version                    the installed version
"""

from __future__ import annotations

import importlib
import sys
import traceback
from importlib import metadata

# Exit codes: 0 fine, 1 the command's "no" (plan --diff: the plan changed; references: a name not found),
# 2 bad input, 3 a bug.
INTERNAL_ERROR = 3
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
    try:
        return int(tool_main(rest))
    except Exception:
        # Exit codes mean something to callers (plan --diff: 1 = the plan changed), and Python's own exit
        # code for an uncaught exception is 1 too: a crash must not read as a change.
        traceback.print_exc()
        print(f"gpu-k8s {command}: internal error (a bug; the traceback is above)", file=sys.stderr)
        return INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
