"""DeepSeek-OCR (v1) composed of transformers modules: transformers (5.25) has no DeepSeek-OCR
class, but it has the parts. The pack adds only what is DeepSeek-OCR's own:

* the config (:class:`DeepseekOcrConfig`): the public ``config.json`` as it is (``vision_config``
  with ``width: {sam_vit_b, clip-l-14-224}``, ``projector_config``, ``language_config``, and the
  decoder's fields repeated at the top level), from which the transformers configs of the parts
  are derived (never written back: exports keep the public fields);
* the DeepEncoder: SAM ViT-B on transformers' ``DeepseekOcr2SamVisionEncoder`` (windowed and
  global attention with relative positions, the neck, two stride-2 convolutions: 1024 channels
  at 1/16 of the view), whose grid is the CLIP-L's patch embedding (:class:`ClipTower`:
  transformers' ``CLIPVisionEmbeddings`` names and ``CLIPEncoder`` layers with quick GELU, the
  class embedding and the position table kept, the table resized bicubically with antialiasing
  to the grid, ``pre_layrnorm`` and no post-norm); each cell's CLIP output (class token dropped)
  and SAM feature concatenated (``[clip, sam]``, 2048 wide) and projected by one linear layer;
* ``image_newline`` and ``view_seperator`` (the public spelling): an image's tokens are its tiles'
  rows across all tiles of a row (``down h x across w`` wide), each closed by a newline, then the
  global view's rows each closed by a newline, then the separator (the reference's order:
  tiles first, whatever ``global_view_pos`` says);
* the decoder: without MLA (``use_mla: false``, the release) transformers'
  ``DeepseekOcr2TextModel`` (DeepSeek-V2's MoE with LLaMA attention); with MLA ``DeepseekV2Model``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.clip.modeling_clip import CLIPEncoder, CLIPVisionEmbeddings

# public language_config fields -> the transformers decoder config's (the rest pass as they are)
LANGUAGE_FIELDS = (
    "vocab_size hidden_size intermediate_size moe_intermediate_size num_hidden_layers num_attention_heads num_key_value_heads "
    "n_routed_experts n_shared_experts num_experts_per_tok routed_scaling_factor topk_method n_group topk_group "
    "max_position_embeddings bos_token_id eos_token_id pad_token_id"
).split()
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# what the released code fixes rather than configures (``deepencoder.py``), overridable for tiny models
SAM_DEFAULTS = {"width": 768, "layers": 12, "heads": 12, "global_attn_indexes": [2, 5, 8, 11], "downsample_channels": [512, 1024], "patch_size": 16, "window_size": 14, "out_chans": 256}
CLIP_DEFAULTS = {"width": 1024, "layers": 24, "heads": 16, "image_size": 224, "patch_size": 14}
RELEASED_IMAGE_TOKEN = 128815  # ``<image>`` in the released tokenizer


class DeepseekOcrConfig(PreTrainedConfig):
    """The public ``config.json`` of ``deepseek-ai/DeepSeek-OCR`` (``model_type: deepseek_vl_v2``),
    plus ``image_token_id`` (the ``<image>`` id; the release leaves it to the tokenizer: 128815)."""

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
        self.candidate_resolutions = [list(r) for r in (self.candidate_resolutions or [[1024, 1024]])]
        if self.image_token_id is None:
            self.image_token_id = RELEASED_IMAGE_TOKEN
        if self.tile_tag != "2D":
            raise ValueError(f"tile_tag {self.tile_tag!r}: only the released '2D' layout (image_newline, view_seperator) is supported")
        if self.projector_config.get("projector_type", "linear") != "linear":
            raise ValueError(f"projector_type {self.projector_config['projector_type']!r}: only the released 'linear' projector is supported")
        super().__post_init__(**kwargs)
        self.text_config = language_config(self.language_config, kwargs)
        self.sam_config = sam_config(self.vision_config)
        self.clip_config = clip_config(self.vision_config)

    def get_text_config(self, decoder: Any = None, encoder: Any = None) -> Any:
        return self.text_config

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        for derived in ("text_config", "sam_config", "clip_config"):
            out.pop(derived, None)
        return out


def language_config(fields: dict[str, Any], top: dict[str, Any] | None = None) -> Any:
    """The transformers decoder config of a public ``language_config`` (fields it lacks read from
    the top level, where the release repeats them, then DeepSeek-V2's defaults: RoPE theta 10000,
    RMSNorm eps 1e-6): softmax routing without top-k renormalisation, as the release routes."""
    import transformers

    merged = {**(top or {}), **fields}
    if merged.get("scoring_func", "softmax") != "softmax" or merged.get("norm_topk_prob") or merged.get("topk_method", "greedy") == "noaux_tc":
        raise ValueError(
            f"language_config: scoring_func {merged.get('scoring_func')!r}, norm_topk_prob {merged.get('norm_topk_prob')!r}, topk_method "
            f"{merged.get('topk_method')!r}: DeepSeek-OCR routes by softmax without renormalisation (greedy or group_limited_greedy)"
        )
    kept = {k: merged[k] for k in LANGUAGE_FIELDS if merged.get(k) is not None}
    kept["rms_norm_eps"] = float(merged.get("rms_norm_eps") or 1e-6)
    kept["hidden_act"] = merged.get("hidden_act") or "silu"
    rope = {"rope_type": "default", "rope_theta": float(merged.get("rope_theta") or 10000.0)}
    dense, layers = int(merged.get("first_k_dense_replace", 1)), int(merged["num_hidden_layers"])
    if merged.get("use_mla", True):
        config = transformers.DeepseekV2Config(**kept, **{k: merged[k] for k in MLA_FIELDS if k in merged}, first_k_dense_replace=dense, rope_parameters=rope)
    else:
        config = transformers.DeepseekOcr2TextConfig(**kept, mlp_layer_types=["dense"] * dense + ["sparse"] * (layers - dense), rope_parameters=rope)
    config._attn_implementation = "sdpa"
    return config


def _widths(fields: dict[str, Any], name: str, defaults: dict[str, Any]) -> dict[str, Any]:
    return {**defaults, **dict(fields.get("width", {}) or {}).get(name, {})}


def sam_config(fields: dict[str, Any]) -> Any:
    """transformers' SAM config of the public ``vision_config.width.sam_vit_b`` (MLP 4x, LayerNorm eps 1e-6, relative positions)."""
    from transformers.models.deepseek_ocr2.configuration_deepseek_ocr2 import DeepseekOcr2SamVisionConfig

    sam = _widths(fields, "sam_vit_b", SAM_DEFAULTS)
    config = DeepseekOcr2SamVisionConfig(
        hidden_size=int(sam["width"]),
        num_hidden_layers=int(sam["layers"]),
        num_attention_heads=int(sam["heads"]),
        image_size=int(fields.get("image_size", 1024)),
        patch_size=int(sam["patch_size"]),
        output_channels=int(sam["out_chans"]),
        window_size=int(sam["window_size"]),
        global_attn_indexes=list(sam["global_attn_indexes"]),
        downsample_channels=[int(c) for c in sam["downsample_channels"]],
        mlp_ratio=4.0,
        initializer_range=0.02,  # the config's default (1e-10, for loading trained weights) leaves a random SAM near zero
    )
    config._attn_implementation = "sdpa"
    return config


