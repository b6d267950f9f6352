"""What `mmcore infer` and the evaluate stage share: requests and their one-line errors, the
answer metrics, and batched left-padded decoding that answers as one-by-one decoding does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmcore.engines.evaluation import char_errors, word_errors
from mmcore.engines.generation import answer_scores, generate_tokens, left_padded, normalize_answer, read_requests, request_from_flags, token_f1


def test_requests_from_a_jsonl_file_each_line_on_its_own(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"\x89PNG")
    lines = [
        {"prompt": "<image>What is it?", "images": ["a.png"]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<image>Colour?"}, {"role": "assistant", "content": "red"}], "images": "a.png"},
        {"conversations": [{"from": "human", "value": "Hi"}]},
        {"prompt": "<image><image>Two?", "images": ["a.png"]},
        {"prompt": "<image>x", "images": ["gone.png"]},
        {"messages": [{"role": "assistant", "content": "alone"}]},
        ["not", "an", "object"],
        {"text": "no prompt"},
        {"prompt": "x", "videos": [1]},
    ]
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n\n{broken\n")
    requests = read_requests(tmp_path / "r.jsonl")
    assert [r.where for r in requests] == [f"r.jsonl:{i}" for i in range(1, 10)] + ["r.jsonl:11"]
    first, second, third = requests[:3]
    assert first.error is None and first.prompt == "<image>What is it?" and first.media == {"images": [tmp_path / "a.png"]}
    assert second.turns == [("system", "Be brief."), ("user", "<image>Colour?")] and second.reference == "red" and second.error is None
    assert third.turns == [("user", "Hi")] and third.error is None
    assert [r.error for r in requests[3:]] == [
        "the prompt has 2 <image> but 1 image(s) were given",
        f"image file not found: {tmp_path / 'gone.png'}",
        "no user turn to answer",
        "expected a JSON object, got list",
        "no 'prompt' string, no 'messages' list and no media",
        "field 'videos' must be a list of paths",
        "invalid JSON: Expecting property name enclosed in double quotes (column 2)",
    ]


def test_request_media_stay_in_the_request_files_folder_unless_allowed(tmp_path: Path) -> None:
    """A request file from elsewhere must not make infer open any file on the machine."""
    folder = tmp_path / "requests"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.png").write_bytes(b"\x89PNG")
    (tmp_path / "outside.png").write_bytes(b"\x89PNG")
    (folder / "link.png").symlink_to(tmp_path / "outside.png")
    names = ["a.png", "sub/../a.png", "../outside.png", str(tmp_path / "outside.png"), "link.png", "a\0.png"]
    (folder / "r.jsonl").write_text("".join(json.dumps({"prompt": "x", "images": [name]}) + "\n" for name in names))
    leads_out = "leads out of the request file's folder {} (paths are relative to it; --allow-any-media-path trusts the file's paths)".format(folder)
    assert [r.error for r in read_requests(folder / "r.jsonl")] == [
        None,
        None,
        f"image path '../outside.png' {leads_out}",
        f"image path {str(tmp_path / 'outside.png')!r} {leads_out}",
        f"image path 'link.png' {leads_out}",
        "image path 'a\\x00.png' contains a NUL byte",
    ]
    trusted = read_requests(folder / "r.jsonl", any_media_path=True)
    assert [r.error for r in trusted[:5]] == [None] * 5 and trusted[4].media == {"images": [tmp_path / "outside.png"]}


def test_requests_from_flags_and_unusable_files(tmp_path: Path) -> None:
    (tmp_path / "a.wav").write_bytes(b"RIFF")
    assert request_from_flags(None, [], [], [str(tmp_path / "a.wav")]).error is None  # a transcription needs no prompt
    assert request_from_flags("<video>What happens?", [], [], []).error == "the prompt has 1 <video> but 0 video(s) were given"
    with pytest.raises(Exception, match="no requests"):
        (tmp_path / "empty.jsonl").write_text("\n")
        read_requests(tmp_path / "empty.jsonl")
    with pytest.raises(Exception, match="cannot read it"):
        read_requests(tmp_path / "absent.jsonl")


def test_answer_metrics() -> None:
    assert normalize_answer("The  Red, square!") == "red square"
    assert answer_scores("a red square.", "Red square") == {"exact_match": 1.0, "token_f1": 1.0}
    assert token_f1("red circle", "red square") == pytest.approx(0.5)  # precision 1/2, recall 1/2
    assert token_f1("red", "red square") == pytest.approx(2 / 3)  # precision 1, recall 1/2
    assert token_f1("", "") == 1.0 and token_f1("blue", "") == 0.0
    assert word_errors("seven one zero", "seven zero") == (1, 3)
    assert char_errors("seven one", "seven on") == (1, 9)


def test_the_vlm_kits_error_rates_are_corpus_wide() -> None:
    """A speech recognition family's evaluate (``VLMFamily.error_rates``): errors per item,
    WER and CER over all reference words and characters, not a mean of per-item rates."""
    from mmcore.kits.vlm.generation import error_rates

    rows = [{"reference": "seven one zero", "prediction": "seven zero"}, {"reference": "Two.", "prediction": "two"}]
    assert error_rates(rows) == {"wer": pytest.approx(1 / 4), "cer": pytest.approx(4 / 17)}
    assert (rows[0]["word_errors"], rows[0]["words"], rows[1]["word_errors"], rows[1]["chars"]) == (1, 3, 0, 3)


def tiny_lm() -> tuple:  # type: ignore[type-arg]
    """A tiny random GPT-2 (decisive logits: init range 0.5), six prompts of different lengths,
    and ``batch_size, options -> tokens`` through :func:`generate_tokens`."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=2, initializer_range=0.5, bos_token_id=None, eos_token_id=None)).eval()
    prompts = [torch.randint(1, 64, (n,)) for n in (3, 9, 5, 12, 1, 7)]

    def inputs_of(chosen: list) -> dict:  # type: ignore[type-arg]
        ids, mask = left_padded([p.tolist() for p in chosen], pad_id=0)
        return {"input_ids": ids, "attention_mask": mask}

    def decode(batch_size: int, options: dict | None = None) -> list[list[int]]:  # type: ignore[type-arg]
        return generate_tokens(model, prompts, inputs_of, length=len, end_ids=[63], pad_id=0, max_new_tokens=10, batch_size=batch_size, options=options)

    return decode


