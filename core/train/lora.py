"""LoRA through peft: adapters injected before sharding, checkpoints of what trains, exports.

The train engine calls :func:`plan_lora` and :func:`inject` on the model it built (on the meta
device when it loads weights itself), before freezing and sharding. Every base parameter is
then frozen and stays bit-identical; the adapters (peft's ``lora_A``/``lora_B``) and the
``modules_to_save`` (trained in place, whole) are the only trainable parameters and the only
model state in a training checkpoint. A checkpoint records its :class:`LoraPlan` in
``lora.json``: the rank and targets, and which base it was trained on (path and content
fingerprint), so that :func:`mmcore.checkpoint.training.load_converted` rebuilds base + adapters from
it and a resume against another base refuses.

Adapters start as peft starts them (A kaiming-uniform or gaussian, B zero: the model starts as
the base), but drawn from a generator seeded by the run's seed and the module's name, on the
whole tensor: the same initial adapters on any number of processes, however they are sharded.

Exports (the PEFT folder, diffusers' keys, merged weights) are :mod:`mmcore.train.lora_export`'s.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import os
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

from mmcore.errors import ConfigError, StageError

if TYPE_CHECKING:
    import torch
    from torch import nn

LORA_FILE = "lora.json"
ADAPTER = "default"  # peft's adapter name while training; exports drop it, as peft's own saving does
#: peft's parameter names of a LoRA layer's own weights (the base layer's are ``base_layer.*``)
ADAPTER_PARTS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.")


@dataclass
class LoraPlan:
    """What adapters a run trains, resolved against its model; saved as ``lora.json``."""

    r: int
    alpha: float
    dropout: float
    init: str
    targets: list[str]  # module names that get adapters
    modules_to_save: list[str] = field(default_factory=list)  # module names trained whole
    base: str = ""  # the base checkpoint (DCP), relative to the training checkpoint when inside the run
    base_fingerprint: str = ""

    def peft_config(self, base_model: str | None = None) -> Any:
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.targets),
            modules_to_save=list(self.modules_to_save) or None,
            bias="none",
            init_lora_weights=True if self.init == "default" else self.init,
            base_model_name_or_path=base_model,
        )

    def base_path(self, checkpoint: Path) -> Path:
        path = Path(self.base)
        return path if path.is_absolute() else (checkpoint / path).resolve()

    def save(self, checkpoint: Path) -> None:
        from mmcore.framework.files import atomic_write_json

        atomic_write_json(checkpoint / LORA_FILE, asdict(self))

    @classmethod
    def read(cls, checkpoint: Path) -> "LoraPlan | None":
        """The plan of a training checkpoint, or None for a full fine-tuning one."""
        path = Path(checkpoint) / LORA_FILE
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise StageError(f"{path}: not a LoRA plan mmcore wrote ({exc})") from None


# --------------------------------------------------------------------------- planning


def _supported(module: Any) -> bool:
    from torch import nn

    return isinstance(module, (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d))


def expand_groups(entries: Sequence[str], groups: Mapping[str, Sequence[str]]) -> list[tuple[str, list[str]]]:
    """Each entry with its globs: a pack group's, or the entry itself."""
    return [(entry, list(groups.get(entry, [entry]))) for entry in entries]


def matches_any(name: str, globs: Iterable[str]) -> bool:
    """Whether ``name`` matches one of ``globs`` (fnmatch, case-sensitive)."""
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


def plan_lora(
    model: "nn.Module", cfg: Any, *, groups: Mapping[str, Sequence[str]], default_targets: Sequence[str], blocks: Sequence["nn.Module"], frozen: Sequence[str], base: tuple[str, str] = ("", "")
) -> LoraPlan:
    """Resolve ``training.lora`` against ``model``.

    Args:
        model: the recipe's model, before any adapter.
        cfg: the ``training.lora`` section (``r`` > 0).
        groups: the pack's named parameter groups (``freeze_groups``); their globs match module
            names as well (``model.visual.*``).
        default_targets: the pack's default ``target_modules`` (groups or globs), used when the
            config names none; restricted to layers inside ``blocks``.
        blocks: the recipe's repeated blocks (``shard_modules``).
        frozen: the parameter globs of ``training.freeze``: modules under them get no adapter.
        base: (base checkpoint path, content fingerprint) recorded in the plan.
    """
    named = [(name, module) for name, module in model.named_modules() if name and _supported(module)]

    def frozen_module(module: Any, name: str) -> bool:
        return any(matches_any(f"{name}.{p}", frozen) for p, _ in module.named_parameters(recurse=False))

    if cfg.target_modules:
        targets: list[str] = []
        for entry, globs in expand_groups(cfg.target_modules, groups):
            hit = [name for name, module in named if matches_any(name, globs)]
            if not hit:
                known = ", ".join(groups) or "none"
                raise StageError(f"training.lora.target_modules: {entry!r} matches no linear, conv or embedding layer and is no group (groups: {known})")
            targets.extend(n for n, m in named if n in hit and not frozen_module(m, n))
    else:
        inside = {id(m) for block in blocks for m in block.modules()}
        defaults = [g for _, globs in expand_groups(default_targets, groups) for g in globs]
        from torch import nn

        targets = [n for n, m in named if id(m) in inside and isinstance(m, nn.Linear) and (not defaults or matches_any(n, defaults)) and not frozen_module(m, n)]
    targets = list(dict.fromkeys(targets))
    if not targets:
        raise StageError("training.lora: no layer to adapt (every target is frozen by training.freeze, or the pack's blocks hold no linear layer)")
    modules = dict(named)
    check_rank(cfg.r, {name: layer_width(modules[name]) for name in targets})
    save: list[str] = []
    for entry, globs in expand_groups(cfg.modules_to_save, groups):
        hit = [name for name, module in model.named_modules() if name and matches_any(name, globs) and any(True for _ in module.parameters(recurse=False))]
        if not hit:
            raise StageError(f"training.lora.modules_to_save: {entry!r} matches no module with parameters")
        save.extend(hit)
    save = _with_tied_partners(model, list(dict.fromkeys(save)))
    both = sorted(set(save) & set(targets))
    if both:
        raise StageError(f"training.lora: {both[0]!r} is both a LoRA target and in modules_to_save; it can only be one")
    return LoraPlan(r=cfg.r, alpha=cfg.alpha, dropout=cfg.dropout, init=cfg.init, targets=targets, modules_to_save=save, base=base[0], base_fingerprint=base[1])


