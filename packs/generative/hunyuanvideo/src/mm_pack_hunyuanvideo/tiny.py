"""Tiny random-weight HunyuanVideo pipelines built from config (how tests and the demo run offline).

``init:tiny`` and ``init:demo`` write the diffusers layout ``HunyuanVideoPipeline.from_pretrained``
loads: ``transformer/`` (double- and single-stream blocks, the token refiner, the guidance
embedding of the guidance-distilled release), ``vae/`` (the 3D causal VAE: 8x space, 4x time,
16 channels; the demo's 4x in space, trained to reconstruct the demo's clips), ``text_encoder/`` + ``tokenizer/`` (a Llama, read at its third-last layer as the
pipeline does), ``text_encoder_2/`` + ``tokenizer_2/`` (CLIP's pooled vector), ``scheduler/``
(flow matching, shift 7 as the release ships it).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mmcore.engines import clip_tokenizer, pick_preset, write_demo_vae_report

CORPUS = [
    "a red square moves left",
    "a red square moves right",
    "a red square moves up",
    "a red square moves down",
    "a blue square moves left",
    "a blue square moves right",
    "a blue square moves up",
    "a blue square moves down",
    "a green circle moves up",  # the demo's other colour and shape: whole words, one token each
    "a cat walks on the grass, realistic style",
]

PRESETS = {
    "tiny": {"heads": 2, "head_dim": 12, "layers": 1, "single_layers": 1},
    # the demo's VAE is trained at init:demo to reconstruct the demo's clips ((steps, of them on
    # single frames): 4x in space, so a 32 px clip is 8x8 latents, 4x4 tokens a frame); 4 heads,
    # not 2: with 2 the held-out caption sensitivity stayed near 1.4 and most samples were static
    "demo": {"heads": 4, "head_dim": 24, "layers": 2, "single_layers": 2, "demo_vae": (900, 700)},
    # the demo's model with its VAE trained only 20 steps (make test's short run of the demo path)
    "demo-short": {"heads": 4, "head_dim": 24, "layers": 2, "single_layers": 2, "demo_vae": (20, 15)},
}

SPECIALS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def chains(pieces: list[str], halves: set[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """BPE merges that build each piece whole from its characters, left to right — except the
    pieces in ``halves``, left in two (their second halves merged after every whole piece, so
    no merge of theirs splits another piece) — and the tokens they make. Built, not trained:
    the same files every time."""
    merges: list[tuple[str, str]] = []
    tokens: list[str] = []
    late: list[str] = []
    for piece in dict.fromkeys(pieces):
        if piece in halves:
            piece, rest = piece[: len(piece) // 2], piece[len(piece) // 2 :]
            late.append(rest)
        chain(piece, merges, tokens)
    for rest in late:
        chain(rest, merges, tokens)
    return merges, tokens


def chain(piece: str, merges: list[tuple[str, str]], tokens: list[str]) -> None:
    if len(set(piece)) == 1:  # a run of one character (spaces): BPE pairs it up, so merge by doubling
        run = piece[0]
        while len(run) * 2 <= len(piece):
            if (run, run) not in merges:
                merges.append((run, run))
            run += run
            if run not in tokens:
                tokens.append(run)
        return
    left = piece[0]
    for right in piece[1:]:
        if (left, right) not in merges:
            merges.append((left, right))
        left += right
        if left not in tokens:
            tokens.append(left)


def fit_caption_start(make: Any, starts: Any, pieces: list[str], target: int) -> Any:
    """``make(halves)``, with pieces of the template's prefix left in two, one at a time, until
    ``starts(tokenizer)`` — where a caption's tokens begin — is ``target``: the count the
    pipeline crops, so the caption starts where the pipeline cuts, as with the real tokenizer."""
    halves: set[str] = set()
    at = starts(make(halves))
    for piece in dict.fromkeys(p for p in pieces if len(p) > 3):
        if at == target:
            break
        if at < target and starts(make(halves | {piece})) <= target:
            halves.add(piece)
            at = starts(make(halves))
    tokenizer = make(halves)
    if starts(tokenizer) != target:
        raise AssertionError(f"the tiny tokenizer starts captions at token {starts(tokenizer)}, not {target}")
    return tokenizer


def llama_tokenizer(corpus: list[str], template: str, crop_start: int):  # type: ignore[no-untyped-def]
    """The ``LlamaTokenizer`` ``HunyuanVideoPipeline`` loads (transformers rebuilds the class's own
    BPE from vocab and merges: no pre-splitting, spaces as ``\u2581``), every word of ``corpus``
    and of ``template`` whole but as many as it takes for captions to start at ``crop_start``."""
    from transformers import LlamaTokenizer

    from mm_pack_hunyuanvideo.caption import caption_start

    specials = "|".join(map(re.escape, SPECIALS))
    pieces = ["\u2581" + w for w in re.findall(r"\S+", " ".join([*corpus, *re.split(specials, template)]))]
    chars = sorted({c for w in pieces for c in w} | {"\n"})

    def make(halves: set[str]) -> Any:
        merges, tokens = chains(pieces, halves)
        vocab = {t: i for i, t in enumerate(dict.fromkeys(["<unk>", "<|begin_of_text|>", "<|end_of_text|>", *chars, *tokens]))}
        tokenizer = LlamaTokenizer(vocab=vocab, merges=merges, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>", pad_token="<|end_of_text|>", unk_token="<unk>", padding_side="right")
        tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS})
        return tokenizer

    prefix = ["\u2581" + w for w in re.findall(r"\S+", re.sub(specials, " ", template.split("{}")[0]))]
    return fit_caption_start(make, lambda tok: caption_start(lambda c: tok(template.format(c)).input_ids), prefix, crop_start)


CHATML = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


def qwen_tokenizer(corpus: list[str], system: str, crop_start: int):  # type: ignore[no-untyped-def]
    """A ``Qwen2Tokenizer`` (byte-level BPE, ChatML template) with every word of ``corpus`` and of
    the system message whole but as many as it takes for the user's text to start at token
    ``crop_start`` of ``HunyuanVideo15Pipeline``'s chat prompt."""
    from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import format_text_input
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    from mm_pack_hunyuanvideo.caption import caption_start

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    splitter = Qwen2Tokenizer(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]).backend_tokenizer.pre_tokenizer

    def split(text: str) -> list[str]:  # the pieces Qwen's pre-tokenizer cuts, bytes mapped as byte-level BPE maps them
        return [piece for piece, _ in splitter.pre_tokenize_str(text)]

    pieces = [p for line in [*corpus, system, "system", "user", "assistant"] for p in split(line)]

    def make(halves: set[str]) -> Any:
        merges, tokens = chains(pieces, halves)
        vocab = {t: i for i, t in enumerate(dict.fromkeys([*alphabet, *tokens]))}
        tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges)
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        tokenizer.chat_template = CHATML
        return tokenizer

    def starts(tokenizer: Any) -> int:
        return caption_start(lambda c: tokenizer.apply_chat_template(format_text_input([c], system), add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"][0])

    return fit_caption_start(make, starts, split(system), crop_start)


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    import torch
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline, HunyuanVideoTransformer3DModel
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE
    from diffusers.utils import logging as diffusers_logging
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel
    from transformers.utils import logging as hf_logging

    p = pick_preset(PRESETS, preset)
    hf_logging.disable_progress_bar()
    diffusers_logging.disable_progress_bar()
    torch.manual_seed(seed)
    tokenizer = llama_tokenizer(CORPUS, DEFAULT_PROMPT_TEMPLATE["template"], DEFAULT_PROMPT_TEMPLATE["crop_start"])
    text_encoder = LlamaModel(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=2,
        )
    ).eval()
    tokenizer_2 = clip_tokenizer(CORPUS)
    text_encoder_2 = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer_2),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=77,
            projection_dim=16,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
        )
    ).eval()
    measured = None
    if "demo_vae" in p:
        vae = AutoencoderKLHunyuanVideo(
            latent_channels=16,
            down_block_types=("HunyuanVideoDownBlock3D",) * 3,
            up_block_types=("HunyuanVideoUpBlock3D",) * 3,
            block_out_channels=(8, 16, 16),
            layers_per_block=1,
            norm_num_groups=4,
            spatial_compression_ratio=4,
            temporal_compression_ratio=4,
            mid_block_add_attention=False,
        )
        measured = train_vae(vae, seed, *p["demo_vae"])
    else:
        vae = AutoencoderKLHunyuanVideo(
            latent_channels=16, block_out_channels=(8, 8, 16, 16), layers_per_block=1, norm_num_groups=4, spatial_compression_ratio=8, temporal_compression_ratio=4, mid_block_add_attention=False
        ).eval()
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=16,
        out_channels=16,
        num_attention_heads=p["heads"],
        attention_head_dim=p["head_dim"],
        num_layers=p["layers"],
        num_single_layers=p["single_layers"],
        num_refiner_layers=1,
        patch_size=2,
        patch_size_t=1,
        guidance_embeds=True,
        text_embed_dim=32,
        pooled_projection_dim=16,
        rope_axes_dim=(p["head_dim"] // 3, p["head_dim"] // 3, p["head_dim"] // 3),
    )
    scheduler = FlowMatchEulerDiscreteScheduler(shift=7.0)
    HunyuanVideoPipeline(text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer, vae=vae, scheduler=scheduler, text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2).save_pretrained(
        out
    )
    if measured is not None:
        write_demo_vae_report(out, measured)


