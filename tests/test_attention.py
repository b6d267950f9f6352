"""Packed attention (mmcore.train.attention): each sample attends only to itself, equal to what
transformers computes with its block-diagonal mask, without ever allocating that T x T mask."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from mmcore.train.attention import segment_bounds, use_packed_attention, varlen_attention  # noqa: E402


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any op produced."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def tiny_decoder(seed: int = 0) -> "transformers.PreTrainedModel":
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    config._attn_implementation = "sdpa"
    return transformers.Qwen2ForCausalLM(config).eval()


def packed_inputs(lengths: list[int], seed: int = 0) -> tuple["torch.Tensor", "torch.Tensor"]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (1, sum(lengths)), generator=g)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    return ids, positions


def test_reference_kernel_is_each_sequence_alone() -> None:
    """Grouped-query heads (4 query, 2 kv), three sequences: each equals SDPA over it alone."""
    import torch.nn.functional as F

    lengths = [5, 3, 6]
    cu = torch.tensor([0, 5, 8, 14])
    q, k, v = torch.randn(14, 4, 8), torch.randn(14, 2, 8), torch.randn(14, 2, 8)
    packed = varlen_attention(q, k, v, cu)
    start = 0
    for n in lengths:
        sl = slice(start, start + n)
        kk, vv = (t[sl].repeat_interleave(2, dim=1).transpose(0, 1)[None] for t in (k, v))
        alone = F.scaled_dot_product_attention(q[sl].transpose(0, 1)[None], kk, vv, is_causal=True)[0].transpose(0, 1)
        assert torch.equal(packed[sl], alone)
        start += n


def test_segment_bounds_come_from_restarting_positions() -> None:
    assert segment_bounds(torch.tensor([[0, 1, 2, 0, 1, 0]])).tolist() == [0, 3, 5, 6]
    assert segment_bounds(torch.arange(6)[None]) is None  # one sequence: plain causal attention
    assert segment_bounds(None) is None


def test_packed_row_equals_transformers_block_diagonal_mask() -> None:
    """The same logits as transformers' SDPA with the mask it builds from restarting positions
    (tolerance: another SDPA kernel, fp32 summation order), and each sample as its own row."""
    lengths = [7, 12, 3, 9]
    ids, positions = packed_inputs(lengths)
    model = tiny_decoder()
    with torch.no_grad():
        want = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        use_packed_attention(model, varlen_attention)
        got = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        start = 0
        for n in lengths:
            alone = model(input_ids=ids[:, start : start + n]).logits
            torch.testing.assert_close(got[:, start : start + n], alone, rtol=1e-5, atol=1e-5)
            start += n


def test_padded_rows_still_take_their_mask() -> None:
    """Rows padded on the right (evaluation, unpacked training) keep transformers' SDPA path."""
    model = tiny_decoder()
    ids = torch.randint(0, 64, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        use_packed_attention(model, varlen_attention)
        got = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(got[0], want[0]) and torch.equal(got[1, :6], want[1, :6])


def test_gradients_equal_the_masked_path() -> None:
    lengths = [6, 10, 4]
    ids, positions = packed_inputs(lengths, seed=1)
    grads = []
    for packed in (False, True):
        model = tiny_decoder(seed=1).train()
        if packed:
            use_packed_attention(model, varlen_attention)
        model(input_ids=ids, position_ids=positions, use_cache=False).logits.square().mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("total", [1024, 2048])
def test_no_t_by_t_mask_is_allocated(total: int) -> None:
    """A packed row of ``total`` tokens in 128-token samples: no tensor of the forward reaches
    T x T elements (transformers' SDPA path, the control, builds one)."""
    lengths = [128] * (total // 128)
    ids, positions = packed_inputs(lengths)
    largest = {}
    for packed in (False, True):
        model = tiny_decoder()
        if packed:
            use_packed_attention(model, varlen_attention)
        with torch.no_grad(), LargestTensor() as seen:
            model(input_ids=ids, position_ids=positions, use_cache=False)
        largest[packed] = seen.largest
    assert largest[False] >= total * total  # the control: the block-diagonal mask
    assert largest[True] < total * 64 + 1  # the logits [1, T, vocab 64] are the largest


@pytest.mark.parametrize("device", ["cuda", "npu"])
def test_device_kernel_matches_the_reference(device: str) -> None:
    """flash-attn varlen (CUDA), npu_fusion_attention TND (NPU) against the reference, bf16
    (tolerance: bf16 rounding of a different summation order)."""
    from mmcore.train.attention import varlen_attention_example
    from mmcore.framework.plugins import Plugins

    registry = Plugins.load().registry
    accelerator = registry.accelerators[device]
    if not accelerator.is_available():
        pytest.skip(f"no {device} device here")
    spec = registry.kernel_spec("varlen_attention", device)
    if spec.device == "reference":
        pytest.skip(f"no {device} implementation usable here (needs {', '.join(registry.kernels[('varlen_attention', device)].requires)})")
    dev = accelerator.device(0)
    args = varlen_attention_example()
    want = varlen_attention(*args)
    got = spec.load()(*(a.to(dev) for a in args))
    torch.testing.assert_close(got.float().cpu(), want.float(), rtol=2e-2, atol=2e-2)


def test_positions_handed_on_under_their_own_name_split_the_row_too() -> None:
    """An attention module whose forward keeps ``position_ids`` (Chameleon's) hands them on as
    ``packed_position_ids``: the packed row is split there exactly as with ``position_ids``."""
    from mmcore.train.attention import packed_attention_forward

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    positions = torch.tensor([[0, 1, 2, 0, 1, 2]])

    class Module:
        is_causal = True

    want, _ = packed_attention_forward(Module(), q, k, v, None, kernel=varlen_attention, position_ids=positions)
    got, _ = packed_attention_forward(Module(), q, k, v, None, kernel=varlen_attention, packed_position_ids=positions)
    whole, _ = packed_attention_forward(Module(), q, k, v, None, kernel=varlen_attention)
    assert torch.equal(got, want) and not torch.allclose(whole, want)
