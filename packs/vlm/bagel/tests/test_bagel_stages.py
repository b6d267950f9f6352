"""The pack's own paths through its stages: text -> picture samples train the flow-matching
heads, ``mmcore infer`` draws a PNG by Euler sampling and answers in text, the mixed kinds
cross two processes as one, and bad data is one line per sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmcore.testing import train_losses
from mmcore.testing.media import write_captioned_pictures as write_pictures


def test_pictures_train_the_flow_heads_and_infer_draws_and_answers(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """(That the flow-matching loss falls is test_bagel_model's, on fixed noise: with fresh noise
    and times every step the tiny model needs far more steps than a test affords.)"""
    from safetensors.torch import load_file

    data = write_pictures(tmp_path / "data")
    from mmcore.framework.plugins import Plugins
    from mmcore.testing import make_runner

    make_runner(
        Plugins.load(),
        "bagel",
        tmp_path / "r",
        preset="tiny",
        overrides=[f"data.datasets=[{data}]", f"data.eval_datasets=[{data}]", "training.micro_batch_size=4", "training.steps=3", "evaluate.limit=2", "generation.num_inference_steps=3"],
    ).run_pipeline()
    losses = list(train_losses(tmp_path / "r").values())
    assert len(losses) == 3 and 1.0 < losses[0] < 4.0, losses  # velocity MSE alone: noise minus latent, about 2 per element
    before, after = load_file(str(tmp_path / "r/download/model/ema.safetensors")), load_file(str(tmp_path / "r/export/bagel/ema.safetensors"))
    for name in ("llm2vae.weight", "vae2llm.weight", "time_embedder.mlp.0.weight", "language_model.model.layers.0.mlp_moe_gen.up_proj.weight"):
        assert not torch.equal(before[name], after[name]), name  # the pictures trained the generation side
    assert torch.equal(
        before["vit_model.vision_model.embeddings.patch_embedding.weight"], after["vit_model.vision_model.embeddings.patch_embedding.weight"]
    )  # no image questions: the tower got zero gradients
    from mmcore.testing import stage_manifest

    evaluate = stage_manifest(tmp_path / "r", "evaluate")["metrics"]
    # every held-out caption ("a red square") is a demo caption: each drawn picture judged, a random VAE's PSNR not claimed
    assert evaluate["pictures"] == 2 and evaluate["agreement_checked"] == evaluate["pictures"] and "reconstruction_psnr" not in evaluate, evaluate
    out = mm("infer", "--run-dir", "r", "--prompt", "a red square", "generation.output=image", "generation.num_inference_steps=4")
    path = Path(out.stdout.strip().removeprefix("image: "))
    assert path.suffix == ".png" and Image.open(path).size == (32, 32) and Image.open(path).mode == "RGB", out.stdout


def test_preprocess_reads_the_three_kinds_and_rejects_bad_input_one_line_each(tmp_path: Path) -> None:
    from mmcore.data import ShardDataset
    from mmcore.errors import StageError
    from mmcore.framework.plugins import Plugins
    from mmcore.testing import make_runner

    from mm_pack_bagel.data import items_of

    (tmp_path / "d").mkdir()
    Image.new("RGB", (40, 40), (200, 30, 30)).save(tmp_path / "d/red.png")
    records = [
        {"messages": [{"role": "user", "content": "<image>What colour?"}, {"role": "assistant", "content": "red"}], "images": ["red.png"]},
        {"messages": [{"role": "user", "content": "Say red."}, {"role": "assistant", "content": "red"}]},
        {"messages": [{"role": "user", "content": "a red square"}, {"role": "assistant", "content": "<image>"}], "images": ["red.png"]},
        {"messages": [{"role": "user", "content": "<image><image>two?"}, {"role": "assistant", "content": "no"}], "images": ["red.png"]},
        {"messages": [{"role": "user", "content": "<image>draw it again"}, {"role": "assistant", "content": "<image>"}], "images": ["red.png", "red.png"]},
    ]
    (tmp_path / "d/data.json").write_text(json.dumps(records))
    settings = [f"data.datasets=[{tmp_path / 'd/data.json'}]", "data.on_bad_sample=skip"]
    runner = make_runner(Plugins.load(), "bagel", tmp_path / "r", preset="tiny", overrides=settings)
    for stage in ("download", "convert", "preprocess"):
        runner.run_stage(stage)
    bad = [json.loads(line) for line in (tmp_path / "r/preprocess/bad_samples.jsonl").read_text().splitlines()]
    assert [b["index"] for b in bad] == [3, 4] and "placeholder" in bad[0]["reason"] and "one picture" in bad[1]["reason"], bad
    data = ShardDataset(tmp_path / "r/preprocess/dataset")
    ids = {k: int(v) for k, v in data.index["tokens"].items()}
    kinds = [[item["type"] for item in items_of(data[i], ids)] for i in range(len(data))]
    assert kinds == [["vit", "text", "text"], ["text", "text"], ["text", "vae"]]
    picture = data[2]
    assert picture["latent_mean"].shape == (1, 4, 16, 16) and (picture["latent_std"] > 0).all()
    # stored normalised as the reference feeds latents, (z - shift) * scale: the space the sampler decodes from
    from mm_pack_bagel.data import pixels
    from mm_pack_bagel.vae import SCALE, SHIFT, load_vae

    with torch.no_grad():
        posterior = load_vae(tmp_path / "r/download/model/ae.safetensors").encode(pixels(tmp_path / "d/red.png", 32)[None]).latent_dist
    torch.testing.assert_close(picture["latent_mean"], (posterior.mean - SHIFT) * SCALE)
    torch.testing.assert_close(picture["latent_std"], posterior.std * SCALE)
    assert [item["loss"] for item in items_of(data[0], ids) if item["type"] == "text"] == [False, True]
    # image sizes that do not fit the model: one line
    wrong = make_runner(Plugins.load(), "bagel", tmp_path / "r", preset="tiny", overrides=[*settings, "data.vae_image_size=30"])
    with pytest.raises(StageError) as err:
        wrong.run_stage("preprocess", force=True)
    assert "data.vae_image_size=30 is not a multiple of 4" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.matrix  # two processes: make test-matrix
@pytest.mark.compares_runs
def test_pictures_questions_and_text_mixed_across_two_processes_train_as_one(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Ranks whose micro-batches differ in kind (a picture to generate, an image question, text)
    still call the same modules (``Bagel.untouched_parts``) and train to the one-process losses."""
    from mmcore.testing.media import write_mixed_mllm

    data = write_mixed_mllm(tmp_path / "data", ("image",))
    write_pictures(tmp_path / "data")
    records = json.loads(data.read_text()) + json.loads((tmp_path / "data/pictures.json").read_text())[:5]
    data.write_text(json.dumps(records))
    common = ("--preset", "tiny", f"data.datasets=[{data}]", "data.demo_samples=0", "training.steps=4", "training.balance_towers=false", "training.eval_every=0")
    mm("run", "--pack", "bagel", *common, "training.micro_batch_size=2", "--run-dir", "one")
    mm("run", "--pack", "bagel", *common, "training.micro_batch_size=1", "--nproc-per-node", "2", "--run-dir", "two")
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert list(one) == list(two) == [1, 2, 3, 4] and all(abs(two[s] - one[s]) <= 1e-4 * abs(one[s]) for s in one), (one, two)


