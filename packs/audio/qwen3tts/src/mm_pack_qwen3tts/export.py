"""Export: the trained talker back to the public folder layout (``config.json``,
``model.safetensors`` with the public names, shapes and dtypes, ``speech_tokenizer/`` and the
tokenizer files copied as downloaded), reloaded with the pack's strict loader; the teacher-forced
logits of held-out samples (talker and code predictor) must equal the trained model's.

After LoRA the export is the adapter folder (mmcore's rule; ``export.merge_lora=true`` for the
merged public layout beside it).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping

from mmcore import Manifest, StageContext, StageResult


def side_files(model_dir: Path, out: Path) -> None:
    """Everything but the root weights: config, tokenizer files, and ``speech_tokenizer/`` whole
    (the codec is not trained)."""
    from mmcore.engines import copy_side_files

    copy_side_files(model_dir, out)
    for sub in Path(model_dir).iterdir():
        if sub.is_dir():
            shutil.copytree(sub, out / sub.name, dirs_exist_ok=True)


def load_exported(folder: Path) -> Any:
    from mmcore.train import with_adapters

    from mm_pack_qwen3tts.model import load_pretrained

    return with_adapters(load_pretrained)(Path(folder))


def export(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    from mmcore.data import ShardDataset
    from mmcore.engines import export_checked

    from mm_pack_qwen3tts.adapter import ADAPTER
    from mm_pack_qwen3tts.model import build_model
    from mm_pack_qwen3tts.train import Samples, collate

    data = ShardDataset(upstream["preprocess"].output("dataset"))
    held = Samples(data.split("eval"))
    probe = held if len(held) else Samples(data.split("train"))
    done = export_checked(
        ctx,
        upstream,
        ADAPTER,
        build_trained=build_model,
        load_exported=load_exported,
        probe=collate([probe[i] for i in range(min(4, len(probe)))]),
        logits=lambda model, batch: model(batch)["logits"],
        side_files=side_files,
    )
    dtypes = input_dtypes(Path(upstream["download"].output("model")))
    if ctx.config.export.dtype == "auto" and dtypes - {"F32"}:
        done.notes.append(f"the downloaded weights are {', '.join(sorted(dtypes))}; this export holds the float32 training weights (export.dtype=bfloat16 writes the public dtype)")
    return StageResult(outputs=done.outputs, metrics=done.metrics, notes=done.notes)


def input_dtypes(model_dir: Path) -> set[str]:
    """The safetensors dtypes of the folder's root weights (from the headers)."""
    import json
    import struct

    found = set()
    for path in model_dir.glob("*.safetensors"):
        with open(path, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        found |= {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    return found
