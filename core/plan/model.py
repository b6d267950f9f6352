"""The model a plan is for: its config read (a folder, a pack's tiny preset, or a hub id's config
files, never weights), built on the ``meta`` device, its parameters counted per group, its
shape for the activation formulas (:mod:`mmcore.plan.activations`), and the FLOPs of a step
from the very function the train engine's MFU metric calls (the pack's family's).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from mmcore.errors import UsageError
from mmcore.plan.activations import DiT, Decoder


@dataclass
class Planned:
    """A model built on ``meta``, as the planner needs it.

    Attributes:
        kind: ``"vlm"`` (a :class:`~mmcore.kits.vlm.VLMFamily`) or ``"diffusion"``.
        model: the model on the meta device (no memory).
        shard_modules: the blocks the engine shards one by one (and recomputes).
        shape: the activation formula's shape.
        flops: ``micro-batch rows -> FLOPs`` of a forward and backward, the engine's function.
        activations: ``(rows, compute bytes, recompute, layers) -> saved bytes``.
        megatron: the family runs on the megatron backend (tensor / pipeline parallel).
        groups: group name -> parameter count.
    """

    kind: str
    model: Any
    shard_modules: list[Any]
    shape: Decoder | DiT
    flops: Callable[[int], float]
    activations: Callable[[int, int, bool, int | None], float]
    megatron: bool
    groups: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    towers: tuple[str, ...] = ()  # module paths the megatron backend keeps whole (the VLM's encoders)
    tokens: int = 0  # per row, the tokens a sequence split divides (decoder tokens, or DiT patch tokens)

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def trained(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def megatron_split(self, trained_only: bool = False) -> tuple[int, int, int]:
        """(kept whole: the towers, in the split layers, the rest: embeddings, norms, head) parameters."""
        blocks = {id(p) for b in self.shard_modules for p in b.parameters()}
        whole = layers = rest = 0
        for name, p in self.model.named_parameters():
            if trained_only and not p.requires_grad:
                continue
            if any(name.startswith(t + ".") for t in self.towers):
                whole += p.numel()
            elif id(p) in blocks:
                layers += p.numel()
            else:
                rest += p.numel()
        return whole, layers, rest

    def largest_block(self) -> int:
        return max((sum(p.numel() for p in b.parameters()) for b in self.shard_modules), default=0)

    def moe(self) -> tuple[int, int, int, int]:
        """(experts per MoE layer, MoE layers, the largest block's expert parameters, experts
        each token is routed to) from transformers' expert-parallel plan; zeros for a dense model."""
        from mmcore.backends.experts import concrete_plan

        modules = dict(self.model.named_modules())
        experts = [modules[name] for name, style in concrete_plan(self.model).items() if style == "ep_dispatch_experts"]
        if not experts:
            return 0, 0, 0, 0
        in_block = max((sum(p.numel() for m in b.modules() if any(m is e for e in experts) for p in m.parameters()) for b in self.shard_modules), default=0)
        config = getattr(self.model.config, "text_config", self.model.config)
        return int(experts[0].num_experts), len(experts), in_block, int(getattr(config, "num_experts_per_tok", 1))


def family_of(pack: str) -> tuple[str, Any, Any]:
    """(pack name, its spec, its kit family) from the train stage's recipe part."""
    from mmcore.framework.plugins import Plugins
    from mmcore.framework.registry import import_object

    entry = Plugins.load().pack(pack)
    spec = entry.spec
    if spec is None or "train" not in spec.stages:
        raise UsageError(f"pack {pack!r} declares no train stage: nothing to plan")
    recipe = spec.declared("train").parts.get("recipe", "")
    owner = recipe.rpartition(".")[0] if "." in recipe.partition(":")[2] else ""
    if not owner:
        raise UsageError(f"pack {pack!r}: its train stage's recipe ({recipe!r}) is not a kit family's method")
    return pack, spec, import_object(owner)


def _scratch() -> Path:
    """A folder removed when the process exits."""
    import atexit
    import shutil

    out = Path(tempfile.mkdtemp(prefix="mmcore-plan-"))
    atexit.register(shutil.rmtree, out, True)
    return out


def model_folder(spec: Any, source: str, diffusion: bool) -> Path:
    """A folder holding ``source``'s config: ``source`` itself, a tiny preset written by the
    pack's ``build_init`` (``init:tiny`` or ``tiny``), or a hub id's config files."""
    from mmcore.framework.registry import import_object

    path = Path(source).expanduser()
    if path.is_dir():
        return path
    preset = source.removeprefix("init:")
    build_init = spec.declared("download").parts.get("build_init") if "download" in spec.stages else None
    if build_init and (source.startswith("init:") or "/" not in source):
        out = _scratch()
        import_object(build_init)(preset, out, 0)
        return out
    from huggingface_hub import hf_hub_download

    out = _scratch()
    for name in ("transformer/config.json", "vae/config.json") if diffusion else ("config.json",):
        try:
            hf_hub_download(source, name, local_dir=out)
        except Exception as exc:  # a missing vae config is fine; a missing model config is not
            if name != "vae/config.json":
                raise UsageError(f"{source}: cannot read {name} from the hub ({type(exc).__name__}: {exc}); pass a local folder") from exc
    return out


