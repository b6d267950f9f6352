"""The diffusion kit's named latents (a clip's video and audio denoised together, LTX-2): the
objective, the loss's draws and the batches treat a dict of latents per name, and a single
tensor exactly as before."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mmcore.kits.diffusion.batches import collate
from mmcore.kits.diffusion.objectives import FlowMatching, diffusion_loss

CFG = SimpleNamespace(caption_dropout=0.0, flow_shift=1.0, timestep_sampling="uniform")


def halve(model, noisy, levels, text):  # type: ignore[no-untyped-def]
    """A stand-in denoiser: half of each noisy latent."""
    return {k: v / 2 for k, v in noisy.items()} if isinstance(noisy, dict) else noisy / 2


def test_named_errors_are_per_name_means_summed_with_their_weights() -> None:
    g = torch.Generator().manual_seed(0)
    video, audio = torch.randn(2, 4, 3, 4, 4, generator=g), torch.randn(2, 4, 7, 4, generator=g)
    noise = {"video": torch.randn(video.shape, generator=g), "audio": torch.randn(audio.shape, generator=g)}
    levels, text = torch.tensor([0.3, 0.7]), torch.zeros(2, 5, 8)
    alone = {name: FlowMatching().errors(halve, None, x, noise[name], levels, text) for name, x in (("video", video), ("audio", audio))}
    joint = FlowMatching(weights={"audio": 2.0}).errors(halve, None, {"video": video, "audio": audio}, noise, levels, text)
    assert torch.allclose(joint, alone["video"] + 2.0 * alone["audio"]) and joint.shape == (2,)


def test_seeded_draws_do_not_depend_on_the_batch_and_a_tensor_is_unchanged() -> None:
    g = torch.Generator().manual_seed(1)
    latents = {"video": torch.randn(3, 4, 3, 4, 4, generator=g), "audio": torch.randn(3, 4, 7, 4, generator=g)}
    text, empty = torch.zeros(3, 5, 8), torch.zeros(5, 8)
    whole = diffusion_loss(FlowMatching(), halve, None, latents, text, empty, CFG, seeds=[5, 6, 7])
    parts = sum(diffusion_loss(FlowMatching(), halve, None, {k: v[i : i + 1] for k, v in latents.items()}, text[:1], empty, CFG, seeds=[s]) for i, s in enumerate([5, 6, 7]))
    assert torch.allclose(whole, parts)
    # one tensor: the draws and the error as the kit always made them
    x = latents["video"]
    generators = [torch.Generator().manual_seed(s) for s in (5, 6, 7)]
    drop = [torch.rand(1, generator=gen) for gen in generators]  # noqa: F841 - the caption-dropout draw comes first
    levels = torch.cat([FlowMatching().draw(1, CFG, gen) for gen in generators])
    noise = torch.stack([torch.randn(x.shape[1:], generator=gen) for gen in generators])
    s = levels.view(-1, 1, 1, 1, 1)
    expected = ((((1 - s) * x + s * noise) / 2 - (noise - x)) ** 2).mean(dim=(1, 2, 3, 4)).sum()
    assert torch.equal(diffusion_loss(FlowMatching(), halve, None, x, text, empty, CFG, seeds=[5, 6, 7]), expected)


def test_cached_named_latents_collate_into_a_dict_per_name() -> None:
    samples = [
        {"latents.video": torch.full((4, 3, 4, 4), float(i)), "latents.audio": torch.full((4, 7, 4), float(i)), "frames": torch.zeros(9, 32, 32, 3), "text": torch.zeros(5, 8)} for i in range(2)
    ]
    batch = collate(samples)
    assert set(batch) == {"num_loss_tokens", "latents", "text"} and batch["num_loss_tokens"] == 2
    assert batch["latents"]["video"].shape == (2, 4, 3, 4, 4) and batch["latents"]["audio"][1].eq(1).all()