def clip_config(fields: dict[str, Any]) -> Any:
    """transformers' ``CLIPVisionConfig`` of the public ``vision_config.width['clip-l-14-224']`` (quick GELU, MLP 4x, eps 1e-5)."""
    from transformers import CLIPVisionConfig

    clip = _widths(fields, "clip-l-14-224", CLIP_DEFAULTS)
    width = int(clip["width"])
    config = CLIPVisionConfig(
        hidden_size=width,
        intermediate_size=4 * width,
        num_hidden_layers=int(clip["layers"]),
        num_attention_heads=int(clip["heads"]),
        image_size=int(clip["image_size"]),
        patch_size=int(clip["patch_size"]),
        hidden_act="quick_gelu",
        layer_norm_eps=1e-5,
    )
    config._attn_implementation = "sdpa"
    return config


def resized_positions(table: torch.Tensor, cells: int) -> torch.Tensor:
    """The CLIP position table ([1 + n x n, C]) for ``cells`` patches: the grid part resized
    bicubically with antialiasing in fp32 (as the reference), the class position kept."""
    side, want = math.isqrt(table.shape[0] - 1), math.isqrt(cells)
    if side == want:
        return table
    grid = table[1:].reshape(1, side, side, -1).permute(0, 3, 1, 2).float()
    grid = nn.functional.interpolate(grid, size=(want, want), mode="bicubic", antialias=True, align_corners=False).to(table.dtype)
    return torch.cat([table[:1], grid.permute(0, 2, 3, 1).reshape(want * want, -1)])