def layer_width(module: Any) -> tuple[int, int]:
    """(inputs, outputs) of a layer LoRA adapts: its rank can be at most the smaller."""
    from torch import nn

    if isinstance(module, nn.Embedding):
        return module.num_embeddings, module.embedding_dim
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    kernel = 1
    for size in module.kernel_size:  # a conv adapter's A sees a whole kernel window of inputs
        kernel *= size
    return module.in_channels // module.groups * kernel, module.out_channels


def check_rank(r: int, widths: Mapping[str, tuple[int, int]]) -> None:
    """A rank above a layer's width adds parameters (and checkpoint bytes) but nothing the
    layer could learn: refused, naming the narrowest layer, before any memory is spent."""
    if not widths:
        return
    name, (inputs, outputs) = min(widths.items(), key=lambda item: min(item[1]))
    if r > min(inputs, outputs):
        raise ConfigError(
            f"training.lora.r: {r} is more than layer {name} is wide ({inputs} inputs, {outputs} outputs): use at most {min(inputs, outputs)}, or leave that layer out of training.lora.target_modules"
        )


def _with_tied_partners(model: "nn.Module", modules: list[str]) -> list[str]:
    """``modules`` plus every module sharing a parameter with one of them (an output layer
    tied to the embedding): peft saves and loads each module to save as its own copy, so the
    partner must be saved too, or the loaded model would keep its old weights there."""
    owners: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append(name)
    out = list(modules)
    for name in modules:
        for param in model.get_submodule(name).parameters(recurse=False):
            out.extend(n for n in owners[id(param)] if n not in out)
    return out


# --------------------------------------------------------------------------- the model


def is_adapter(name: str) -> bool:
    """A LoRA parameter (``...q_proj.lora_A.default.weight``)."""
    return any(part in name for part in ADAPTER_PARTS)


def base_key(name: str) -> str | None:
    """The base model's name of a state key of an adapted model; None for adapter weights."""
    if is_adapter(name):
        return None
    return name.replace(".base_layer.", ".")


def inject(model: "nn.Module", plan: LoraPlan) -> "nn.Module":
    """Put peft's LoRA layers on ``plan.targets`` (in place, on whatever device the model is,
    meta included); only adapters and ``modules_to_save`` stay trainable."""
    import warnings

    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=plan.r, lora_alpha=plan.alpha, lora_dropout=plan.dropout, target_modules=list(plan.targets), bias="none", init_lora_weights=True if plan.init == "default" else plan.init)
    with warnings.catch_warnings():  # peft warns that a model it did not wrap has no .config: expected here
        warnings.simplefilter("ignore")
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    from peft.tuners.lora import LoraLayer

    adapted = {name for name, module in model.named_modules() if isinstance(module, LoraLayer) and not name.endswith(".base_layer")}
    if adapted != set(plan.targets):
        # peft (0.21) rewrites targets named like the MLP projections of MoE families whose
        # layout changed in transformers 5 into their fused experts' parameters, even fully
        # qualified names of dense or shared-expert layers: what it adapted is not what was asked
        strays = sorted(adapted ^ set(plan.targets))
        raise StageError(
            f"training.lora: peft adapted other layers than the ones planned ({strays[0]}{' and more' if len(strays) > 1 else ''}): "
            "for this MoE family peft maps MLP projection names onto the fused experts; target the attention layers instead"
        )
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter(name) or _under(name, plan.modules_to_save))
    return model


@contextmanager
def adapters_disabled(model: "nn.Module") -> Iterator[None]:
    """Inside the block the model computes as its base: every LoRA layer's adapters are off."""
    from peft.tuners.lora import LoraLayer

    # peft's enable_adapters also flips requires_grad, which a sharded model must not see mid-run;
    # the flag the layers' forward reads is enough for a forward without gradients.
    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


