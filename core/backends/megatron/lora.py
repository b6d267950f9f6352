"""LoRA on megatron-core's parallel linears, exported in the PEFT format transformers' models load.

peft's own Megatron path is broken in 0.21 (FACTS: it reads a ``fan_in_fan_out`` key the parallel
layers lack and scales the ``(output, bias)`` tuple they return), so this is a small own layer:
``out = base(x) + alpha / r * B(A(x))``, split as its base is.

* Column-parallel base (q/k/v, gate/up): ``A`` [r, in] whole on every rank, ``B`` [out / TP, r]
  cut as the base's rows; ``A x`` passes Megatron's copy-to-TP region, so the gradient reaching
  ``A`` is summed over the ranks' ``B`` shards and ``A`` stays the same everywhere.
* Row-parallel base (o_proj, down_proj): ``A`` [r, in / TP] cut as the base's columns, its
  partial products summed over the ranks (reduce-from-TP region), ``B`` [out, r] whole.

Under sequence parallelism the base takes (column) or gives (row) this rank's part of the
sequence: ``A x`` is gathered over the sequence before ``B`` (column), the row adapter's partial
products reduce-scattered over it instead of summed; the weight that then sees only this rank's
tokens (column: ``A``; row: ``B``) is marked ``sequence_parallel``, its gradient summed over TP.

Dropout (``training.lora.dropout``) on the adapter's input draws each mask whole, over the
input as one process would hold it, from the stream the tensor-parallel ranks share
(``Layout.rng_stream``), and each rank keeps its part: the same masks at any TP size, and
the same on every rank that holds the same input (``A`` stays the same on every rank). Under
sequence parallelism megatron-core's transformer block runs in its model-parallel random stream
(each TP rank its own): the masks come from there, and the engine's checkpoints hold those
streams. A recomputed layer draws them again from the RNG state checkpointing restored.

Export: shards merged by the family's table as their base weights are, then split to HF's
modules (a fused q/k/v's ``B`` per query group into q, k and v, each with the same ``A``), under
PEFT's names (``base_model.model.<module>.lora_A.weight``) with an ``adapter_config.json``.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from mmcore.errors import StageError

#: the Megatron linears that get adapters by default: every linear of the language model's layers
DEFAULT_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def parallel_lora(base: Any, r: int, alpha: float, dropout: float = 0.0) -> Any:
    """A parallel linear with a low-rank adapter beside it (the module docstring says how it splits)."""
    return _lora_class()(base, r, alpha, dropout)


@functools.cache
def _lora_class() -> type:
    """The adapter module's class, made on first use (importing this module needs no torch)."""
    import torch

    class ParallelLoRA(torch.nn.Module):
        def __init__(self, base: Any, r: int, alpha: float, dropout: float = 0.0) -> None:
            from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, set_tensor_model_parallel_attributes

            super().__init__()
            self.base, self.r, self.scaling, self.dropout = base, r, alpha / r, dropout
            self.column = isinstance(base, ColumnParallelLinear)
            if not self.column and not isinstance(base, RowParallelLinear):
                raise StageError(f"LoRA on megatron-core: {type(base).__name__} is neither a column- nor a row-parallel linear")
            weight = base.weight
            self.lora_A = torch.nn.Parameter(torch.empty(r, weight.shape[1], dtype=weight.dtype))
            self.lora_B = torch.nn.Parameter(torch.zeros(weight.shape[0] if self.column else base.output_size, r, dtype=weight.dtype))
            torch.nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's and peft's default
            set_tensor_model_parallel_attributes(self.lora_B if self.column else self.lora_A, True, 0 if self.column else 1, 1)
            self.sequence_parallel = bool(base.config.sequence_parallel)
            (self.lora_A if self.column else self.lora_B).sequence_parallel = self.sequence_parallel

        def sharded_state_dict(self, prefix: str = "", sharded_offsets: Any = (), metadata: Any = None) -> Any:
            """For ``dist_checkpointing``: the base linear's own sharding (under ``base.``), the
            adapters split over TP as their base (column: ``B`` by rows; row: ``A`` by columns)."""
            from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group, make_sharded_tensors_for_checkpoint

            from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

            metadata = ensure_metadata_has_dp_cp_group(metadata)
            state = self.base.sharded_state_dict(prefix=f"{prefix}base.", sharded_offsets=sharded_offsets, metadata=metadata)
            state.update(
                make_sharded_tensors_for_checkpoint(
                    {"lora_A": self.lora_A, "lora_B": self.lora_B},
                    prefix,
                    {"lora_B": 0} if self.column else {"lora_A": 1},
                    sharded_offsets,
                    tp_group=self.base.tp_group,
                    dp_cp_group=metadata["dp_cp_group"],
                )
            )
            if prefix.endswith("linear_fc1.") and self.base.config.gated_linear_unit:
                # a rank's rows are [gate_r; up_r]: saved as gate and up halves so another TP size
                # reads them back (Megatron's MLP does this to the keys of an unwrapped linear_fc1)
                for key in (f"{prefix}base.weight", f"{prefix}base.bias", f"{prefix}lora_B"):
                    if key in state:
                        state[key] = apply_swiglu_sharded_factory(state[key], sharded_offsets, (metadata or {}).get("singleton_local_shards", False))
            return state

        def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
            from megatron.core.tensor_parallel import mappings

            out, bias = self.base(x, *args, **kwargs)
            low = torch.nn.functional.linear(self._dropped(x) if self.training and self.dropout else x, self.lora_A)
            if self.sequence_parallel:
                low = mappings.gather_from_sequence_parallel_region(low) if self.column else mappings.reduce_scatter_to_sequence_parallel_region(low)
            else:
                low = mappings.copy_to_tensor_model_parallel_region(low) if self.column else mappings.reduce_from_tensor_model_parallel_region(low)
            return out + self.scaling * torch.nn.functional.linear(low, self.lora_B), bias

        def _dropped(self, x: Any) -> Any:
            """``x`` times this rank's part of a dropout mask drawn for the whole input
            ([sequence, batch, features]: a column adapter's input is whole, or this rank's
            part of the sequence under sequence parallelism; a row adapter's is this rank's
            part of the features)."""
            from megatron.core import parallel_state

            rank, tp = parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size()
            split = (0 if self.sequence_parallel else None) if self.column else x.dim() - 1
            whole = list(x.shape)
            if split is not None:
                whole[split] *= tp
            keep = torch.empty(whole, dtype=x.dtype, device=x.device).bernoulli_(1 - self.dropout)
            if split is not None:
                keep = keep.narrow(split, rank * x.shape[split], x.shape[split])
            return x * keep / (1 - self.dropout)

    return ParallelLoRA


