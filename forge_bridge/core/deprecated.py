"""Old names kept working for one release after a rename (one meaning per word: docs/architecture.md's
glossary), each use warning with the new name."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, Callable, TypeVar

from forge_bridge.core.errors import WrongType

C = TypeVar("C", bound=type)


def renamed(old: str, new: str) -> Callable[[C], C]:
    """A class decorator (above `@dataclass`): the attribute `old` (read, and written where the
    class allows it) is `new`, and so is the constructor keyword `old` where `new` is a field, with a
    DeprecationWarning."""

    def decorate(cls: C) -> C:
        message = f"{cls.__name__}.{old} is now {cls.__name__}.{new}"
        if new in {f.name for f in dataclasses.fields(cls)}:
            init: Callable[..., None] = getattr(cls, "__init__")

            @functools.wraps(init)
            def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
                if old in kwargs:
                    if new in kwargs:
                        raise WrongType(f"{cls.__name__}() got both {old}= and {new}= ({message})")
                    warnings.warn(message, DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
                init(self, *args, **kwargs)

            setattr(cls, "__init__", __init__)

        def read(self: Any) -> Any:
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            return getattr(self, new)

        def write(self: Any, value: Any) -> None:
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            setattr(self, new, value)

        setattr(cls, old, property(read, write, doc=f"Deprecated: `{new}`."))
        return cls

    return decorate


def renamed_argument(what: str, old: str, new: str, old_value: Any, new_value: Any, stacklevel: int = 3) -> Any:
    """An argument's value, renamed `old` -> `new` (both None by default): `new_value`, or where
    only the deprecated `old` is given its value (warning at the caller of the function that calls this)."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise WrongType(f"{what}: got both {old}= and {new}= ({old}= is now {new}=)")
    warnings.warn(f"{what}: {old}= is now {new}=", DeprecationWarning, stacklevel=stacklevel)
    return old_value


def renamed_keyword(what: str, old: str, new: str, kwargs: dict[str, Any], stacklevel: int = 3) -> dict[str, Any]:
    """`kwargs` with the deprecated keyword `old` read as `new` (warning at the caller of the
    function that calls this; both given is an error)."""
    if old not in kwargs:
        return kwargs
    if new in kwargs:
        raise WrongType(f"{what}: got both {old}= and {new}= ({old}= is now {new}=)")
    warnings.warn(f"{what}: {old}= is now {new}=", DeprecationWarning, stacklevel=stacklevel)
    kwargs = dict(kwargs)
    kwargs[new] = kwargs.pop(old)
    return kwargs


__all__ = ["renamed", "renamed_argument", "renamed_keyword"]
