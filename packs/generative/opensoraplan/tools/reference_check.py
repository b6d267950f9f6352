"""Equivalence of mm_pack_opensoraplan's transformer with MindSpeed-MM's ``SparseUMMDiT`` (the
reference Open-Sora Plan v1.5 code), on CPU, by hand (not a test: it needs the reference source)::

    git clone https://gitcode.com/Ascend/MindSpeed-MM   # or any checkout of it
    pip install einops beartype
    python packs/generative/opensoraplan/tools/reference_check.py /path/to/MindSpeed-MM

Megatron's parallel linears, its RMSNorm and torch_npu's fused attention are replaced by their
single-device definitions (nn.Linear returning (out, bias); RMS norm; SDPA with the NPU's mask
convention, True = masked); the rest of the model code is the reference's, imported from the
checkout. Random weights, renamed to the released checkpoint's names (the converter's mapping
reversed), load strictly into the pack's model; the two outputs are compared.
"""

import importlib.abc
import importlib.machinery
import sys
import types

ROOT = sys.argv[1] if len(sys.argv) > 1 else "MindSpeed-MM"
sys.path.insert(0, ROOT)

import torch
import torch.nn.functional as F
from torch import nn


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything


class Anything(metaclass=_Meta):
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return Anything()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything()


class StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything


STUBS = {"megatron", "mindspeed", "torch_npu", "decord", "apex"}


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, Finder())


class Args:
    sequence_parallel = False
    recompute_granularity = None
    distribute_saved_activations = False
    recompute_num_layers = None
    attention_mask_type = None
    context_parallel_algo = None

    def __getattr__(self, name):
        return None


class Linear(nn.Linear):
    def __init__(self, i, o, config=None, init_method=None, bias=True, **k):
        super().__init__(i, o, bias=bias)

    def forward(self, x):
        return super().forward(x.to(self.weight.dtype)), None  # as under autocast: the reference's float32 conditioning meets bf16 weights


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6, sequence_parallel=False, **k):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class MegatronModule(nn.Module):
    def __init__(self, config=None):
        super().__init__()
        self.config = config


def npu_fusion_attention(q, k, v, head_num, atten_mask=None, input_layout="SBH", scale=None, **kw):
    assert input_layout == "SBH"
    s, b, hd = q.shape
    d = hd // head_num
    q, k, v = (t.view(t.shape[0], b, head_num, d).permute(1, 2, 0, 3) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=~atten_mask, scale=scale)
    return (out.permute(2, 0, 1, 3).reshape(s, b, hd),)


import megatron.core  # noqa: E402  (stubs)
import megatron.core.tensor_parallel as tp  # noqa: E402
import megatron.training  # noqa: E402
import megatron.training.arguments  # noqa: E402
import megatron.legacy.model.rms_norm  # noqa: E402
import megatron.core.transformer.module  # noqa: E402
import torch_npu  # noqa: E402

