"""The opensoraplan pack's pipeline: training sees the text the pipeline gives its denoiser, the
sampler is the reference's, the released model_ema.pt reads strictly, the demo keeps its promise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mm_pack_opensoraplan.tiny import build_init_checkpoint

CAPTION_SENSITIVITY = 1.5  # the demo's promise (tools/demo_matrix.py PROMISES["opensoraplan"], the README)


def manifest(run: Path, stage: str) -> dict:  # type: ignore[type-arg]
    return json.loads((run / stage / "manifest.json").read_text())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("osp") / "pipe"
    build_init_checkpoint("tiny", out, seed=0)
    return out


def test_the_denoiser_gets_the_text_training_caches_and_the_reference_levels(tiny: Path) -> None:
    """What extract caches for a caption (T5 states, mask, CLIP's pooled vector) is what the
    pipeline hands its transformer; the levels are linspace(1, 0, n + 1) shifted by 7, the
    timesteps 1000 x level, as MindSpeed-MM's OpenSoraPlanScheduler samples."""
    from mm_pack_opensoraplan.family import Encoders, unpack_text
    from mm_pack_opensoraplan.pipeline import OpenSoraPlanPipeline

    cached = Encoders(tiny, 16).text("a red square moves right")
    states, mask, pooled = unpack_text(cached[None], 32)
    assert states.shape == (1, 16, 32) and 0 < int(mask.sum()) < 16

    pipe = OpenSoraPlanPipeline.from_pretrained(tiny)
    pipe.set_progress_bar_config(disable=True)
    seen: list = []  # type: ignore[type-arg]
    pipe.transformer.register_forward_pre_hook(lambda module, args, kwargs: seen.append((args, kwargs)), with_kwargs=True)
    out = pipe("a red square moves right", height=32, width=32, num_frames=5, num_inference_steps=3, guidance_scale=4.0, max_sequence_length=16, generator=torch.Generator().manual_seed(0))
    assert out.frames.shape == (1, 5, 32, 32, 3) and 0 <= out.frames.min() and out.frames.max() <= 1
    (latents, timestep, text, got_pooled), kwargs = seen[0]
    assert latents.shape[0] == 2  # the negative ("") and the prompt
    # the pipeline encodes the negative prompt beside the prompt: a batch of two rounds its last bits otherwise
    torch.testing.assert_close(text[1], states[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got_pooled[1], pooled[0], rtol=0, atol=1e-5)
    assert torch.equal(kwargs["encoder_attention_mask"][1].bool(), mask[0])
    s = np.linspace(1, 0, 4)
    levels = 7 * s / (1 + 6 * s)
    assert [float(a[1][0]) for a, _ in seen] == pytest.approx(list(1000 * levels[:-1]), rel=1e-6)


def test_the_released_model_ema_pt_reads_strictly(tiny: Path, tmp_path: Path) -> None:
    """A model_ema.pt as released (tensors under ema_state_dict, data-parallel ``module.``
    names) and the reference's predictor config (its extra fields dropped) give the same
    transformer; a checkpoint of another config is one line naming what does not fit."""
    from mmcore import StageError

    from mm_pack_opensoraplan.public import import_public
    from mm_pack_opensoraplan.transformer import OpenSoraPlanTransformer3DModel

    model = OpenSoraPlanTransformer3DModel.from_pretrained(tiny / "transformer").eval()
    torch.save({"ema_state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, tmp_path / "model_ema.pt")
    config = {k: v for k, v in model.config.items() if not k.startswith("_")}
    (tmp_path / "predictor.json").write_text(json.dumps({"model_id": "SparseUMMDiT", "dtype": "fp16", **config}))
    imported = import_public(tmp_path / "model_ema.pt", tmp_path / "predictor.json", tmp_path / "transformer")
    again = OpenSoraPlanTransformer3DModel.from_pretrained(tmp_path / "transformer").eval()
    inputs = (torch.randn(1, 16, 2, 4, 4), torch.tensor([300.0]), torch.randn(1, 5, 32), torch.randn(1, 32))
    with torch.no_grad():
        want = model(*inputs, return_dict=False)[0]
        # the imported model keeps torch.load's tensors where they lie (assign=True: no second
        # copy of an 8B model), and kernels over that storage block differently on some CPUs
        # (4.8e-7 of 1.8 on an AMD EPYC): its weights are compared bit for bit, its output to
        # 1e-5; the folder it wrote, loaded as training loads it, gives the output bit for bit
        theirs = imported.state_dict()
        assert theirs.keys() == model.state_dict().keys() and all(torch.equal(theirs[k], v) for k, v in model.state_dict().items())
        torch.testing.assert_close(imported.eval()(*inputs, return_dict=False)[0], want, rtol=0, atol=1e-5)
        assert torch.equal(again(*inputs, return_dict=False)[0], want)
    # and back: the transformer folder as a released-style model_ema.pt, the same names, shapes, dtypes and bits
    from mm_pack_opensoraplan.public import export_public, public_state_dict

    written = export_public(tmp_path / "transformer", tmp_path / "back.pt")
    read = public_state_dict(tmp_path / "back.pt")
    assert set(read) == set(model.state_dict()) and all(torch.equal(read[k], v) and read[k].dtype == v.dtype for k, v in model.state_dict().items())
    assert set(written) == set(read)
    (tmp_path / "predictor.json").write_text(json.dumps({**config, "num_layers": [2, 4, 2]}))
    with pytest.raises(StageError, match=r"model_ema\.pt: the weights do not fit the Open-Sora Plan transformer predictor\.json describes: \d+ missing \(first transformer_blocks\.1\.[23]\.") as err:
        import_public(tmp_path / "model_ema.pt", tmp_path / "predictor.json", tmp_path / "other")
    assert "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.matrix  # the full demo (1500 steps); tools/demo_matrix.py holds its promise over seeds
@pytest.mark.compares_runs
def test_demo_keeps_its_promise(osp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from mmcore.testing import diffusion_demo_holds

    run = diffusion_demo_holds(osp, tmp_path, "opensoraplan", sensitivity=CAPTION_SENSITIVITY, agreement=0.8)
    assert manifest(run, "evaluate")["metrics"]["reconstruction_psnr"] > 17  # the demo VAE trained at init:demo (19.6 dB at seed 0)
    from mm_pack_opensoraplan.tiny import DRAWN_PSNR_FLOOR
    from mmcore.engines import demo_vae_report

    assert demo_vae_report(run / "download/model")["train_drawn_psnr"] >= DRAWN_PSNR_FLOOR  # it draws the shapes in their colours


def test_a_folder_without_the_clip_encoder_is_one_line(osp, tiny: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    shutil.copytree(tiny, tmp_path / "pipe", ignore=lambda folder, names: [n for n in names if n == "text_encoder_2"])
    proc = osp("download", "--pack", "opensoraplan", "--preset", "tiny", "--model", str(tmp_path / "pipe"), check=False)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith("error: ") and "text_encoder_2" in last, proc.stderr
