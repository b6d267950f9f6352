"""The generative rules of SDK 1.19 and 1.20 fail the breaks they exist for, each in one line naming
its rule: a denoiser that ignores its caption (conditioning) or its first frame (conditions), a pipeline folder whose
``model_index.json`` names no diffusers pipeline (export), noise drawn from torch's global RNG
(global rng). Each broken pack is the wan pack with one thing changed, pip-installed as its own
distribution; the suite's shared run and rules are called as a pack's conformance class calls
them: in make test four tiny runs (wan's through export ~20 s, wan-i2v's of one step ~7 s, two cut
short at their break ~3 s each) and the install (~9 s), ~40 s in all on a 2-core machine; the
two-process case (~30 s) in the matrix."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from mmcore_helpers import pip_install_target, write_pack_project

pytest.importorskip("mm_pack_wan", reason="the broken packs borrow the wan pack's parts")

SPEC = """
import dataclasses

from mmcore import Stage
from mm_pack_wan.pack import {base} as wan

TINY = {{
    "model": {{"source": "init:tiny"}},
    "data": {{"buckets": [[32, 32, 5]], "fps": 8, "max_sequence_length": 16, "demo_samples": 6, "eval_fraction": 0.34}},
    "training": {{"steps": 3, "lr": 0.001, "micro_batch_size": 2}},
}}
KIT = {{stage: f"{{__name__}}:FAMILY.{{stage}}" for stage in ("convert", "preprocess", "extract", "export")}}
TRAIN = Stage("mmcore.train:train_stage", parts={{"recipe": f"{{__name__}}:FAMILY.recipe"}})
STAGES = {{**wan.stages, **KIT, "train": TRAIN, {download}}}
# through export: what the rules read (no evaluate or infer, which would only cost time here)
PACK = dataclasses.replace(wan, name="{name}", presets={{"tiny": TINY}}, default_preset="tiny", stages={{k: v for k, v in STAGES.items() if k not in ("evaluate", "infer")}})


def __getattr__(attr):
    if attr != "FAMILY":
        raise AttributeError(attr)
    from mm_pack_wan import {family} as family

    globals()["FAMILY"] = built = dataclasses.replace(family.FAMILY, predict=predict)
    return built


def predict(model, noisy, sigma, text, **options):
    from mm_pack_wan.{family} import predict as wan_predict

{predict}
    return wan_predict(model, noisy, sigma, text, **options)