class ClipEmbeddings(CLIPVisionEmbeddings):
    """CLIP's embeddings whose patches are the SAM grid ([B, C, h, w]); ``patch_embedding`` is
    kept (the release holds it) but unused, as in the reference."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        patches = features.flatten(2).transpose(1, 2)
        cls = self.class_embedding.to(patches.dtype).expand(patches.shape[0], 1, -1)
        tokens = torch.cat([cls, patches], dim=1)
        return tokens + resized_positions(self.position_embedding.weight, patches.shape[1]).to(tokens.dtype)


class ClipTower(nn.Module):
    """``vision_model``: embeddings, ``pre_layrnorm`` (the public spelling), ``transformer.layers``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embeddings = ClipEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.transformer = CLIPEncoder(config)

    def forward(self, sam_features: torch.Tensor) -> torch.Tensor:
        return self.transformer(inputs_embeds=self.pre_layrnorm(self.embeddings(sam_features))).last_hidden_state


class Projector(nn.Module):
    """The public ``linear`` projector (``projector.layers``)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__()
        self.layers = nn.Linear(int(fields.get("input_dim", 2048)), int(fields.get("n_embed", 1280)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class DeepseekOcrModel(nn.Module):
    """``model.*``: the DeepEncoder, projector, layout parameters and the decoder (``language_model``)."""

    def __init__(self, config: DeepseekOcrConfig) -> None:
        import transformers
        from transformers.models.deepseek_ocr2.modeling_deepseek_ocr2 import DeepseekOcr2SamVisionEncoder

        super().__init__()
        self.sam_model = DeepseekOcr2SamVisionEncoder(config.sam_config)
        self.vision_model = ClipTower(config.clip_config)
        self.projector = Projector(config.projector_config)
        width = self.projector.layers.out_features
        self.image_newline = nn.Parameter(torch.zeros(width))
        self.view_seperator = nn.Parameter(torch.zeros(width))
        decoder = transformers.DeepseekV2Model if isinstance(config.text_config, transformers.DeepseekV2Config) else transformers.DeepseekOcr2TextModel
        self.language_model = decoder(config.text_config)
        # Under FSDP2 every rank must call the towers alike: with crop mode on several ranks, a
        # micro-batch without tiles encodes its first global view once more in their place (its
        # result enters as an exact zero), as a rank holding tiles calls the towers twice.
        self.always_tiles = False

    def encode(self, views: torch.Tensor) -> torch.Tensor:
        """Projected features of square views ([V, 3, S, S] -> [V, cells, D]): ``[clip, sam]`` per cell."""
        sam = self.sam_model(views).last_hidden_state
        clip = self.vision_model(sam)
        return self.projector(torch.cat([clip[:, 1:], sam.flatten(2).transpose(1, 2)], dim=-1))

    def image_features(self, pixel_values: torch.Tensor, images_spatial_crop: torch.Tensor, pixel_values_local: torch.Tensor | None = None) -> torch.Tensor:
        """Every image's tokens in order, laid out as the reference lays them ([tokens, D])."""
        dtype = self.projector.layers.weight.dtype
        glob = self.encode(pixel_values.to(dtype))
        tiles = self.encode(pixel_values_local.to(dtype)) if pixel_values_local is not None and len(pixel_values_local) else None
        if tiles is None and self.always_tiles:
            glob = glob + 0.0 * self.encode(pixel_values[:1].to(dtype)).sum()
        width = glob.shape[-1]
        newline, sep = self.image_newline.to(glob.dtype), self.view_seperator.to(glob.dtype)[None]
        out, at = [], 0
        for i, (across, down) in enumerate(images_spatial_crop.reshape(-1, 2).tolist()):
            across, down = int(across), int(down)
            side = math.isqrt(glob.shape[1])
            parts = []
            if across > 1 or down > 1:
                if tiles is None or at + across * down > tiles.shape[0]:
                    raise ValueError(f"image {i} has {across} x {down} tiles, but pixel_values_local holds {0 if tiles is None else tiles.shape[0] - at} more")
                s = math.isqrt(tiles.shape[1])
                grid = tiles[at : at + across * down].reshape(down, across, s, s, width).permute(0, 2, 1, 3, 4).reshape(down * s, across * s, width)
                parts.append(torch.cat([grid, newline.expand(down * s, 1, width)], dim=1).reshape(-1, width))
                at += across * down
            parts.append(torch.cat([glob[i].reshape(side, side, width), newline.expand(side, 1, width)], dim=1).reshape(-1, width))
            parts.append(sep)
            out.append(torch.cat(parts))
        if len(out) != glob.shape[0] or at != (0 if tiles is None else tiles.shape[0]):
            raise ValueError(f"pixel_values has {glob.shape[0]} views and {at} tiles used, images_spatial_crop accounts for {len(out)} images")
        return torch.cat(out)


