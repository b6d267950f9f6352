"""The config sections of the training methods beyond SFT: ``training.dpo`` and ``training.grpo``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from mmcore.config.base import Section, Steps


class DpoSection(Section):
    """Direct preference optimisation (``training.method: dpo``) on preference pairs."""

    beta: float = Field(0.1, gt=0, description="Strength of the KL tie to the reference (DPO's beta; the diffusion kit scales it as Diffusion-DPO does, see its docs).")
    sft_weight: float = Field(0.0, ge=0, description="Add this times the chosen answer's mean token NLL to each pair's loss (LLaMA-Factory's pref_ftx).")
    reference: Literal["auto", "precomputed", "adapters_off"] = Field(
        "auto",
        description="The frozen starting weights, never a second copy: adapters_off = the base with the LoRA adapters switched off, precomputed = every pair's reference log-probabilities computed once before the first step; auto = adapters_off with LoRA, else precomputed.",
    )


class GrpoSection(Section):
    """Group relative policy optimisation (``training.method: grpo``, Shao et al. 2024): each
    step samples ``group_size`` answers to each prompt from the model being trained, scores them
    with the reward functions, and raises the likelihood of the answers better than their group's
    mean (clipped policy ratio, optional KL to the reference)."""

    group_size: int = Field(8, ge=2, le=1024, description="Answers sampled per prompt; each answer's advantage is its reward against its group's mean (and std).")
    max_new_tokens: int = Field(64, ge=1, description="Longest sampled answer, in tokens.")
    temperature: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="Sampling temperature of the rollouts (the held-out answers are greedy); the loss scores the answers under the same temperature (logits / temperature), as TRL and verl do.",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the rollouts: keep the smallest set of tokens whose probability reaches top_p.")
    top_k: int = Field(
        0,
        ge=0,
        description="Top-k sampling of the rollouts: only the k likeliest tokens are drawn from (0: all); with a large vocabulary and a young model, what keeps temperature 1 from answering junk.",
    )
    min_p: float = Field(
        0.0, ge=0, lt=1, description="Min-p sampling of the rollouts: drop the tokens less likely than min_p x the likeliest one (0: keep all); cuts a barely-trained model's flat tail."
    )
    rewards: dict[str, float] = Field(
        default_factory=lambda: {"accuracy": 1.0},
        description="Reward function name -> weight; an answer's reward is the weighted sum. Built in: accuracy, exact, format, length, similarity; more from plugins (mmcore_register_rewards; `mmcore list` lists them). A mapping given in a file or on the command line merges into the preset's: weight 0 takes a preset's reward out of the sum (it is still scored and logged).",
    )
    epsilon: float = Field(0.2, gt=0, lt=1, description="Clip range of the policy ratio: 1 - epsilon .. 1 + epsilon (it matters from a rollout's second step, training.grpo.epochs > 1).")
    beta: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="Weight of the KL penalty to the reference (the k3 estimator per token); 0: no penalty and no reference pass. The reference: with training.lora the base with the adapters off; fully fine-tuned, the weights of the first rollout (after warmup_sft_steps), a frozen copy of each process's shards (saved in the stage's grpo-reference/ for a resume).",
    )
    entropy_coef: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="Entropy bonus: each answer token's loss minus this times the policy's next-token entropy there (0: none); keeps a policy from growing so sure that a group's answers are all alike and nothing is learnt (exploration collapse).",
    )
    skip_uniform_groups: bool = Field(
        False,
        description="Leave a group whose answers all got the same reward (advantages 0) out of the update: it teaches nothing and would dilute the token average of the groups that do (DAPO's dynamic sampling, without its resampling). The informative_groups metric is the share kept.",
    )
    epochs: int = Field(1, ge=1, le=64, description="Optimizer steps on each rollout batch: answers are sampled once, then trained on this many steps (the ratio to the sampling policy clipped).")
    loss_averaging: Literal["token", "sequence"] = Field(
        "token",
        description="token: every answer token of the global batch weighs the same (long answers are not diluted); sequence: the mean over each answer's tokens, then over answers (the GRPO paper).",
    )
    scale_rewards: bool = Field(True, description="Divide each advantage by its group's reward std (the GRPO paper); false: the difference from the group's mean only (Dr. GRPO).")
    format_pattern: str = Field(r"<think>.*?</think>\s*<answer>.*?</answer>", description="The `format` reward's regular expression: 1 where a whole answer matches it, else 0.")
    warmup_sft_steps: Steps = Field(
        0, ge=0, description="Supervised steps on the references before the first rollout: a warm start for a base that does not yet answer in the expected form (0: RL from the first step)."
    )
    lr: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="The learning rate of the steps from the first rollout on (after warmup_sft_steps), held constant; none: training.lr_schedule goes on across the switch. On the FLUX demo's slowest seed, 5e-4 from step 400 raised the held-out reward by 0.14 in 75 steps, where the cosine schedule's tail (3e-4 to 3e-5) gave 0.055.",
    )
    fresh_optimizer: bool = Field(
        True,
        description="With warmup_sft_steps: the optimizer's state (Adam's moments and step count) starts afresh at the first rollout. The warm-up's moments are of the supervised loss, whose gradients can be far larger than the policy loss's: carried over, they first push on in the warm-up's direction and then shrink the policy's steps (the FLUX demo: held-out reward 0.82 -> 0.54, where it stayed).",
    )
    eval_prompts: int = Field(64, ge=0, description="Held-out prompts answered (greedily) at every evaluation for the eval/reward and eval/accuracy metrics.")

    @field_validator("rewards")
    @classmethod
    def _some_reward(cls, value: dict[str, float]) -> dict[str, float]:
        if not value or not any(weight != 0 for weight in value.values()):
            raise ValueError("give at least one reward function with a non-zero weight, e.g. {accuracy: 1.0}")
        return value


__all__ = ["DpoSection", "GrpoSection"]
