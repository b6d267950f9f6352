"""The stage engines a pack binds to its parts: download, convert, export, evaluate, infer.

* :mod:`~mmcore.engines.download` — a hub id, a local folder, or ``init:<preset>`` random
  weights (:mod:`~mmcore.engines.tiny`: tokenizers for those, built offline).
* :mod:`~mmcore.engines.convert` — Hugging Face safetensors <-> DCP, streamed; its rules per
  family are :mod:`~mmcore.engines.state_dict` adapters, its key check
  :mod:`~mmcore.engines.coverage`.
* :mod:`~mmcore.engines.export` — trained DCP -> Hugging Face folder, then proof.
* :mod:`~mmcore.engines.evaluation`, :mod:`~mmcore.engines.generation`,
  :mod:`~mmcore.engines.report` — held-out evaluation, batched decoding, ``report.html``.
* :mod:`~mmcore.engines.infer` — ``mmcore infer``, outside the pipeline.

The train engine is its own folder, :mod:`mmcore.train`.
"""

from __future__ import annotations

from mmcore.framework.facade import lazy_exports

#: the SDK names of this façade -> the module that defines each (:mod:`mmcore.sdk`)
_EXPORTS: dict[str, str] = {
    "load_strictly": "mmcore.engines.coverage",
    **dict.fromkeys(
        (
            "DEMO_VAE_FILE",
            "demo_vae_report",
            "fit_demo_autoencoder",
            "kmeans_codebook",
            "set_latent_normalisation",
            "train_demo_vae",
            "train_demo_vae_until",
            "write_demo_vae_report",
        ),
        "mmcore.engines.demo_vae",
    ),
    **dict.fromkeys(
        (
            "FusedExpertsAdapter",
            "MODEL_PREFIX",
            "Recipe",
            "RenameAdapter",
            "SAFE_INDEX",
            "SafetensorsFolder",
            "StateDictAdapter",
            "TensorInfo",
            "compare_hf",
            "convert_stage",
            "copy_side_files",
            "coverage_problems",
            "dcp_index",
            "dcp_to_hf",
            "expected_tensors",
            "hf_to_dcp",
            "iter_pairs",
            "load_dcp_tensors",
            "model_from_config",
            "read_header",
            "safetensors_files",
            "write_safetensors_streaming",
        ),
        "mmcore.engines.convert",
    ),
    **dict.fromkeys(
        (
            "InitBuilder",
            "check_checkpoint_folder",
            "download_model",
            "download_stage",
            "remote_code",
        ),
        "mmcore.engines.download",
    ),
    **dict.fromkeys(
        (
            "ModelSource",
            "PLACEHOLDERS",
            "Request",
            "answer_scores",
            "batches",
            "empty_evaluation",
            "exact_match",
            "generate_tokens",
            "generation_dtype",
            "left_padded",
            "media_problem",
            "normalize_answer",
            "read_held_out",
            "sampling_options",
            "token_f1",
        ),
        "mmcore.engines.generation",
    ),
    **dict.fromkeys(("cache_argument", "cached_forward"), "mmcore.engines.kv_cache"),
    **dict.fromkeys(
        (
            "byte_level_tokenizer",
            "clip_tokenizer",
            "pick_preset",
            "train_byte_level_bpe",
            "unigram_tokenizer",
        ),
        "mmcore.engines.tiny",
    ),
    **dict.fromkeys(
        (
            "char_errors",
            "normalize_words",
            "sharded_sums",
            "word_errors",
        ),
        "mmcore.engines.evaluation",
    ),
    **dict.fromkeys(
        (
            "export_checked",
            "trained_checkpoint",
        ),
        "mmcore.engines.export",
    ),
    **dict.fromkeys(
        (
            "held_out_sources",
            "keep_media",
            "media_kind",
            "user_text",
            "write_results",
        ),
        "mmcore.engines.report",
    ),
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
