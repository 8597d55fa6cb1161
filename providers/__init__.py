"""One package per cloud; each registers its platforms in its `platforms` module, imported here.

Adding a platform = adding a folder with a `platforms.py` (DEVELOPERS.md, "Add a platform"). The modules
that create resources are imported only when their stack is built, so an AWS plan never loads pulumi_gcp.
"""

from __future__ import annotations

import importlib
import pkgutil

for _package in pkgutil.iter_modules(__path__):
    if _package.ispkg:
        importlib.import_module(f"{__name__}.{_package.name}.platforms")