def build_init(preset, out, seed):
    import json

    from mm_pack_wan.tiny import build_init_checkpoint

    build_init_checkpoint(preset, out, seed)
{build_init}
"""

FINE_DOWNLOAD = ""
BAD_INDEX_DOWNLOAD = '"download": Stage("mmcore.engines:download_stage", parts={"build_init": f"{__name__}:build_init"}, options=wan.stages["download"].options)'

T2V = {"base": "wan", "family": "family"}
BROKEN = {
    # the text dropped on the way to the denoiser: trains, exports and lowers its loss all the same
    "captionless": dict(T2V, download=FINE_DOWNLOAD, predict="    text = text * 0", build_init="    pass"),
    # image-to-video with its first frame (mask + latents, CLIP states) dropped: reads the caption only
    "frameless": dict(
        base="wan_i2v",
        family="i2v",
        download=FINE_DOWNLOAD,
        predict='    options = {**options, "condition": options["condition"] * 0, "image_embeds": options["image_embeds"] * 0}',
        build_init="    pass",
    ),
    # noise augmentation of the text states from the process's RNG: resumes exactly, 2 ranks != 1
    "globalnoise": dict(T2V, download=FINE_DOWNLOAD, predict="    import torch\n\n    text = text + 0.01 * torch.randn_like(text)", build_init="    pass"),
    # a pipeline class diffusers does not have in model_index.json: every named class still loads
    "badindex": dict(
        T2V,
        download=BAD_INDEX_DOWNLOAD,
        predict="    pass",
        build_init='    index = out / "model_index.json"\n    index.write_text(json.dumps({**json.loads(index.read_text()), "_class_name": "WanVideoPipeline"}))',
    ),
}


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("broken-generative")
    projects = [write_pack_project(root, f"mm-pack-{name}", f"mm_pack_{name}", SPEC.format(name=name, **parts), {name: f"mm_pack_{name}:PACK"}) for name, parts in BROKEN.items()]
    target = tmp_path_factory.mktemp("broken-generative-site")
    pip_install_target(projects, target)
    sys.path.insert(0, str(target))
    yield target
    sys.path.remove(str(target))


#: the smallest run that reaches a break found before held-out clips are needed (train's first
#: step, the export): two clips, one step
SHORT = {"steps": 1, "overrides": ("data.demo_samples=2", "data.eval_fraction=0")}


def _suite(name: str, **settings: Any) -> Any:
    from mmcore.testing.conformance import PackConformance

    return type(f"Broken_{name}", (PackConformance,), {"pack_name": name, **settings})


def _one_line_failure(call: Any, *args: Any) -> str:
    with pytest.raises(pytest.fail.Exception) as caught:
        call(*args)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def test_a_denoiser_that_ignores_its_caption_fails_conditioning_and_a_bad_index_fails_export(broken_site: Path, tmp_path: Path) -> None:
    from mmcore.framework.plugins import Plugins

    suite = _suite("captionless")
    run = suite._shared_run(tmp_path)  # trains, exports, evaluates: nothing else notices
    plugins = Plugins.load()
    metrics = json.loads((run / "train/manifest.json").read_text())["metrics"]
    assert metrics["eval/loss_shuffled"] == metrics["eval/loss"]  # bit-identical: the rule's threshold has all the room of float noise
    message = _one_line_failure(suite().test_held_out_loss_depends_on_the_caption, plugins, plugins.pack("captionless"), run)
    assert message.startswith("[conditioning] mmcore_train: the held-out loss does not depend on the caption: eval/loss "), message

    # the conformance check of a finished export whose model_index.json names no pipeline: one line, no traceback
    broken = tmp_path / "bad-index"
    shutil.copytree(run, broken, symlinks=True)
    index = broken / "export/pipeline/model_index.json"
    index.write_text(json.dumps({**json.loads(index.read_text()), "_class_name": "WanVideoPipeline"}))
    message = _one_line_failure(suite().test_export_loads_in_its_library, plugins, broken)
    assert (
        message
        == f"[export] mmcore_export: diffusers.DiffusionPipeline.from_pretrained cannot load {broken}/export/pipeline: model_index.json _class_name 'WanVideoPipeline' is not a diffusers pipeline"
    )


def test_a_denoiser_that_ignores_its_first_frame_fails_conditions(broken_site: Path, tmp_path: Path) -> None:
    """wan-i2v (SDK 1.20) with the first frame's conditions zeroed in predict: the caption rule
    passes (it reads its text), the conditions rule names the break."""
    from mmcore.framework.plugins import Plugins

    suite = _suite("frameless", steps=1)  # 6 clips, 2 held out: each gets the other's first frame
    run = suite._shared_run(tmp_path)
    plugins = Plugins.load()
    metrics = json.loads((run / "train/manifest.json").read_text())["metrics"]
    assert metrics["eval/loss_other_condition"] == metrics["eval/loss"]
    suite().test_held_out_loss_depends_on_the_caption(plugins, plugins.pack("frameless"), run)
    message = _one_line_failure(suite().test_held_out_loss_depends_on_the_conditions, plugins, plugins.pack("frameless"), run)
    assert message.startswith("[conditions] mmcore_train: the held-out loss does not depend on the family's conditions: eval/loss "), message


def test_an_export_the_generic_loader_cannot_open_fails_export(broken_site: Path, tmp_path: Path) -> None:
    message = _one_line_failure(_suite("badindex", **SHORT)._shared_run, tmp_path)
    expected = (
        f"[export] mmcore_export: diffusers.DiffusionPipeline.from_pretrained cannot load {tmp_path}/tiny/export/pipeline: model_index.json _class_name 'WanVideoPipeline' is not a diffusers pipeline"
    )
    assert message == expected


def test_noise_from_the_global_rng_fails_global_rng(broken_site: Path, tmp_path: Path) -> None:
    message = _one_line_failure(_suite("globalnoise", **SHORT)._shared_run, tmp_path)
    assert message.startswith("[global rng] mmcore_train: step 1's forward and backward drew from torch's global RNG (the CPU's: "), message


def test_the_global_rng_check_passes_dropout_at_zero_and_catches_it_above() -> None:
    """Dropout and attention dropout at p=0 draw nothing (the model's, during the step): no false
    alarm for a denoiser built with them; at p > 0 they draw, which 2 ranks != 1 too."""
    import torch

    from mmcore.errors import StageError
    from mmcore.train.guards import GlobalRngCheck

    check = GlobalRngCheck(torch.device("cpu"))
    x = torch.randn(2, 4, 8, 16, requires_grad=True)
    for p in (0.0, 0.1):
        before = check.state()
        y = torch.nn.Dropout(p).train()(x)
        y = torch.nn.functional.scaled_dot_product_attention(y, y, y, dropout_p=p)
        y.sum().backward()
        if p == 0.0:
            check.check(1, before)
        else:
            with pytest.raises(StageError, match=r"^global rng: step 2's forward"):
                check.check(2, before)


@pytest.mark.matrix  # two processes (~30 s); the global rng rule catches the same break in make test
@pytest.mark.compares_runs
def test_noise_from_the_global_rng_fails_two_processes(broken_site: Path, tmp_path: Path) -> None:
    """Without the loop's check (a pack of an earlier SDK, a user's run), the same break trains,
    and resumes exactly; two processes draw other noise than one, which the matrix rule sees."""
    from mmcore.framework.plugins import Plugins

    suite = _suite("globalnoise", steps=2, overrides=("data.demo_samples=2", "data.eval_fraction=0"))
    suite._runner(tmp_path / "tiny").run_pipeline(resume="no")  # what _shared_run does, the check off
    plugins = Plugins.load()
    message = _one_line_failure(suite().test_two_processes_train_as_one, plugins, plugins.pack("globalnoise"), tmp_path, tmp_path / "tiny")
    assert message.startswith("[two processes] mmcore_train: two processes' losses "), message
