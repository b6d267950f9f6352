"""Ming-Lite-Omni as the VLM kit sees it: the pack's own model class and config (no transformers
class exists), picture patches as media fields, audio clips padded by :func:`~mm_pack_ming.data.
collate_clips`. The kit (:mod:`mmcore.kits.vlm`) does preprocessing, collation, the loss (summed
next-token CE; the engine divides by the step's target tokens: the reference's token mean),
training (FSDP2 units, LoRA) and evaluate / infer through the model's own ``generate``.

The training recipe MindSpeed-MM's Ming example runs (``finetune_vl.py``): the LLM
(``model.*``: decoder and ``lm_head``) trained, the vision tower, the audio encoder and both
projectors frozen: the presets' ``training.freeze``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import Field

from mmcore import Manifest, StageContext
from mmcore.config import RunConfig
from mmcore.data import write_shape_tone_questions
from mmcore.engines import RenameAdapter
from mmcore.kits import VLMFamily, rows_of
from mm_qwen_vision import QwenVisionData

from mm_pack_ming.data import AUDIO_PATCH, EOS, IMAGE_PATCH, collate_clips

# the release's names are the model's: nothing renamed; the talker's tensors are not converted
ADAPTER = RenameAdapter(rules=[], ignore=[r"^talker\."])

# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "vision": ["vision.*"],
    "audio": ["audio.*"],
    "projector": ["linear_proj.*", "linear_proj_audio.*"],
    "llm": ["model.model.*"],
    "lm_head": ["model.lm_head.*"],
}

# LoRA's default layers: the decoder's attention and every expert's projections (routed and
# shared); not the routers.
LORA_TARGETS = ("model.model.layers.*.attention.query_key_value", "model.model.layers.*.attention.dense", "model.model.layers.*.mlp.experts.*.*_proj", "model.model.layers.*.mlp.shared_experts.*_proj")


class MingRunConfig(RunConfig):
    data: QwenVisionData = Field(default_factory=QwenVisionData)


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from mm_pack_ming.config import load_config
    from mm_pack_ming.data import Encoder

    return Encoder(tokenizer, model_dir, ctx.config.data, load_config(model_dir).vision)


def audio_frames(batch: dict[str, Any]) -> float:
    lengths = batch.get("audio_feats_lengths")
    return 0.0 if lengths is None else float(lengths.sum())


class MingFamily(VLMFamily):
    """The kit's family on the pack's own model class and the release's ``config.json``."""

    def config(self, model_dir: Path) -> Any:
        from mm_pack_ming.config import load_config

        return load_config(model_dir)

    def model_type(self, config: Any) -> Any:
        from mm_pack_ming.model import MingOmni

        return MingOmni

    def load_exported(self, folder: Path) -> Any:
        from mmcore.train import with_adapters
        from mm_pack_ming.checkpoint import load_model

        return with_adapters(load_model)(folder)

    def export_side_files(self, model_dir: Path, out: Path) -> None:
        from mmcore.engines import copy_side_files

        copy_side_files(model_dir, out)

    def download(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        """The core's download (hub id, local folder, ``init:tiny`` / ``init:demo``), then the
        release layout checked strictly (:func:`mm_pack_ming.checkpoint.check_layout`)."""
        from mmcore import StageResult
        from mmcore.engines import download_stage
        from mm_pack_ming.checkpoint import build_model, check_layout
        from mm_pack_ming.tiny import build_init_checkpoint

        result = download_stage(ctx, upstream, build_init=build_init_checkpoint)
        folder = Path(result.outputs["model"])
        folder = folder if folder.is_absolute() else ctx.stage_dir / folder
        found = check_layout(build_model(folder, device="meta"), folder)
        kept = sum(1 for k in found if k.startswith("talker."))
        note = f"release layout checked: {len(found)} tensors in {len({f for f, _, _ in found.values()})} file(s), {kept} of them the talker's (kept, not built)"
        return StageResult(outputs=result.outputs, metrics={**result.metrics, "tensors": len(found)}, notes=[*result.notes, note])

    def export(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        from mm_pack_ming.stages import export

        return export(self, ctx, upstream)


FAMILY = MingFamily(
    model_class="MingOmni",
    encoder=encoder,
    adapter=ADAPTER,
    media_fields=("pixel_values", "image_grid_thw"),
    tokens={"image_token_id": IMAGE_PATCH, "audio_token_id": AUDIO_PATCH},
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("vision.blocks", "audio.encoders", "model.model.layers"),
    model_inputs=("audio_feats", "audio_feats_lengths", "audio_token_id"),
    collate_extra=collate_clips,
    towers={"vision": rows_of("pixel_values"), "audio": audio_frames},
    demo=write_shape_tone_questions,
    end_token=EOS,
    packed_attention=False,
    lora_targets=LORA_TARGETS,
    router_aux_loss=False,
)
