"""By hand, not in CI: this pack's ``StepVideoTransformer3DModel`` against the reference's
``StepVideoModel`` (github.com/stepfun-ai/Step-Video-T2V, ``stepvideo/modules``) on the same
random weights.

    python packs/generative/stepvideo/tools/reference_equivalence.py /path/to/Step-Video-T2V

The reference's model code is imported from that checkout unchanged. Swapped, infrastructure
only: ``model.py`` imports its blocks and norms from xDiT
(``xfuser.model_executor.models.customized.step_video_t2v.{blocks,normalization}``): pointed at
the checkout's own ``stepvideo/modules/{blocks,normalization}.py``; ``stepvideo.parallel`` (xDiT's
process groups) is a one-rank stand-in, and the model is built with ``attention_type="torch"``
(the reference's own single-device attention, SDPA) instead of xDiT's sequence-parallel
attention. The reference's package ``__init__`` (its pipeline: HTTP clients, imageio) is not run.

Random weights: the reference's model is built (its init leaves parameters uninitialised), every
tensor is filled from one seed, the state dict is loaded strictly into this pack's model under
the same names; both run the reference's input layout ([B, F, C, H, W] there, [B, C, F, H, W]
here) with a text mask that cuts one caption short.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from pathlib import Path

import torch


def load_reference(root: Path) -> type:
    pkg = root / "stepvideo"
    for name, path in (("stepvideo", pkg), ("stepvideo.modules", pkg / "modules")):
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
    spec = importlib.util.spec_from_file_location("stepvideo.utils", pkg / "utils" / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    sys.modules["stepvideo.utils"] = utils

    parallel = types.ModuleType("stepvideo.parallel")
    parallel.get_sequence_parallel_world_size = lambda: 1
    parallel.get_sequence_parallel_rank = lambda: 0

    def parallel_forward(fn):  # one rank: no sequence split, no gather
        return lambda self, hidden_states, *args, **kwargs: fn(self, hidden_states, *args, **kwargs)

    parallel.parallel_forward = parallel_forward
    sys.modules["stepvideo.parallel"] = parallel
    blocks = importlib.import_module("stepvideo.modules.blocks")
    norms = importlib.import_module("stepvideo.modules.normalization")
    base = "xfuser.model_executor.models.customized.step_video_t2v"
    parts = base.split(".")
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    sys.modules[f"{base}.blocks"], sys.modules[f"{base}.normalization"] = blocks, norms
    return importlib.import_module("stepvideo.modules.model").StepVideoModel


def compare(Reference: type, fields: dict, dtype: torch.dtype, seed: int = 0, control: bool = False) -> tuple[float, float]:
    """max |reference - ours| and the reference output's std; ``control``: one of our weights
    nudged first (the comparison must then see a difference)."""
    from mm_pack_stepvideo.transformer import StepVideoTransformer3DModel

    torch.manual_seed(seed)
    ref = Reference(attention_type="torch", **fields).eval()
    gen = torch.Generator().manual_seed(seed)
    state = {
        k: torch.randn(v.shape, generator=gen) * (0.02 if v.ndim >= 2 else 0.2) + (1.0 if k.endswith("norm.weight") or ".norm" in k and k.endswith("weight") else 0.0)
        for k, v in ref.state_dict().items()
    }
    ref.load_state_dict(state, strict=True)
    ours = StepVideoTransformer3DModel(attention_type="torch", **fields).eval()
    missing, unexpected = ours.load_state_dict(state, strict=True)
    assert not missing and not unexpected
    if control:
        with torch.no_grad():
            ours.transformer_blocks[-1].attn2.wq.weight[0, 0] += 0.1
    ref, ours = ref.to(dtype), ours.to(dtype)

    b, f, h, w = 2, 3, 4, 6
    c = fields["in_channels"]
    llm, clip = fields["caption_channels"]
    x = torch.randn(b, f, c, h, w, generator=gen)
    t = torch.tensor([0.3, 0.85])
    text, text2 = torch.randn(b, 7, llm, generator=gen), torch.randn(b, 5, clip, generator=gen)
    mask = torch.ones(b, 5 + 7)
    mask[1, 5 + 4 :] = 0  # the second caption: 4 of 7 Step-LLM tokens
    with torch.no_grad():
        a = ref(x.to(dtype), encoder_hidden_states=text.to(dtype), encoder_hidden_states_2=text2.to(dtype), timestep=t.to(dtype), encoder_attention_mask=mask.to(dtype), return_dict=False)
        o = ours(x.transpose(1, 2).to(dtype), t.to(dtype), text.to(dtype), text2.to(dtype), mask, return_dict=False)[0].transpose(1, 2)
    return float((a.float() - o.float()).abs().max()), float(a.float().std())


def main() -> None:
    from diffusers.utils import logging

    logging.set_verbosity_error()
    parser = argparse.ArgumentParser()
    parser.add_argument("reference", type=Path, help="a checkout of stepfun-ai/Step-Video-T2V")
    args = parser.parse_args()
    Reference = load_reference(args.reference)
    configs = {
        # heads of 128: the reference's fixed RoPE split [64, 32, 32]
        "2 blocks, 2 heads of 128, patch 1": {"num_attention_heads": 2, "attention_head_dim": 128, "in_channels": 8, "out_channels": 8, "num_layers": 2, "caption_channels": [48, 24]},
        "2 blocks, 2 heads of 128, patch 2, extra conditions": {
            "num_attention_heads": 2,
            "attention_head_dim": 128,
            "in_channels": 8,
            "out_channels": 8,
            "num_layers": 2,
            "patch_size": 2,
            "caption_channels": [48, 24],
            "use_additional_conditions": True,
        },
    }
    for name, fields in configs.items():
        for dtype in (torch.float32, torch.bfloat16):
            diff, std = compare(Reference, fields, dtype)
            print(f"{name}, {str(dtype).removeprefix('torch.')}: max |diff| {diff:.3g} (output std {std:.3g})")
        print(f"{name}, control (one weight of ours nudged by 0.1), float32: max |diff| {compare(Reference, fields, torch.float32, control=True)[0]:.3g}")


if __name__ == "__main__":
    main()
