"""Group relative policy optimisation (GRPO, Shao et al. 2024): the loss of one rollout batch.

A rollout batch holds ``group_size`` sampled answers to each prompt, every answer a row whose
labels are its tokens (``-100`` over the prompt). For answer ``i`` of a group with rewards
``r``, the advantage is ``A_i = (r_i - mean(r)) / (std(r) + 1e-4)`` (std unbiased, as TRL's;
without ``scale`` only the difference). Per answer token ``t``, with ``pi``/``old``/``ref`` the
token's log-probability under the policy, the policy that sampled it and the reference::

    ratio = exp(pi - old)
    loss_t = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) + beta * (exp(ref - pi) - (ref - pi) - 1)

(the KL term is Schulman's k3 estimator, >= 0). With an entropy bonus ``c`` (``entropy_coef``)
each token's loss also has ``- c * H_t``, ``H_t`` the entropy of the policy's whole next-token
distribution at that position: a push against a policy so sure of itself that a group's answers
are all alike (all rewarded alike, so advantages 0 and nothing learnt). ``token`` averaging sums ``loss_t`` over every
answer token of the global batch and divides by their count (the engine's loss unit is the
token); ``sequence`` averaging takes each answer's mean over its tokens, summed over answers
and divided by the answers of the global batch (the unit is the answer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

IGNORE = -100
#: added to a group's reward std before dividing (TRL's value): a group whose rewards are all
#: equal has advantages 0, not 0 / 0
STD_EPS = 1e-4


def group_advantages(rewards: "torch.Tensor", group_size: int, *, scale: bool = True) -> "torch.Tensor":
    """Each answer's reward against its group's: ``rewards`` [groups * group_size], a group's
    answers next to each other."""
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (grouped.std(dim=1, keepdim=True) + STD_EPS)
    return centred.reshape(-1)


def token_logps(logits: "torch.Tensor", labels: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """(log-probability of each next token [rows, T-1], in float32 or float64 where the logits
    are, 1.0 where it is supervised): position ``t`` scores ``labels[:, t + 1]``."""
    import torch
    import torch.nn.functional as F

    target = labels[:, 1:]
    scores = logits[:, :-1]
    scores = scores if scores.dtype == torch.float64 else scores.float()
    logps = -F.cross_entropy(scores.reshape(-1, scores.shape[-1]), target.reshape(-1), ignore_index=IGNORE, reduction="none").view(target.shape)
    return logps, (target != IGNORE).to(logps.dtype)


def token_entropy(logits: "torch.Tensor") -> "torch.Tensor":
    """The entropy of each position's next-token distribution [rows, T-1] (aligned with
    :func:`token_logps`), in float32 or float64 where the logits are."""
    import torch

    scores = logits[:, :-1]
    scores = scores if scores.dtype == torch.float64 else scores.float()
    logp = torch.log_softmax(scores, dim=-1)
    return -(logp.exp() * logp).sum(-1)


@dataclass
class GRPOTerms:
    """One micro-batch's GRPO loss and what it measured (sums, and the counts they are over)."""

    loss_sum: "torch.Tensor"  # summed over the loss units (tokens, or answers with sequence averaging)
    units: int
    kl_sum: "torch.Tensor"  # the k3 estimate (or the given KL), summed over answer tokens
    clipped_sum: "torch.Tensor"  # answer tokens whose clipped branch was taken
    tokens: "torch.Tensor"  # answer tokens
    entropy_sum: "torch.Tensor | None" = None  # the policy's entropy, summed over answer tokens (with an entropy bonus)


def grpo_terms(
    logps: "torch.Tensor",
    mask: "torch.Tensor",
    advantages: "torch.Tensor",
    *,
    old_logps: "torch.Tensor | None" = None,
    ref_logps: "torch.Tensor | None" = None,
    kl: "torch.Tensor | None" = None,
    epsilon: float = 0.2,
    beta: float = 0.0,
    averaging: str = "token",
    entropy: "torch.Tensor | None" = None,
    entropy_coef: float = 0.0,
) -> GRPOTerms:
    """The GRPO loss of rows with per-token ``logps`` [rows, T] (the policy's, with gradients),
    ``mask`` [rows, T] (1 on answer tokens) and one advantage per row. ``old_logps``: the
    sampling policy's (None: the policy's own, detached: the first step on a rollout);
    ``ref_logps``: the reference's (needed where ``beta`` > 0), or instead ``kl`` [rows, T]: each
    unit's KL to the reference where the caller has it exactly (the diffusion kit's Gaussian
    steps, :mod:`mmcore.kits.diffusion.flow_grpo`), in place of the k3 estimate. A row's units
    are its answer tokens, or a generated picture's denoising steps. ``entropy``: the policy's
    per position [rows, T] (:func:`token_entropy`, with gradients; needed where ``entropy_coef`` > 0)."""
    import torch

    old = logps.detach() if old_logps is None else old_logps
    ratio = torch.exp(logps - old)
    adv = advantages.to(logps.dtype).unsqueeze(1)
    unclipped, clipped = ratio * adv, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * adv
    per_token = -torch.min(unclipped, clipped)
    if beta:
        if kl is None:
            if ref_logps is None:
                raise ValueError("beta > 0 needs the reference's log-probabilities")
            delta = ref_logps - logps
            kl = torch.exp(delta) - delta - 1
        per_token = per_token + beta * kl
    else:
        kl = torch.zeros_like(logps)
    if entropy_coef:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the policy's entropy per position")
        per_token = per_token - entropy_coef * entropy
    if averaging == "token":
        loss_sum, units = (per_token * mask).sum(), int(mask.sum().item())
    elif averaging == "sequence":
        loss_sum, units = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum(), logps.shape[0]
    else:
        raise ValueError(f"unknown averaging {averaging!r}: token or sequence")
    took_clip = ((ratio < 1 - epsilon) & (adv < 0)) | ((ratio > 1 + epsilon) & (adv > 0))
    entropy_sum = (entropy.detach() * mask).sum() if entropy is not None else None
    return GRPOTerms(loss_sum, units, (kl.detach() * mask).sum(), (took_clip.to(mask.dtype) * mask).sum(), mask.sum(), entropy_sum)


def answer_span(labels: "torch.Tensor") -> tuple[int, int] | None:
    """``(start, end)`` of the last supervised run of a sample's ``labels`` (its last assistant
    turn: GRPO's reference answer; what comes before is the prompt), None where nothing is."""
    supervised = (labels != IGNORE).nonzero().flatten().tolist()
    if not supervised:
        return None
    end = supervised[-1] + 1
    start = end - 1
    while start > 0 and labels[start - 1] != IGNORE:
        start -= 1
    return start, end


__all__ = ["GRPOTerms", "group_advantages", "grpo_terms", "token_entropy", "token_logps", "answer_span", "STD_EPS"]
