"""The mmcore SDK: what a pack may import from mmcore, versioned.

A pack declares the SDK version it was written against in ``PackSpec(sdk="1.0")`` and the
mmcore releases it supports in its distribution's requirements (``mmcore>=0.1,<0.2``).
Versions follow semantic versioning on this surface alone: a minor version adds names, a
major version changes or removes them. A pack built for SDK ``M.n`` loads on a core with SDK
``M.k`` where ``k >= n``; otherwise ``mmcore list`` shows it as broken, with the reason.

:data:`SURFACE` lists every module a pack may import from and the names it may use there.
Everything else in mmcore is internal and may change in any release. The conformance suite
(:mod:`mmcore.testing.conformance`) reads a pack's source and fails on any other import.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Mapping

SDK_VERSION = "1.17"  # what each minor added: docs/sdk-changelog.md

#: module -> the names a pack may import from it. ``"*"`` would mean every public name; no
#: module uses it, so that a new helper joins the SDK only by being listed here.
SURFACE: Mapping[str, frozenset[str]] = {
    "mmcore": frozenset({
        "__version__", "hookimpl", "STAGES", "PackSpec", "Stage", "StageResult", "StageContext", "WorldInfo",
        "RunConfig", "KernelSpec", "BackendSpec", "Manifest", "MmcoreError", "ConfigError", "UsageError",
        "PackError", "StageError",
    }),
    "mmcore.pack": frozenset({"STAGES", "PackSpec", "Stage", "StageResult", "STAGE_OUTPUTS", "ON_DEMAND", "MODEL", "CHECKPOINT", "DATASET", "FEATURES", "RESULTS"}),
    "mmcore.errors": frozenset({"MmcoreError", "ConfigError", "UsageError", "PackError", "StageError", "missing_dependency"}),
    "mmcore.context": frozenset({"StageContext", "WorldInfo"}),
    "mmcore.rundir": frozenset({"Manifest"}),
    "mmcore.registry": frozenset({"KernelSpec", "BackendSpec"}),
    "mmcore.config": frozenset({"RunConfig", "Section", "ModelSection", "DataSection", "TrainingSection", "ExportSection", "ExtractSection", "ConvertSection", "EvaluateSection", "GenerationSection", "LoraSection", "DpoSection",
                                "MegatronConvertSection", "MegatronExportSection"}),
    # Megatron's layout: a family's HF <-> Megatron table, MindSpeed-MM checkpoints
    "mmcore.parallel_map": frozenset({"Rule", "LayerStack", "ParallelMap", "even_layers"}),
    "mmcore.mindspeed_mm": frozenset({"write_checkpoint", "read_checkpoint", "read_stages", "is_checkpoint", "export_mindspeed", "import_mindspeed"}),
    # megatron-core models (optional extra): build, train, checkpoint, LoRA
    "mmcore.megatron": frozenset({"status", "TESTED_MINOR"}),
    "mmcore.megatron.gpt": frozenset({"init_model_parallel", "padded_vocab", "gpt_model", "SequenceParallelNorm", "pad_sequence", "scatter_sequence", "load_rank_state", "check_rank_names", "copy_rank_state", "mark_parallel_weights"}),
    "mmcore.megatron.train": frozenset({"forward_backward", "forward_scores", "vocab_parallel_loss_sum", "vocab_parallel_exact_match", "reduce_gradients", "sum_tied_gradients", "grad_norm", "clip_gradients"}),
    "mmcore.megatron.checkpoint": frozenset({"sharded_state", "save", "load"}),
    "mmcore.megatron.engine": frozenset({"MegatronFamily", "MegatronBackend", "Layout", "TRAINED", "ADAPTER", "write_adapter", "run_megatron_training", "rank_sources", "load_rank", "fill_rank", "gather_hub_state", "write_trained"}),
    "mmcore.megatron.lora": frozenset({"DEFAULT_TARGETS", "parallel_lora", "add_adapters", "init_adapters", "adapter_shards", "merged_state", "peft_state", "write_peft"}),
    "mmcore.preference": frozenset({"Pair", "read_pairs", "sequence_logps", "dpo_terms", "reward_sums", "ReferenceLogps", "reference_mode"}),
    "mmcore.lora": frozenset({"LoraPlan", "with_adapters", "load_adapter_folder", "is_adapter_folder", "merged_state", "write_peft_adapter", "diffusers_lora_state", "is_adapter"}),
    # engines: the stages a pack binds to its parts
    "mmcore.hub": frozenset({"download_stage", "download_model", "InitBuilder", "remote_code", "check_checkpoint_folder"}),
    "mmcore.convert": frozenset({
        "convert_stage", "StateDictAdapter", "RenameAdapter", "FusedExpertsAdapter", "Recipe", "TensorInfo", "SafetensorsFolder", "MODEL_PREFIX",
        "SAFE_INDEX", "hf_to_dcp", "dcp_to_hf", "dcp_index", "load_dcp_tensors", "copy_side_files", "compare_hf", "iter_pairs",
        "read_header", "safetensors_files", "write_safetensors_streaming", "expected_tensors", "coverage_problems", "model_from_config",
    }),
    "mmcore.train": frozenset({"train_stage", "run_training", "TrainRecipe", "load_converted", "EpochSampler", "freeze", "lr_lambda", "sample_seed"}),
    "mmcore.export": frozenset({"export_checked", "trained_checkpoint"}),
    "mmcore.ema": frozenset({"EMA_OUTPUT", "MovingAverage", "decay_at"}),
    "mmcore.causal_lm": frozenset({"count_loss_tokens", "evaluate_accuracy", "generate_accuracy", "next_token_loss_sum", "packed_rows", "padded_rows"}),
    "mmcore.evaluation": frozenset({"word_errors", "char_errors", "sharded_sums", "normalize_words"}),
    "mmcore.generation": frozenset({
        "Request", "ModelSource", "PLACEHOLDERS", "answer_scores", "empty_evaluation", "read_held_out", "batches", "exact_match", "generate_tokens", "generation_dtype", "left_padded",
        "media_problem", "normalize_answer", "sampling_options", "token_f1", "write_results",
    }),
    "mmcore.tiny": frozenset({"train_byte_level_bpe", "byte_level_tokenizer", "pick_preset", "unigram_tokenizer", "clip_tokenizer"}),
    "mmcore.io": frozenset({"atomic_write_json", "sha256_file", "sha256_json"}),
    # evaluate reports (1.17): report.html with the items' media, for a pack writing its own evaluate
    "mmcore.report": frozenset({"held_out_sources", "keep_media", "media_kind", "user_text", "write_results"}),
    "mmcore.faults": frozenset({"crash_point"}),
    "mmcore.data.workers": frozenset({"Failed", "map_in_order"}),
    # data: shards, feature cache, media, conversations
    "mmcore.data.shards": frozenset({"ShardDataset", "ShardWriter", "held_out", "split_key"}),
    "mmcore.data.fillers": frozenset({"KINDS", "Fill", "append_fillers", "encode_fillers", "kinds_by_fields", "kinds_in", "write_filler_media"}),
    "mmcore.sampler": frozenset({"EpochSampler", "TokenBudgetSampler", "refuse_fewer_than_a_step"}),
    "mmcore.data.feature_cache": frozenset({"FeatureCacheWriter", "FeatureCache", "CachedSamples"}),
    "mmcore.data.clips": frozenset({"preprocess_captioned_videos"}),
    "mmcore.kits": frozenset({"blocks_at"}),
    "mmcore.kits.diffusion": frozenset({"DiffusionFamily", "VideoData", "DiffusionTraining", "FlowMatchingTraining", "GuidanceEmbeddingTraining", "guidance_option", "text_to_video_sample", "SampleExport", "sigmas", "flow_matching_loss",
                                       "diffusion_loss", "FlowMatching", "NoiseSchedule", "FLOW_MATCHING", "EXPERTS", "content_key", "collate", "denoiser_flops", "EVAL_SIGMAS"}),
    "mmcore.data.badsamples": frozenset({"BadSample", "BadSamples"}),
    "mmcore.data.media": frozenset({"MediaError", "media_limits", "check_pixels", "check_seconds"}),
    "mmcore.data.video": frozenset({"MediaError", "Probe", "write_mp4", "contact_sheet", "load_image", "probe", "choose_bucket", "resize_crop", "sample_frames", "frames_at"}),
    "mmcore.data.audio": frozenset({"MediaError", "load_audio", "write_audio"}),
    "mmcore.data.captions": frozenset({"read_captions"}),
    "mmcore.data.synthetic": frozenset({"COLOURS", "SHAPES", "shape_image", "write_shape_questions", "write_shape_preferences",
                                        "PITCHES", "SHAPE_TONE_QUESTION", "TONE_RATE", "tone_clip", "write_shape_tone_questions",
                                        "SQUARE_COLOURS", "MOVES", "moving_square", "write_moving_squares", "write_moving_square_preferences"}),
    "mmcore.kits.auto": frozenset({"TransformersNames", "ProcessorImages", "auto_family", "tiny_checkpoint", "shrink_config", "TINY_SIZES"}),
    "mmcore.data.mllm": frozenset({"MLLMDataSection", "BadJSON", "BadRecord", "Columns", "Sample", "Turn", "PLACEHOLDERS", "load_records", "media_root", "read_samples", "resolve_media"}),
    "mmcore.data.chatml": frozenset({"IGNORE", "ChatMLEncoder", "CHATML_TEMPLATE", "Encoded", "Piece", "Expander"}),
    "mmcore.kits.vlm": frozenset({"VLMFamily", "restarting_positions", "rows_of", "with_tail"}),
    "mmcore.kits.mel_audio": frozenset({"MelClipExpander", "collate_mel_clips", "pad_clips", "mel_tower_tokens", "audio_clips", "clip_key", "use_cached_audio"}),
    "mmcore.flops": frozenset({"parameter_counts", "dense_flops", "attention_flops", "StepFlops"}),
    "mmcore.attention": frozenset({"varlen_attention", "use_packed_attention", "segment_bounds"}),
    "mmcore.data.chat_template": frozenset({"IGNORE", "PART_TYPES", "ChatTemplateEncoder", "ChatTemplateError", "Encoded", "Piece", "Expander"}),
    "mmcore.data.conversations": frozenset({"preprocess_conversations", "dataset_files", "DemoWriter"}),
    "mmcore.testing": frozenset({"plugins_with", "make_config", "make_runner", "StageCLI", "run_nodes", "cache_matches_on_the_fly", "diffusion_demo_holds"}),
    "mmcore.testing.conformance": frozenset({"PackConformance"}),
    "mmcore.testing.crash": frozenset({"crash_chain", "straight_run", "differences", "points_for", "declined_stages", "losses", "run_args", "run_mmcore"}),
}


def sdk_problem(pack_sdk: str, core_sdk: str = SDK_VERSION) -> str | None:
    """Why a pack written for SDK ``pack_sdk`` cannot load on this core, or None if it can."""
    try:
        want = tuple(int(part) for part in pack_sdk.split("."))
        have = tuple(int(part) for part in core_sdk.split("."))
    except ValueError:
        return f"its SDK version {pack_sdk!r} is not MAJOR.MINOR"
    if len(want) != 2:
        return f"its SDK version {pack_sdk!r} is not MAJOR.MINOR"
    if want[0] != have[0]:
        return f"it was written for mmcore SDK {pack_sdk}, this mmcore provides SDK {core_sdk} (major versions differ)"
    if want[1] > have[1]:
        return f"it needs mmcore SDK {pack_sdk}, this mmcore provides only {core_sdk}; upgrade mmcore"
    return None


def imports_outside_sdk(package_dir: Path) -> list[str]:
    """Every ``import mmcore...`` in the ``.py`` files under ``package_dir`` that is not in
    :data:`SURFACE`, as ``"file:line: what"`` lines."""
    problems = []
    for path in sorted(package_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "mmcore":
                allowed = SURFACE.get(node.module)
                for alias in node.names:
                    if allowed is None:
                        problems.append(f"{path.name}:{node.lineno}: module {node.module} is not part of the mmcore SDK")
                        break
                    if alias.name not in allowed:
                        problems.append(f"{path.name}:{node.lineno}: {node.module}.{alias.name} is not part of the mmcore SDK")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "mmcore" and alias.name not in SURFACE:
                        problems.append(f"{path.name}:{node.lineno}: module {alias.name} is not part of the mmcore SDK")
    return problems


__all__ = ["SDK_VERSION", "SURFACE", "sdk_problem", "imports_outside_sdk"]