def add_adapters(model: Any, r: int, alpha: float, targets: Sequence[str] = DEFAULT_TARGETS, dropout: float = 0.0) -> list[str]:
    """Put a :func:`parallel_lora` on every parallel linear named in ``targets`` (``dropout`` on
    its input while training), freeze every other parameter; returns the wrapped modules' names."""
    from mmcore.train.lora import check_rank

    chosen = [
        (f"{name}.{child_name}" if name else child_name, child)
        for name, module in model.named_modules()
        for child_name, child in module.named_children()
        if child_name in targets and not isinstance(child, _lora_class()) and hasattr(child, "weight")
    ]
    # the parallel linears know their whole (unsplit) sizes
    check_rank(r, {name: (child.input_size, child.output_size) for name, child in chosen if hasattr(child, "input_size") and hasattr(child, "output_size")})
    wrapped = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name in targets and not isinstance(child, _lora_class()) and hasattr(child, "weight"):
                setattr(module, child_name, parallel_lora(child, r, alpha, dropout))
                wrapped.append(f"{name}.{child_name}" if name else child_name)
    if not wrapped:
        raise StageError(f"LoRA on megatron-core: no parallel linear named {', '.join(targets)}")
    for parameter_name, parameter in model.named_parameters():
        parameter.requires_grad_(".lora_A" in parameter_name or ".lora_B" in parameter_name)
    return wrapped


def _global_names(gpt: Any) -> dict[str, str]:
    """Module name in this pipeline stage's ``GPTModel`` -> its name in the whole model (a
    stage numbers its layers from 0; each layer knows its global ``layer_number``, from 1)."""
    names = {}
    for name, module in gpt.named_modules():
        names[name] = name
    layers = getattr(getattr(gpt, "decoder", None), "layers", [])
    for local, layer in enumerate(layers):
        for name, _ in layer.named_modules():
            here = f"decoder.layers.{local}" + (f".{name}" if name else "")
            names[here] = f"decoder.layers.{layer.layer_number - 1}" + (f".{name}" if name else "")
    return names


