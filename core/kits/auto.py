"""A VLM family from a transformers class name alone: what ``mmcore new-pack --from-transformers``
starts a pack with, before its author writes anything.

* :class:`TransformersNames`: the state-dict adapter transformers itself applies (its
  conversion mapping: hub names <-> the model's), for families whose checkpoints only rename.
* :class:`ProcessorImages`: the ``<image>`` expander that asks the family's own processor what
  one image becomes (its image tokens and ``pixel_values``), so the token count always agrees
  with the model.
* :func:`tiny_checkpoint`: a random-weight checkpoint of the class, shrunk from its default
  config (:func:`shrink_config`), with a tiny tokenizer, the processor and a chat template.
* :func:`auto_family`: the :class:`~mmcore.kits.vlm.VLMFamily` of all that.

Each is a starting point a pack replaces piece by piece where its family differs.
"""

from __future__ import annotations

import inspect
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from mmcore.engines.state_dict import Recipe, StateDictAdapter, TensorInfo
from mmcore.data.chat_template import Piece
from mmcore.errors import StageError
from mmcore.engines.download import remote_code
from mmcore.kits.vlm import VLMFamily

#: Sizes a tiny model gets wherever its config has the field (every sub-config too).
TINY_SIZES: Mapping[str, int] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "projection_dim": 32,
    "image_size": 28,
    "patch_size": 14,
    "max_position_embeddings": 2048,
}

#: LLaVA-1.5's conversation format, for tokenizers of the tiny checkpoint (assistant text marked).
DEFAULT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{% for c in message['content'] if c['type'] == 'text' %}"
    "{{ c['text'] + '\n' }}{% endfor %}{% else %}{{ message['role'].upper() + ': ' }}"
    "{% for c in message['content'] if c['type'] == 'image' %}{{ '<image>\n' }}{% endfor %}"
    "{% if message['role'] == 'assistant' %}{% generation %}{% for c in message['content'] if c['type'] == 'text' %}{{ c['text'] }}{% endfor %}"
    "{{ eos_token }}{% endgeneration %}{{ '\n' }}{% else %}{% for c in message['content'] if c['type'] == 'text' %}{{ c['text'] }}{% endfor %}"
    "{{ '\n' }}{% endif %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT: ' }}{% endif %}"
)


def model_class(name: str) -> Any:
    import transformers

    try:
        return getattr(transformers, name)
    except AttributeError:
        raise StageError(f"transformers {transformers.__version__} has no class {name!r}") from None


class TransformersNames(StateDictAdapter):
    """Hub names <-> model names exactly as ``from_pretrained``/``save_pretrained`` rename them.

    Built from the class's conversion mapping on a meta-device model of its default config;
    families whose mapping also transforms tensors (fused or split weights) need their own
    adapter, and are refused here in one line.
    """

    def __init__(self, class_name: str) -> None:
        self.class_name = class_name

    @cached_property
    def _meta(self) -> Any:
        import torch

        cls = model_class(self.class_name)
        with torch.device("meta"):  # renames do not depend on sizes; shrunk, every default config is consistent
            return cls(shrink_config(cls.config_class()))

    def to_mm(self, hf: dict[str, TensorInfo]) -> dict[str, Recipe]:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        transforms = get_model_conversion_mapping(self._meta)
        if any(isinstance(t, WeightConverter) for t in transforms):
            raise StageError(f"{self.class_name} checkpoints combine or split tensors on load; the pack needs its own adapter (mmcore.engines.state_dict)")
        renames = [t for t in transforms if isinstance(t, WeightRenaming)]
        meta_state = self._meta.state_dict()
        return _unique({rename_source_key(k, renames, [], self._meta.base_model_prefix, meta_state)[0]: Recipe((k,), info) for k, info in hf.items()}, hf)

    def to_hf(self, mm: dict[str, TensorInfo]) -> dict[str, Recipe]:
        import torch
        from transformers.core_model_loading import revert_weight_conversion

        tensors = {k: torch.empty(0) for k in mm}  # identities only: renaming does not look inside
        name_of = {id(t): k for k, t in tensors.items()}
        renamed = revert_weight_conversion(self._meta, dict(tensors))
        return _unique({hub: Recipe((name_of[id(t)],), mm[name_of[id(t)]]) for hub, t in renamed.items()}, mm)


def _unique(out: dict[str, Recipe], given: Mapping[str, Any]) -> dict[str, Recipe]:
    if len(out) != len(given):
        raise StageError(f"renaming mapped {len(given)} tensors onto {len(out)} names; the pack needs its own adapter")
    return out


