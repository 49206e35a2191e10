"""A package's public names loaded on first use (PEP 562), from a table of the module each comes from.

Used by `sej`, `sej.hub` and `sej.shard`, so that importing a package costs nothing until a name is used: the
console scripts' start, and `sej serve`'s on a producer. This module imports nothing itself (importlib on first use).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from collections.abc import Callable


def lazy_names(package: str, namespace: dict[str, object], where: dict[str, str]
               ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:  # fmt: skip
    """The `__getattr__` and `__dir__` of `package`, whose globals are `namespace`: each name of `where` is loaded
    from its module (relative to `package`, as ".errors" or "..frames") when first used, and kept in `namespace`;
    any other name that is a submodule is imported (`sej.offset` after `import sej`, as a package that imports its
    submodules offers them)."""

    def __getattr__(name: str) -> object:
        import importlib

        module = where.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module, package), name)
            namespace[name] = value
            return value
        if name.isidentifier() and not name.startswith("__"):
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
