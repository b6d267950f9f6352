"""The download stage: mmcore's ``download_stage`` (``init:tiny``, a local folder, a hub id; the
safetensors headers and index checked), then the folder checked as a Qwen3-TTS one: a
``qwen3_tts`` config.json, root weights (the talker's; ``speech_tokenizer/`` holds safetensors
too, which the generic check accepts alone) and ``speech_tokenizer/config.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from mmcore import StageError, StageResult


def download(ctx: Any, upstream: Mapping[str, Any]) -> StageResult:
    from mmcore.engines import download_stage

    from mm_pack_qwen3tts.config import CheckpointError, read_config
    from mm_pack_qwen3tts.tiny import build_init_checkpoint

    result = download_stage(ctx, upstream, build_init=build_init_checkpoint, subfolders=("speech_tokenizer",))
    folder = Path(result.outputs["model"])
    folder = folder if folder.is_absolute() else ctx.stage_dir / folder
    if ctx.world.is_local_main:
        try:
            cfg = read_config(folder)
        except CheckpointError as exc:
            raise StageError(str(exc)) from None
        if not any(folder.glob("*.safetensors")):
            raise StageError(f"{folder}: no model.safetensors (the talker's weights) at the top of the folder")
        if not (folder / "speech_tokenizer" / "config.json").is_file():
            raise StageError(f"{folder}: no speech_tokenizer/config.json (the 12 Hz codec)")
        result.notes.append(f"a Qwen3-TTS folder ({cfg.get('tts_model_type')}, {cfg.get('tts_model_size')}): config.json, model.safetensors, speech_tokenizer/")
    return result
