"""Preference optimisation (DPO): pairs of answers, the reference model, the loss.

* **Data**: LLaMA-Factory's ranking datasets (``ranking: true`` there, ``data.ranking`` here):
  a conversation ending with the user's turn plus ``chosen`` and ``rejected`` answers (ShareGPT
  ``conversations`` / ``messages`` with the answers as messages or strings, or the alpaca style
  ``instruction`` / ``input``), with ``images`` / ``videos`` / ``audios`` belonging to the prompt.
  :func:`read_pairs` gives each record as two samples that differ only in the last turn.
* **Reference**: the frozen starting weights, never a second copy of the model. With LoRA the
  base with its adapters switched off (:func:`mmcore.train.lora.adapters_disabled`); otherwise every
  pair's reference log-probabilities computed once, before the first step, with the model the
  engine built (:class:`ReferenceLogps`, kept beside the checkpoints so a resume reuses them).
* **Loss** (Rafailov et al. 2023, sigmoid form): per pair
  ``-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` with ``pi``/``ref`` the summed
  log-probabilities of an answer's tokens under the policy / reference, plus
  ``sft_weight * -pi_c / |c|`` (the chosen answer's mean token NLL) where asked. The engine's
  loss unit is the pair. Rewards are ``beta * (pi - ref)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from mmcore.data.badsamples import BadSample
from mmcore.errors import StageError

if TYPE_CHECKING:
    import torch

    from mmcore.data.mllm import MLLMDataSection, Sample

IGNORE = -100
REFERENCE_FILE = "reference_logps.safetensors"


@dataclass
class Pair:
    """One preference record as two samples: the prompt turns plus each answer."""

    chosen: "Sample"
    rejected: "Sample"

    @property
    def file(self) -> str:
        return self.chosen.file

    @property
    def index(self) -> int:
        return self.chosen.index


# --------------------------------------------------------------------------- data


def _answer(value: Any, field: str, role_key: str, content_key: str, assistant: str) -> dict[str, Any]:
    from mmcore.data.mllm import BadRecord

    if isinstance(value, str):
        text = value
    elif isinstance(value, dict) and isinstance(value.get(content_key), str):
        text = value[content_key]
    else:
        raise BadRecord(f"field {field!r} is missing or is neither a string nor a message with {content_key!r}")
    if not text.strip():
        raise BadRecord(f"field {field!r} is an empty answer")
    return {role_key: assistant, content_key: text}


def read_pairs(path: Path, section: "MLLMDataSection") -> Iterator[Pair | BadSample]:
    """Every preference pair of one dataset file, or a :class:`BadSample` saying what is wrong."""
    from mmcore.data.mllm import PLACEHOLDERS, BadJSON, BadRecord, _parse, open_records

    records, columns, roles, root = open_records(path, section)
    for index, record in enumerate(records):
        if isinstance(record, BadJSON):
            yield BadSample(str(path), index, str(record))
            continue
        try:
            if not isinstance(record, dict):
                raise BadRecord(f"expected an object, got {type(record).__name__}")
            if columns.messages in record:
                prompt = record[columns.messages]
                if not isinstance(prompt, list) or not prompt:
                    raise BadRecord(f"field {columns.messages!r} is not a non-empty list")
                base = dict(record)
            elif isinstance(record.get("instruction"), str):  # alpaca style
                query = record.get("input") or ""
                text = record["instruction"] + ("\n" + query if isinstance(query, str) and query else "")
                prompt = [{columns.role: columns.user_tag, columns.content: text}]
                base = {k: v for k, v in record.items() if k not in ("instruction", "input")}
            else:
                raise BadRecord(f"no prompt: neither {columns.messages!r} nor 'instruction'")
            answers = []
            for field in ("chosen", "rejected"):
                if field not in record:
                    raise BadRecord(f"field {field!r} is missing: a preference pair needs a chosen and a rejected answer")
                answers.append(_answer(record[field], field, columns.role, columns.content, columns.assistant_tag))
            if answers[0][columns.content].strip() == answers[1][columns.content].strip():
                raise BadRecord("chosen and rejected are the same answer")
            for field, answer in zip(("chosen", "rejected"), answers):
                held = [p for p in PLACEHOLDERS.values() if p in answer[columns.content]]
                if held:
                    raise BadRecord(f"the {field} answer holds a {held[0]} placeholder: media belong to the prompt, the same for both answers")
            pair = [_parse(path, index, {**base, columns.messages: [*prompt, answer]}, columns, roles, root) for answer in answers]
        except BadRecord as bad:
            yield BadSample(str(path), index, str(bad))
            continue
        yield Pair(*pair)


# --------------------------------------------------------------------------- log-probabilities


def sequence_logps(logits: "torch.Tensor", labels: "torch.Tensor", segments: "torch.Tensor | None" = None) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(summed log-probability of each sequence's supervised tokens, their counts).

    ``logits`` [rows, T, V] predict the next token: position ``t`` scores ``labels[:, t + 1]``.
    Without ``segments`` each row is a sequence; with them (one packed row), each segment.
    """
    import torch
    import torch.nn.functional as F

    target = labels[:, 1:]
    scores = logits[:, :-1]
    token_logps = -F.cross_entropy(scores.reshape(-1, scores.shape[-1]).float(), target.reshape(-1), ignore_index=IGNORE, reduction="none").view(target.shape)
    mask = (target != IGNORE).to(token_logps.dtype)
    if segments is None:
        return (token_logps * mask).sum(-1), mask.sum(-1)
    # the label at position t + 1 belongs to the segment holding t + 1
    owner = torch.repeat_interleave(torch.arange(len(segments), device=labels.device), segments.to(labels.device))[1:]
    sums = torch.zeros(len(segments), dtype=token_logps.dtype, device=labels.device).index_add(0, owner, (token_logps * mask)[0])
    counts = torch.zeros(len(segments), dtype=token_logps.dtype, device=labels.device).index_add(0, owner, mask[0])
    return sums, counts


