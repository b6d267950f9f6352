"""The model: the packed row's attention pattern, the two experts' routing, the flow-matching
and text losses, and that training on them learns."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mm_pack_bagel.checkpoint import load_model
from mm_pack_bagel.decoder import block_mask
from mm_pack_bagel.model import loss


def test_block_mask_keeps_samples_apart_and_noise_private() -> None:
    # sample 0: text(3) causal, image(2) full, text(2) causal; sample 1: text(2) causal, noise(3)
    mask = block_mask([7, 5], [3, 2, 2, 2, 3], ["causal", "full", "causal", "causal", "noise"])
    assert mask[0, 0] and not mask[0, 1] and mask[2, 0]  # causal text
    assert mask[3, 4] and mask[4, 3] and not mask[3, 5]  # the image reads itself whole, not what follows
    assert mask[5, 3] and mask[6, 4]  # later text reads the image
    assert not mask[7, :7].any() and not mask[:7, 7:].any()  # samples never meet
    assert mask[9, 7] and mask[9, 11] and mask[11, 9]  # noise reads its caption and itself whole
    assert not mask[8, 9:].any()  # the caption does not read the noise
    with pytest.raises(ValueError, match="'diagonal' is not one of causal, full, noise"):
        block_mask([2], [2], ["diagonal"])
    with pytest.raises(ValueError, match="split_lens add up to 3 but sample_lens to 2"):
        block_mask([2], [3], ["causal"])


def test_noise_split_hides_from_later_splits_of_its_sample() -> None:
    # a clean (full) image after a noised one: it must not read the noised tokens
    mask = block_mask([7], [2, 3, 2], ["causal", "noise", "full"])
    assert not mask[5:, 2:5].any() and mask[5:, :2].all()


def test_understanding_only_rows_leave_the_generation_expert_untouched(tiny_dir: Path, tokenizer, mixed_batch) -> None:  # type: ignore[no-untyped-def]
    model = load_model(tiny_dir).train()
    out = model(mixed_batch(model, tokenizer, generate=False))
    assert out["mse"] is None and out["ce"].numel() > 0
    loss(out).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(g is None or not g.any() for n, g in grads.items() if "moe_gen" in n)
    assert grads["language_model.model.layers.0.self_attn.q_proj.weight"].abs().sum() > 0


def test_both_experts_and_heads_get_gradients_from_a_mixed_row(tiny_dir: Path, tokenizer, mixed_batch) -> None:  # type: ignore[no-untyped-def]
    model = load_model(tiny_dir).train()
    batch = mixed_batch(model, tokenizer)
    loss(model(batch)).backward()
    for name in (
        "language_model.model.layers.1.mlp_moe_gen.up_proj.weight",
        "language_model.model.layers.1.self_attn.q_norm_moe_gen.weight",
        "vae2llm.weight",
        "time_embedder.mlp.0.weight",
        "llm2vae.weight",
        "vit_model.vision_model.embeddings.patch_embedding.weight",
        "connector.fc1.weight",
    ):
        assert model.get_parameter(name).grad.abs().sum() > 0, name
    assert model.latent_pos_embed.pos_embed.grad is None  # the sin-cos tables stay frozen


def test_flow_matching_targets_the_velocity_from_data_to_noise(tiny_dir: Path, tokenizer, mixed_batch) -> None:  # type: ignore[no-untyped-def]
    model = load_model(tiny_dir).train()
    batch = mixed_batch(model, tokenizer)
    clean = model.patchify_latents(batch["padded_latent"], batch["patchified_vae_latent_shapes"])
    noise = torch.randn_like(clean)
    out = model(batch, noise=noise)
    torch.testing.assert_close(out["mse"], (out["velocity"] - (noise - clean)) ** 2)
    t = model.flow_time(torch.tensor([0.0, float("-inf")]))
    assert t.tolist() == [0.5, 0.0]
    model.config.timestep_shift = 3.0
    assert model.flow_time(torch.tensor([0.0])).item() == pytest.approx(0.75)  # 3 * 0.5 / (1 + 2 * 0.5)
    # patchify and unpatchify are inverse
    latent = batch["padded_latent"][0]
    h, w = batch["patchified_vae_latent_shapes"][0]
    assert torch.equal(model.unpatchify_latent(model.patchify_latents([latent], [(h, w)]), h, w), latent)


def test_training_on_a_mixed_row_lowers_both_losses(tiny_dir: Path, tokenizer, mixed_batch) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = load_model(tiny_dir).train()
    batch = mixed_batch(model, tokenizer)
    clean = model.patchify_latents(batch["padded_latent"], batch["patchified_vae_latent_shapes"])
    noise = torch.randn_like(clean)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    first = None
    for _ in range(25):
        out = model(batch, noise=noise)
        parts = (out["ce"].mean().item(), out["mse"].mean().item())
        first = first or parts
        optimizer.zero_grad()
        loss(out).backward()
        optimizer.step()
    assert parts[0] < 0.5 * first[0] and parts[1] < 0.8 * first[1], (first, parts)
