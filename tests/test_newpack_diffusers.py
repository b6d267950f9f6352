"""``mmcore new-pack --category generative --from-diffusers PIPELINE``: the generated pack
installs, runs every stage on its tiny preset and passes its conformance suite before anything
is filled in, for each shape of pipeline the generator knows (Wan, CogVideoX, FLUX, LTX-Video).
LTX-Video (the shape an outside author wrote by hand) runs in ``make test``; the others in
``make test-matrix``. The kit's pieces the packs are built on are checked against diffusers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffusers", reason="generated generative packs are built on diffusers")

from mmcore_helpers import pip_install_target  # noqa: E402

SHAPES = {"ltx": "LTXPipeline", "wan": "WanPipeline", "flux": "FluxPipeline", "cogvideox": "CogVideoXPipeline"}
IN_MAKE_TEST = ("ltx",)


def _param(shape: str):  # type: ignore[no-untyped-def]
    return pytest.param(shape, marks=() if shape in IN_MAKE_TEST else (pytest.mark.matrix,))


class Generated:
    """Packs generated (in this process: ``write_pack`` is what the command calls) and installed
    into one folder, one shape at a time as the tests ask for them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MMCORE_")}
        self.env["PYTHONPATH"] = os.pathsep.join([str(root / "site"), *(p for p in sys.path if p)])
        self.env["MMCORE_HOME"] = str(root / "home")

    def __call__(self, shape: str) -> Path:
        from mmcore.cli.newpack import write_pack

        project = self.root / f"mm-pack-gen-{shape}"
        if not project.is_dir():
            write_pack(f"gen-{shape}", "generative", self.root, SHAPES[shape], pipeline=SHAPES[shape])
            pip_install_target([project], self.root / "site")
        return project


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    return Generated(tmp_path_factory.mktemp("new-diffusers-pack"))


def mmcore(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mmcore", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=900)


@pytest.mark.parametrize("shape", [_param(s) for s in SHAPES])
def test_the_skeleton_imports_only_the_sdk_and_is_short(generated, shape: str) -> None:  # type: ignore[no-untyped-def]
    from mmcore.sdk import imports_outside_sdk

    package = generated(shape) / f"src/mm_pack_gen_{shape}"
    assert sorted(p.name for p in package.glob("*.py")) == ["__init__.py", "config.py", "family.py", "pack.py"]
    assert imports_outside_sdk(package) == []
    family = (package / "family.py").read_text()
    assert "._" not in family, "a generated family calls no private pipeline method"
    assert len(family.splitlines()) < 130


@pytest.mark.parametrize("shape", [_param(s) for s in SHAPES])
def test_generated_pack_runs_every_stage_on_its_tiny_preset(generated, shape: str) -> None:  # type: ignore[no-untyped-def]
    generated(shape)
    root = generated.root
    run = mmcore(generated.env, root, "run", "--pack", f"gen-{shape}", "--preset", "tiny")
    assert run.returncode == 0, run.stderr[-3000:]
    for stage in ("download", "convert", "preprocess", "extract", "train", "export", "evaluate"):
        manifest = json.loads((root / f"runs/gen-{shape}-tiny/{stage}/manifest.json").read_text())
        assert manifest["status"] == "finished", (stage, manifest)
    assert "weights bit-identical to training" in run.stdout
    assert json.loads((root / f"runs/gen-{shape}-tiny/evaluate/manifest.json").read_text())["metrics"]["samples"] == 1


@pytest.mark.parametrize("shape", [_param(s) for s in SHAPES])
def test_generated_pack_passes_its_conformance_suite(generated, shape: str) -> None:  # type: ignore[no-untyped-def]
    """Every rule; in ``make test`` without the four that rerun training (LoRA, kill-and-resume,
    infer from the checkpoint, two processes), which ``make test-matrix`` runs here and wan's suite
    in ``make test``."""
    project = generated(shape)
    quick = ["-k", "not lora and not killed and not infer and not two_processes"] if shape in IN_MAKE_TEST else []
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *quick, "tests"], capture_output=True, text=True, cwd=project, env=generated.env, timeout=900)
    assert tests.returncode == 0, tests.stdout[-3000:]


