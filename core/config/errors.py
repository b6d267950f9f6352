"""A pydantic validation error as one line per problem, naming the layer (file, preset or
command line) that set the key, and for an unknown key the one the user likely meant."""

from __future__ import annotations

import difflib
from typing import Any, Mapping

from pydantic import BaseModel, ValidationError


def _origin_of(loc: tuple[str, ...], origins: Mapping[tuple[str, ...], str]) -> str:
    for end in range(len(loc), 0, -1):
        if loc[:end] in origins:
            return origins[loc[:end]]
    return "defaults"


def _fields_at(model: type[BaseModel], loc: tuple[str, ...]) -> list[str]:
    """Field names of the section at ``loc`` (to suggest the key the user meant)."""
    current: Any = model
    for part in loc:
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = field.annotation
    return list(getattr(current, "model_fields", {}))


def format_validation_error(exc: ValidationError, model: type[BaseModel], origins: Mapping[tuple[str, ...], str]) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        key = ".".join(loc) or "(top level)"
        origin = _origin_of(loc, origins)
        if err["type"] == "extra_forbidden":
            known = _fields_at(model, loc[:-1])
            guess = difflib.get_close_matches(loc[-1], known, n=1)
            hint = f"; did you mean {'.'.join((*loc[:-1], guess[0]))!r}?" if guess else (f"; known keys: {', '.join(known)}" if known else "")
            lines.append(f"{origin}: {key}: unknown key{hint}")
        else:
            got = err.get("input")
            shown = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
            lines.append(f"{origin}: {key}: {err['msg']}{shown}")
    return lines


__all__ = ["format_validation_error"]
