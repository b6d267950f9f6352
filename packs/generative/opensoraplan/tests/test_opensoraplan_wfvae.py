"""The WF-VAE (Open-Sora Plan v1.5's own video VAE): a folder in the released layout loads
strictly and round-trips, the compression is the released model's (8x in time after the causal
first frame, 8x in space), a tensor that does not fit is one line, and the pack's pipeline,
extract and download take a pipeline folder whose ``vae/`` is a WF-VAE."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from mm_pack_opensoraplan.tiny import build_init_checkpoint, tiny_wfvae
from mm_pack_opensoraplan.wfvae import WFVAEModel
from mm_pack_opensoraplan.wfvae_io import RELEASED_CHECKPOINT, load_wfvae, save_released


@pytest.fixture(scope="module")
def pipe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("osp_wf") / "pipe"
    build_init_checkpoint("tiny-wfvae", out, seed=0)
    return out


def randomised() -> WFVAEModel:
    """The tiny WF-VAE, every trainable tensor moved off its initial value (no norm is the identity)."""
    torch.manual_seed(0)
    vae = tiny_wfvae().eval()
    with torch.no_grad():
        for p in vae.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    return vae


def clip(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(1, 3, frames, 32, 48, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_the_released_layout_loads_strictly_and_round_trips(tmp_path: Path) -> None:
    """config.json + checkpoint.ckpt as the reference's trainer saves it (the whole state dict, or
    the EMA's trainable parameters under data-parallel names, no Haar filters) loads bit for bit;
    save_pretrained's folder loads back bit for bit with the same outputs."""
    vae = randomised()
    want = vae.state_dict()
    save_released(vae, tmp_path / "released")
    save_released(vae, tmp_path / "ema", ema=True)
    assert sorted(p.name for p in (tmp_path / "released").iterdir()) == ["checkpoint.ckpt", "config.json"]
    assert json.loads((tmp_path / "released/config.json").read_text())["_class_name"] == "WFVAEModel"
    saved = torch.load(tmp_path / "ema" / RELEASED_CHECKPOINT, weights_only=True)["ema_state_dict"]
    assert all(k.startswith("module.") for k in saved) and not any("wavelet" in k for k in saved)
    for folder in ("released", "ema"):
        got = load_wfvae(tmp_path / folder).state_dict()
        assert got.keys() == want.keys() and all(torch.equal(got[k], v) for k, v in want.items()), folder
    loaded = WFVAEModel.from_pretrained(tmp_path / "released")
    loaded.save_pretrained(tmp_path / "saved")
    again = WFVAEModel.from_pretrained(tmp_path / "saved")
    assert again.config == loaded.config
    assert all(torch.equal(again.state_dict()[k], v) for k, v in want.items())
    x = clip(9)
    with torch.no_grad():
        z = vae.encode(x).latent_dist.mode()
        assert torch.equal(again.encode(x).latent_dist.mode(), z)
        assert torch.equal(again.decode(z).sample, vae.decode(z).sample)
    assert again.to(torch.bfloat16).dtype == torch.bfloat16


def test_compression_is_the_released_models_and_the_first_frame_causal() -> None:
    """8k + 1 frames of 8h x 8w -> k + 1 latent frames of h x w and back; frame 0 is encoded (and
    decoded) alone: later frames change nothing of it; encoding and decoding in chunks of frames
    give the same latents and frames; latents normalise as the reference's pipeline does, (z - shift) * scale."""
    from mmcore.kits import denormalise_latents, normalise_latents

    vae = randomised()
    x = clip(17)
    later = x.clone()
    later[:, :, 1:] = clip(16, seed=1)
    with torch.no_grad():
        post = vae.encode(x).latent_dist
        z, z_later, z_image = post.mode(), vae.encode(later).latent_dist.mode(), vae.encode(x[:, :, :1]).latent_dist.mode()
        assert z.shape == (1, 8, 3, 4, 6) and z_image.shape == (1, 8, 1, 4, 6)
        assert torch.equal(z_later[:, :, 0], z[:, :, 0]) and not torch.equal(z_later[:, :, 1:], z[:, :, 1:])
        torch.testing.assert_close(z_image[:, :, 0], z[:, :, 0], rtol=1e-5, atol=1e-5)  # the same sums, blocked differently for a shorter clip
        torch.testing.assert_close(post.sample(torch.Generator().manual_seed(3)), post.sample(torch.Generator().manual_seed(3)), rtol=0, atol=0)
        dec, dec_image = vae.decode(z).sample, vae.decode(z[:, :, :1]).sample
        assert dec.shape == (1, 3, 17, 32, 48) and dec_image.shape == (1, 3, 1, 32, 48)
        torch.testing.assert_close(dec_image[:, :, 0], dec[:, :, 0], rtol=1e-5, atol=1e-5)
    scale, shift = torch.tensor(vae.config.scale).view(1, -1, 1, 1, 1), torch.tensor(vae.config.shift).view(1, -1, 1, 1, 1)
    torch.testing.assert_close(normalise_latents(vae, z), (z - shift) * scale, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(denormalise_latents(vae, normalise_latents(vae, z)), z, rtol=1e-6, atol=1e-6)
    # in chunks (tiling): the whole clip's latents and frames, whatever the chunks, the decoder's
    # one-frame look-ahead (time interpolation) held back at a chunk's end
    for chunk, latent_chunk in ((8, 1), (16, 2)):
        vae.enable_tiling(chunk, latent_chunk)
        with torch.no_grad():
            torch.testing.assert_close(vae.encode(x).latent_dist.parameters, post.parameters, rtol=1e-5, atol=1e-5)
            assert torch.equal(vae.encode(x[:, :, :1]).latent_dist.mode(), z_image)
            torch.testing.assert_close(vae.decode(z).sample, dec, rtol=1e-5, atol=1e-5)
    vae.disable_tiling()
    with pytest.raises(ValueError, match="chunk_frames 12 is not a positive multiple of 8"):
        vae.enable_tiling(12)
    with pytest.raises(ValueError, match=r"8k \+ 1 frames"):
        vae.encode(clip(5))
    with pytest.raises(ValueError, match="l1_dowmsample_block 'Downsample' is not ported"):
        WFVAEModel(l1_dowmsample_block="Downsample")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("rename", r"1 missing \(e\.g\. encoder\.conv_out\.conv\.weight\); 1 unexpected \(e\.g\. encoder\.conv_out\.conv\.weights\)"),
        ("reshape", r"1 of another shape \(e\.g\. decoder\.conv_in\.conv\.bias: \[3\], the config needs \[32\]\)"),
    ],
)
def test_a_tensor_that_does_not_fit_is_one_line(tmp_path: Path, edit: str, message: str) -> None:
    vae = randomised()
    save_released(vae, tmp_path)
    path = tmp_path / RELEASED_CHECKPOINT
    saved = torch.load(path, weights_only=True)
    tensors = saved["state_dict"]["gen_model"]
    if edit == "rename":
        tensors["encoder.conv_out.conv.weights"] = tensors.pop("encoder.conv_out.conv.weight")
    else:
        tensors["decoder.conv_in.conv.bias"] = tensors["decoder.conv_in.conv.bias"][:3]
    torch.save(saved, path)
    with pytest.raises(ValueError, match=f"^{path}: the WF-VAE weights do not fit its config.json: {message}$") as err:
        load_wfvae(tmp_path)
    assert "\n" not in str(err.value)