def _under(param_name: str, modules: Sequence[str]) -> bool:
    return any(param_name.startswith(m + ".") for m in modules)


def trained_names(model: "nn.Module", plan: LoraPlan) -> list[str]:
    """The state keys a LoRA checkpoint holds: adapters and ``modules_to_save``."""
    return [k for k in model.state_dict() if is_adapter(k) or _under(base_key(k) or k, plan.modules_to_save)]


def init_adapters(model: "nn.Module", plan: LoraPlan, seed: int) -> None:
    """Give every adapter its initial value, the same whole tensor on every process (drawn on
    the CPU from ``seed`` and the module's name), copied into its shard where sharded."""
    import torch
    from peft.tuners.lora import LoraLayer
    from torch import nn

    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer) or ADAPTER not in module.lora_A:
            continue
        a, b = module.lora_A[ADAPTER].weight, module.lora_B[ADAPTER].weight
        gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
        whole = torch.empty(tuple(a.shape), dtype=torch.float32)
        if plan.init == "gaussian":
            whole.normal_(0.0, 1.0 / plan.r, generator=gen)
        else:  # nn.init.kaiming_uniform_(a=sqrt(5)), as nn.Linear and peft do: bound = 1 / sqrt(fan_in)
            fan_in = nn.init._calculate_fan_in_and_fan_out(whole)[0]
            bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
            whole.uniform_(-bound, bound, generator=gen)
        _assign(a, whole)
        _assign(b, torch.zeros(tuple(b.shape), dtype=torch.float32))


def _assign(param: "torch.Tensor", whole: "torch.Tensor") -> None:
    import torch

    with torch.no_grad():
        if hasattr(param, "device_mesh"):  # a DTensor shard: every process holds the same whole tensor
            from torch.distributed.tensor import distribute_tensor

            local = distribute_tensor(whole.to(param.dtype), param.device_mesh, param.placements, src_data_rank=None).to_local()
            param.to_local().copy_(local)
        else:
            param.copy_(whole.to(param.dtype))


def base_identity(weights: Path, upstream: Mapping[str, Any]) -> tuple[str, str]:
    """(path, fingerprint) of the base checkpoint ``weights``: the fingerprint hashes the file
    hashes its stage's manifest recorded when it finished (its content), else the DCP index."""
    weights = Path(weights).resolve()
    for manifest in upstream.values():
        for name, files in getattr(manifest, "output_files", {}).items():
            try:
                if manifest.output(name).resolve() == weights and files:
                    return str(weights), _digest(files)
            except Exception:  # noqa: BLE001 - an output that is not a path
                continue
    return str(weights), _digest({"metadata": hashlib.sha256((weights / ".metadata").read_bytes()).hexdigest()})


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:32]


def relative_base(base: str, checkpoint_root: Path) -> str:
    """``base`` relative to a checkpoint directory under ``checkpoint_root`` (one level deeper),
    so a run directory that moves keeps its base; absolute when on another file system tree."""
    try:
        return os.path.relpath(base, checkpoint_root / "step")
    except ValueError:
        return base


def load_trained(model: "nn.Module", checkpoint: Path, plan: LoraPlan) -> None:
    """Base weights from the plan's base checkpoint, then adapters, then the trained weights of
    ``checkpoint`` (an unsharded model; what export, evaluate and infer build)."""
    from mmcore.checkpoint import safe_dcp
    from mmcore.checkpoint.sharded_load import load_weights

    base = plan.base_path(checkpoint)
    if not (base / ".metadata").is_file():
        raise StageError(f"{checkpoint / LORA_FILE}: the base checkpoint it was trained on is gone ({base})")
    load_weights(model, base, distributed=False)
    inject(model, plan)
    saved = {k[len("model.") :] for k in safe_dcp.read_metadata(checkpoint).state_dict_metadata if k.startswith("model.")}
    state = model.state_dict()
    wanted = set(trained_names(model, plan))
    if saved != wanted:
        odd = sorted(saved ^ wanted)
        raise StageError(f"{checkpoint}: its trained weights do not fit the model with the adapters of {LORA_FILE} (e.g. {odd[0]!r})")
    part = {f"model.{k}": state[k] for k in sorted(wanted)}
    safe_dcp.load(part, checkpoint, distributed=False)
    missing, unexpected = model.load_state_dict({k[len("model.") :]: v for k, v in part.items()}, strict=False)
    assert not unexpected, unexpected


#: what moved to :mod:`mmcore.train.lora_export`, still importable from here
_EXPORT_NAMES = frozenset({"adapter_tensors", "save_peft_config", "write_peft_adapter", "diffusers_lora_state", "merged_state", "load_adapter_folder", "is_adapter_folder", "with_adapters"})


def __getattr__(name: str) -> Any:
    if name in _EXPORT_NAMES:
        from mmcore.train import lora_export

        return getattr(lora_export, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LORA_FILE", "LoraPlan", "plan_lora", "inject", "adapters_disabled", "init_adapters", "trained_names", "base_key", "is_adapter", "base_identity", "load_trained", "relative_base"]
