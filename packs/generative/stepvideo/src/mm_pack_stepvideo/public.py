"""The released transformer as this pack reads and writes it: stepfun-ai/stepvideo-t2v's
``transformer/`` folder (diffusers layout written by the reference's ``StepVideoModel``:
``config.json`` with ``_class_name`` ``StepVideoModel``, ``diffusion_pytorch_model*.safetensors``,
one file or shards with their index), loaded strictly into
:class:`~mm_pack_stepvideo.transformer.StepVideoTransformer3DModel` (the same parameter names).

``python -m mm_pack_stepvideo.public import RELEASE/transformer OUT`` writes ``OUT`` as this
pack's transformer folder; put it as ``transformer/`` of a pipeline folder (see the README).
``python -m mm_pack_stepvideo.public export EXPORT/pipeline/transformer OUT`` writes a trained
transformer back as the release has it: the reference's config fields and class name, the same
tensor names, shapes and dtypes (sharded like diffusers' own, 10 GB a file), which the
reference's ``StepVideoModel.from_pretrained`` and :func:`import_public` read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: config fields of the reference's ``StepVideoModel`` (the rest of a config.json is diffusers' own)
REFERENCE_FIELDS = (
    "num_attention_heads",
    "attention_head_dim",
    "in_channels",
    "out_channels",
    "num_layers",
    "dropout",
    "patch_size",
    "norm_type",
    "norm_elementwise_affine",
    "norm_eps",
    "use_additional_conditions",
    "caption_channels",
    "attention_type",
)


def read_tensors(folder: Path) -> dict[str, Any]:
    """Every tensor of the ``*.safetensors`` files in ``folder`` (one file or shards)."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors files (expected the release's transformer/ folder)")
    return {k: v for f in files for k, v in load_file(f).items()}


def import_public(folder: Path, out: Path) -> Any:
    """The released ``transformer/`` ``folder`` loaded strictly, saved as this pack's model folder ``out``; returns the model."""
    import torch

    from mmcore.engines import load_strictly
    from mm_pack_stepvideo.transformer import StepVideoTransformer3DModel

    config = json.loads((Path(folder) / "config.json").read_text())
    fields = {k: v for k, v in config.items() if k in (*REFERENCE_FIELDS, "rope_split")}
    with torch.device("meta"):
        model = StepVideoTransformer3DModel(**fields)
    load_strictly(model, read_tensors(folder), folder, "the Step-Video transformer its config.json describes", assign=True)
    model.save_pretrained(out)
    return model


def export_public(transformer: Path, out: Path) -> dict[str, Any]:
    """This pack's transformer folder (an export's) as the release's ``transformer/`` folder; returns its tensors."""
    from huggingface_hub import save_torch_state_dict

    config = json.loads((Path(transformer) / "config.json").read_text())
    if config.get("rope_split") not in (None, [64, 32, 32]):
        raise ValueError(f"{transformer}: rope_split {config['rope_split']}: the reference fixes [64, 32, 32] (heads of 128); this model has no released form")
    state = read_tensors(transformer)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_torch_state_dict(state, out, filename_pattern="diffusion_pytorch_model{suffix}.safetensors", max_shard_size="10GB")
    released = {"_class_name": "StepVideoModel", **{k: config[k] for k in REFERENCE_FIELDS if k in config}}
    (out / "config.json").write_text(json.dumps(released, indent=2) + "\n")
    return state


if __name__ == "__main__":  # pragma: no cover - a user's one-off conversion
    verb, *paths = sys.argv[1:]
    (import_public if verb == "import" else export_public)(*map(Path, paths))
