"""Step-Video's Video-VAE: a folder in the released layout loads strictly and round-trips, the
compression and the 17-frame groups are the reference's, a tensor or config that does not fit is
one line, and the pack's pipeline, extract and download take a pipeline folder whose ``vae/`` is
Step-Video's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mm_pack_stepvideo.stepvae import StepVideoVAE
from mm_pack_stepvideo.stepvae_blocks import CausalConv3d
from mm_pack_stepvideo.stepvae_io import RELEASED, check_stepvae_folder, folder_config, load_stepvae, save_released
from mm_pack_stepvideo.tiny import build_init_checkpoint, tiny_stepvae


@pytest.fixture(scope="module")
def pipe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stepvae") / "pipe"
    build_init_checkpoint("tiny-stepvae", out, seed=0)
    return out


def randomised() -> StepVideoVAE:
    """The tiny VAE, every tensor moved off its initial value (no norm is the identity)."""
    torch.manual_seed(0)
    vae = tiny_stepvae().eval()
    with torch.no_grad():
        for p in vae.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return vae


def clip(frames: int, seed: int = 0, side: int = 32) -> torch.Tensor:
    return torch.rand(1, 3, frames, side, side, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_the_released_layout_loads_strictly_and_round_trips(tmp_path: Path) -> None:
    """vae_v2.safetensors under the release's names (decoder.conv_out.weight, no inner conv) loads
    bit for bit; save_pretrained's folder loads back bit for bit with the same outputs; a folder
    with no config.json is the reference's released sizes (version 2, 64 channels)."""
    vae = randomised()
    want = vae.state_dict()
    save_released(vae, tmp_path / "released")
    assert sorted(p.name for p in (tmp_path / "released").iterdir()) == ["config.json", RELEASED[2]]
    names = set(load_file(tmp_path / "released" / RELEASED[2]))
    assert {"decoder.conv_out.weight", "encoder.conv_out.conv.weight", "decoder.up.2.upsample.conv3d.conv1.conv.weight", "encoder.conv_patchify.conv.conv.weight"} <= names
    got = load_stepvae(tmp_path / "released").state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], v) for k, v in want.items())
    loaded = StepVideoVAE.from_pretrained(tmp_path / "released")
    loaded.save_pretrained(tmp_path / "saved")
    again = StepVideoVAE.from_pretrained(tmp_path / "saved")
    assert again.config == loaded.config and all(torch.equal(again.state_dict()[k], v) for k, v in want.items())
    x = clip(17)
    with torch.no_grad():
        z = vae.encode(x).latent_dist.mode()
        assert torch.equal(again.encode(x).latent_dist.mode(), z)
        assert torch.equal(again.decode(z).sample, vae.decode(z).sample)

    (tmp_path / "released/config.json").unlink()  # the release's folder has none
    assert folder_config(tmp_path / "released") == {"version": 2, "z_channels": 64}
    with pytest.raises(
        ValueError,
        match=rf"^{tmp_path / 'released' / RELEASED[2]}: the weights do not fit the Step-Video VAE its config describes: .*of another shape \(first decoder\.conv_in\.conv\.bias: \(256,\) in the checkpoint, \(2048,\) in",
    ):
        check_stepvae_folder(tmp_path / "released")