@pytest.mark.matrix
@pytest.mark.parametrize("shape", IN_MAKE_TEST)
def test_generated_pack_passes_the_rules_that_rerun_training(generated, shape: str) -> None:  # type: ignore[no-untyped-def]
    """The rules ``make test`` leaves out above, for the shapes it runs there."""
    project = generated(shape)
    rest = ["-k", "lora or killed or infer or two_processes"]
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *rest, "tests"], capture_output=True, text=True, cwd=project, env=generated.env, timeout=900)
    assert tests.returncode == 0, tests.stdout[-3000:]


def test_bad_requests_are_one_line_errors(tmp_path: Path) -> None:
    from mmcore.cli.newpack import write_pack
    from mmcore.errors import UsageError

    unknown = subprocess.run(
        [sys.executable, "-m", "mmcore", "new-pack", "x", "--category", "generative", "--from-diffusers", "HunyuanVideoPipeline", "--dir", str(tmp_path)], capture_output=True, text=True
    )
    assert unknown.returncode == 2 and unknown.stderr.strip().count("\n") == 0
    assert "none of the shapes the generator knows: wan (WanPipeline" in unknown.stderr and "ltx (LTXPipeline" in unknown.stderr
    with pytest.raises(UsageError, match="no pipeline class of that name"):
        write_pack("x", "generative", tmp_path, "LTXVideoTransformer3DModel", pipeline="LTXVideoTransformer3DModel")
    assert not any(tmp_path.iterdir())


def test_pipeline_options_must_be_the_pipelines_own() -> None:
    from diffusers import LTXPipeline, WanPipeline

    from mmcore.errors import ConfigError
    from mmcore.kits import SampleExport

    export = SampleExport(pipeline_options={"frame_rate": 25})
    assert export.call_options(LTXPipeline.__new__(LTXPipeline)) == {"frame_rate": 25}
    with pytest.raises(ConfigError, match=r"export.pipeline_options.frame_rate: WanPipeline.__call__ takes no such argument \(it takes: prompt, "):
        export.call_options(WanPipeline.__new__(WanPipeline))
    with pytest.raises(ConfigError, match="the kit sets num_frames itself"):
        SampleExport(pipeline_options={"num_frames": 9}).call_options(LTXPipeline.__new__(LTXPipeline))


def test_packing_is_the_pipelines_own() -> None:
    """The kit's token layout equals LTX-Video's and FLUX's pipelines' (compared here, once, so
    that packs need not call those private methods)."""
    import torch
    from diffusers import FluxPipeline, LTXPipeline

    from mmcore.kits import latent_token_ids, pack_latents, unpack_latents

    video = torch.randn(2, 8, 4, 6, 4)
    for patch, patch_t in ((1, 1), (2, 2)):
        packed = pack_latents(video, patch, patch_t)
        assert torch.equal(packed, LTXPipeline._pack_latents(video, patch, patch_t))
        assert torch.equal(unpack_latents(packed, 4, 6, 4, patch, patch_t), video)
    image = torch.randn(2, 16, 6, 4)
    assert torch.equal(pack_latents(image, 2), FluxPipeline._pack_latents(image, 2, 16, 6, 4))
    assert torch.equal(unpack_latents(pack_latents(image, 2), None, 6, 4, 2), image)
    assert torch.equal(latent_token_ids(1, 3, 2), FluxPipeline._prepare_latent_image_ids(2, 3, 2, "cpu", torch.float32))


def test_the_guide_documents_every_diffusion_family_field() -> None:
    """docs/writing-a-pack.md section 1b: each field of ``DiffusionFamily`` with what it takes and returns."""
    import dataclasses

    from mmcore.kits import DiffusionFamily

    guide = (Path(__file__).resolve().parents[1] / "docs/writing-a-pack.md").read_text()
    section = guide[guide.index("## 1b. The diffusion kit, field by field") : guide.index("## 2. The declaration")]
    assert [f.name for f in dataclasses.fields(DiffusionFamily) if f"`{f.name}`" not in section] == []
    assert "pipeline_options" in section and "sigma in (0, 1)" in section and "integer timestep" in section
