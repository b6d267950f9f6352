"""megatron-core for mmcore: whether it is usable here, and what a family builds on it.

megatron-core is an optional extra (``pip install 'mmcore[megatron]'``), never imported unless a
run or a test asks for it. :func:`status` says whether it is usable and, if not, why (``mmcore
doctor`` and ``mmcore info`` print it). :mod:`mmcore.backends.megatron.cpu` makes the pinned minor
version run on the CPU accelerator (gloo), :mod:`mmcore.backends.megatron.gpt` builds a ``GPTModel``
from a transformers config and loads it from a family's :class:`mmcore.backends.megatron.tensor_map.ParallelMap`.
"""

from __future__ import annotations

from mmcore.framework.facade import lazy_exports

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


#: the SDK names of this façade -> the module that defines each (:mod:`mmcore.sdk`)
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("MegatronRecipe", "MegatronPart", "MegatronTable"), "mmcore.backends.megatron.family"),
    **dict.fromkeys(
        (
            "ADAPTER",
            "Layout",
            "MegatronBackend",
            "MegatronFamily",
            "TRAINED",
            "fill_rank",
            "gather_hub_state",
            "load_rank",
            "rank_sources",
            "run_megatron_training",
            "write_adapter",
            "write_trained",
        ),
        "mmcore.backends.megatron.engine",
    ),
    **dict.fromkeys(
        (
            "DEFAULT_TARGETS",
            "adapter_shards",
            "add_adapters",
            "init_adapters",
            "merged_state",
            "parallel_lora",
            "peft_state",
            "write_peft",
        ),
        "mmcore.backends.megatron.lora",
    ),
    **dict.fromkeys(
        (
            "LayerStack",
            "ParallelMap",
            "Rule",
            "even_layers",
        ),
        "mmcore.backends.megatron.tensor_map",
    ),
    **dict.fromkeys(
        (
            "SequenceParallelNorm",
            "check_rank_names",
            "copy_rank_state",
            "gpt_model",
            "init_model_parallel",
            "load_rank_state",
            "mark_parallel_weights",
            "pad_sequence",
            "padded_vocab",
            "scatter_sequence",
        ),
        "mmcore.backends.megatron.gpt",
    ),
    **dict.fromkeys(("context_multiple", "to_context_rank"), "mmcore.backends.megatron.context"),
    **dict.fromkeys(
        (
            "clip_gradients",
            "forward_backward",
            "forward_scores",
            "grad_norm",
            "reduce_gradients",
            "sum_tied_gradients",
            "vocab_parallel_exact_match",
            "vocab_parallel_loss_sum",
        ),
        "mmcore.backends.megatron.train",
    ),
    **dict.fromkeys(
        (
            "export_mindspeed",
            "import_mindspeed",
            "is_checkpoint",
            "read_checkpoint",
            "read_stages",
            "write_checkpoint",
        ),
        "mmcore.backends.megatron.mindspeed_mm",
    ),
    **dict.fromkeys(
        (
            "load",
            "save",
            "sharded_state",
        ),
        "mmcore.backends.megatron.checkpoint",
    ),
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
