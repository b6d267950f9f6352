"""The model's own parts against independent statements of the released behaviour: the
projector's 2 x 2 cell concatenation in ``F.unfold``'s order (channel-major, what the released
weights were trained on), and the image's token layout (global rows with newlines, the
separator, all tiles' rows across with newlines)."""

from __future__ import annotations

from pathlib import Path

import torch

from mm_pack_deepseek_vl2.model import DeepseekVL2ForCausalLM, DownsampleProjector


def test_projector_cells_are_unfolds_order_with_the_odd_grid_padded() -> None:
    torch.manual_seed(0)
    projector = DownsampleProjector({"input_dim": 6, "n_embed": 8, "depth": 2, "mlp_ratio": 1, "downsample_ratio": 2}, 6)
    features = torch.randn(3, 25, 6)  # a 5 x 5 grid, as the released 27 x 27 is odd
    grid = torch.nn.functional.pad(features.reshape(3, 5, 5, 6), (0, 0, 0, 1, 0, 1)).permute(0, 3, 1, 2)
    cells = torch.nn.functional.unfold(grid, kernel_size=2, stride=2).permute(0, 2, 1)  # [views, 9, 6 * 4]
    assert torch.allclose(projector(features), projector.layers(cells), atol=0, rtol=0)


def test_image_tokens_are_laid_out_as_the_released_model_lays_them(tiny_dir: Path) -> None:
    """Views tagged by (view, row, column): a 3 x 2 grid of tiles (3 across, 2 down), 3 x 3 tokens a view."""
    model = DeepseekVL2ForCausalLM.from_pretrained(tiny_dir)
    side, across, down = 3, 3, 2
    views = 1 + across * down
    tags = torch.tensor([[[v, r, c] for r in range(side) for c in range(side)] for v in range(views)], dtype=torch.float32)
    width = model.image_newline.shape[0]
    model.vision = torch.nn.Identity()
    model.vision.forward = lambda pixels: type("Out", (), {"last_hidden_state": pixels})()  # type: ignore[method-assign]
    model.projector = torch.nn.Identity()
    with torch.no_grad():
        model.image_newline.fill_(-1)
        model.view_seperator.fill_(-2)
        out = model.image_features(torch.nn.functional.pad(tags, (0, width - 3)), torch.tensor([[across, down]]))[:, :3].tolist()
    newline, sep = [-1.0] * 3, [-2.0] * 3
    want = [row for r in range(side) for row in ([[0, r, c] for c in range(side)] + [newline])] + [sep]
    for tile_row in range(down):
        for r in range(side):
            want += [[1 + tile_row * across + t, r, c] for t in range(across) for c in range(side)] + [newline]
    assert out == want and len(out) == side * (side + 1) + 1 + down * side * (across * side + 1)


def test_generate_with_a_cache_answers_as_full_forwards_do(tiny_dir: Path, tmp_path: Path) -> None:
    """``generate()`` (images at the prefill only, then the KV cache) picks the tokens greedy full
    forwards pick, for the decoder without MLA and with it."""
    from transformers import AutoTokenizer

    from mmcore.data import Sample, Turn
    from mmcore.testing.media import write_noise
    from mmcore.testing.packing import encoded
    from mm_pack_deepseek_vl2.family import DeepseekVL2Config, encoder
    from mm_pack_deepseek_vl2.tiny import build_init_checkpoint

    class Ctx:
        config = DeepseekVL2Config()

    build_init_checkpoint("tiny-mla", tmp_path / "mla", seed=1)
    write_noise(tmp_path / "a.png", (70, 40), 0)
    for folder in (tiny_dir, tmp_path / "mla"):
        tokenizer = AutoTokenizer.from_pretrained(folder)
        (row,) = encoded(encoder(Ctx(), folder, tokenizer), [Sample("x", 0, [Turn("user", "<image>What colour?")], {"images": [tmp_path / "a.png"]})])
        model = DeepseekVL2ForCausalLM.from_pretrained(folder)
        media = {"pixel_values": row["pixel_values"], "images_spatial_crop": row["images_spatial_crop"].long()}
        ids = row["input_ids"][None]
        with torch.no_grad():
            got = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **media, max_new_tokens=5, do_sample=False, eos_token_id=[], pad_token_id=0)[0, ids.shape[1] :]
            want = ids
            for _ in range(5):
                want = torch.cat([want, model(input_ids=want, **media).logits[:, -1:].argmax(-1)], dim=1)
        assert got.tolist() == want[0, ids.shape[1] :].tolist(), folder


def test_the_released_tiny_geometry_has_the_published_size() -> None:
    """deepseek-vl2-tiny's config (SigLIP-SO400M, 12-layer MoE of 64 experts, no MLA), built on
    the meta device: 3.355B parameters, plus SigLIP's unused attention-pool head (15.3M, left
    out) the published 3.37B."""
    from mm_pack_deepseek_vl2.model import DeepseekVL2Config

    language = dict(
        vocab_size=129280,
        hidden_size=1280,
        intermediate_size=6848,
        moe_intermediate_size=896,
        num_hidden_layers=12,
        num_attention_heads=10,
        num_key_value_heads=10,
        n_routed_experts=64,
        n_shared_experts=2,
        num_experts_per_tok=6,
        first_k_dense_replace=1,
        use_mla=False,
    )
    vision = {"image_size": 384, "patch_size": 14, "width": 1152, "layers": 27, "heads": 16, "mlp_ratio": 3.7362}
    config = DeepseekVL2Config(vision_config=vision, projector_config={"input_dim": 1152, "n_embed": 1280}, language_config=language)
    with torch.device("meta"):
        model = DeepseekVL2ForCausalLM(config)
    width, mlp = 1152, int(1152 * 3.7362)
    head = width + 4 * width * width + 4 * width + 2 * width + 2 * width * mlp + mlp + width  # probe, attention, norm, MLP
    assert round((sum(p.numel() for p in model.parameters()) + head) / 1e9, 2) == 3.37


def test_what_the_model_cannot_do_is_refused_in_one_line(tiny_dir: Path) -> None:
    import pytest

    from mm_pack_deepseek_vl2.model import DeepseekVL2Config

    with pytest.raises(ValueError, match="tile_tag '1D'"):
        DeepseekVL2Config(tile_tag="1D")
    model = DeepseekVL2ForCausalLM.from_pretrained(tiny_dir)
    ids = torch.full((1, 10), model.config.image_token_id)
    with pytest.raises(ValueError, match=r"10 <image> tokens in input_ids, but the images make 25 features"):
        model(input_ids=ids, pixel_values=torch.zeros(2, 3, 35, 35), images_spatial_crop=torch.tensor([[1, 1]]))