def dpo_terms(
    policy_chosen: "torch.Tensor", policy_rejected: "torch.Tensor", ref_chosen: "torch.Tensor", ref_rejected: "torch.Tensor", beta: float
) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """(per-pair sigmoid DPO loss, chosen rewards, rejected rewards)."""
    import torch.nn.functional as F

    chosen_rewards = beta * (policy_chosen - ref_chosen)
    rejected_rewards = beta * (policy_rejected - ref_rejected)
    return -F.logsigmoid(chosen_rewards - rejected_rewards), chosen_rewards.detach(), rejected_rewards.detach()


def reward_sums(chosen_rewards: "torch.Tensor", rejected_rewards: "torch.Tensor") -> dict[str, "torch.Tensor"]:
    """Per-step sums of the DPO metrics over pairs (the engine divides by the step's pairs):
    reward accuracy counts a tie (both rewards equal, as at the start) as half right."""
    margins = chosen_rewards - rejected_rewards
    return {
        "rewards/accuracy": ((margins > 0).float() + 0.5 * (margins == 0).float()).sum(),
        "rewards/chosen": chosen_rewards.sum(),
        "rewards/rejected": rejected_rewards.sum(),
        "rewards/margin": margins.sum(),
    }


class ReferenceLogps:
    """Every pair's reference log-probabilities (chosen, rejected), by split and pair index,
    computed once before the first step and kept in ``<train>/reference_logps.safetensors``."""

    def __init__(self, values: dict[str, "torch.Tensor"]) -> None:
        self.values = values

    def lookup(self, split: str, indices: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        table = self.values[split]
        picked = table[indices.cpu()]
        return picked[:, 0], picked[:, 1]

    @classmethod
    def load_or_compute(cls, folder: Path, splits: dict[str, Any], compute: Any, *, is_main: bool, distributed: bool) -> "ReferenceLogps":
        """Read the file, or compute ``compute(split, data) -> [n, 2]`` for every split (all
        processes run the same forwards), the main process writing the file atomically."""
        import os

        import torch
        from safetensors.torch import load_file, save_file

        path = folder / REFERENCE_FILE
        if path.is_file():
            values = load_file(str(path))
            if set(values) == set(splits) and all(values[k].shape[0] == len(v) for k, v in splits.items()):
                return cls(values)
        values = {split: compute(split, data).detach().to("cpu", torch.float32).contiguous() for split, data in splits.items()}
        if is_main:
            tmp = path.with_name(path.name + ".tmp")
            save_file(values, str(tmp))
            os.replace(tmp, path)
        if distributed:
            import torch.distributed as dist

            dist.barrier()
        return cls(values)


def reference_mode(training: Any) -> str:
    """``training.dpo.reference`` resolved: ``adapters_off`` with LoRA (no modules to save),
    else ``precomputed``."""
    mode = training.dpo.reference
    lora = training.lora.r > 0
    if mode == "auto":
        return "adapters_off" if lora and not training.lora.modules_to_save else "precomputed"
    if mode == "adapters_off" and not lora:
        raise StageError("training.dpo.reference=adapters_off needs LoRA adapters (training.lora.r > 0): the base is the reference")
    if mode == "adapters_off" and training.lora.modules_to_save:
        raise StageError("training.dpo.reference=adapters_off: training.lora.modules_to_save train base modules, so the base is no longer the reference; use precomputed")
    return mode


__all__ = ["Pair", "read_pairs", "sequence_logps", "dpo_terms", "reward_sums", "ReferenceLogps", "reference_mode", "REFERENCE_FILE"]