@pytest.mark.compares_runs
def test_batched_left_padded_decoding_answers_as_one_by_one() -> None:
    """The same greedy tokens for prompts of different lengths, whether decoded 3 at a time
    (left-padded, KV cache) or alone."""
    decode = tiny_lm()
    alone, together = decode(1), decode(3)
    assert together == alone and sum(map(len, alone)) > 30, alone  # most run to max_new_tokens; some end early
    ids, mask = left_padded([[5, 6], [7]], pad_id=0)
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]


def test_greedy_by_default_and_sampling_is_seeded() -> None:
    from mmcore.config import GenerationSection
    from mmcore.engines.generation import sampling_options

    assert sampling_options(GenerationSection(), seed=0) == {"do_sample": False}
    decode = tiny_lm()
    greedy = decode(3)
    hot = GenerationSection(temperature=2.0, seed=7)
    first, again = decode(3, sampling_options(hot, seed=0)), decode(3, sampling_options(hot, seed=0))
    assert first == again and first != greedy  # generation.seed makes sampling repeatable; it samples
    assert decode(3, sampling_options(GenerationSection(temperature=2.0, seed=8), seed=0)) != first


def test_generation_dtype_is_bf16_on_an_accelerator_that_has_it_and_fp32_on_cpu() -> None:
    import types

    import torch

    from mmcore.config import GenerationSection, RunConfig
    from mmcore.engines.generation import generation_dtype

    def ctx(device_type: str, bf16: bool, dtype: str = "auto") -> object:
        accelerator = types.SimpleNamespace(device_type=device_type, supports_bf16=lambda: bf16)
        return types.SimpleNamespace(config=RunConfig(generation=GenerationSection(dtype=dtype)), accelerator=accelerator)

    assert generation_dtype(ctx("cpu", True)) == torch.float32  # CPU: exact figures
    assert generation_dtype(ctx("cuda", True)) == torch.bfloat16
    assert generation_dtype(ctx("npu", False)) == torch.float32
    assert generation_dtype(ctx("cuda", True, "float16")) == torch.float16
