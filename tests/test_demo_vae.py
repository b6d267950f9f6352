"""mmcore.engines.train_demo_vae: a small diffusers VAE learns to reconstruct demo frames, seeded
(the same VAE twice on one machine), and its pipeline's latent normalisation comes from its
latents."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


def small_vae(seed: int):  # type: ignore[no-untyped-def]
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        shift_factor=0.0,
        scaling_factor=1.0,
    )


def test_demo_vae_learns_is_seeded_and_sets_the_normalisation(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from mmcore.data import moving_shape_clips
    from mmcore.engines import demo_vae_report, train_demo_vae, write_demo_vae_report

    clips, held = [c[:1] for c in moving_shape_clips(16, 0)], [c[:1] for c in moving_shape_clips(4, 1)]
    untrained = train_demo_vae(small_vae(0), clips, held, steps=1)
    vae = small_vae(0)
    measured = train_demo_vae(vae, clips, held, steps=40, batch=4)
    again = small_vae(0)
    assert train_demo_vae(again, clips, held, steps=40, batch=4)["reconstruction_psnr"] == measured["reconstruction_psnr"]
    assert all(torch.equal(a, b) for a, b in zip(vae.state_dict().values(), again.state_dict().values()))
    assert measured["reconstruction_psnr"] > untrained["reconstruction_psnr"] + 3, (untrained, measured)
    assert vae.config.shift_factor == pytest.approx(measured["latents_mean"], abs=1e-4)
    assert vae.config.scaling_factor == pytest.approx(1 / measured["latents_std"], rel=1e-3)
    write_demo_vae_report(tmp_path, measured)
    assert demo_vae_report(tmp_path) == measured and demo_vae_report(tmp_path / "none") is None


def test_a_vae_with_statistics_buffers_is_normalised_there() -> None:
    """LTX-Video's and LTX-2's video VAEs keep ``latents_mean``/``latents_std`` as buffers (saved
    with their weights) and the pipelines read them there: the demo VAE's normalisation is
    written into them, ``scaling_factor`` left as it is, and the kit's latents come out
    normalised by them."""
    from diffusers import AutoencoderKLLTXVideo

    from mmcore.engines import set_latent_normalisation
    from mmcore.kits import normalise_latents

    torch.manual_seed(0)
    vae = AutoencoderKLLTXVideo(latent_channels=4, block_out_channels=(8, 8), decoder_block_out_channels=(8, 8), layers_per_block=(1, 1, 1), decoder_layers_per_block=(1, 1, 1),
                                spatio_temporal_scaling=(True, False), decoder_spatio_temporal_scaling=(True, False), patch_size=2)  # fmt: skip
    mean, std = torch.tensor([0.5, -1.0, 2.0, 0.0]), torch.tensor([2.0, 0.5, 1.0, 4.0])
    set_latent_normalisation(vae, mean, std, 0.3, 1.7)
    assert torch.equal(vae.latents_mean, mean) and torch.equal(vae.latents_std, std) and vae.config.scaling_factor == 1.0
    z = torch.randn(1, 4, 2, 3, 3)
    assert torch.allclose(normalise_latents(vae, z), (z - mean.view(1, -1, 1, 1, 1)) / std.view(1, -1, 1, 1, 1))


def test_a_demo_vae_below_its_floor_is_fitted_afresh() -> None:
    """``train_demo_vae_until`` keeps the first fit that reaches the drawn-pixel floor and fits a
    fresh VAE (``make_vae(k)``, batches from ``seed + 1000 k``) while none does, ``tries`` at most;
    where none reaches it, the fit nearest it."""
    from mmcore.data import moving_shape_clips
    from mmcore.engines import train_demo_vae, train_demo_vae_until

    clips, held = [c[:1] for c in moving_shape_clips(8, 0)], [c[:1] for c in moving_shape_clips(2, 1)]
    made: list[int] = []

    def make_vae(attempt: int):  # type: ignore[no-untyped-def]
        made.append(attempt)
        return small_vae(attempt)

    vae, measured = train_demo_vae_until(make_vae, clips, held, drawn_psnr_floor=-100.0, steps=2, batch=4, seed=5)
    assert made == [0] and measured["tries"] == 1 and "drawn_psnr" in measured
    alone = train_demo_vae(small_vae(0), clips, held, steps=2, batch=4, seed=5)
    assert {k: measured[k] for k in alone if k != "seconds"} == {k: alone[k] for k in alone if k != "seconds"}
    made.clear()
    vae, measured = train_demo_vae_until(make_vae, clips, held, drawn_psnr_floor=100.0, tries=3, steps=2, batch=4, seed=5)
    assert made == [0, 1, 2] and measured["tries"] == 3 and measured["drawn_psnr_floor"] == 100.0
    # none reaches the floor: the fit nearest it is kept (fit k: make_vae(k), batches from seed + 1000 k)
    fits = [small_vae(k) for k in range(3)]
    psnrs = [train_demo_vae(fit, clips, held, steps=2, batch=4, seed=5 + 1000 * k)["train_drawn_psnr"] for k, fit in enumerate(fits)]
    best = max(range(3), key=lambda k: psnrs[k])
    assert measured["kept"] == best + 1 and measured["train_drawn_psnr"] == psnrs[best]
    assert all(torch.equal(a, b) for a, b in zip(vae.state_dict().values(), fits[best].state_dict().values()))