def test_compression_and_groups_are_the_references() -> None:
    """17k frames of 16h x 16w -> 3k latent frames of h x w and back; each group of 17 frames is
    encoded alone (a later group changes nothing of an earlier one's latents), each group of 3
    latent frames decoded alone, then the frames either side of a boundary blended 0.6 / 0.4 as the
    reference's ``mix``; a large convolution in slices of frames gives the same values; the
    latents' scaling is the reference pipeline's (scale_factor)."""
    from mmcore.kits import denormalise_latents, normalise_latents

    vae = randomised()
    assert (vae.temporal_compression_ratio, vae.spatial_compression_ratio, vae.latent_len, vae.latent_frames(34)) == (8, 16, 3, 6)
    x = clip(34)
    with torch.no_grad():
        post = vae.encode(x).latent_dist
        z = post.mode()
        assert z.shape == (1, 8, 6, 2, 2)
        assert torch.equal(vae.encode(x[:, :, :17]).latent_dist.mode(), z[:, :, :3])
        assert torch.equal(vae.encode(x[:, :, 17:]).latent_dist.mode(), z[:, :, 3:])
        whole = vae.encoder(x)  # one pass over both groups, which the reference never makes: not even its shape
        assert whole.shape[2] == 5
        dec = vae.decode(z).sample
        first, second = vae.decoder(z[:, :, :3]), vae.decoder(z[:, :, 3:])
        assert dec.shape == (1, 3, 34, 32, 32) and first.shape[2] == 17
        torch.testing.assert_close(dec[:, :, :16], first[:, :, :16], rtol=0, atol=0)
        torch.testing.assert_close(dec[:, :, 18:], second[:, :, 1:], rtol=0, atol=0)
        back = second[:, :, 0] * 0.6 + first[:, :, 16] * 0.4
        torch.testing.assert_close(dec[:, :, 17], back, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(dec[:, :, 16], first[:, :, 16] * 0.6 + back * 0.4, rtol=1e-6, atol=1e-6)
        CausalConv3d.SPLIT_NUMEL = 1
        try:
            torch.testing.assert_close(vae.decode(z).sample, dec, rtol=1e-5, atol=1e-5)
        finally:
            CausalConv3d.SPLIT_NUMEL = 2**30
    vae.register_to_config(scaling_factor=0.5)
    torch.testing.assert_close(normalise_latents(vae, z), z * 0.5)
    torch.testing.assert_close(denormalise_latents(vae, normalise_latents(vae, z)), z)
    with pytest.raises(ValueError, match=r"^Step-Video VAE encode: a clip \[B, 3, a multiple of 17 frames, H, W\] with H, W multiples of 16, got \[1, 3, 16, 32, 32\]$"):
        vae.encode(clip(16))
    with pytest.raises(ValueError, match=r"a multiple of 3 frames"):
        vae.decode(z[:, :, :4])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("rename", r"1 missing \(first decoder\.conv_out\.weight\), 1 unexpected \(first decoder\.conv_out\.conv\.weight\)"),
        ("reshape", r"1 of another shape \(first decoder\.conv_in\.conv\.bias: \(3,\) in the checkpoint, \(256,\) in the Step-Video VAE its config describes\)"),
    ],
)
def test_a_tensor_that_does_not_fit_is_one_line(tmp_path: Path, edit: str, message: str) -> None:
    save_released(randomised(), tmp_path)
    path = tmp_path / RELEASED[2]
    tensors = load_file(path)
    if edit == "rename":  # the name the reference's module has, not its file
        tensors["decoder.conv_out.conv.weight"] = tensors.pop("decoder.conv_out.weight")
    else:
        tensors["decoder.conv_in.conv.bias"] = tensors["decoder.conv_in.conv.bias"][:3].clone()
    save_file(tensors, path)
    for load in (load_stepvae, check_stepvae_folder):
        with pytest.raises(ValueError, match=f"^{path}: the weights do not fit the Step-Video VAE its config describes: {message}$") as err:
            load(tmp_path)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [("version", 3), ("encoder_ch", 48), ("z_channels", 48)],
)
def test_a_config_the_model_cannot_take_is_one_line_naming_it(tmp_path: Path, field: str, value: object) -> None:
    save_released(tiny_stepvae(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'config.json'}: Step-Video VAE config: {field} .* does not build the reference's model"):
        load_stepvae(tmp_path)


def test_the_pipeline_extract_and_download_take_a_stepvae_folder(stepvideo, pipe_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The pipeline samples through Step-Video's VAE (3 latent frames per 17), extract's latents
    are its normalised posterior mode, a clip of other than 17k frames is one line; download
    accepts the folder and refuses it, in one line naming the tensor, once a vae/ tensor is misnamed."""
    import numpy as np

    from mmcore import StageError
    from mmcore.kits import normalise_latents

    from mm_pack_stepvideo.family import Encoders
    from mm_pack_stepvideo.pipeline import StepVideoPipeline

    assert sorted(p.name for p in (pipe_dir / "vae").iterdir()) == ["config.json", RELEASED[2]]
    pipe = StepVideoPipeline.from_pretrained(pipe_dir)
    pipe.set_progress_bar_config(disable=True)
    assert isinstance(pipe.vae, StepVideoVAE) and pipe.vae_scales() == (8, 16)
    out = pipe("a red square moves right", height=32, width=32, num_frames=34, num_inference_steps=2, max_sequence_length=16, generator=torch.Generator().manual_seed(0), output_type="latent")
    assert out.frames.shape == (1, 8, 6, 2, 2)
    out = pipe("a red square moves right", height=32, width=32, num_frames=17, num_inference_steps=2, max_sequence_length=16, generator=torch.Generator().manual_seed(0))
    assert out.frames.shape == (1, 17, 32, 32, 3) and np.isfinite(out.frames).all()

    frames = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (17, 32, 32, 3), dtype=np.uint8))
    encoders = Encoders(pipe_dir, 16)
    latents = encoders.latents(frames)
    video = frames.permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
    with torch.no_grad():
        want = normalise_latents(pipe.vae, pipe.vae.encode(video).latent_dist.mode())[0]
    assert latents.shape == (8, 3, 2, 2)
    torch.testing.assert_close(latents, want, rtol=0, atol=0)
    with pytest.raises(StageError, match=r"^bucket of 9 frames: Step-Video's VAE encodes groups of 17 frames: frames must be a multiple of 17 \(data.buckets\)$"):
        encoders.latents(frames[:9])

    assert stepvideo("download", "--pack", "stepvideo", "--preset", "tiny", "--model", str(pipe_dir), "--run-dir", str(tmp_path / "ok")).returncode == 0
    shutil.copytree(pipe_dir, tmp_path / "bad")
    path = tmp_path / "bad/vae" / RELEASED[2]
    tensors = load_file(path)
    tensors["decoder.mid.attn_1.q.conv.wieght"] = tensors.pop("decoder.mid.attn_1.q.conv.weight")
    save_file(tensors, path)
    proc = stepvideo("download", "--pack", "stepvideo", "--preset", "tiny", "--model", str(tmp_path / "bad"), "--run-dir", str(tmp_path / "bad_run"), check=False)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith("error: ") and str(path) in last and "decoder.mid.attn_1.q.conv.weight" in last, proc.stderr
