"""DeepSeek-VL2 composed of transformers modules: transformers (5.25) has no DeepSeek-VL2 class,
but it has the parts. The pack adds only what is DeepSeek-VL2's own:

* the config (:class:`DeepseekVL2Config`): the public ``config.json`` as it is
  (``vision_config``, ``projector_config``, ``language_config``, ``tile_tag``,
  ``global_view_pos``, ``candidate_resolutions``), from which the transformers configs of the
  parts are derived (never written back: exports keep the public fields);
* the vision tower: transformers' ``SiglipVisionModel`` (SigLIP-SO400M: 27 layers, width 1152,
  MLP ``int(width x mlp_ratio)``, tanh GELU, LayerNorm eps 1e-6, the final LayerNorm applied, no
  attention-pool head: the released model ignores it);
* the projector (:class:`DownsampleProjector`): the 27 x 27 patch grid padded to 28 x 28, each
  2 x 2 cell's features concatenated channel-major (``[c, dy, dx]``), then Linear-GELU-Linear;
* ``image_newline`` and ``view_seperator`` (the public spelling), the image's tokens laid out as
  the global view's rows each closed by a newline, the separator, then the tiles' rows across all
  tiles of a row (``h x tiles_w`` wide) each closed by a newline (``global_view_pos: head``;
  ``tail`` puts the tiles first);
* the decoder: without MLA (``use_mla: false``, DeepSeek-VL2-Tiny) transformers'
  ``DeepseekOcr2TextModel`` (DeepSeek-V2's MoE with LLaMA attention, the decoder DeepSeek-OCR
  shares with VL2-Tiny); with MLA (Small, base) ``DeepseekV2Model``; and a ``lm_head``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

# public language_config fields -> the transformers decoder config's (the rest pass as they are)
LANGUAGE_FIELDS = (
    "vocab_size hidden_size intermediate_size moe_intermediate_size num_hidden_layers num_attention_heads num_key_value_heads "
    "n_routed_experts n_shared_experts num_experts_per_tok routed_scaling_factor topk_method n_group topk_group rms_norm_eps "
    "max_position_embeddings hidden_act bos_token_id eos_token_id pad_token_id attention_bias"
).split()
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "first_k_dense_replace")


class DeepseekVL2Config(PreTrainedConfig):
    """The public ``config.json`` of ``deepseek-ai/deepseek-vl2{-tiny,-small,}`` (``model_type:
    deepseek_vl_v2``), plus ``image_token_id`` (the ``<image>`` id, which the public config leaves
    to the processor)."""

    model_type = "deepseek_vl_v2"
    vision_config: dict | None = None
    projector_config: dict | None = None
    language_config: dict | None = None
    tile_tag: str = "2D"
    global_view_pos: str = "head"
    candidate_resolutions: list | None = None
    image_token_id: int | None = None
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs: Any) -> None:
        self.vision_config = dict(self.vision_config or {})
        self.projector_config = dict(self.projector_config or {})
        self.language_config = dict(self.language_config or {})
        self.candidate_resolutions = [list(r) for r in (self.candidate_resolutions or [[384, 384]])]
        if self.tile_tag != "2D":
            raise ValueError(f"tile_tag {self.tile_tag!r}: only the released '2D' layout (image_newline, view_seperator) is supported")
        if self.global_view_pos not in ("head", "tail"):
            raise ValueError(f"global_view_pos {self.global_view_pos!r}: 'head' or 'tail'")
        if self.projector_config.get("projector_type", "downsample_mlp_gelu") != "downsample_mlp_gelu":
            raise ValueError(f"projector_type {self.projector_config['projector_type']!r}: only the released 'downsample_mlp_gelu' is supported")
        super().__post_init__(**kwargs)
        self.text_config = language_config(self.language_config)
        self.siglip_config = siglip_config(self.vision_config)

    def get_text_config(self, decoder: Any = None, encoder: Any = None) -> Any:
        return self.text_config

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        for derived in ("text_config", "siglip_config"):
            out.pop(derived, None)
        return out


def language_config(fields: dict[str, Any]) -> Any:
    """The transformers decoder config of a public ``language_config``: DeepSeek-V2's softmax
    routing on ``DeepseekV2`` (with MLA) or ``DeepseekOcr2Text`` (without); sigmoid routing with
    the ``noaux_tc`` expert choice (a per-expert bias picks, the unbiased scores weigh) on
    ``DeepseekV3``, whose router is the public gate's (MLA required, as V3 has it)."""
    import transformers

    kept = {k: fields[k] for k in LANGUAGE_FIELDS if fields.get(k) is not None}
    rope = {"rope_type": "default", "rope_theta": float(fields.get("rope_theta", 10000.0))}
    scoring = fields.get("scoring_func", "softmax")
    if scoring == "sigmoid":
        if fields.get("topk_method") != "noaux_tc" or not fields.get("use_mla", True):
            raise ValueError(
                f"language_config: sigmoid routing is read with topk_method 'noaux_tc' and MLA (DeepSeek-V3's router), not topk_method {fields.get('topk_method')!r}, use_mla {fields.get('use_mla', True)}"
            )
        # The public gate renormalises only when it picks more than one expert; V3's always does.
        norm = bool(fields.get("norm_topk_prob")) and int(fields.get("num_experts_per_tok", 1)) > 1
        kept.pop("topk_method")
        mla = {k: fields[k] for k in MLA_FIELDS if k in fields}
        config = transformers.DeepseekV3Config(**kept, **mla, norm_topk_prob=norm, rope_interleave=True, num_mtp_layers=0, rope_parameters=rope)
    elif scoring != "softmax" or fields.get("norm_topk_prob"):
        raise ValueError(
            f"language_config: scoring_func {scoring!r} with norm_topk_prob {fields.get('norm_topk_prob')!r}: supported are softmax routing without "
            "top-k renormalisation (DeepSeek-V2's) and sigmoid routing with topk_method 'noaux_tc' (DeepSeek-V3's)"
        )
    elif fields.get("use_mla", True):
        config = transformers.DeepseekV2Config(**kept, **{k: fields[k] for k in MLA_FIELDS if k in fields}, rope_parameters=rope)
    else:
        dense = int(fields.get("first_k_dense_replace", 1))
        layers = int(fields["num_hidden_layers"])
        config = transformers.DeepseekOcr2TextConfig(**kept, mlp_layer_types=["dense"] * dense + ["sparse"] * (layers - dense), rope_parameters=rope)
    config._attn_implementation = "sdpa"
    return config


