"""Names a package exports but loads on first use (PEP 562), so importing one floor of the
package does not import the others: ``__getattr__, __dir__ = lazy(__name__, {"name": "module"})``."""

from __future__ import annotations

import sys
from importlib import import_module


def lazy(package: str, exports: dict[str, str]):
    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = import_module(f".{exports[name]}", package)
        # every export of that module at once: importing it set the package's attribute of the
        # module's own name (accounting.table1) to the module, and a function of that name must win
        for other, where in exports.items():
            if where == exports[name]:
                setattr(sys.modules[package], other, getattr(module, other))
        return getattr(sys.modules[package], name)

    def __dir__():
        return sorted({*exports, *vars(sys.modules[package])})

    return __getattr__, __dir__