def adapter_shards(model: Any, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """This rank's adapters: the base weight's Megatron name in the whole model (under
    ``prefix``) -> (A, B)."""
    names = _global_names(model)
    return {f"{prefix}{names.get(name, name)}.weight": (module.lora_A.detach(), module.lora_B.detach()) for name, module in model.named_modules() if isinstance(module, _lora_class())}


def init_adapters(gpt: Any, seed: int, kind: str = "default") -> None:
    """Start every adapter as peft does (``A`` kaiming-uniform as ``nn.Linear``, or normal with
    std 1/r for ``gaussian``; ``B`` zero), drawn for the whole ``A`` from ``seed`` and the
    module's name in the whole model, each rank keeping its part: the same adapters whatever
    the tensor/pipeline layout."""
    import hashlib

    import torch
    from megatron.core import parallel_state

    rank, tp = parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size()
    names = _global_names(gpt)
    for name, module in gpt.named_modules():
        if not isinstance(module, _lora_class()):
            continue
        digest = hashlib.sha256(f"{seed}:{names.get(name, name)}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)
        r, width = module.lora_A.shape
        whole_width = width if module.column else width * tp
        if kind == "gaussian":
            whole = torch.randn(r, whole_width, generator=generator) / r
        else:
            bound = 1 / math.sqrt(whole_width)  # kaiming_uniform_(a=sqrt(5)) on [r, in]
            whole = (torch.rand(r, whole_width, generator=generator) * 2 - 1) * bound
        with torch.no_grad():
            module.lora_A.copy_(whole if module.column else whole[:, rank * width : (rank + 1) * width])
            module.lora_B.zero_()


def merged_state(gpt: Any) -> dict[str, Any]:
    """This rank's ``GPTModel`` state with every adapter merged into its base weight
    (``W + alpha / r * B A``, on the rank's shard: the product of the shards is the shard of the
    product), under the base's own names; without adapters, the plain state."""
    return {name: make() for name, (_, make) in merged_makers(gpt).items()}


def merged_makers(gpt: Any) -> dict[str, tuple[Any, Callable[[], Any]]]:
    """:func:`merged_state`'s tensors, each made only when asked: name -> (a tensor of its shape
    and dtype, what makes it). A rank that writes them one at a time holds one merged weight at
    a time, not a merged copy of every adapted weight."""
    out: dict[str, tuple[Any, Callable[[], Any]]] = {}
    for key, value in gpt.state_dict().items():
        if not key.endswith("_extra_state"):
            out[key] = (value.detach(), lambda value=value: value.detach())
    for name, module in gpt.named_modules():
        if isinstance(module, _lora_class()):
            del out[f"{name}.lora_A"], out[f"{name}.lora_B"]
            base = out.pop(f"{name}.base.weight")[0]
            out[f"{name}.weight"] = (base, lambda base=base, module=module: base + module.scaling * (module.lora_B.detach() @ module.lora_A.detach()))
            if f"{name}.base.bias" in out:
                out[f"{name}.bias"] = out.pop(f"{name}.base.bias")
    return out


def peft_state(pmap: Any, ranks: Sequence[Mapping[str, tuple[Any, Any]]], hf_module: Callable[[str], str]) -> dict[str, Any]:
    """PEFT's tensors of the adapters of every tensor-parallel rank (``ranks``: each rank's
    :func:`adapter_shards`, under the table's Megatron names): the shards merged as their base
    weight is, a fused base's ``B`` split into the HF modules' (``A`` shared by them).
    ``hf_module``: a hub weight name -> the module path in the transformers model."""
    import torch

    out: dict[str, Any] = {}
    for name in ranks[0]:
        rule = pmap.rule_of(name)
        a_shards, b_shards = [rank[name][0] for rank in ranks], [rank[name][1] for rank in ranks]
        column = rule.kind != "row"
        a = a_shards[0] if column else torch.cat(a_shards, dim=1)
        b = rule.merge(b_shards) if column else b_shards[0]
        index = pmap.layer_of(rule, name)
        for hf_name, b_part in zip(rule.hf, rule.unfuse(b) if column else [b]):
            module = hf_module(hf_name.format(n=index) if index is not None else hf_name).removesuffix(".weight")
            out[f"base_model.model.{module}.lora_A.weight"] = a.clone()  # each module its own copy (safetensors stores no shared memory)
            out[f"base_model.model.{module}.lora_B.weight"] = b_part.contiguous()
    return out


def write_peft(folder: Path, tensors: Mapping[str, Any], r: int, alpha: float, base_model: Path, dropout: float = 0.0, modules_to_save: Sequence[str] = ()) -> None:
    """``adapter_model.safetensors`` and ``adapter_config.json`` as peft saves them (a module to
    save's tensors under its own name, ``base_model.model.<module>.weight``)."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    from mmcore.train.lora import save_peft_config

    folder.mkdir(parents=True, exist_ok=True)
    save_file(dict(tensors), str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    modules = sorted({key.removeprefix("base_model.model.").rsplit(".lora_", 1)[0].rsplit(".", 1)[-1] for key in tensors if ".lora_" in key})
    save_peft_config(LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=modules, modules_to_save=list(modules_to_save) or None, base_model_name_or_path=str(base_model)), folder)


__all__ = ["DEFAULT_TARGETS", "parallel_lora", "add_adapters", "init_adapters", "adapter_shards", "merged_state", "peft_state", "write_peft"]
