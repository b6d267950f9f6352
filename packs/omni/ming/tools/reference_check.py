"""Ming-Lite-Omni's pack model against the reference code, run once by hand (not in CI).

    python3.11 -m venv /tmp/ming-ref
    /tmp/ming-ref/bin/pip install torch==2.13.0 'transformers==4.45.*' einops
    /tmp/ming-ref/bin/pip install --no-deps funasr==1.2.6      # SANMEncoder's module only
    .venv/bin/python packs/omni/ming/tools/reference_check.py [--reference-python /tmp/ming-ref/bin/python]

The reference is inclusionAI/Ming's ``Ming-omni/`` (``modeling_bailingmm.py``,
``modeling_bailing_moe.py``, ``qwen2_5_vit.py``, ``modeling_utils.py`` and their configs), read
from the snapshot with ``git show`` into a temporary folder and imported in a side venv with
transformers 4.45 (what it was written for) and FunASR's ``SANMEncoder``. Three things are
stubbed, none of them maths: FunASR's package ``__init__`` (it imports the whole toolkit; the
encoder's own module is imported as it is), ``modeling_bailing_talker`` (the talker is out of
scope and not built: ``talker_config`` is absent), and the vision tower's hard-coded
``image_emb_dim = 8192`` (set to the config's ``out_hidden_size``, which is 8192 in the release,
so the tiny tower can be narrower).

The reference's ``BailingMMNativeForConditionalGeneration.forward`` cannot run as written: it
passes ``input_ids`` and ``inputs_embeds`` together (``BailingMoeModel`` raises) and the image
span as ``image_indices`` (``BailingMoeForCausalLM`` has no such argument, so with
``multi_gate`` the router's ``len(image_start_indices)`` fails on None). The check therefore runs
the path its ``generate`` runs: ``extract_image_feature`` / ``extract_audio_feature``,
``prompt_wrap_navit``, then ``self.model(inputs_embeds=..., labels=..., image_start_indices=...,
...)``, one sample at a time (the reference's spans are per row; a row without pictures in a
batch with some would be routed as a picture, see :mod:`mm_pack_ming.moe`).

One tiny random checkpoint (``init:tiny``'s layout and fields, seed 7, bfloat16 on disk, both
sides in float32), three samples: picture + question + answer, clip + question + answer, text
only. Compared: logits and CE loss, with the reference's LLM in training mode (its MoE training
path; there also every parameter's gradient of the loss) and in eval mode (``moe_infer``, and ``norm_head`` folded into the weight), and the pack's
model on the three samples padded into one batch. Control: the pack's model with two rows of layer 0's
image router swapped (experts 0 and 1 trade places for picture tokens): the picture sample's
logits differ, the clip's and the text's do not. Processors: the release's
``BailingMMImageProcessor`` (its preprocessor_config's pixel budget) against the pack's PIL
Qwen2-VL processor on three random pictures, and its ``apply_lfr`` + ``apply_cmvn`` against
``stack_lfr`` + :func:`mm_pack_ming.data.read_cmvn` on one fbank matrix with a written
``am.mvn`` (its ``kaldi.fbank`` needs torchaudio, which has no wheel for this CPU torch: the
fbank itself is ``mmcore.data.kaldi_fbank``, which the funasr pack's tests hold to transformers'
extractor). Prints a JSON report.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SNAPSHOT = Path("/work/.mirror/inclusionAI+Ming/repo")
SOURCES = (
    "image_processing_bailingmm",
    "audio_processing_bailingmm",
    "modeling_bailingmm",
    "modeling_bailing_moe",
    "configuration_bailingmm",
    "configuration_bailing_moe",
    "configuration_audio",
    "qwen2_5_vit",
    "modeling_utils",
    "configuration_bailing_talker",
)


def make_samples(folder: Path) -> list[dict]:  # type: ignore[type-arg]
    import torch
    from transformers import AutoTokenizer

    from mm_pack_ming.config import load_config

    tok = AutoTokenizer.from_pretrained(folder)
    cfg = load_config(folder)
    g = torch.Generator().manual_seed(3)
    patch, t = cfg.vision["patch_size"], cfg.vision["temporal_patch_size"]
    grid = torch.tensor([[1, 4, 6]])
    n_image = int(grid.prod()) // cfg.vision["spatial_merge_size"] ** 2
    frames = 9
    texts = [
        ("<role>HUMAN</role><image>" + "<imagePatch>" * n_image + "</image>\nWhat colour is the shape?<role>ASSISTANT</role>", "The shape is red.<|endoftext|>"),
        ("<role>HUMAN</role><audio>" + "<audioPatch>" * frames + "</audio>What is the tone?<role>ASSISTANT</role>", "a high tone<|endoftext|>"),
        ("<role>HUMAN</role>What colour is a red square?<role>ASSISTANT</role>", "The square is red.<|endoftext|>"),
    ]
    samples = []
    for i, (prompt, answer) in enumerate(texts):
        p, a = tok(prompt)["input_ids"], tok(answer)["input_ids"]
        ids = torch.tensor([p + a])
        s = {"input_ids": ids, "labels": torch.tensor([[-100] * len(p) + a])}
        if i == 0:
            s["pixel_values"] = torch.randn(int(grid.prod()), 3 * t * patch * patch, generator=g)
            s["image_grid_thw"] = grid
        if i == 1:
            s["audio_feats"] = torch.randn(1, frames, cfg.sanm.input_size, generator=g)
            s["audio_feats_lengths"] = torch.tensor([frames])
            s["audio_token_id"] = tok.convert_tokens_to_ids("<audioPatch>")
            s["audio_placeholder_loc_lens"] = torch.tensor([[[p.index(tok.convert_tokens_to_ids("<audioPatch>")), frames]]])
        samples.append(s)
    return samples


def _import_reference(snapshot: Path):  # type: ignore[no-untyped-def]
    """The reference modules from the snapshot, with the three stubs the docstring lists."""
    import importlib.util
    import types

    src = Path(tempfile.mkdtemp(prefix="ming-ref-src-"))
    for name in SOURCES:
        text = subprocess.run(["git", "-C", str(snapshot), "show", f"HEAD:Ming-omni/{name}.py"], check=True, capture_output=True, text=True).stdout
        (src / f"{name}.py").write_text(text)
    sys.path.insert(0, str(src))
    site = Path(importlib.util.find_spec("funasr").submodule_search_locations[0])
    pkg = types.ModuleType("funasr")
    pkg.__path__ = [str(site)]
    sys.modules["funasr"] = pkg
    talker = types.ModuleType("modeling_bailing_talker")
    talker.BailingTalkerForConditionalGeneration = None
    sys.modules["modeling_bailing_talker"] = talker
    import modeling_bailingmm
    import qwen2_5_vit

    plain_init = qwen2_5_vit.Qwen2_5_VisionTransformer.__init__

    def init(self, config, *args, **kwargs):  # type: ignore[no-untyped-def]
        plain_init(self, config, *args, **kwargs)
        self.image_emb_dim = config.out_hidden_size

    qwen2_5_vit.Qwen2_5_VisionTransformer.__init__ = init
    return modeling_bailingmm


def run_reference(folder: Path, batch: Path, out: Path, snapshot: Path) -> None:
    """Side venv: the reference model on each sample (training-mode and eval-mode LLM)."""
    import torch
    from safetensors.torch import load_file

    ref = _import_reference(snapshot)
    from configuration_bailingmm import BailingMMConfig

    config = BailingMMConfig.from_pretrained(str(folder))
    config.llm_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "sdpa"
    model = ref.BailingMMNativeForConditionalGeneration(config).float()
    state = {}
    for f in sorted(folder.glob("model-*.safetensors")):
        state.update({k: v.float() for k, v in load_file(str(f)).items()})
    model.load_state_dict(state, strict=True)
    samples = torch.load(batch, weights_only=True)
    results: dict[str, list] = {"train": [], "eval": []}  # type: ignore[type-arg]
    for mode in ("train", "eval"):  # train first: eval folds norm_head into lm_head's weight in place
        model.eval()
        if mode == "train":
            model.model.train()
        with torch.set_grad_enabled(mode == "train"):  # the training path also gives its gradients
            for s in samples:
                model.zero_grad()
                ids = s["input_ids"]
                image = audio = lengths = None
                if "pixel_values" in s:
                    image = model.extract_image_feature(s["pixel_values"], grid_thw=s["image_grid_thw"])
                if "audio_feats" in s:
                    audio, lengths = model.extract_audio_feature(s["audio_feats"], s["audio_feats_lengths"][:, None])
                if image is None and audio is None:
                    words = model.model.get_input_embeddings()(ids)
                    spans = [[999999]] * 4
                else:
                    words, *spans = model.prompt_wrap_navit(ids, image, None, audio, lengths, s.get("audio_placeholder_loc_lens"), None)
                o = model.model(
                    inputs_embeds=words, labels=s["labels"], use_cache=False, image_start_indices=spans[0], image_end_indices=spans[1], audio_start_indices=spans[2], audio_end_indices=spans[3]
                )
                row = {"logits": o.logits.detach().float(), "loss": float(o.loss)}
                if mode == "train":
                    o.loss.backward()
                    row["grads"] = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
                results[mode].append(row)
    torch.save(results, out)


def run_reference_processors(work: Path, snapshot: Path) -> None:
    """Side venv: the release's image processor on the driver's pictures, and its LFR + CMVN
    steps on the driver's fbank matrix (``torchaudio``, which its module imports for
    ``kaldi.fbank`` and resampling, is stubbed: neither is called here)."""
    import types

    import numpy as np
    import torch
    from PIL import Image

    import importlib.machinery

    _import_reference(snapshot)
    stub = types.ModuleType("torchaudio")
    stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    compliance = types.ModuleType("torchaudio.compliance")
    compliance.kaldi = types.ModuleType("torchaudio.compliance.kaldi")
    stub.compliance = compliance
    sys.modules.update({"torchaudio": stub, "torchaudio.compliance": compliance, "torchaudio.compliance.kaldi": compliance.kaldi})
    import audio_processing_bailingmm as audio
    import image_processing_bailingmm as image

    settings = json.loads((work / "processors.json").read_text())
    out = {}
    for name in settings["pictures"]:
        proc = image.BailingMMImageProcessor(min_pixels=settings["min_pixels"], max_pixels=settings["max_pixels"], patch_size=settings["patch_size"])
        got = proc.preprocess(images=[Image.open(work / name)], return_tensors="np")
        out[name] = {"pixel_values": torch.from_numpy(np.asarray(got["pixel_values"])), "image_grid_thw": torch.from_numpy(np.asarray(got["image_grid_thw"]))}
    fbank = torch.load(work / "fbank.pt", weights_only=True)
    cmvn = audio.load_cmvn(str(work / "am.mvn"))
    out["lfr_cmvn"] = audio.apply_cmvn(audio.apply_lfr(fbank, 7, 6), cmvn)  # tensors only: read back with weights_only
    torch.save(out, work / "processors_ref.pt")


def check_processors(work: Path, reference_python: str, snapshot: Path) -> dict:  # type: ignore[type-arg]
    """The pack's picture patches and clip rows against the release's processors (same inputs)."""
    import numpy as np
    import torch
    from PIL import Image

    from mm_pack_ming.data import read_cmvn
    from mm_qwen_vision import image_processor
    from mmcore.data import kaldi_fbank, stack_lfr

    settings = {"min_pixels": 78400, "max_pixels": 802816, "patch_size": 14, "pictures": []}  # the release's preprocessor_config.json
    rng = np.random.default_rng(0)
    for i, size in enumerate([(97, 61), (640, 480), (33, 300)]):
        name = f"picture{i}.png"
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(work / name)
        settings["pictures"].append(name)
    (work / "processors.json").write_text(json.dumps(settings))
    t = torch.arange(16000 * 0.73) / 16000
    fbank = kaldi_fbank(32768.0 * 0.3 * torch.sin(2 * torch.pi * 523.0 * t) + 300.0 * torch.randn(t.shape, generator=torch.Generator().manual_seed(0)))
    torch.save(fbank, work / "fbank.pt")
    shift, scale = torch.linspace(-12, -4, 560), torch.linspace(0.1, 0.4, 560)
    (work / "am.mvn").write_text(
        "<Nnet>\n<Splice> 560 560\n[ 0 ]\n<AddShift> 560 560\n<LearnRateCoef> 0 [ "
        + " ".join(f"{v:.6f}" for v in shift.tolist())
        + " ]\n<Rescale> 560 560\n<LearnRateCoef> 0 [ "
        + " ".join(f"{v:.6f}" for v in scale.tolist())
        + " ]\n</Nnet>\n"
    )
    subprocess.run([reference_python, __file__, "--side", "processors", "--snapshot", str(snapshot), str(work)], check=True)
    ref = torch.load(work / "processors_ref.pt", weights_only=True)
    ref = {k: ({n: t.numpy() for n, t in v.items()} if isinstance(v, dict) else v.numpy()) for k, v in ref.items()}
    proc = image_processor(settings["min_pixels"], settings["max_pixels"], settings["patch_size"])
    report = {}
    for name in settings["pictures"]:
        mine = proc(images=[Image.open(work / name).convert("RGB")], return_tensors="np")
        same_grid = mine["image_grid_thw"].tolist() == ref[name]["image_grid_thw"].tolist()
        report[name] = {
            "grid": mine["image_grid_thw"][0].tolist(),
            "grid_equal": same_grid,
            "max_abs_pixel_values_diff": float(np.abs(mine["pixel_values"] - ref[name]["pixel_values"]).max()) if same_grid else None,
        }
    c_shift, c_scale = read_cmvn(work / "am.mvn")
    rows = (stack_lfr(fbank, 7, 6) + c_shift) * c_scale
    report["clip LFR + CMVN rows"] = {"rows": int(rows.shape[0]), "max_abs_diff": float(np.abs(rows.numpy() - ref["lfr_cmvn"]).max())}
    return report


def run_pack(folder: Path, samples: list[dict], nudge: str | None = None) -> tuple[list, list]:  # type: ignore[type-arg]
    """The pack's model: each sample alone, and the three right-padded into one batch."""
    import torch

    from mm_pack_ming.checkpoint import load_model

    model = load_model(folder).eval()
    if nudge:
        with torch.no_grad():
            w = model.get_parameter(nudge)
            w[[0, 1]] = w[[1, 0]].clone()
    alone = []
    for s in samples:
        model.zero_grad()
        out = model(**s)
        out.loss.backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        alone.append({"logits": out["logits"].detach(), "loss": out.loss.item(), "grads": grads})
    with torch.no_grad():
        longest = max(s["input_ids"].shape[1] for s in samples)
        pad = lambda t, v: torch.nn.functional.pad(t, (0, longest - t.shape[1]), value=v)  # noqa: E731
        batch = {
            "input_ids": torch.cat([pad(s["input_ids"], 0) for s in samples]),
            "labels": torch.cat([pad(s["labels"], -100) for s in samples]),
            "attention_mask": torch.cat([pad(torch.ones_like(s["input_ids"]), 0) for s in samples]),
            **{k: samples[0][k] for k in ("pixel_values", "image_grid_thw")},
            **{k: samples[1][k] for k in ("audio_feats", "audio_feats_lengths", "audio_token_id")},
        }
        out = model(**batch)
    batched = [out["logits"][i, : s["input_ids"].shape[1]] for i, s in enumerate(samples)]
    return alone, batched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference-python", default="/tmp/ming-ref/bin/python")
    parser.add_argument("--snapshot", type=Path, default=SNAPSHOT)
    parser.add_argument("--side", choices=["driver", "reference", "processors"], default="driver")
    parser.add_argument("paths", nargs="*", type=Path)
    args = parser.parse_args()
    if args.side == "reference":
        run_reference(*args.paths, snapshot=args.snapshot)
        return
    if args.side == "processors":
        run_reference_processors(args.paths[0], args.snapshot)
        return
    import torch

    from mm_pack_ming.tiny import build_init_checkpoint

    work = Path(tempfile.mkdtemp(prefix="ming-check-"))
    folder = work / "model"
    build_init_checkpoint("tiny", folder, seed=7)
    samples = make_samples(folder)
    torch.save(samples, work / "batch.pt")
    cmd = [args.reference_python, __file__, "--side", "reference", "--snapshot", str(args.snapshot), str(folder), str(work / "batch.pt"), str(work / "ref.pt")]
    subprocess.run(cmd, check=True)
    ref = torch.load(work / "ref.pt", weights_only=True)
    alone, batched = run_pack(folder, samples)
    names = ["image+text", "audio+text", "text only"]
    report: dict[str, dict] = {}  # type: ignore[type-arg]
    for i, name in enumerate(names):
        row = {"tokens": int(samples[i]["input_ids"].shape[1])}
        for mode in ("train", "eval"):
            row[f"max_abs_logits_vs_reference_{mode}"] = float((alone[i]["logits"] - ref[mode][i]["logits"]).abs().max())
            row[f"loss_abs_diff_vs_reference_{mode}"] = abs(alone[i]["loss"] - ref[mode][i]["loss"])
        row["loss_pack"], row["loss_reference"] = alone[i]["loss"], ref["train"][i]["loss"]
        mine, theirs = alone[i]["grads"], ref["train"][i]["grads"]
        row["gradients_same_parameters"] = sorted(mine) == sorted(theirs)
        row["max_abs_grad_diff_over_all_parameters"] = max(float((mine[k] - theirs[k]).abs().max()) for k in theirs)
        row["max_abs_grad"] = max(float(g.abs().max()) for g in theirs.values())
        row["parameters_with_gradients"] = len(theirs)
        row["max_abs_logits_batched_vs_alone"] = float((batched[i] - alone[i]["logits"][0]).abs().max())
        report[name] = row
    nudged, _ = run_pack(folder, samples, nudge="model.model.layers.0.mlp.image_gate.weight")
    report["control: the pack's model with layer 0's image_gate rows 0 and 1 swapped, max |logits - reference|"] = {
        name: float((nudged[i]["logits"] - ref["train"][i]["logits"]).abs().max()) for i, name in enumerate(names)
    }
    report["processors"] = check_processors(work, args.reference_python, args.snapshot)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
