"""The author's guide and the development notes show code that works with this mmcore: their declaration
and adapter examples are run here, so a change to the SDK that breaks them fails a test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(path: Path, starting: str) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)
    return [b for b in blocks if b.startswith(starting)]


@pytest.mark.parametrize("doc", ["docs/writing-a-pack.md", "docs/development.md"])
def test_the_documented_declaration_is_a_valid_pack_spec(doc: str) -> None:
    from mmcore import PackSpec

    blocks = python_blocks(ROOT / doc, "from mmcore import PackSpec, Stage")
    assert blocks, f"{doc} shows no PackSpec declaration"
    for block in blocks:
        namespace: dict = {}  # type: ignore[type-arg]
        exec(compile(block, doc, "exec"), namespace)
        spec = namespace["pack"]
        assert isinstance(spec, PackSpec) and set(spec.stages) == {"download", "convert", "preprocess", "train", "export", "evaluate", "infer"}
        assert spec.declared("convert").function == "mmcore.engines:convert_stage"


def test_the_documented_adapter_renames_both_ways() -> None:
    import torch

    from mmcore.engines.convert import TensorInfo

    (block,) = python_blocks(ROOT / "docs/writing-a-pack.md", "from mmcore.engines import RenameAdapter")
    namespace: dict = {}  # type: ignore[type-arg]
    exec(compile(block, "writing-a-pack.md", "exec"), namespace)
    adapter = namespace["ADAPTER"]
    info = TensorInfo((2, 2), torch.float32)
    assert list(adapter.to_mm({"language_model.model.norm.weight": info})) == ["model.language_model.norm.weight"]
    assert list(adapter.to_hf({"model.language_model.norm.weight": info, "lm_head.weight": info})) == ["language_model.model.norm.weight"]