class DeepseekOcrForCausalLM(PreTrainedModel, GenerationMixin):
    """DeepEncoder -> linear projector -> views laid out with newlines -> DeepSeek-MoE decoder.

    Inputs besides the text's: ``pixel_values`` [images, 3, B, B] (each image's global view),
    ``images_spatial_crop`` [images, 2] (tiles across, tiles down; 1 x 1: no tiles) and
    ``pixel_values_local`` [tiles, 3, T, T] (the tiled images' tiles, row by row, images in order)."""

    config_class = DeepseekOcrConfig
    base_model_prefix = ""
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_attention_backend = True
    _no_split_modules = ["DeepseekOcr2SamVisionLayer", "CLIPEncoderLayer", "DeepseekV2DecoderLayer", "DeepseekOcr2TextDecoderLayer"]

    def __init__(self, config: DeepseekOcrConfig) -> None:
        super().__init__(config)
        self.model = DeepseekOcrModel(config)
        self.lm_head = nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def from_pretrained(cls, folder: Any, *args: Any, **kwargs: Any) -> "DeepseekOcrForCausalLM":  # type: ignore[override]
        """The model of a local folder in the public layout (``config.json``, safetensors in the
        public names, read through :mod:`.names`), strictly, in eval mode; fp32, SDPA attention."""
        from pathlib import Path

        from mm_pack_deepseek_ocr.names import load_public

        folder = Path(folder)
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder}: not a local DeepSeek-OCR folder (config.json and safetensors; `mmcore download --pack deepseek-ocr` fetches one)")
        model = cls(DeepseekOcrConfig.from_pretrained(folder))
        missing, unexpected = model.load_state_dict(load_public(folder), strict=False)
        missing = [k for k in missing if not k.endswith("position_ids")]
        if missing or unexpected:
            raise ValueError(f"{folder}: the weights do not fit the config (missing {missing[:3]}, unexpected {unexpected[:3]})")
        return model.eval()

    def _init_weights(self, module: nn.Module) -> None:
        if module is self:
            std = 1 / math.sqrt(self.model.image_newline.shape[0])
            for p in (self.model.image_newline, self.model.view_seperator):
                nn.init.normal_(p, std=std)
            nn.init.normal_(self.lm_head.weight, std=0.02)
        elif isinstance(module, Projector):
            nn.init.normal_(module.layers.weight, std=0.02)
            nn.init.zeros_(module.layers.bias)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.language_model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.language_model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        pixel_values: torch.Tensor | None = None,
        images_spatial_crop: torch.Tensor | None = None,
        pixel_values_local: torch.Tensor | None = None,
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
                crop = images_spatial_crop if images_spatial_crop is not None else torch.ones(pixel_values.shape[0], 2, dtype=torch.long)
                features = self.model.image_features(pixel_values, crop, pixel_values_local)
                slots = (input_ids == self.config.image_token_id)[..., None]
                if int(slots.sum()) != features.shape[0]:
                    raise ValueError(f"{int(slots.sum())} <image> tokens in input_ids, but the images make {features.shape[0]} features")
                inputs_embeds = inputs_embeds.masked_scatter(slots, features.to(inputs_embeds.dtype))
        out = self.model.language_model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids, cache=cache, use_cache=use_cache, **kwargs)
        hidden = out.last_hidden_state
        logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.text_config.vocab_size) if labels is not None else None
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=getattr(out, "cache", None))


__all__ = ["DeepseekOcrConfig", "DeepseekOcrForCausalLM", "ClipTower", "language_config", "sam_config", "clip_config", "resized_positions"]
