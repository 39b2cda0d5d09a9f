"""Typed reads of the core's own state records (changelog rows and users, the gate, the arrival
counts): a value of another type is refused with a ValueError naming the field, never coerced.

Why strict, and why here: a compiled class (mypyc, setup.py) stores a bool given for an int
field as the int 1 and refuses an int for a bool, where the interpreted class keeps whatever it
is given; `int()` would turn 1.9 into 1 and True into 1 in both. Checking the type before a
value reaches a class makes both builds accept and refuse exactly the same records (issue 30;
tests/differential checks the two builds against each other)."""

from __future__ import annotations

from typing import Any


def int_field(value: Any, name: str) -> int:
    """`value` when it is an int (a bool is not), else ValueError."""
    if type(value) is not int:
        raise ValueError(f"{name}: expected an integer, got {_kind(value)}")
    result: int = value
    return result


def optional_int_field(value: Any, name: str) -> int | None:
    if value is None:
        return None
    return int_field(value, name)


def bool_field(value: Any, name: str) -> bool:
    if type(value) is not bool:
        raise ValueError(f"{name}: expected true or false, got {_kind(value)}")
    result: bool = value
    return result


def str_field(value: Any, name: str) -> str:
    if type(value) is not str:
        raise ValueError(f"{name}: expected a string, got {_kind(value)}")
    result: str = value
    return result


def optional_str_field(value: Any, name: str) -> str | None:
    if value is None:
        return None
    return str_field(value, name)


def optional_bytes_field(value: Any, name: str) -> bytes | None:
    if value is None:
        return None
    if type(value) is not bytes:
        raise ValueError(f"{name}: expected bytes, got {_kind(value)}")
    result: bytes = value
    return result


def list_field(value: Any, name: str) -> list[Any]:
    if type(value) is not list:
        raise ValueError(f"{name}: expected a list, got {_kind(value)}")
    result: list[Any] = value
    return result


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