class ProcessorImages:
    """``<image>`` -> what the family's processor makes of one image: its tokens and arrays
    (``options``: the processor's image keywords, e.g. a tiling mode)."""

    def __init__(self, processor: Any, **options: Any) -> None:
        self.processor = processor
        self.token = processor.image_token
        self.options = options

    def __call__(self, path: Path) -> Piece:
        from mmcore.data.video import load_image

        out = self.processor(text=self.token, images=[load_image(path)], add_special_tokens=False, return_tensors="np", **self.options)
        ids = [int(t) for t in out["input_ids"][0]]
        return Piece(ids, {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask", "token_type_ids")})


def auto_encoder(ctx: Any, model_dir: Path, tokenizer: Any) -> Any:
    from transformers import AutoProcessor

    from mmcore.data.chat_template import ChatTemplateEncoder

    processor = AutoProcessor.from_pretrained(model_dir, **remote_code())
    images = ProcessorImages(processor)
    return ChatTemplateEncoder(
        tokenizer,
        {"<image>": images},
        markers={"<image>": images.token},
        chat_template=getattr(processor, "chat_template", None) or tokenizer.chat_template,
        train_on_prompt=ctx.config.data.train_on_prompt,
        media_token_ids=[tokenizer.convert_tokens_to_ids(images.token)],
    )


def auto_family(class_name: str, *, demo: Any = None, **overrides: Any) -> VLMFamily:
    """The VLM kit's family for ``class_name`` with nothing family-specific yet: images through
    the processor, the tokenizer's template, transformers' own names, the language model's
    decoder layers as FSDP units."""
    fields: dict[str, Any] = dict(
        model_class=class_name,
        encoder=auto_encoder,
        adapter=TransformersNames(class_name),
        media_fields=("pixel_values", "image_sizes"),
        tokens={},
        freeze_groups={"vision": ["model.vision_tower.*"], "projector": ["model.multi_modal_projector.*"], "llm": ["model.language_model.*", "lm_head.*"]},
        shard_layers=("model.language_model.layers",),
        demo=demo,
    )
    fields.update(overrides)
    return VLMFamily(**fields)


def shrink_config(config: Any, sizes: Mapping[str, int] = TINY_SIZES) -> Any:
    """``config`` with every field named in ``sizes`` set to it, in every sub-config too."""
    for name in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, name, None)
        if sub is not None:
            shrink_config(sub, sizes)
    for key, value in sizes.items():
        current = getattr(config, key, None)
        if isinstance(current, (list, tuple)):  # per-axis sizes (InternViT's image_size, patch_size)
            setattr(config, key, type(current)([value] * len(current)))
        elif current is not None:
            setattr(config, key, value)
    if isinstance(getattr(config, "layer_types", None), list):  # one entry per layer, validated against the count
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    return config


def processor_class(class_name: str, model_type: str) -> Any:
    """The family's processor class: transformers' auto mapping, else ``<Family>Processor``."""
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    name = PROCESSOR_MAPPING_NAMES.get(model_type) or class_name.replace("ForConditionalGeneration", "Processor")
    if not hasattr(transformers, name):
        raise StageError(f"{class_name}: no processor class {name!r} in transformers; the pack needs its own tiny checkpoint builder")
    return getattr(transformers, name)


def image_processor_class(model_type: str) -> Any:
    """The family's image processor class, its PIL backend where it has one (no torchvision needed)."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
    if isinstance(names, dict):
        name = names.get("pil") or next(iter(names.values()), None)
    else:
        name = names[0] if names else None
    if not name or not hasattr(transformers, name):
        raise StageError(f"{model_type}: transformers names no image processor for it; the pack needs its own tiny checkpoint builder")
    return getattr(transformers, name)


def tiny_checkpoint(class_name: str, out: Path, seed: int, *, corpus: list[str], chat_template: str = DEFAULT_TEMPLATE, image_token: str = "<image>", sizes: Mapping[str, int] = TINY_SIZES) -> None:
    """Write a random-weight ``class_name`` checkpoint that ``from_pretrained`` and
    ``AutoProcessor`` load: shrunk config, a byte-level tokenizer over ``corpus``, the family's
    processor with its image processor sized to the tiny vision tower, and ``chat_template``."""
    import torch
    from transformers.utils import logging as hf_logging

    from mmcore.engines.tiny import byte_level_tokenizer

    hf_logging.disable_progress_bar()
    cls = model_class(class_name)
    config = shrink_config(cls.config_class(), sizes)
    tokenizer = byte_level_tokenizer(corpus, [image_token], vocab_size=384, eos="</s>", pad="<pad>", bos="<s>", chat_template=chat_template)
    text = getattr(config, "text_config", config)
    text.vocab_size = len(tokenizer)
    text.pad_token_id, text.eos_token_id, text.bos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id
    for name in ("image_token_id", "image_token_index"):
        if hasattr(config, name):
            setattr(config, name, tokenizer.convert_tokens_to_ids(image_token))
    # the defaults pick layers of a deep tower; a tiny one has TINY_SIZES' two (keep how many are picked)
    depth = getattr(getattr(config, "vision_config", None), "num_hidden_layers", 2)
    for name in ("vision_feature_layer", "vision_feature_layers"):
        layer = getattr(config, name, None)
        if isinstance(layer, int):
            setattr(config, name, -1)
        elif isinstance(layer, (list, tuple)):
            setattr(config, name, [-1 - i % depth for i in range(len(layer))])
    vision = getattr(config, "vision_config", None)
    side = getattr(vision, "image_size", 28)
    image_processor = image_processor_class(config.model_type)(size={"height": side, "width": side}, crop_size={"height": side, "width": side}, do_center_crop=False)
    processor_cls = processor_class(class_name, config.model_type)
    accepted = inspect.signature(processor_cls.__init__).parameters
    extra = {
        "patch_size": getattr(vision, "patch_size", None),
        "image_token": image_token,
        "vision_feature_select_strategy": getattr(config, "vision_feature_select_strategy", None),
        # a CLIP tower's class token counts in its output; with the "default" strategy the
        # processor then drops one as the model drops the class token
        "num_additional_image_tokens": int("clip" in getattr(vision, "model_type", "") and getattr(config, "vision_feature_select_strategy", None) == "default"),
    }
    extra = {k: v for k, v in extra.items() if v is not None and k in accepted}
    processor = processor_cls(image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template, **extra)
    torch.manual_seed(seed)
    model = cls(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)


__all__ = ["TINY_SIZES", "DEFAULT_TEMPLATE", "TransformersNames", "ProcessorImages", "auto_family", "shrink_config", "tiny_checkpoint"]
