"""`mmcore infer` and the evaluate stage on a trained run: the same answers from the training
checkpoint and the export, batched and one by one; bad requests reported per line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# The demo, trained part of the way: answers are right or wrong (not noise), so comparing them means something.
DEMO = ["--pack", "qwen2vl", "--preset", "demo", "convert.verify=false", "training.steps=40", "training.eval_every=0"]


def rows(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    from mmcore.testing import StageCLI

    root = tmp_path_factory.mktemp("infer")
    cli = StageCLI(root)
    cli("run", *DEMO, "--run-dir", "r")
    return root, cli


@pytest.mark.compares_runs
def test_infer_answers_the_same_from_the_train_checkpoint_and_the_export(trained) -> None:  # type: ignore[no-untyped-def]
    root, mm = trained
    demo = root / "r/preprocess/demo-data"
    held_out = json.loads((demo / "eval.json").read_text())[:6]
    lines = [json.dumps(record) for record in held_out]  # conversations with their answers, as in training data
    lines.append(json.dumps({"prompt": "What colour is the square?", "images": [held_out[0]["images"][0]]}))  # no placeholder: one is added
    lines.append(json.dumps({"prompt": "<image><image>Two?", "images": [held_out[0]["images"][0]]}))
    lines.append(json.dumps({"prompt": "<image>Where?", "images": ["images/missing.png"]}))
    lines.append("{not json")
    (demo / "requests.jsonl").write_text("\n".join(lines) + "\n")
    answers = {}
    for name, which in (("latest", "latest"), ("export", "export"), ("folder", str(root / "r/export/hf"))):
        proc = mm(
            "infer", "--run-dir", "r", "--checkpoint", which, "--input", str(demo / "requests.jsonl"), "--output", f"{name}.jsonl", "generation.max_new_tokens=8", "--batch-size", "4", check=False
        )
        assert proc.returncode == 1, proc.stderr  # some requests failed; the others were answered
        answers[name] = rows(root / f"{name}.jsonl")
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert errors == [
            "error: requests.jsonl:8: the prompt has 2 <image> but 1 image(s) were given",
            f"error: requests.jsonl:9: image file not found: {demo / 'images/missing.png'}",
            "error: requests.jsonl:10: invalid JSON: Expecting property name enclosed in double quotes (column 2)",
        ], proc.stderr
    latest, export = answers["latest"], answers["export"]
    assert len(latest) == 10 and all("text" in r for r in latest[:7])
    assert [r.get("text") for r in latest] == [r.get("text") for r in export]  # greedy: identical tokens, either weights
    assert [r.get("text") for r in answers["folder"]] == [r.get("text") for r in export]  # any HF folder: here the export's
    assert sum(r["text"] == r["reference"] for r in latest[:6]) >= 3  # the model was trained: mostly right
    assert latest[0]["reference"] == held_out[0]["messages"][1]["content"]
    # one request on the command line prints just its answer (request 7 with its placeholder written out)
    image = demo / held_out[0]["images"][0]
    proc = mm("infer", "--run-dir", "r", "--prompt", "<image>What colour is the square?", "--image", str(image), "--max-new-tokens", "8")
    assert proc.stdout.strip() == latest[6]["text"]
    # generation.dtype=bfloat16 (auto picks it on an accelerator with bf16): weights and pixels cast, it answers
    proc = mm("infer", "--run-dir", "r", "--prompt", "<image>What colour is the square?", "--image", str(image), "--max-new-tokens", "8", "generation.dtype=bfloat16")
    assert proc.stdout.strip() and "error" not in proc.stderr


@pytest.mark.compares_runs
def test_evaluate_batched_equals_one_by_one_and_reruns_only_when_asked(trained) -> None:  # type: ignore[no-untyped-def]
    root, mm = trained
    run = root / "r"
    batched = rows(run / "evaluate/results.jsonl")
    metrics = json.loads((run / "evaluate/metrics.json").read_text())
    assert metrics["items"] == len(batched) > 0 and (run / "evaluate/report.html").stat().st_size > 500
    proc = mm("run", "--run-dir", "r")
    assert "[evaluate] skipped: up to date" in proc.stdout
    mm("eval", "--run-dir", "r", "generation.batch_size=1")
    single = rows(run / "evaluate/results.jsonl")
    assert [r["prediction"] for r in single] == [r["prediction"] for r in batched]
    assert json.loads((run / "evaluate/metrics.json").read_text())["token_accuracy"] == metrics["token_accuracy"]
    # ... and is what the export stage's one-by-one generate() check printed before the evaluate stage
    from transformers import AutoTokenizer

    from mm_pack_qwen2vl.family import FAMILY
    from mmcore.train import generate_accuracy
    from mmcore.data import ShardDataset

    data = ShardDataset(run / "preprocess/dataset")
    ids = FAMILY.token_ids(data)

    def prompt_inputs(sample: dict, start: int) -> dict:  # type: ignore[type-arg]  # the former export check's inputs
        prompt = dict(sample, input_ids=sample["input_ids"][:start], labels=sample["labels"][:start])
        return {k: v for k, v in FAMILY.collate([prompt], ids).items() if k not in ("labels", "num_loss_tokens")}

    end = AutoTokenizer.from_pretrained(run / "export/hf").convert_tokens_to_ids("<|im_end|>")
    model = FAMILY.load_exported(run / "export/hf").eval()
    assert metrics["token_accuracy"] > 0.3  # answers, not noise: the comparison can fail
    assert generate_accuracy(model, data.split("eval"), prompt_inputs, end, ids["pad_id"], limit=256) == metrics["token_accuracy"]


def test_eval_on_a_file_of_held_out_conversations(trained) -> None:  # type: ignore[no-untyped-def]
    root, mm = trained
    demo = root / "r/preprocess/demo-data"
    records = json.loads((demo / "eval.json").read_text())[:5]
    records.append({"messages": [{"role": "user", "content": "<image>Colour?"}, {"role": "assistant", "content": "red"}], "images": ["images/gone.png"]})
    (demo / "mine.json").write_text(json.dumps(records))
    own = (root / "r/evaluate/manifest.json").read_text()
    proc = mm("eval", "--run-dir", "r", "--data", str(demo / "mine.json"), check=False)
    assert proc.returncode == 1 and "mine.json: sample 5: image file not found" in proc.stderr.strip().splitlines()[-1]
    mm("eval", "--run-dir", "r", "--data", str(demo / "mine.json"), "data.on_bad_sample=skip")
    metrics = json.loads((root / "r/evaluate-mine/metrics.json").read_text())  # its own folder: the run's evaluate/ stays
    assert metrics["items"] == 5 and metrics["skipped"] == 1
    assert [r["item"] for r in rows(root / "r/evaluate-mine/results.jsonl")] == [f"mine.json:{i}" for i in range(5)]
    assert (root / "r/evaluate/manifest.json").read_text() == own  # the run's own evaluation stays, and counts as done
    assert "  evaluate    ok    up to date" in mm("status", "--run-dir", "r").stdout


def test_infer_refuses_what_the_model_cannot_take_each_request_on_its_own_line(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from mmcore.data import write_audio
    from mmcore.testing.media import tone

    root, mm = trained
    demo = root / "r/preprocess/demo-data"
    image = json.loads((demo / "eval.json").read_text())[0]["images"][0]
    write_audio(demo / "tone.wav", tone(0.5), 16000)
    (tmp_path / "elsewhere.png").write_bytes((demo / image).read_bytes())
    lines = [
        {"prompt": "<image>What colour is the square?", "images": [image]},
        {"prompt": "What do you hear?", "audios": ["tone.wav"]},  # a VLM: the sound would be ignored
        {"prompt": " ".join(["word"] * 1000)},  # ~5k tokens, over the tiny model's 4096 positions
        {"prompt": "<image>What colour is the square?", "images": [str(tmp_path / "elsewhere.png")]},
    ]
    requests = demo / "guarded.jsonl"
    requests.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = mm("infer", "--run-dir", "r", "--input", str(requests), "--output", "guarded.jsonl", "--max-new-tokens", "4", check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert errors[0] == "error: guarded.jsonl:2: this model takes no audios (it takes images, videos)", proc.stderr
    assert errors[1].startswith("error: guarded.jsonl:3: the prompt is ") and errors[1].endswith(" tokens, the model's context is 4096 (max_position_embeddings in its config.json): shorten it"), (
        proc.stderr
    )
    assert (
        errors[2]
        == (
            f"error: guarded.jsonl:4: image path {str(tmp_path / 'elsewhere.png')!r} leads out of the request file's folder {demo} "
            "(paths are relative to it; --allow-any-media-path trusts the file's paths)"
        )
        and len(errors) == 3
    )
    answered = rows(root / "guarded.jsonl")
    assert "text" in answered[0] and [sorted(r) for r in answered[1:]] == [["error", "prompt", "request"]] * 3
    # the user vouches for the file's paths
    proc = mm("infer", "--run-dir", "r", "--input", str(requests), "--output", "trusted.jsonl", "--max-new-tokens", "4", "--allow-any-media-path", check=False)
    assert proc.returncode == 1 and rows(root / "trusted.jsonl")[3]["text"] == answered[0]["text"], proc.stderr
    # usage errors before any work: results over the requests; a planted checkpoint
    proc = mm("infer", "--run-dir", "r", "--input", str(requests), "--output", "r/preprocess/demo-data/guarded.jsonl", check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: --output r/preprocess/demo-data/guarded.jsonl is the --input file: the requests would be overwritten by the results (hint: write the results to another file)"
    ), proc.stderr
    assert requests.read_text() == "".join(json.dumps(line) + "\n" for line in lines)
    import pickle

    class Planted:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (Path.write_text, (tmp_path / "ran", "code ran"))

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt/.metadata").write_bytes(pickle.dumps(Planted()))
    proc = mm("infer", "--run-dir", "r", "--checkpoint", str(tmp_path / "ckpt"), "--prompt", "Hi", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"error: --checkpoint {tmp_path / 'ckpt'}: {tmp_path / 'ckpt/.metadata'}: refused to load: it references pathlib.Path.write_text")
    assert not (tmp_path / "ran").exists()


def test_a_run_directory_cannot_make_infer_run_its_code(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A copied or planted run: its config.yaml turns trust_remote_code on and its model folder
    names a module of its own (auto_map). Only the user's command line can let that run."""
    import shutil

    import yaml

    from mmcore.run.rundir import RunDir, hash_outputs

    root, mm = trained
    run = tmp_path / "planted"
    shutil.copytree(root / "r", run, symlinks=True, ignore=shutil.ignore_patterns("preprocess", "evaluate", "infer"))
    model, marker = run / "download/model", tmp_path / "code-ran"
    (model / "planted.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\nfrom transformers import Qwen2VLConfig as PlantedConfig\n")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoConfig": "planted.PlantedConfig"}}))
    settings = yaml.safe_load((run / "config.yaml").read_text())
    settings["model"]["trust_remote_code"] = True
    (run / "config.yaml").write_text(yaml.safe_dump(settings))
    infer = ("infer", "--run-dir", str(run), "--prompt", "Hi", "--max-new-tokens", "2")
    modules = {"HF_MODULES_CACHE": str(tmp_path / "modules")}
    # the download manifest recorded config.json: infer refuses the changed file before loading anything
    proc = mm(*infer, check=False, **modules)
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and line.startswith(f"error: the output of stage 'download' changed after it finished: {model / 'config.json'}: "), proc.stderr
    assert line.endswith(f"(hint: nothing read it; rerun `mmcore download --force --run-dir {run}` (or `mmcore run`) to rebuild it, `mmcore verify` checks every file)")
    assert not marker.exists()
    # with the manifest rewritten to match, verify cannot tell (RELIABILITY.md section 5 says so) ...
    rd = RunDir(run)
    manifest = rd.read_manifest("download")
    manifest.output_files = hash_outputs(manifest)
    rd.write_manifest(manifest)
    assert "FAILED" not in mm("verify", "--run-dir", str(run)).stdout
    # ... but the run directory still grants nothing: its model's code does not run
    proc = mm(*infer, check=False, **modules)
    assert proc.returncode == 0 and "trust_remote_code" not in proc.stderr and not marker.exists(), proc.stderr
    # the user's own command line does grant it (what the lines above kept from happening)
    proc = mm(*infer, "model.trust_remote_code=true", check=False, **modules)
    assert "model.trust_remote_code=true (given on this command line or in --config)" in proc.stderr and marker.read_text() == "ran", proc.stderr
