"""megatron-core for mmcore: whether it is usable here, and what a family builds on it.

megatron-core is an optional extra (``pip install 'mmcore[megatron]'``), never imported unless a
run or a test asks for it. :func:`status` says whether it is usable and, if not, why (``mmcore
doctor`` and ``mmcore info`` print it). :mod:`mmcore.megatron.cpu` makes the pinned minor
version run on the CPU accelerator (gloo), :mod:`mmcore.megatron.gpt` builds a ``GPTModel``
from a transformers config and loads it from a family's :class:`mmcore.parallel_map.ParallelMap`.
"""

from __future__ import annotations

import warnings

#: the megatron-core minor version the CPU compatibility layer and the tests were written for
TESTED_MINOR = "0.16"

# megatron-core announces at import every optional accelerator library it falls back from (a
# dozen lines per process): mmcore builds the local spec on purpose, and `mmcore doctor` says
# what is installed.
warnings.filterwarnings("ignore", message=r"(Transformer Engine and Apex are|Apex is) not installed", category=UserWarning)
warnings.filterwarnings("ignore", message=r"full scope is deprecated", category=UserWarning)


def status() -> tuple[bool, str]:
    """(usable, a one-line reason): installed, of the tested minor version, with psutil (its
    checkpoint writer's child process dies without it and the parent hangs)."""
    import importlib.metadata as metadata
    import importlib.util

    try:
        version = metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return False, "megatron-core is not installed (pip install 'mmcore[megatron]')"
    if not version.startswith(TESTED_MINOR + "."):
        return False, f"megatron-core {version} is installed; mmcore is tested with {TESTED_MINOR}.x (pip install 'mmcore[megatron]')"
    if importlib.util.find_spec("psutil") is None:
        return False, f"megatron-core {version} needs psutil, which it does not declare (pip install psutil)"
    return True, f"megatron-core {version}"


__all__ = ["TESTED_MINOR", "status"]