def test_the_pipeline_extract_and_download_take_a_wfvae_folder(osp, pipe_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The pipeline samples through the WF-VAE, extract's latents are its normalised posterior
    mode, a clip of other than 8k + 1 frames is one line; download accepts the folder and
    refuses it, in one line naming the tensor, once a vae/ tensor is misnamed."""
    import numpy as np

    from mmcore import StageError
    from mmcore.kits import normalise_latents

    from mm_pack_opensoraplan.family import Encoders
    from mm_pack_opensoraplan.pipeline import OpenSoraPlanPipeline

    pipe = OpenSoraPlanPipeline.from_pretrained(pipe_dir)
    pipe.set_progress_bar_config(disable=True)
    assert isinstance(pipe.vae, WFVAEModel) and pipe.vae_scales() == (8, 8)
    out = pipe("a red square moves right", height=32, width=32, num_frames=9, num_inference_steps=2, max_sequence_length=16, generator=torch.Generator().manual_seed(0))
    assert out.frames.shape == (1, 9, 32, 32, 3) and np.isfinite(out.frames).all()

    frames = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (9, 32, 32, 3), dtype=np.uint8))
    encoders = Encoders(pipe_dir, 16)
    latents = encoders.latents(frames)
    video = frames.permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
    with torch.no_grad():
        want = normalise_latents(pipe.vae, pipe.vae.encode(video).latent_dist.mode())[0]
    assert encoders.pipe.vae.encode_chunk_frames == 8  # extract encodes in the reference's chunks: the same latents
    assert latents.shape == (8, 2, 4, 4)
    torch.testing.assert_close(latents, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(StageError, match=r"^bucket of 5 frames: the VAE compresses 8x in time after the first frame: frames must be 8k \+ 1 \(data.buckets\)$"):
        encoders.latents(frames[:5])

    assert osp("download", "--pack", "opensoraplan", "--preset", "tiny", "--model", str(pipe_dir), "--run-dir", str(tmp_path / "ok")).returncode == 0
    shutil.copytree(pipe_dir, tmp_path / "bad")
    path = tmp_path / "bad/vae" / RELEASED_CHECKPOINT
    saved = torch.load(path, weights_only=True)
    saved["state_dict"]["gen_model"]["decoder.mid.1.q.conv.wieght"] = saved["state_dict"]["gen_model"].pop("decoder.mid.1.q.conv.weight")
    torch.save(saved, path)
    proc = osp("download", "--pack", "opensoraplan", "--preset", "tiny", "--model", str(tmp_path / "bad"), "--run-dir", str(tmp_path / "bad_run"), check=False)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith("error: ") and str(path) in last and "decoder.mid.1.q.conv.weight" in last, proc.stderr


def test_a_config_the_model_cannot_take_is_one_line_naming_it(tmp_path: Path) -> None:
    save_released(tiny_wfvae(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "scale": [1.0, 1.0, 1.0]}))
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'config.json'}: WF-VAE config: scale \(3\) and shift \(8\) need latent_dim \(8\) values each$"):
        load_wfvae(tmp_path)