def siglip_config(fields: dict[str, Any]) -> Any:
    """transformers' ``SiglipVisionConfig`` of a public ``vision_config`` (timm's SigLIP names)."""
    from transformers import SiglipVisionConfig

    width = int(fields.get("width", 1152))
    config = SiglipVisionConfig(
        hidden_size=width,
        intermediate_size=int(width * float(fields.get("mlp_ratio", 3.7362))),
        num_hidden_layers=int(fields.get("layers", 27)),
        num_attention_heads=int(fields.get("heads", 16)),
        image_size=int(fields.get("image_size", 384)),
        patch_size=int(fields.get("patch_size", 14)),
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6,
        vision_use_head=False,
    )
    config._attn_implementation = "sdpa"
    return config


def tokens_per_side(config: DeepseekVL2Config) -> int:
    """Tokens along one side of a view after the projector: ceil(patches per side / downsample)."""
    vision = config.siglip_config
    return math.ceil((vision.image_size // vision.patch_size) / int(config.projector_config.get("downsample_ratio", 2)))


class DownsampleProjector(nn.Module):
    """The public ``downsample_mlp_gelu`` projector: pad the patch grid to a multiple of the
    ratio, concatenate each ratio x ratio cell's features channel-major, then an MLP
    (``depth`` Linear layers with GELU between; the first widens by ``mlp_ratio``)."""

    def __init__(self, fields: dict[str, Any], vision_width: int) -> None:
        super().__init__()
        self.ratio = int(fields.get("downsample_ratio", 2))
        width, depth, ratio = int(fields.get("n_embed", 2048)), int(fields.get("depth", 2)), int(fields.get("mlp_ratio", 1))
        dims = [int(fields.get("input_dim", vision_width)) * self.ratio**2] + [width * ratio] * (depth - 1) + [width]
        modules: list[nn.Module] = []
        for i in range(depth):
            if i:
                modules.append(nn.GELU())
            modules.append(nn.Linear(dims[i], dims[i + 1]))
        self.layers = nn.Sequential(*modules)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        views, cells, channels = features.shape
        side, r = math.isqrt(cells), self.ratio
        grid = features.reshape(views, side, side, channels)
        pad = (-side) % r
        if pad:
            grid = nn.functional.pad(grid, (0, 0, 0, pad, 0, pad))
        n = (side + pad) // r
        grid = grid.reshape(views, n, r, n, r, channels).permute(0, 1, 3, 5, 2, 4).reshape(views, n * n, channels * r * r)
        return self.layers(grid)


class DeepseekVL2Language(nn.Module):
    """``language.model`` (the transformers decoder) and ``language.lm_head``: the public names."""

    def __init__(self, config: Any) -> None:
        import transformers

        super().__init__()
        decoders = {transformers.DeepseekV2Config: transformers.DeepseekV2Model, transformers.DeepseekV3Config: transformers.DeepseekV3Model}
        decoder = decoders.get(type(config), transformers.DeepseekOcr2TextModel)
        self.model = decoder(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)


class DeepseekVL2ForCausalLM(PreTrainedModel, GenerationMixin):
    """SigLIP tower -> downsample projector -> views laid out with newlines -> DeepSeek-MoE decoder.

    Inputs besides the text's: ``pixel_values`` [views, 3, S, S] (each image's global view, then
    its tiles row by row, images in order) and ``images_spatial_crop`` [images, 2] (tiles across,
    tiles down)."""

    config_class = DeepseekVL2Config
    base_model_prefix = ""
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_attention_backend = True
    _no_split_modules = ["SiglipEncoderLayer", "DeepseekV2DecoderLayer", "DeepseekV3DecoderLayer", "DeepseekOcr2TextDecoderLayer"]

    def __init__(self, config: DeepseekVL2Config) -> None:
        from transformers import SiglipVisionModel

        super().__init__(config)
        self.vision = SiglipVisionModel(config.siglip_config)
        self.projector = DownsampleProjector(config.projector_config, config.siglip_config.hidden_size)
        width = self.projector.layers[-1].out_features
        self.image_newline = nn.Parameter(torch.zeros(width))
        self.view_seperator = nn.Parameter(torch.zeros(width))
        self.language = DeepseekVL2Language(config.text_config)
        self.post_init()

    @classmethod
    def from_pretrained(cls, folder: Any, *args: Any, **kwargs: Any) -> "DeepseekVL2ForCausalLM":  # type: ignore[override]
        """The model of a local folder in the public layout (``config.json``, safetensors in the
        public names, read through :mod:`.names`), in eval mode; fp32, SDPA attention."""
        import copy
        from pathlib import Path

        from safetensors import safe_open

        from mmcore.engines import TensorInfo
        from mm_pack_deepseek_vl2.names import ADAPTER, built

        folder = Path(folder)
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder}: not a local DeepSeek-VL2 folder (config.json and safetensors; `mmcore download --pack deepseek-vl2` fetches one)")
        model = cls(DeepseekVL2Config.from_pretrained(folder))
        tensors: dict[str, torch.Tensor] = {}
        for path in sorted(folder.glob("*.safetensors")):
            with safe_open(path, "pt") as f:
                tensors.update({k: f.get_tensor(k) for k in f.keys()})
        plan = copy.deepcopy(ADAPTER).to_mm({k: TensorInfo(tuple(v.shape), v.dtype) for k, v in tensors.items()})
        missing, unexpected = model.load_state_dict({k: built(r, tensors) for k, r in plan.items()}, strict=False)
        missing = [k for k in missing if not k.endswith("position_ids")]
        if missing or unexpected:
            raise ValueError(f"{folder}: the weights do not fit the config (missing {missing[:3]}, unexpected {unexpected[:3]})")
        return model.eval()

    def _init_weights(self, module: nn.Module) -> None:
        if module is self:
            std = 1 / math.sqrt(self.image_newline.shape[0])
            for p in (self.image_newline, self.view_seperator):
                nn.init.normal_(p, std=std)
        elif isinstance(module, DownsampleProjector):
            for layer in module.layers:
                if isinstance(layer, nn.Linear):
                    nn.init.normal_(layer.weight, std=0.02)
                    nn.init.zeros_(layer.bias)
        elif isinstance(module, DeepseekVL2Language):
            nn.init.normal_(module.lm_head.weight, std=0.02)

    def get_input_embeddings(self) -> nn.Module:
        return self.language.model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.language.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Module:
        return self.language.lm_head

    def image_features(self, pixel_values: torch.Tensor, images_spatial_crop: torch.Tensor) -> torch.Tensor:
        """Every image's tokens in order, laid out as the released model lays them ([tokens, D])."""
        views = self.projector(self.vision(pixel_values.to(self.dtype)).last_hidden_state)
        side, width = tokens_per_side(self.config), views.shape[-1]
        newline, out, at = self.image_newline.to(views.dtype), [], 0
        for across, down in images_spatial_crop.tolist():
            across, down = int(across), int(down)
            glob = torch.cat([views[at].reshape(side, side, width), newline.expand(side, 1, width)], dim=1).reshape(-1, width)
            tiles = views[at + 1 : at + 1 + across * down].reshape(down, across, side, side, width).permute(0, 2, 1, 3, 4).reshape(down * side, across * side, width)
            tiles = torch.cat([tiles, newline.expand(down * side, 1, width)], dim=1).reshape(-1, width)
            sep = self.view_seperator.to(views.dtype)[None]
            out.append(torch.cat([glob, sep, tiles] if self.config.global_view_pos == "head" else [tiles, sep, glob]))
            at += 1 + across * down
        if at != views.shape[0]:
            raise ValueError(f"pixel_values has {views.shape[0]} views, images_spatial_crop accounts for {at}")
        return torch.cat(out)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        pixel_values: torch.Tensor | None = None,
        images_spatial_crop: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        if cache is None and "past_key_values" in kwargs:
            cache = kwargs.pop("past_key_values")
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
            if pixel_values is not None:
                features = self.image_features(pixel_values, images_spatial_crop)
                slots = (input_ids == self.config.image_token_id)[..., None]
                if int(slots.sum()) != features.shape[0]:
                    raise ValueError(f"{int(slots.sum())} <image> tokens in input_ids, but the images make {features.shape[0]} features")
                inputs_embeds = inputs_embeds.masked_scatter(slots, features.to(inputs_embeds.dtype))
        out = self.language.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids, cache=cache, use_cache=use_cache, **kwargs)
        hidden = out.last_hidden_state
        logits = self.language.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.text_config.vocab_size) if labels is not None else None
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=getattr(out, "cache", None))


__all__ = ["DeepseekVL2Config", "DeepseekVL2ForCausalLM", "DownsampleProjector", "language_config", "siglip_config", "tokens_per_side"]
