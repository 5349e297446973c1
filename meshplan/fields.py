"""Typed field readers shared by every file parser: each failure names the field and what is valid."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from meshplan.errors import InputError

AUTO = "auto"


def require_mapping(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(field, f"must be a mapping, got {type(value).__name__}")
    return value


def reject_unknown(data: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    known = list(known)
    for key in data:
        if key not in known:
            prefix = f"{where}." if where else ""
            raise InputError(f"{prefix}{key}", f"unknown field; valid fields: {', '.join(known)}")


def as_int(value: Any, field: str, minimum: int | None = None, allow_auto: bool = False,
           maximum: int | None = None) -> Any:
    if allow_auto and value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and not isinstance(value, bool):
            value = int(value)
        else:
            hint = " or 'auto'" if allow_auto else ""
            raise InputError(field, f"must be an integer{hint}, got {value!r}")
    if minimum is not None and value < minimum:
        raise InputError(field, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise InputError(field, f"must be <= {maximum}, got {value}")
    return value


def as_float(value: Any, field: str, minimum: float | None = None, exclusive_min: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(field, f"must be a number, got {value!r}")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise InputError(field, f"must be a finite number, got {value}")
    if minimum is not None and (value < minimum or (exclusive_min and value == minimum)):
        relation = ">" if exclusive_min else ">="
        raise InputError(field, f"must be {relation} {minimum}, got {value}")
    return value


def as_bool(value: Any, field: str, allow_auto: bool = False) -> Any:
    if allow_auto and value == AUTO:
        return AUTO
    if not isinstance(value, bool):
        hint = ", false or 'auto'" if allow_auto else " or false"
        raise InputError(field, f"must be true{hint}, got {value!r}")
    return value


def as_choice(value: Any, field: str, choices: Iterable[str], allow_auto: bool = False) -> Any:
    choices = list(choices)
    if allow_auto and value == AUTO:
        return AUTO
    if value not in choices:
        extra = ["auto"] if allow_auto else []
        raise InputError(field, f"must be one of {' | '.join(choices + extra)}, got {value!r}")
    return value


def as_str(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(field, f"must be a non-empty string, got {value!r}")
    return value
