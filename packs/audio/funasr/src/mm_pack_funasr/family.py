"""Fun-ASR-Nano as the VLM kit sees it: a SAN-M audio tower and a Transformer adaptor feeding a
Qwen3 decoder (``FunAsrNanoForConditionalGeneration``), one ``<|object_ref_start|>`` token per
LFR feature row of a clip. The kit (:mod:`mmcore.kits.vlm`) does preprocessing, collation,
loss, training (LoRA, DPO), export, evaluate (with WER and CER: ``error_rates``) and infer.

A stored sample holds its clips' feature rows concatenated (``input_features`` [rows, 560]) and
each clip's row count (``audio_feature_lengths``); a batch carries ``input_features`` [clips,
longest, 560] zero-padded with ``input_features_mask``, as ``FunAsrNanoFeatureExtractor`` pads
a batch. The tower's outputs at valid rows do not depend on the padding (its attention is
masked and its FSMN memory zeroes padded rows), so padded, packed and one-by-one batches agree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from mmcore import StageContext
from mmcore.kits import VLMFamily

from mm_pack_funasr.adapter import ADAPTER
from mm_pack_funasr.demo import write_spoken_digits

# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "audio": ["model.audio_tower.*"],
    "projector": ["model.multi_modal_projector.*"],
    "llm": ["model.language_model.*", "lm_head.*"],
}


def feature_settings(model_dir: Path) -> dict[str, Any]:
    """The folder's ``FunAsrNanoFeatureExtractor`` settings (preprocessor or processor config)."""
    for name, key in (("preprocessor_config.json", None), ("processor_config.json", "feature_extractor")):
        path = model_dir / name
        if path.is_file():
            data = json.loads(path.read_text())
            data = data.get(key, {}) if key else data
            if data:
                return data
    return {}


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from transformers import FunAsrNanoConfig

    from mm_pack_funasr.data import Encoder

    positions = FunAsrNanoConfig.from_pretrained(model_dir).audio_config.max_position_embeddings
    return Encoder(tokenizer, feature_settings(model_dir), ctx.config.data, max_rows=positions - 1)


def collate_lfr_clips(batch: dict[str, Any], samples: list[dict[str, Any]], ids: Mapping[str, int]) -> None:
    """``input_features`` [clips, longest, dim] zero-padded and ``input_features_mask``. A
    sample cut before some of its clips' tokens (evaluate's prompt: the turns before the first
    answer) brings only the clips whose tokens it holds."""
    import torch

    runs, lengths = [], []
    for s in samples:
        if "audio_feature_lengths" not in s:
            continue
        kept, held = [], int((s["input_ids"] == ids["audio_token_id"]).sum()) if "audio_token_id" in ids else None
        for n in s["audio_feature_lengths"].tolist():
            if held is not None and sum(kept) + n > held:
                break
            kept.append(n)
        if kept:
            runs.append(s["input_features"][: sum(kept)])
            lengths.append(torch.tensor(kept))
    if not lengths:
        return
    lengths = torch.cat(lengths)
    flat = torch.cat(runs)
    out = torch.zeros(len(lengths), int(lengths.max()), flat.shape[1])
    for clip, rows in enumerate(torch.split(flat, lengths.tolist())):
        out[clip, : len(rows)] = rows
    batch["audio_feature_lengths"] = lengths
    batch["input_features"] = out
    batch["input_features_mask"] = (torch.arange(int(lengths.max()))[None] < lengths[:, None]).long()


def audio_rows(batch: dict[str, Any]) -> float:
    return float(batch["audio_feature_lengths"].sum()) if "audio_feature_lengths" in batch else 0.0


FAMILY = VLMFamily(
    model_class="FunAsrNanoForConditionalGeneration",
    encoder=encoder,
    adapter=ADAPTER,
    media_fields=(),
    tokens={"audio_token_id": "<|object_ref_start|>"},
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("model.audio_tower.layers", "model.multi_modal_projector.layers", "model.language_model.layers"),
    model_inputs=("input_features", "input_features_mask"),
    collate_extra=collate_lfr_clips,
    towers={"model.audio_tower": audio_rows, "model.multi_modal_projector": audio_rows},
    demo=write_spoken_digits,
    end_token="<|im_end|>",
    error_rates=True,
)