def test_euler_sampling_follows_a_known_velocity_field(tiny_dir: Path) -> None:
    """With ``llm2vae`` zeroed except its bias, the predicted velocity is the constant bias, so
    Euler's steps from t = 1 to 0 move the noise by exactly bias * 1 (the times' sum)."""
    from mm_pack_bagel.checkpoint import load_model
    from mm_pack_bagel.generation import picture
    from mm_pack_bagel.tiny import build_tokenizer, token_ids

    model = load_model(tiny_dir).eval()
    with torch.no_grad():
        model.llm2vae.weight.zero_()
        model.llm2vae.bias.copy_(torch.linspace(-1, 1, model.llm2vae.bias.numel()))
    ids = token_ids(build_tokenizer())
    drawn = picture(model, [], ids, size=16, steps=5, generator=torch.Generator().manual_seed(0))
    noise = torch.randn(16, model.config.patch_latent_dim, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(drawn, model.unpatchify_latent(noise - model.llm2vae.bias, 4, 4))


@pytest.mark.slow
@pytest.mark.matrix  # about a minute; tools/demo_matrix.py holds the promise over seeds and ISAs
@pytest.mark.compares_runs
def test_demo_answers_about_pictures_and_draws_their_colour(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from mmcore.testing import stage_manifest as manifest

    mm("run", "--pack", "bagel", "--preset", "demo", "--run-dir", "demo")
    evaluate = manifest(tmp_path / "demo", "evaluate")["metrics"]
    # four colours: chance 0.25 on both sides (colour and shape: 1/12); the README's promise, as tools/demo_matrix.py measured it
    assert evaluate["image_answers"] >= 20 and evaluate["image_accuracy"] == 1.0, evaluate
    assert evaluate["agreement_checked"] >= 20 and evaluate["colour_agreement"] >= 0.8 and evaluate["caption_agreement"] >= 0.4, evaluate
    assert evaluate["reconstruction_psnr"] > 18, evaluate
