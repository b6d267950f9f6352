"""The mmcore SDK: what a pack may import from mmcore, versioned.

A pack declares the SDK version it was written against in ``PackSpec(sdk="1.0")`` and the
mmcore releases it supports in its distribution's requirements (``mmcore>=0.1,<0.2``).
Versions follow semantic versioning on this surface alone: a minor version adds names, a
major version changes or removes them. A pack built for SDK ``M.n`` loads on a core with SDK
``M.k`` where ``k >= n``; otherwise ``mmcore list`` shows it as broken, with the reason.

:data:`SURFACE` is the façade (SDK 1.18+), as ``pytest`` is over ``_pytest``: eight modules a
pack imports from -- the contract (``mmcore``), ``mmcore.config``, ``mmcore.engines``,
``mmcore.train``, ``mmcore.data``, ``mmcore.kits``, ``mmcore.backends.megatron`` and
``mmcore.testing`` -- and the names it may use there. :data:`LEGACY_SURFACE` keeps the SDK 1.0-1.17
module paths working until SDK 2.0. Everything else in mmcore is internal and may change in
any release. The conformance suite (:mod:`mmcore.testing.conformance`) reads a pack's source and
fails on any other import.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Mapping

SDK_VERSION = "1.34"  # what each minor added: docs/sdk-changelog.md

#: SDK 1.0-1.17: the module paths of the flat ``mmcore/`` -> the names a pack may import from
#: each. They keep working (:mod:`mmcore.framework.moved`) and passing this check until SDK 2.0;
# The tables stay as written: one module per line reads better than one name per line.
# fmt: off
#: new code imports the façade, :data:`SURFACE`.
LEGACY_SURFACE: Mapping[str, frozenset[str]] = {
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


#: SDK 1.18+: the façade -> the names a pack may import from it (each façade loads a name's
#: module on first use and never imports torch by itself). Everything else in mmcore is internal.
SURFACE: Mapping[str, frozenset[str]] = {
    # the contract: what a pack declares, what a stage receives and returns, errors, file helpers
    "mmcore": frozenset({
        "BackendSpec", "CHECKPOINT", "ConfigError", "DATASET", "FEATURES", "KernelSpec", "MODEL", "Manifest",
        "MmcoreError", "ON_DEMAND", "PackError", "PackSpec", "RESULTS", "RunConfig", "STAGES", "STAGE_OUTPUTS",
        "Stage", "StageContext", "StageError", "StageResult", "UsageError", "WorldInfo", "__version__",
        "atomic_write_json", "crash_point", "hookimpl", "missing_dependency", "sha256_file", "sha256_json",
        "RewardSpec",
        "read_json_object",  # 1.34
    }),
    # the run configuration a pack extends
    "mmcore.config": frozenset({
        "ConvertSection", "DataSection", "DpoSection", "EvaluateSection", "ExportSection", "ExtractSection",
        "GenerationSection", "LoraSection", "MegatronConvertSection", "MegatronExportSection", "ModelSection",
        "RunConfig", "Section", "TrainingSection",
        "GrpoSection",
    }),
    # the stage engines a pack binds: download, convert, export, evaluate, infer
    "mmcore.engines": frozenset({
        "FusedExpertsAdapter", "InitBuilder", "MODEL_PREFIX", "ModelSource", "PLACEHOLDERS", "Recipe",
        "RenameAdapter", "Request", "SAFE_INDEX", "SafetensorsFolder", "StateDictAdapter", "TensorInfo",
        "answer_scores", "batches", "byte_level_tokenizer", "char_errors", "check_checkpoint_folder",
        "clip_tokenizer", "compare_hf", "convert_stage", "copy_side_files", "coverage_problems", "dcp_index",
        "dcp_to_hf", "download_model", "download_stage", "empty_evaluation", "exact_match", "expected_tensors",
        "export_checked", "generate_tokens", "generation_dtype", "held_out_sources", "hf_to_dcp", "iter_pairs",
        "keep_media", "left_padded", "load_dcp_tensors", "media_kind", "media_problem", "model_from_config",
        "normalize_answer", "normalize_words", "pick_preset", "read_header", "read_held_out", "remote_code",
        "safetensors_files", "sampling_options", "sharded_sums", "token_f1", "train_byte_level_bpe",
        "trained_checkpoint", "unigram_tokenizer", "user_text", "word_errors", "write_results",
        "write_safetensors_streaming",
        "cache_argument", "cached_forward", "DEMO_VAE_FILE", "demo_vae_report", "fit_demo_autoencoder", "set_latent_normalisation", "train_demo_vae", "write_demo_vae_report",
        "load_strictly",
        "train_demo_vae_until",  # 1.27
        "kmeans_codebook",  # 1.28
    }),
    # the train engine and its methods: recipe, sampler, LoRA, DPO, EMA, losses
    "mmcore.train": frozenset({
        "EMA_OUTPUT", "EpochSampler", "LoraPlan", "MovingAverage", "Pair", "ReferenceLogps", "StepFlops",
        "TokenBudgetSampler", "TrainRecipe", "attention_flops", "count_loss_tokens", "decay_at", "dense_flops",
        "diffusers_lora_state", "dpo_terms", "evaluate_accuracy", "freeze", "generate_accuracy", "is_adapter",
        "is_adapter_folder", "load_adapter_folder", "load_converted", "lr_lambda", "merged_state",
        "next_token_loss_sum", "packed_rows", "padded_rows", "parameter_counts", "read_pairs", "reference_mode",
        "refuse_fewer_than_a_step", "reward_sums", "run_training", "sample_seed", "segment_bounds", "sequence_logps",
        "train_stage", "use_packed_attention", "varlen_attention", "with_adapters", "write_peft_adapter",
        "group_advantages", "grpo_terms", "token_logps",
        "loss_of_terms",  # 1.31
    }),
    # data engines: MLLM JSON, chat templates, shards, feature cache, media, synthetic demo data
    "mmcore.data": frozenset({
        "BadJSON", "BadRecord", "BadSample", "BadSamples", "CHATML_TEMPLATE", "COLOURS", "CachedSamples",
        "ChatMLEncoder", "ChatTemplateEncoder", "ChatTemplateError", "Columns", "DemoWriter", "Encoded", "Expander",
        "Failed", "FeatureCache", "FeatureCacheWriter", "Fill", "IGNORE", "KINDS", "MLLMDataSection", "MOVES",
        "MediaError", "PART_TYPES", "PITCHES", "PLACEHOLDERS", "Piece", "Probe", "SHAPES", "SHAPE_TONE_QUESTION",
        "SQUARE_COLOURS", "Sample", "ShardDataset", "ShardWriter", "TONE_RATE", "Turn", "append_fillers",
        "check_pixels", "check_seconds", "choose_bucket", "contact_sheet", "dataset_files", "encode_fillers",
        "frames_at", "held_out", "kinds_by_fields", "kinds_in", "load_audio", "load_image", "load_records",
        "map_in_order", "media_limits", "media_root", "moving_square", "preprocess_captioned_videos",
        "preprocess_conversations", "probe", "read_captions", "read_samples", "resize_crop", "resolve_media",
        "sample_frames", "shape_image", "split_key", "tone_clip", "write_audio", "write_filler_media",
        "write_moving_square_preferences", "write_moving_squares", "write_mp4", "write_shape_preferences",
        "write_shape_questions", "write_shape_tone_questions",
        "MOVING_SHAPES", "SHAPE_COLOURS", "caption_agreement", "moving_shape", "moving_shape_clips", "what_is_drawn", "write_moving_shapes",
        "DIGIT_PACES", "DIGIT_RATE", "DIGIT_WORDS", "digit_pitch", "digits_clip", "digits_wer", "pitch_segments", "transcribe_digits", "write_spoken_digit_clips", "SpokenText", "read_spoken_texts",  # 1.26
        "griffin_lim",  # 1.28
        "MediaKinds",  # 1.32
        "LFR_DEFAULTS", "kaldi_fbank", "lfr_features", "mel_banks", "stack_lfr",  # 1.33
    }),
    # the kits: VLMFamily, DiffusionFamily and what they share
    "mmcore.kits": frozenset({
        "VLMRecipe", "VLMDPORecipe", "VLMGRPORecipe", "VLMMegatronRecipe", "DiffusionRecipe", "DiffusionDPORecipe",
        "DiffusionFamily", "DiffusionTraining", "EVAL_SIGMAS", "EXPERTS", "FLOW_MATCHING", "FlowMatching",
        "FlowMatchingTraining", "GuidanceEmbeddingTraining", "MelClipExpander", "NoiseSchedule", "ProcessorImages",
        "SampleExport", "TINY_SIZES", "TransformersNames", "VLMFamily", "VideoData", "audio_clips", "auto_family",
        "blocks_at", "clip_key", "collate", "collate_mel_clips", "content_key", "denoiser_flops", "diffusion_loss",
        "flow_matching_loss", "guidance_option", "mel_tower_tokens", "pad_clips", "restarting_positions", "rows_of",
        "shrink_config", "sigmas", "text_to_video_sample", "tiny_checkpoint", "use_cached_audio", "with_tail",
        # 1.19: a diffusion family on public diffusers API (mmcore new-pack --from-diffusers)
        "PipelineEncoders", "TINY_COMPONENTS", "latent_token_ids", "normalise_latents", "pack_latents",
        "pipeline_components", "rotary_positions_3d", "tiny_pipeline", "unpack_latents", "vae_compression", "vae_compression_of", "vae_latents",
        # 1.22: Flow-GRPO in the diffusion kit
        "DiffusionGRPORecipe", "FlowGrpoSection", "vae_frames",
        "VideoLatents", "denormalise_latents",  # 1.27: a pack's own pipeline's clips <-> latents
        "OwnFolderModel",  # 1.30
    }),
    # megatron-core (optional extra): a family's Megatron part, its tensor table, MindSpeed-MM checkpoints
    "mmcore.backends.megatron": frozenset({
        "MegatronRecipe", "MegatronPart", "MegatronTable",
        "ADAPTER", "DEFAULT_TARGETS", "LayerStack", "Layout", "MegatronBackend", "MegatronFamily", "ParallelMap",
        "Rule", "SequenceParallelNorm", "TESTED_MINOR", "TRAINED", "adapter_shards", "add_adapters",
        "check_rank_names", "clip_gradients", "copy_rank_state", "even_layers", "export_mindspeed", "fill_rank",
        "forward_backward", "forward_scores", "gather_hub_state", "gpt_model", "grad_norm", "import_mindspeed",
        "init_adapters", "init_model_parallel", "is_checkpoint", "load", "load_rank", "load_rank_state",
        "mark_parallel_weights", "merged_state", "pad_sequence", "padded_vocab", "parallel_lora", "peft_state",
        "rank_sources", "read_checkpoint", "read_stages", "reduce_gradients", "run_megatron_training", "save",
        "scatter_sequence", "sharded_state", "status", "sum_tied_gradients", "vocab_parallel_exact_match",
        "vocab_parallel_loss_sum", "write_adapter", "write_checkpoint", "write_peft", "write_trained",
        "context_multiple", "to_context_rank",  # 1.25: parallel.context_parallel
    }),
    # test helpers, the conformance suite, the crash matrix
    "mmcore.testing": frozenset({
        "PackConformance", "StageCLI", "cache_matches_on_the_fly", "crash_chain", "declined_stages", "differences",
        "diffusion_demo_holds", "losses", "make_config", "make_runner", "plugins_with", "points_for", "preprocessed",
        "run_args", "run_mmcore", "run_nodes", "straight_run",
    }),
    # a VLM-kit pack's packing checks, with the tolerances stated once (1.23)
    "mmcore.testing.packing": frozenset({
        "LOGITS_ATOL", "each_sample_equals_it_alone", "encoded", "packed_copy", "packed_equals_padded",
        "packed_training_matches_padded", "row_and_alone", "stage_losses",
        "mixed_rows",  # 1.24
    }),
    "mmcore.testing.media": frozenset({"write_image", "write_video", "write_audio", "tone", "write_noise", "write_wild_mllm", "write_wild_image_mllm", "write_wild_omni", "write_mixed_mllm", "write_captioned_pictures", "PICTURE_COLOURS"}),
}
# fmt: on


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
                allowed = SURFACE.get(node.module, LEGACY_SURFACE.get(node.module))
                for alias in node.names:
                    if allowed is None:
                        problems.append(f"{path.name}:{node.lineno}: module {node.module} is not part of the mmcore SDK")
                        break
                    if alias.name not in allowed:
                        problems.append(f"{path.name}:{node.lineno}: {node.module}.{alias.name} is not part of the mmcore SDK")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "mmcore" and alias.name not in SURFACE and alias.name not in LEGACY_SURFACE:
                        problems.append(f"{path.name}:{node.lineno}: module {alias.name} is not part of the mmcore SDK")
    return problems


__all__ = ["SDK_VERSION", "SURFACE", "LEGACY_SURFACE", "sdk_problem", "imports_outside_sdk"]
