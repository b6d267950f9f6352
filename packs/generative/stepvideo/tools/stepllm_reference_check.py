"""Equivalence of mm_pack_stepvideo's Step-LLM with the reference ``Step1Model`` and its tokenizer
wrapper (stepfun-ai/Step-Video-T2V ``stepvideo/text_encoder/{stepllm,tokenizer}.py``), on CPU in
float32, by hand (not a test: it needs the reference source)::

    git clone https://github.com/stepfun-ai/Step-Video-T2V   # or any checkout of it
    pip install einops sentencepiece
    python packs/generative/stepvideo/tools/stepllm_reference_check.py /path/to/Step-Video-T2V

Stubbed, infrastructure only: the packages' ``__init__`` files (they import the DiT and xDiT),
``stepvideo.utils`` (its package imports the whole repository's dependencies; ``with_empty_init`` left out: the loaded weights replace the initialisation), and
``transformers.modeling_utils.PretrainedConfig`` (transformers 5 exports it from
``transformers`` only). **Assumed, not checked**: the reference's attention is
``torch.ops.Optimus.fwd``, a compiled kernel shipped as a binary beside the weights; it is
replaced by causal softmax attention with the square-root ALiBi bias ``-slope_h * sqrt(i - j)``
written here on its own (einsum, not SDPA), the math of the fallback StepFun ships for the same
kernel with Step-1's weights in Step-Audio. Everything else is the reference's code: the fused
projections' split, the grouped key/value repetition, SwiGLU's halves and rounded width, the
norms, the block order, the embedding, the output's layout; and its tokenizer wrapper on the
same SentencePiece file.

For each config (query heads per group > 1, = heads, a head count that is not a power of two, a
feed-forward width that is not a multiple of 256): this pack's model gets random weights (norms
perturbed), is written in the release's layout (``save_pretrained``), the reference model loads
those tensors strictly, and both run the same ids (two prompts padded to 24, as its wrapper pads
them). Printed: the tokenizers' agreement and max |diff| of the hidden states; a control nudges one
weight of this pack's model and must differ.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import tempfile
import types
from pathlib import Path

import torch

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else "Step-Video-T2V")
PROMPTS = ["a red square moves left", "video of a cat, slow motion, bright light, white background"]


def sqrt_alibi_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = True, **_: object) -> torch.Tensor:
    """[b, s, h, d] each -> [b, s, h, d]: the stand-in for ``torch.ops.Optimus.fwd``."""
    b, s, h, d = q.shape
    n = 2 ** math.floor(math.log2(h))
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)] + [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(h - n)]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * (softmax_scale or d**-0.5)
    rows, cols = torch.arange(s).view(-1, 1), torch.arange(s).view(1, -1)
    bias = -torch.tensor(slopes).view(-1, 1, 1) * (rows - cols).clamp(min=0).float().sqrt()
    scores = (scores + bias).masked_fill(cols > rows, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


def reference_modules() -> tuple[types.ModuleType, types.ModuleType]:
    import transformers
    import transformers.modeling_utils as modeling_utils

    modeling_utils.PretrainedConfig = transformers.PretrainedConfig  # type: ignore[attr-defined]
    utils = types.ModuleType("stepvideo.utils")
    utils.with_empty_init = lambda func: func  # type: ignore[attr-defined]
    sys.modules["stepvideo.utils"] = utils
    for package in ("stepvideo", "stepvideo.text_encoder", "stepvideo.modules"):  # their __init__s import the DiT and xDiT
        module = types.ModuleType(package)
        module.__path__ = [str(ROOT / package.replace(".", "/"))]  # type: ignore[attr-defined]
        sys.modules[package] = module
    import stepvideo.text_encoder.flashattention as flash

    flash.flash_attn_func = sqrt_alibi_attention
    spec = importlib.util.spec_from_file_location("stepvideo_reference_stepllm", ROOT / "stepvideo" / "text_encoder" / "stepllm.py")
    ref = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(ref)  # type: ignore[union-attr]
    import stepvideo.text_encoder.tokenizer as tokenizer

    return ref, tokenizer


def perturbed(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))


def check(ref: types.ModuleType, tok: types.ModuleType, name: str, fields: dict) -> None:
    import transformers

    from mm_pack_stepvideo.stepllm import StepLLM
    from mm_pack_stepvideo.stepllm_io import TOKENIZER
    from mm_pack_stepvideo.tiny import tiny_stepllm

    torch.manual_seed(0)
    proto = tiny_stepllm().sentencepiece_proto
    ours = StepLLM(**fields).eval()
    perturbed(ours, 1)
    ours.set_tokenizer(proto)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "step_llm"
        ours.save_pretrained(folder)
        config = transformers.PretrainedConfig(
            **fields, seq_length=64, use_flash_attn=True, attention_dropout=0.0, hidden_dropout=0.0, params_dtype=torch.float32, fp32_residual_connection=False, embedding_weights_in_fp32=False
        )
        theirs = ref.Step1Model(config).eval()
        from safetensors.torch import load_file

        theirs.load_state_dict(load_file(folder / "model.safetensors"), strict=True)
        wrapper = tok.Wrapped_StepChatTokenizer(str(folder / TOKENIZER))
        tokens = wrapper(PROMPTS, max_length=24)
        ids, mask = StepLLM.from_pretrained(folder).tokenize(PROMPTS, 24)
    same_tokens = torch.equal(ids, tokens.input_ids) and torch.equal(mask, tokens.attention_mask)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).transpose(0, 1)  # the reference encoder's own transpose
        got = ours(ids, attention_mask=mask).last_hidden_state
        with_prompt = (got - expected)[mask.bool()].abs().max().item()
        everywhere = (got - expected).abs().max().item()
        p = ours.transformer.layers[0].attention.wqkv.weight
        p.add_(1e-3)
        control = (ours(ids).last_hidden_state - expected).abs().max().item()
        p.sub_(1e-3)
    print(
        f"{name}: tokens equal {same_tokens}; hidden max|diff| prompt tokens {with_prompt:.2e}, all {everywhere:.2e} "
        f"(output std {expected.std().item():.3f}); control (a wqkv weight +1e-3) {control:.2e}"
    )
    assert same_tokens and everywhere < 1e-4 and control > 10 * everywhere


def main() -> None:
    ref, tok = reference_modules()
    base = {"hidden_size": 48, "num_attention_heads": 4, "num_attention_groups": 2, "ffn_hidden_size": 64, "num_layers": 2, "padded_vocab_size": 64, "layernorm_epsilon": 1e-5}
    check(ref, tok, "grouped (4 heads, 2 groups)", base)
    check(ref, tok, "one group (4 heads)", {**base, "num_attention_groups": 1})
    check(ref, tok, "6 heads, 3 groups, ffn 300", {**base, "num_attention_heads": 6, "num_attention_groups": 3, "ffn_hidden_size": 300, "num_layers": 3})
    check(ref, tok, "groups = heads", {**base, "num_attention_groups": 4})


if __name__ == "__main__":
    main()