def planned(pack: str, source: str, *, seq: int = 0, frames: int = 0, height: int = 0, width: int = 0, caption: int = 512, freeze: Sequence[str] = ()) -> Planned:
    """The model of ``source`` for ``pack``, built on meta, with its step's FLOPs and activations;
    ``freeze``: ``training.freeze``'s globs or the pack's groups, frozen as the engine freezes them."""
    from mmcore.kits.diffusion.family import DiffusionFamily
    from mmcore.kits.vlm.family import VLMFamily

    _, spec, family = family_of(pack)
    if isinstance(family, VLMFamily):
        if seq <= 0:
            raise UsageError("--seq: the decoder's tokens per row (text and media placeholders)")
        return _vlm(family, model_folder(spec, source, False), seq, freeze)
    if isinstance(family, DiffusionFamily):
        if min(frames, height, width) <= 0:
            raise UsageError("--frames, --height and --width: the clip the denoiser trains on")
        return _diffusion(family, model_folder(spec, source, True), frames, height, width, caption, freeze)
    raise UsageError(f"pack {pack!r}: mmcore plan knows the VLM and diffusion kits' families, not {type(family).__name__}")


def _meta(build: Callable[[], Any]) -> Any:
    import torch

    with torch.device("meta"):
        return build()


def _groups(model: Any, paths: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, p in model.named_parameters():
        group = next((path for path in paths if name.startswith(path + ".")), "other")
        counts[group] = counts.get(group, 0) + p.numel()
    return counts


def _frozen(model: Any, family: Any, freeze: Sequence[str]) -> Any:
    from mmcore.train.optim import freeze as freeze_params

    freeze_params(model, list(freeze), family.freeze_groups)
    return model


def _vlm(family: Any, folder: Path, seq: int, freeze: Sequence[str]) -> Planned:
    import torch

    from mmcore.kits.vlm.family import megatron_part_of

    config = family.config(folder)
    config._attn_implementation = "sdpa"
    model = _frozen(_meta(lambda: family.model_type(config)(config)), family, freeze)
    text = config.get_text_config()
    heads = text.num_attention_heads
    shape = Decoder(
        layers=text.num_hidden_layers,
        hidden=text.hidden_size,
        heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        intermediate=text.intermediate_size,
        vocab=text.vocab_size,
    )
    count = family.step_flops()

    def flops(rows: int) -> float:  # text tokens only: the towers' media are not in the budget
        return count(model, {"attention_mask": torch.ones(rows, seq, dtype=torch.long)})

    def activations(rows: int, a: int, recompute: bool, layers: int | None) -> float:
        return shape.step_bytes(rows, seq, a, recompute, layers)

    notes = [f"{seq} decoder tokens per row; the vision tower's activations are not in the figures (towers frozen, cached or small beside the decoder)"]
    blocks = family.shard_modules(model)
    return Planned("vlm", model, blocks, shape, flops, activations, megatron_part_of(family) is not None, _groups(model, family.shard_layers), notes, tuple(family.towers), seq)


def latent_grid(folder: Path, frames: int, height: int, width: int) -> tuple[tuple[int, int, int], str]:
    """The latent grid of a clip, by the VAE's compression (its config's ``scale_factor_*``, else Wan's 4 x 8 x 8)."""
    import json

    vae = folder / "vae" / "config.json"
    cfg = json.loads(vae.read_text()) if vae.is_file() else {}
    t, s = int(cfg.get("scale_factor_temporal", 4)), int(cfg.get("scale_factor_spatial", 8))
    how = f"VAE {t}x{s}x{s}" + ("" if vae.is_file() else " (assumed: no vae/config.json)")
    return ((frames - 1) // t + 1, height // s, width // s), how


def _diffusion(family: Any, folder: Path, frames: int, height: int, width: int, caption: int, freeze: Sequence[str]) -> Planned:
    import torch

    from mmcore.kits.diffusion.flops import denoiser_flops
    from mmcore.kits import blocks_at

    cls = family.diffusers_class(family.transformer_class)
    config = cls.load_config(folder / family.subfolder)
    model = _frozen(_meta(lambda: cls.from_config(config)), family, freeze)
    cfg = model.config
    patch = tuple(cfg.patch_size)
    grid, how = latent_grid(folder, frames, height, width)
    tokens = math.prod(n // p for n, p in zip(grid, patch[-3:]))
    shape = DiT(
        layers=cfg.num_layers,
        hidden=cfg.num_attention_heads * cfg.attention_head_dim,
        heads=cfg.num_attention_heads,
        head_dim=cfg.attention_head_dim,
        ffn=cfg.ffn_dim,
        latent_channels=cfg.in_channels,
        patch_elements=cfg.in_channels * math.prod(patch),
        freq_dim=cfg.freq_dim,
    )
    count = (family.flops or denoiser_flops)()

    def flops(rows: int) -> float:
        batch = {"latents": torch.empty(rows, cfg.in_channels, *grid, device="meta"), "text": torch.empty(rows, caption, cfg.text_dim, device="meta")}
        return count(model, batch)

    def activations(rows: int, a: int, recompute: bool, layers: int | None) -> float:
        return shape.step_bytes(rows, tokens, caption, cfg.text_dim, a, recompute, layers)

    notes = [f"{frames} frames {height}x{width} -> latents {grid[0]}x{grid[1]}x{grid[2]} ({how}) -> {tokens} tokens; caption {caption} rows; VAE and text encoder cached (extract)"]
    blocks = blocks_at(model, family.shard_layers)
    return Planned("diffusion", model, blocks, shape, flops, activations, False, _groups(model, family.shard_layers), notes, tokens=tokens)


__all__ = ["Planned", "family_of", "model_folder", "planned", "latent_grid"]
