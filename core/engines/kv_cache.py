"""A model called step by step with its KV cache, under whichever name the installed
transformers gives the cache: 5.2x renamed ``past_key_values`` to ``cache`` (the argument and
the output's attribute). Packs that decode with their own loop (Whisper, the speech-generation
LMs) call :func:`cached_forward` instead of naming either.
"""

from __future__ import annotations

import inspect
from typing import Any

#: model class -> the keyword its forward takes the cache by (looked up once per class)
_CACHE_ARGUMENT: dict[type, str] = {}


def cache_argument(module: Any) -> str:
    """``"cache"`` or ``"past_key_values"``: the keyword ``module.forward`` takes its KV cache by,
    and the attribute its output returns it in."""
    kind = type(module)
    if kind not in _CACHE_ARGUMENT:
        _CACHE_ARGUMENT[kind] = "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"
    return _CACHE_ARGUMENT[kind]


def cached_forward(module: Any, cache: Any, *, use_cache: bool = True, **inputs: Any) -> tuple[Any, Any]:
    """``module(**inputs)`` given ``cache`` (None on the first step) and ``use_cache``:
    (its output, the cache it returned, or None)."""
    name = cache_argument(module)
    out = module(**inputs, use_cache=use_cache, **{name: cache})
    return out, getattr(out, name, None)


__all__ = ["cache_argument", "cached_forward"]