def train_vae(vae, seed: int, steps: int, frame_steps: int) -> dict:  # type: ignore[no-untyped-def, type-arg]
    """Train the demo's VAE on moving-shape clips (:func:`mmcore.engines.train_demo_vae`, which
    also sets ``scaling_factor``, what the pipeline divides latents by, from the trained
    latents): held-out PSNR on 16 other clips. Without the residual shortcut Wan's VAE has, it
    learns slower: a higher learning rate than wan's (2e-3 reached 11.8 dB, near a white frame's)."""
    from mmcore.data import moving_shape_clips
    from mmcore.engines import train_demo_vae

    clips, held_out = moving_shape_clips(96, seed + 1_000), moving_shape_clips(16, seed + 2_000)
    return train_demo_vae(vae, clips, held_out, steps=steps, frame_steps=frame_steps, lr=1e-2, batch=2, seed=seed)


PRESETS_15 = {
    "tiny": {"heads": 2, "head_dim": 12, "layers": 2},
    "demo": {"heads": 2, "head_dim": 24, "layers": 3},
}


def build_v15_checkpoint(preset: str, out: Path, seed: int) -> None:
    """A tiny HunyuanVideo 1.5 text-to-video pipeline: ``transformer/`` (one stream of blocks over
    the video and the Qwen, ByT5 and image-token sequences), ``vae/`` (the 1.5 VAE's layout; 8x
    space here to keep 32-pixel clips 4 x 4 latents, 16x in the release), ``text_encoder/`` +
    ``tokenizer/`` (a Qwen2.5-VL text model, ChatML), ``text_encoder_2/`` + ``tokenizer_2/``
    (ByT5 for quoted glyph text), ``guider/`` (classifier-free guidance), ``scheduler/``."""
    import torch
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline, HunyuanVideo15Transformer3DModel
    from diffusers.guiders import ClassifierFreeGuidance
    from diffusers.utils import logging as diffusers_logging
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel, T5Config, T5EncoderModel
    from transformers.utils import logging as hf_logging

    p = pick_preset(PRESETS_15, preset)
    hf_logging.disable_progress_bar()
    diffusers_logging.disable_progress_bar()
    torch.manual_seed(seed)
    tokenizer = qwen_tokenizer(CORPUS, *pipeline_prompt())
    text_encoder = Qwen2_5_VLTextModel(
        Qwen2_5_VLTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
        )
    ).eval()
    tokenizer_2 = ByT5Tokenizer()
    text_encoder_2 = T5EncoderModel(
        T5Config(vocab_size=len(tokenizer_2), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1)
    ).eval()
    vae = AutoencoderKLHunyuanVideo15(latent_channels=8, block_out_channels=(8, 8, 16, 16), layers_per_block=1, spatial_compression_ratio=8, temporal_compression_ratio=4, scaling_factor=0.2).eval()
    third = p["head_dim"] // 3
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=8 * 2 + 1,
        out_channels=8,
        num_attention_heads=p["heads"],
        attention_head_dim=p["head_dim"],
        num_layers=p["layers"],
        num_refiner_layers=1,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=32,
        text_embed_2_dim=16,
        image_embed_dim=16,
        rope_axes_dim=(third, third, third),
        task_type="t2v",
    )
    HunyuanVideo15Pipeline(
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        guider=ClassifierFreeGuidance(guidance_scale=6.0),
    ).save_pretrained(out)


def pipeline_prompt() -> tuple[str, int]:
    """(system message, crop) of ``HunyuanVideo15Pipeline``'s prompt (the defaults of its Qwen
    encoding; extract checks a checkpoint's tokenizer against what the pipeline instance uses)."""
    import inspect

    from diffusers import HunyuanVideo15Pipeline

    defaults = inspect.signature(HunyuanVideo15Pipeline._get_mllm_prompt_embeds).parameters
    return defaults["system_message"].default, defaults["crop_start"].default
