"""``@plain``: a class of plain data (fields, defaults, ``__init__``, ``__eq__``, ``__repr__``)
without ``dataclasses``' cost when the class is created.

``@dataclass`` writes each class's ``__init__``, ``__repr__`` and ``__eq__`` as source text and
compiles it, and works out a signature for its docstring: 0.3-1.5 ms per class, paid by every
hook process for every class it imports (``healthcheck/facts.py``'s ten took 5 ms and more,
docs/performance.md). ``@plain`` reads the class's annotations once and gives it shared methods
that walk the field list: creating the class costs microseconds, an instance a little more than
a dataclass's (facts are made a few dozen times per run).

What it keeps of ``@dataclass`` (the subset the facts use): fields in annotation order, each
with a default, a ``field(default_factory=...)`` or none (then required, and before the
defaulted ones); positional or keyword arguments; ``repr=False`` and ``compare=False`` per field;
``__eq__`` on the compared fields of the same class (and ``__hash__`` None, as a dataclass with
``eq``; ``frozen=True``: no assignment, hashed on the compared fields); instances pickle as any
object (a frozen one too: pickle restores its ``__dict__`` without ``__setattr__``). ``asdict`` turns one into a dict of copies, nested
``@plain`` instances and lists, tuples and dicts of them included.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple, TypeVar

_MISSING = object()
T = TypeVar("T")


class _Field:
    __slots__ = ("default", "factory", "repr", "compare")

    def __init__(self, default: Any, factory: Any, repr: bool, compare: bool):
        self.default, self.factory, self.repr, self.compare = default, factory, repr, compare


def field(*, default: Any = _MISSING, default_factory: Any = _MISSING, repr: bool = True,  # noqa: A002
          compare: bool = True) -> Any:
    return _Field(default, default_factory, repr, compare)


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    spec = type(self).__plain__
    names = spec[0]
    if len(args) > len(names):
        raise TypeError(f"{type(self).__name__}() takes {len(names)} positional arguments but {len(args)} were given")
    for name, value in zip(names, args):
        if name in kwargs:
            raise TypeError(f"{type(self).__name__}() got multiple values for argument {name!r}")
        object.__setattr__(self, name, value)
    defaults, factories = spec[1], spec[2]
    for name in names[len(args):]:
        if name in kwargs:
            value = kwargs.pop(name)
        elif name in factories:
            value = factories[name]()
        elif name in defaults:
            value = defaults[name]
        else:
            raise TypeError(f"{type(self).__name__}() missing required argument: {name!r}")
        object.__setattr__(self, name, value)
    if kwargs:
        raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument {next(iter(kwargs))!r}")
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in type(self).__plain__[3])
    return f"{type(self).__qualname__}({shown})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return all(getattr(self, name) == getattr(other, name) for name in type(self).__plain__[4])


class FrozenInstanceError(AttributeError):
    """A field of a ``@plain(frozen=True)`` instance was assigned (as dataclasses')."""


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, name) for name in type(self).__plain__[4]))


def plain(cls: Any = None, *, frozen: bool = False) -> Any:
    """``@plain`` or ``@plain(frozen=True)`` (then hashable on its compared fields)."""
    if cls is None:
        return lambda target: _make(target, frozen)
    return _make(cls, frozen)


def _make(cls: "type[T]", frozen: bool) -> "type[T]":
    names, defaults, factories, shown, compared = [], {}, {}, [], []
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if "ClassVar" in str(annotation):
            continue
        value = cls.__dict__.get(name, _MISSING)
        repr_it = compare_it = True
        if isinstance(value, _Field):
            repr_it, compare_it = value.repr, value.compare
            if value.factory is not _MISSING:
                factories[name] = value.factory
                value = _MISSING
            else:
                value = value.default
            if value is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, value)
        if value is not _MISSING:
            defaults[name] = value
        elif factories.get(name) is None and (defaults or factories):
            raise TypeError(f"{cls.__name__}: field {name!r} without a default follows one with a default")
        names.append(name)
        if repr_it:
            shown.append(name)
        if compare_it:
            compared.append(name)
    cls.__plain__ = (tuple(names), defaults, factories, tuple(shown), tuple(compared))
    cls.__init__ = _init
    cls.__repr__ = _repr
    cls.__eq__ = _eq
    cls.__hash__ = _hash if frozen else None
    if frozen:
        cls.__setattr__ = _frozen_setattr
        cls.__delattr__ = _frozen_delattr
    return cls


def fields_of(obj: Any) -> Tuple[str, ...]:
    return type(obj).__plain__[0]


def asdict(obj: Any) -> Dict[str, Any]:
    """``obj``'s fields as a dict; nested ``@plain`` instances (in lists, tuples, dicts too) as dicts."""
    return {name: _value(getattr(obj, name)) for name in fields_of(obj)}


def _value(value: Any) -> Any:
    if hasattr(type(value), "__plain__"):
        return asdict(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_value(item) for item in value)
    if isinstance(value, dict):
        return {key: _value(item) for key, item in value.items()}
    return value


def replace(obj: Any, **changes: Any) -> Any:
    """A copy of ``obj`` with ``changes`` (as ``dataclasses.replace``: through ``__init__``); a
    dataclass instance is handed to ``dataclasses.replace`` itself."""
    if not hasattr(type(obj), "__plain__"):
        import dataclasses

        return dataclasses.replace(obj, **changes)
    values = {name: getattr(obj, name) for name in fields_of(obj)}
    unknown = set(changes) - set(values)
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {sorted(unknown)[0]!r}")
    values.update(changes)
    return type(obj)(**values)
