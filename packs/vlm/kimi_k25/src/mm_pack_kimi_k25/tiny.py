"""Tiny random-weight checkpoints built from config: how tests and the demo run offline.

``init:tiny`` and ``init:demo`` write a folder that ``from_pretrained`` and ``Kimi_K25Processor``
load: config (the real config's fields: a MoonViT vision tower with a learned, bicubically
resampled position grid and 2-D RoPE, the 2 x 2 patch-merger projector, and a DeepSeek-V3 decoder
with multi-head latent attention whose first layer is dense and the rest routed experts beside a
shared expert), safetensors weights in the released checkpoint's layout (the pack's export), a
byte-level tokenizer with Kimi's special tokens, the pack's PIL image processor and Kimi-K2.5's
chat template.

The released tokenizer is a tiktoken model loaded by remote code (``tokenization_kimi.py``),
which an offline test cannot have: the tiny tokenizer carries the same special tokens
(``<|im_user|>`` ... ``<|media_pad|>``, ``<think>``) and the template below.
"""

from __future__ import annotations

from pathlib import Path

from mmcore.engines import pick_preset

BOS, EOS, PAD, END = "[BOS]", "[EOS]", "[PAD]", "<|im_end|>"
IMAGE, VIDEO = "<|media_pad|>", "<|kimi_k25_video_placeholder|>"
SPECIALS = [END, "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "<|media_begin|>", "<|media_content|>", "<|media_end|>", IMAGE, "<think>", "</think>", VIDEO]
DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."

# Kimi-K2.5's conversation format: a default system turn, ``<|im_user|>user<|im_middle|>`` ...
# ``<|im_end|>`` turns, images as ``<|media_begin|>image<|media_content|><|media_pad|><|media_end|>``
# (the processor widens the pad to the image's tokens), past assistant turns with an empty
# ``<think></think>``, and the generation prompt opening ``<think>`` (thinking mode, the default;
# ``thinking=False`` closes it). Tool calls are left out.
CHAT_TEMPLATE = (
    "{%- macro content(m) -%}{%- if m['content'] is string -%}{{ m['content'] }}{%- else -%}"
    "{%- for c in m['content'] -%}{%- if c['type'] == 'image' -%}<|media_begin|>image<|media_content|><|media_pad|><|media_end|>{{ '\\n' }}"
    "{%- elif c['type'] == 'video' -%}<|kimi_k25_video_placeholder|>{%- else -%}{{ c['text'] }}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}"
    "{%- if messages|length == 0 or messages[0]['role'] != 'system' -%}<|im_system|>system<|im_middle|>" + DEFAULT_SYSTEM + "<|im_end|>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}<|im_user|>user<|im_middle|>{{ content(m) }}<|im_end|>"
    "{%- elif m['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|><think></think>{{ content(m) }}<|im_end|>"
    "{%- else -%}<|im_system|>{{ m['role'] }}<|im_middle|>{{ content(m) }}<|im_end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}{%- endif -%}"
)

# Words the tiny tokenizer learns whole: the demo's vocabulary plus common chat text.
CORPUS = [
    "What colour is the shape? What colour is the triangle? What colour is the square? What colour is the circle?",
    "The shape is red. The shape is green. The shape is blue. The shape is yellow. Describe the image.",
    "red green blue yellow triangle square circle user assistant system image video You are Kimi, an AI assistant created by Moonshot AI.",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]

# patch: the vision patch (released: 14 pixels); side: at most this many patches a side
# (released: 512); max_patches: the patch budget of an image (released: 16384); v_head: MLA's
# value head, against 8 + 8 for query and key (released: 128 against 128 + 64; tiny keeps it narrower).
PRESETS = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "v_head": 8, "vision": 32, "vision_layers": 2, "patch": 4, "side": 16, "max_patches": 160},
    "demo": {"hidden": 96, "layers": 2, "heads": 4, "v_head": 16, "vision": 64, "vision_layers": 2, "patch": 14, "side": 16, "max_patches": 256},
}


def build_tokenizer():  # type: ignore[no-untyped-def]
    """A byte-level BPE tokenizer with Kimi's special tokens."""
    from mmcore.engines import byte_level_tokenizer

    tokenizer = byte_level_tokenizer(CORPUS, SPECIALS, vocab_size=384, eos=EOS, pad=PAD, bos=BOS, chat_template=CHAT_TEMPLATE)
    tokenizer.add_bos_token = False  # as Kimi's: the template starts the conversation
    return tokenizer


def model_config(preset: str, tokenizer):  # type: ignore[no-untyped-def]
    """The transformers config of a tiny preset, its token ids taken from ``tokenizer``."""
    from transformers import Kimi_K25Config

    p = pick_preset(PRESETS, preset)
    vision = dict(patch_size=p["patch"], pos_emb_height=8, pos_emb_width=8, num_attention_heads=2, num_hidden_layers=p["vision_layers"], hidden_size=p["vision"], intermediate_size=2 * p["vision"])
    text = dict(
        model_type="deepseek_v3",
        vocab_size=len(tokenizer),
        hidden_size=p["hidden"],
        intermediate_size=2 * p["hidden"],
        moe_intermediate_size=p["hidden"] // 2,
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["heads"],
        first_k_dense_replace=1,  # as the released model: the first layer dense
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=p["v_head"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids(END),
        pad_token_id=tokenizer.pad_token_id,
    )
    ids = {
        name: tokenizer.convert_tokens_to_ids(token)
        for name, token in (("image_token_id", IMAGE), ("video_token_id", VIDEO), ("vision_start_token_id", "<|media_begin|>"), ("vision_end_token_id", "<|media_end|>"))
    }
    return Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=p["vision"], tie_word_embeddings=False, **ids)


def image_processor(preset: str):  # type: ignore[no-untyped-def]
    from mm_pack_kimi_k25.image_processor import KimiK25ImageProcessorPil

    p = pick_preset(PRESETS, preset)
    return KimiK25ImageProcessorPil(patch_size=p["patch"], merge_size=2, max_patches=p["max_patches"], size={"max_height": p["side"], "max_width": p["side"]})


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight checkpoint of ``preset`` (model, tokenizer, processor) into ``out``,
    its weights in the released layout."""
    import torch
    from safetensors.torch import save_file
    from transformers import Kimi_K25ForConditionalGeneration
    from transformers.utils import logging as hf_logging

    from mm_pack_kimi_k25.family import adapter_for

    hf_logging.disable_progress_bar()
    tokenizer = build_tokenizer()
    config = model_config(preset, tokenizer)
    torch.manual_seed(seed)
    model = Kimi_K25ForConditionalGeneration(config)
    out.mkdir(parents=True, exist_ok=True)
    config.architectures = ["Kimi_K25ForConditionalGeneration"]
    config.save_pretrained(out)
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.save_pretrained(out)
    state = model.state_dict()
    hub = {
        key: recipe.combine(*(state[s] for s in recipe.sources)) if recipe.combine else state[recipe.sources[0]]
        for key, recipe in adapter_for(config).to_hf({k: _info(v) for k, v in state.items()}).items()
    }
    save_file({k: v.contiguous() for k, v in hub.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(out)
    image_processor(preset).save_pretrained(out)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def _info(tensor):  # type: ignore[no-untyped-def]
    from mmcore.engines import TensorInfo

    return TensorInfo(tuple(tensor.shape), tensor.dtype)
