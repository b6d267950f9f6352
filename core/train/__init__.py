"""Training: the one loop every pack and backend runs, and what it is made of.

* :mod:`~mmcore.train.loop` — :func:`~mmcore.train.loop.run_training`: setup, step, checkpoint, log.
* :mod:`~mmcore.train.recipe` — :class:`~mmcore.train.recipe.TrainRecipe`, the model's part.
* :mod:`~mmcore.train.sampler` — which samples make each micro-batch, resumable anywhere.
* :mod:`~mmcore.train.optim` — optimizer, freezing, learning-rate schedule.
* :mod:`~mmcore.train.guards` — a non-finite loss or gradient stops the run.
* :mod:`~mmcore.train.progress`, :mod:`~mmcore.train.plot` — the progress line and ``train.png``.
* Methods on top of the loop: :mod:`~mmcore.train.lora`, :mod:`~mmcore.train.preference` (DPO), :mod:`~mmcore.train.grpo` (GRPO),
  :mod:`~mmcore.train.ema`; what losses share: :mod:`~mmcore.train.causal_lm`,
  :mod:`~mmcore.train.attention` (packed attention), :mod:`~mmcore.train.recompute`,
  :mod:`~mmcore.train.flops`.

Where the model lives and how it computes is the backend's (:mod:`mmcore.backends`).
The names of the SDK 1.x module ``mmcore.train`` are importable from here, loaded on first use.
"""

from __future__ import annotations

from mmcore.framework.facade import lazy_exports

#: the SDK names of this façade -> the module that defines each (:mod:`mmcore.sdk`)
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        (
            "Backend",
            "CHECKPOINTS",
            "EpochSampler",
            "HeldOutLog",
            "NonFinite",
            "Prepared",
            "TrainRecipe",
            "build_optimizer",
            "computes_in_bf16",
            "filler_count",
            "freeze",
            "load_converted",
            "lr_lambda",
            "newest_complete",
            "planned_steps",
            "run_training",
            "sample_seed",
            "sampler_notes",
            "step_batches",
            "tower_balance",
            "train_stage",
        ),
        "mmcore.train.loop",
    ),
    **dict.fromkeys(
        (
            "EMA_OUTPUT",
            "MovingAverage",
            "decay_at",
        ),
        "mmcore.train.ema",
    ),
    **dict.fromkeys(
        (
            "LoraPlan",
            "is_adapter",
        ),
        "mmcore.train.lora",
    ),
    **dict.fromkeys(
        (
            "diffusers_lora_state",
            "is_adapter_folder",
            "load_adapter_folder",
            "merged_state",
            "with_adapters",
            "write_peft_adapter",
        ),
        "mmcore.train.lora_export",
    ),
    **dict.fromkeys(
        (
            "Pair",
            "ReferenceLogps",
            "dpo_terms",
            "read_pairs",
            "reference_mode",
            "reward_sums",
            "sequence_logps",
        ),
        "mmcore.train.preference",
    ),
    **dict.fromkeys(("group_advantages", "grpo_terms", "token_logps"), "mmcore.train.grpo"),
    **dict.fromkeys(("loss_of_terms",), "mmcore.train.recipe"),
    **dict.fromkeys(
        (
            "StepFlops",
            "attention_flops",
            "dense_flops",
            "parameter_counts",
        ),
        "mmcore.train.flops",
    ),
    **dict.fromkeys(
        (
            "TokenBudgetSampler",
            "refuse_fewer_than_a_step",
        ),
        "mmcore.train.sampler",
    ),
    **dict.fromkeys(
        (
            "count_loss_tokens",
            "evaluate_accuracy",
            "generate_accuracy",
            "next_token_loss_sum",
            "packed_rows",
            "padded_rows",
        ),
        "mmcore.train.causal_lm",
    ),
    **dict.fromkeys(
        (
            "segment_bounds",
            "use_packed_attention",
            "varlen_attention",
        ),
        "mmcore.train.attention",
    ),
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
