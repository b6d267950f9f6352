"""The VLM kit on a family it was not written for (LLaVA, from its transformers class alone):
tensor names as transformers renames them, packed rows computing what padded rows do."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers", reason="the VLM kit drives transformers models")

import torch  # noqa: E402

from mmcore.config import RunConfig  # noqa: E402
from mmcore.data.mllm import MLLMDataSection, Sample, Turn  # noqa: E402
from mmcore.kits.auto import TransformersNames, auto_family, tiny_checkpoint  # noqa: E402
from mmcore.testing.media import write_image  # noqa: E402

LLAVA = "LlavaForConditionalGeneration"
FAMILY = auto_family(LLAVA)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("llava") / "model"
    tiny_checkpoint(LLAVA, out, seed=0, corpus=["What colour is the square? red green blue", "USER: ASSISTANT:"])
    return out


def test_checkpoint_names_map_to_the_model_and_back_as_transformers_does(tiny: Path) -> None:
    from safetensors import safe_open

    from mmcore.engines.state_dict import TensorInfo

    with safe_open(str(tiny / "model.safetensors"), "pt") as handle:
        hub = {k: TensorInfo(tuple(handle.get_slice(k).get_shape()), torch.float32) for k in handle.keys()}
    adapter = TransformersNames(LLAVA)
    to_model = adapter.to_mm(hub)
    assert set(to_model) == set(FAMILY.build_model(tiny).state_dict())
    assert hub.keys() != to_model.keys()  # LLaVA's hub layout differs from transformers 5's modules
    back = adapter.to_hf({k: r.info for k, r in to_model.items()})
    assert {k: r.sources[0] for k, r in back.items()} == {r.sources[0]: k for k, r in to_model.items()}


@pytest.mark.compares_runs
def test_a_packed_row_computes_the_padded_batch_loss(tiny: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    write_image(tmp_path / "a.png", (220, 30, 30), (56, 56))
    write_image(tmp_path / "b.png", (40, 60, 220), (40, 64))
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    encoder = FAMILY.encoder(SimpleNamespace(config=RunConfig(data=MLLMDataSection())), tiny, tokenizer)
    samples = []
    for sample in [
        Sample("f", 0, [Turn("user", "<image>What colour is the square?"), Turn("assistant", "red")], {"images": [tmp_path / "a.png"]}),
        Sample("f", 1, [Turn("user", "What colour?"), Turn("assistant", "green blue")]),
        Sample("f", 2, [Turn("user", "<image>and this?"), Turn("assistant", "blue")], {"images": [tmp_path / "b.png"]}),
    ]:
        enc = encoder.encode(sample)
        samples.append({"input_ids": torch.tensor(enc.input_ids), "labels": torch.tensor(enc.labels), **enc.tensors})
    ids = FAMILY.token_ids_of(tokenizer)
    model = FAMILY.build_model(tiny).eval()
    padded, packed = FAMILY.collate(samples, ids), FAMILY.collate(samples, ids, pack=True)
    assert packed["input_ids"].shape[0] == 1 and packed["num_loss_tokens"] == padded["num_loss_tokens"] > 0
    with torch.no_grad():
        a, b = FAMILY.loss_sum(model, padded).item(), FAMILY.loss_sum(model, packed).item()
        leaky = FAMILY.loss_sum(model, dict(packed, segments=packed["segments"].sum(0, keepdim=True))).item()
    assert b == pytest.approx(a, rel=1e-5)  # fp32; the tolerance covers the different reduction order
    assert abs(leaky - b) > 1e-4  # the control: without the restarts, later samples see earlier ones