ARGS = Args()
megatron.training.get_args = lambda: ARGS
megatron.training.arguments.core_transformer_config_from_args = lambda args: types.SimpleNamespace(init_method=None, sequence_parallel=False)
tp.ColumnParallelLinear = tp.RowParallelLinear = Linear
tp.gather_from_sequence_parallel_region = lambda x, **k: x
tp.mappings = types.SimpleNamespace(gather_from_tensor_model_parallel_region=lambda x: x, all_gather_last_dim_from_tensor_parallel_region=lambda x: x)
megatron.core.tensor_parallel = tp
mpu = types.SimpleNamespace(get_context_parallel_world_size=lambda: 1, get_tensor_model_parallel_world_size=lambda: 1, get_pipeline_model_parallel_world_size=lambda: 1)
megatron.core.mpu = mpu
megatron.core.utils = types.SimpleNamespace(divide=lambda a, b: a // b)
megatron.legacy.model.rms_norm.RMSNorm = RMSNorm
megatron.core.transformer.module.MegatronModule = MegatronModule
torch_npu.npu_fusion_attention = npu_fusion_attention

# the package inits import every model: empty ones instead
for pkg in ("mindspeed_mm", "mindspeed_mm.models", "mindspeed_mm.models.predictor", "mindspeed_mm.models.predictor.dits"):
    m = types.ModuleType(pkg)
    m.__path__ = [f"{ROOT}/" + pkg.replace(".", "/")]
    sys.modules[pkg] = m

from mindspeed_mm.models.predictor.dits.sparseu_mmdit import SparseUMMDiT  # noqa: E402

from mm_pack_opensoraplan.transformer import OpenSoraPlanTransformer3DModel  # noqa: E402

RENAME = {  # MindSpeed-MM's name -> the released checkpoint's (the converter's str_replace_mapping, reversed)
    "attn1.norm_proj_q": "attn1.norm_q",
    "attn1.norm_proj_k": "attn1.norm_k",
    "attn1.norm_added_proj_q": "attn1.norm_added_q",
    "attn1.norm_added_proj_k": "attn1.norm_added_k",
    "attn1.added_proj_q": "attn1.add_q_proj",
    "attn1.added_proj_k": "attn1.add_k_proj",
    "attn1.added_proj_v": "attn1.add_v_proj",
    "attn1.added_proj_out": "attn1.to_add_out",
    "attn1.proj_q": "attn1.to_q",
    "attn1.proj_k": "attn1.to_k",
    "attn1.proj_v": "attn1.to_v",
    "attn1.proj_out": "attn1.to_out.0",
}


def released_name(name: str) -> str:
    for a, b in RENAME.items():
        if a in name:
            return name.replace(a, b)
    return name


def check(zero_init: bool, sparse_n, frames=3, hw=8, text_len=6, mask_text=True, dtype=torch.float32) -> float:
    torch.manual_seed(0)
    cfg = dict(
        num_heads=2,
        head_dim=32,
        in_channels=4,
        out_channels=4,
        num_layers=[2, 2, 2, 2, 2],
        sparse_n=sparse_n,
        double_ff=True,
        sparse1d=True,
        caption_channels=8,
        pooled_projection_dim=8,
        timestep_embed_dim=16,
        skip_connection=True,
        skip_connection_zero_init=zero_init,
        patch_size_thw=[1, 2, 2],
        activation_fn="gelu-approximate",
        norm_cls="fp32_layer_norm",
        norm_eps=1e-6,
        attention_bias=True,
    )
    ref = SparseUMMDiT(**cfg, sample_size_t=frames, sample_size_h=hw // 2, sample_size_w=hw // 2).eval()
    for p in ref.parameters():
        p.data.normal_(0, 0.2)
    state = {released_name(k): v for k, v in ref.state_dict().items()}
    ours = OpenSoraPlanTransformer3DModel(**cfg).eval()
    ours.load_state_dict(state, strict=True)
    ref, ours = ref.to(dtype), ours.to(dtype)
    b = 2
    x = torch.randn(b, 4, frames, hw, hw)
    t = torch.tensor([37.0, 861.0])
    enc = torch.randn(b, text_len, 8)
    pooled = torch.randn(b, 8)
    mask = torch.ones(b, text_len)
    if mask_text:
        mask[0, 4:] = 0
    x, enc, pooled = x.to(dtype), enc.to(dtype), pooled.to(dtype)
    with torch.no_grad():
        want = ref(x, timestep=t, prompt=[enc, pooled], video_mask=torch.ones(b, frames, hw, hw), prompt_mask=[mask])
        got = ours(x, t, enc, pooled, encoder_attention_mask=mask.bool(), return_dict=False)[0]
    diff = float((want.float() - got.float()).abs().max())
    print(f"{dtype} zero_init={zero_init} sparse_n={sparse_n} frames={frames} {hw}x{hw}: {len(state)} tensors, loaded strictly; output std {float(want.std()):.3f}, max |diff| {diff:.3g}")
    return diff


if __name__ == "__main__":
    worst = max(
        check(True, [1, 2, 4, 2, 1]),
        check(False, [1, 2, 4, 2, 1]),
        check(True, [1, 2, 4, 2, 1], frames=5, hw=6),  # 45 tokens: padded for k = 2 (to 48) and k = 4 (to 48)
        check(True, [1, 1, 1, 1, 1], mask_text=False),
        check(True, [1, 2, 4, 2, 1], dtype=torch.bfloat16),
    )
    print(f"worst max |diff| {worst:.3g}")
