"""Tiny random-weight checkpoints built from config: how tests and the demo run offline.

``init:tiny`` / ``init:demo`` write a folder a user's Lumina-mGPT folder resembles: a
``ChameleonConfig`` (with Lumina's extra fields ``z_loss_weight``, ``mask_image_logits``,
``dropout`` kept in ``config.json``, as theirs carries them; transformers ignores them), the
weights as ``ChameleonForConditionalGeneration.save_pretrained`` writes them (the decoder, the
VQ encoder ``model.vqmodel.*``, an untied ``lm_head``), a byte-level tokenizer with Chameleon's
special tokens (``<image>``, ``<racm3:break>`` / ``<eoss>`` around an image, the separator
``<reserved08706>`` that ends every turn, Lumina's new-line ``<reserved08799>`` and size tokens
``<reserved08800+n>``, and one ``IMGIMG...Z`` token per VQ code, which the config's
``vocabulary_map`` maps to codes as the real one does), and ``ChameleonProcessor`` on its PIL
image processor. The real vocabulary's ids differ (``<reserved08800+n>`` is id 8804 + n there):
the pack reads every id by token name.

Sizes: the processor and VQ encoder see ``image`` pixels; the VQ model compresses by
2^(levels - 1) (the released one: 512 pixels, 16x, 1024 tokens); Lumina's size unit is two
latent cells (32 pixels there).
"""

from __future__ import annotations

from pathlib import Path

from mmcore.engines import pick_preset

BOS, EOS, PAD, SEP = "<s>", "</s>", "<pad>", "<reserved08706>"
IMAGE, BOI, EOI, NEWLINE = "<image>", "<racm3:break>", "<eoss>", "<reserved08799>"

# Lumina-mGPT's conversation (its data/convertsation.py): each turn's text followed by the
# separator, no role words; the begin-of-sentence token first. Assistant turns are learnt.
CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}<reserved08706>{% endfor %}"

CORPUS = [
    "What colour is the shape? What colour is the triangle? What colour is the square? What colour is the circle?",
    "The shape is red. The shape is green. The shape is blue. The shape is yellow. a red square a blue circle a green triangle",
    "Generate an image of 32x32 according to the following prompt: red green blue yellow triangle square circle picture",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]

# image: the processor's and VQ encoder's side; vq_levels: channel multipliers (2^(len-1) compression)
PRESETS = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "image": 32, "vq_levels": [1, 1, 2, 2], "codebook": 64},
    "demo": {"hidden": 96, "layers": 2, "heads": 4, "kv_heads": 4, "image": 32, "vq_levels": [1, 1, 2, 2], "codebook": 64},
}


def code_token(code: int) -> str:
    """The vocabulary's name of VQ code ``code`` (Chameleon's: digits as letters A-J, then Z)."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def size_token(grids: int) -> str:
    """Lumina's token for an image side of ``grids`` size units."""
    return f"<reserved{8800 + grids:05d}>"


def build_tokenizer(codebook: int, max_grids: int = 16):  # type: ignore[no-untyped-def]
    from tokenizers.processors import TemplateProcessing

    from mmcore.engines import byte_level_tokenizer

    specials = [IMAGE, BOI, EOI, SEP, NEWLINE, *[size_token(n) for n in range(1, max_grids + 1)], *[code_token(c) for c in range(codebook)]]
    tokenizer = byte_level_tokenizer(CORPUS, specials, vocab_size=400, eos=EOS, pad=PAD, bos=BOS, chat_template=CHAT_TEMPLATE)
    bos = tokenizer.convert_tokens_to_ids(BOS)
    # Chameleon's Llama tokenizer adds the begin-of-sentence token, as ChameleonProcessor relies on
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)])
    tokenizer.sep_token = SEP
    return tokenizer


def model_config(preset: str, tokenizer):  # type: ignore[no-untyped-def]
    from transformers import ChameleonConfig

    p = pick_preset(PRESETS, preset)
    vq = dict(
        embed_dim=8,
        num_embeddings=p["codebook"],
        latent_channels=32,
        resolution=p["image"],
        base_channels=32,  # the VQ encoder's GroupNorms take 32 groups
        channel_multiplier=p["vq_levels"],
        num_res_blocks=1,
    )
    config = ChameleonConfig(
        vocab_size=len(tokenizer),
        hidden_size=p["hidden"],
        intermediate_size=2 * p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        vq_config=vq,
        vocabulary_map=dict(tokenizer.get_vocab()),
    )
    # Lumina-mGPT's own fields (ChameleonXLLMXConfig), carried through as their config.json has them
    config.z_loss_weight, config.mask_image_logits, config.dropout = 0.0, False, 0.0
    return config


def image_tokens(preset: str) -> int:
    p = pick_preset(PRESETS, preset)
    side = p["image"] // 2 ** (len(p["vq_levels"]) - 1)
    return side * side


def build_processor(preset: str, tokenizer):  # type: ignore[no-untyped-def]
    """``ChameleonProcessor`` on its PIL image processor (no torchvision), sized to the tiny VQ encoder."""
    from transformers import ChameleonImageProcessorPil, ChameleonProcessor

    p = pick_preset(PRESETS, preset)
    images = ChameleonImageProcessorPil(size={"shortest_edge": p["image"]}, crop_size={"height": p["image"], "width": p["image"]})
    return ChameleonProcessor(images, tokenizer, image_seq_length=image_tokens(preset))


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight checkpoint of ``preset`` (model, tokenizer, processor) into ``out``."""
    import torch
    from transformers import ChameleonForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    p = pick_preset(PRESETS, preset)
    tokenizer = build_tokenizer(p["codebook"])
    config = model_config(preset, tokenizer)
    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if preset == "demo":  # codes that tell the demo's colours apart (mm_pack_lumina_mgpt.demo_vq)
        from mm_pack_lumina_mgpt.demo_vq import fit_demo_vq

        fit_demo_vq(model.model.vqmodel, build_processor(preset, tokenizer).image_processor, seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    build_processor(preset, tokenizer).save_pretrained(out)
