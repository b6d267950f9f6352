"""GRPO for the VLM kit (``training.method: grpo``): :class:`VLMGRPORecipe`, online RL on the
prompts of an SFT dataset with their references.

* **Data**: what preprocess writes for SFT (LLaMA-Factory-style JSON/JSONL, media included):
  a sample's last assistant turn is the reference answer, everything before it the prompt. A
  sample with no assistant turn has nothing to learn from and is refused when read.
* **Rollouts** (:meth:`VLMGRPORecipe.rollout`): on every rank, for its prompts of the step,
  ``group_size`` answers sampled from the model being trained through transformers'
  ``generate()`` (temperature, top-p, ``max_new_tokens``), one call per prompt under its own
  seed from (``run.seed``, step, prompt index): the same answers however the prompts are cut
  into micro-batches and ranks, and after a resume. Rewards (:mod:`mmcore.train.rewards`) score
  the decoded answers; advantages are normalised in each prompt's group.
* **Loss** (:mod:`mmcore.train.grpo`): clipped policy ratio and the k3 KL to the reference (the
  base with the LoRA adapters off; fully fine-tuned, the weights of the first rollout, kept
  frozen beside the model), an optional entropy bonus, token or sequence averaging; each answer a padded row
  with the prompt's media. ``training.grpo.epochs`` > 1 trains on a rollout for that many steps
  (the sampling policy's log-probabilities kept from the rollout).
* **Metrics**: reward mean and std (``reward``, ``reward_std``), each function's mean
  (``rewards/<name>``), ``kl``, ``clip_fraction``, ``answer_tokens``, and the engine's
  ``rollout_share``; held out: greedy answers to ``eval_prompts`` prompts, their mean reward
  and each function's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from mmcore.errors import StageError
from mmcore.framework.context import StageContext
from mmcore.backends.frozen import GrpoReference
from mmcore.kits.vlm.batches import Batch, with_tail
from mmcore.kits.vlm.recipe import VLMRecipe
from mmcore.run.rundir import Manifest
from mmcore.train.rollouts import INDEX, IndexedSamples

if TYPE_CHECKING:
    from mmcore.kits.vlm.family import VLMFamily


class VLMGRPORecipe(VLMRecipe):
    """The train engine's GRPO recipe of ``family`` on the prompts and references preprocess wrote."""

    method = "grpo"
    ulysses = False  # rollouts are padded rows, not split (parallel.ulysses: supervised fine-tuning)

    def __init__(self, family: "VLMFamily", ctx: StageContext, upstream: Mapping[str, Manifest]) -> None:
        from transformers import AutoTokenizer

        from mmcore.engines.download import remote_code
        from mmcore.train.rewards import RewardSet

        super().__init__(family, ctx, upstream)
        cfg = ctx.config.training
        self.settings, self.seed = cfg.grpo, ctx.seed
        self.loss_unit = "tokens" if self.settings.loss_averaging == "token" else "answers"
        self.steps_per_rollout = self.settings.epochs
        self._check(ctx, upstream)
        assert ctx.plugins is not None, "GRPO's rewards come from the registry"
        self.rewards = RewardSet(ctx.plugins.registry, self.settings.rewards, self.settings)
        self.tokenizer = AutoTokenizer.from_pretrained(upstream["download"].output("model"), **remote_code())
        end = self.tokenizer.convert_tokens_to_ids(family.end_token) if family.end_token else None
        self.end_ids = sorted({end, self.tokenizer.eos_token_id} - {None})
        # media placeholders and padding are never an answer's: a sampled image token would ask the tower for an image
        self.suppressed = sorted({int(v) for v in self.ids.values()} - set(self.end_ids))
        self.device = ctx.accelerator.device(ctx.world.local_rank)
        self.generation_batch = ctx.config.generation.batch_size
        self.sums: dict[str, Any] = {}
        self.shown: dict[str, Any] = {}  # the rollout's first group, for rollouts.jsonl
        self.reference = GrpoReference(bool(cfg.lora.r), ctx.stage_dir, ctx.world)
        self.first_rollout = False
        self.updates = 1  # micro-batch updates by this process, counted for the crash tests' kill point

    def _check(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> None:
        from mmcore.train.rollouts import check_rollout_window

        cfg = ctx.config.training
        if ctx.config.parallel.backend != "fsdp2":
            raise StageError(f"training.method=grpo runs on parallel.backend: fsdp2 (not {ctx.config.parallel.backend} yet)")
        if "extract" in upstream:
            raise StageError("training.method=grpo reads the towers live: the feature cache holds single samples (set extract.enabled: false)")
        check_rollout_window(cfg)

    def check(self, index: Mapping[str, Any], ctx: StageContext, upstream: Mapping[str, Manifest]) -> None:
        if index.get("ranking"):
            raise StageError("training.method=grpo learns from prompts with reference answers, not preference pairs (data.ranking): preprocess the prompts without data.ranking")

    def samples(self, split: str) -> Any:
        return IndexedSamples(super().samples(split))

    # -- collation: the SFT batch, and the prompts the rollout answers ---------------------------

    def collate(self, samples: list[dict[str, Any]]) -> Batch:
        return self.collate_filled(samples, [])

    def collate_filled(self, samples: list[dict[str, Any]], fillers: list[dict[str, Any]]) -> Batch:
        bare = [{k: v for k, v in s.items() if k != INDEX} for s in samples]
        batch = self.family.collate(with_tail(bare, fillers), self.ids, pack=self.packing)
        batch["grpo_prompts"] = [self.prompt(s) for s in samples]  # not a tensor: stays on the CPU
        batch["grpo_fillers"] = fillers
        return batch

    # -- the rollout ---------------------------------------------------------------------------

    def rollout(self, ctx: StageContext, model: Any, micro: list[Batch], step: int) -> list[Batch] | None:
        """The answers of the step's prompts, scored and collated as rows (None in the warm-up)."""
        if step < self.settings.warmup_sft_steps:
            return None
        from mmcore.framework.faults import crash_point
        from mmcore.train.loop import sample_seed

        self.first_rollout = step == self.settings.warmup_sft_steps
        out = []
        for batch in micro:
            prompts = batch["grpo_prompts"]
            answers = [self.sample_answers(model, p, sample_seed(self.seed, step, 0, p["index"])) for p in prompts]
            crash_point("grpo-rollout", step + 1)  # the crash tests' kill point: answers sampled, the step not trained
            out.append(self.rows(model, prompts, answers, batch["grpo_fillers"]))
        if ctx.world.is_main and self.shown:
            self.show(ctx, step + 1)
        return out

    def show(self, ctx: StageContext, step: int) -> None:
        """Append the step's first group (prompt, reference, answers, rewards) to ``rollouts.jsonl``
        in the stage folder: what the model answered, to read beside the metrics."""
        import json

        with open(ctx.stage_dir / "rollouts.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps({"step": step, **self.shown}) + "\n")
        self.shown = {}

    def sample_answers(self, model: Any, prompt: dict[str, Any], seed: int) -> list[list[int]]:
        """``group_size`` answers to one prompt, sampled under ``seed`` (the end token kept where drawn)."""
        import torch

        settings = self.settings
        inputs = self.family.generation_inputs(model, [prompt["inputs"]] * settings.group_size, self.ids)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            generated = model.generate(
                **inputs,
                do_sample=True,
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k,
                **({"min_p": settings.min_p} if settings.min_p else {}),
                max_new_tokens=settings.max_new_tokens,
                eos_token_id=self.end_ids,
                pad_token_id=self.ids["pad_id"],
                suppress_tokens=self.suppressed,
            )
        answers = []
        for row in generated[:, inputs["input_ids"].shape[1] :].tolist():
            ends = [k for k, t in enumerate(row) if t in self.end_ids]
            answers.append(row[: ends[0] + 1] if ends else row)
        return answers

    def prompt(self, sample: dict[str, Any]) -> dict[str, Any]:
        """:func:`prompt_of` with the reference and the prompt as text, for the reward functions."""
        prompt = prompt_of(sample)
        prompt["reference"] = self.decode(prompt["reference_ids"])
        prompt["question"] = self.tokenizer.decode(prompt["inputs"]["input_ids"].tolist(), skip_special_tokens=True).strip()
        return prompt

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode([t for t in tokens if t not in self.end_ids], skip_special_tokens=True).strip()

    def rows(self, model: Any, prompts: list[dict[str, Any]], answers: list[list[list[int]]], fillers: list[dict[str, Any]]) -> Batch:
        """Every answer as a row (prompt + answer, labels on the answer), with rewards,
        advantages and, where needed, the sampling policy's and the reference's log-probabilities."""
        import torch

        from mmcore.train.grpo import IGNORE, group_advantages

        settings = self.settings
        texts, references, questions, samples = [], [], [], []
        for prompt, group in zip(prompts, answers):
            for tokens in group:
                ids = prompt["inputs"]["input_ids"].tolist()
                samples.append({**prompt["inputs"], "input_ids": torch.tensor(ids + tokens), "labels": torch.tensor([IGNORE] * len(ids) + tokens)})
                texts.append(self.decode(tokens))
                references.append(prompt["reference"])
                questions.append(prompt["question"])
        totals, each = self.rewards.score(texts, references, questions)
        if not self.shown:
            g = settings.group_size
            self.shown = {"prompt": questions[0], "reference": references[0], "answers": texts[:g], "rewards": totals[:g]}
        rewards = torch.tensor(totals, dtype=torch.float32)
        grouped = rewards.view(-1, settings.group_size)
        advantages = group_advantages(rewards, settings.group_size, scale=settings.scale_rewards)
        informative = grouped.amax(dim=1) > grouped.amin(dim=1)  # a group whose rewards differ: advantages not all 0
        keep = [i for i in range(len(samples)) if informative[i // settings.group_size] or not settings.skip_uniform_groups]
        if not keep:  # nothing to learn here: one answer with no label, so this rank's forward still runs as the others' do
            keep, samples[0] = [0], {**samples[0], "labels": torch.full_like(samples[0]["labels"], IGNORE)}
        batch = self.family.collate(with_tail([samples[i] for i in keep], fillers), self.ids, pack=False)
        batch["advantages"] = advantages[keep]
        batch["num_loss_tokens"] = int((batch["labels"] != IGNORE).sum()) if settings.loss_averaging == "token" else sum(int((samples[i]["labels"] != IGNORE).any()) for i in keep)
        answer_tokens = sum(len(a) for group in answers for a in group)
        n = float(len(samples))
        self.add("informative_groups", informative.sum(), float(len(informative)))
        self.add("reward", rewards.sum(), n)
        self.add("reward_std", grouped.std(dim=1).sum(), float(grouped.shape[0]))
        for name, values in each.items():
            self.add(f"rewards/{name}", torch.tensor(values).sum(), n)
        self.add("answer_tokens", float(answer_tokens), n)
        on_device = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        if settings.epochs > 1:
            batch["old_logps"] = self.logps(model, on_device)[0].cpu()
        if settings.beta > 0:
            with self.reference.of(model, self.first_rollout):
                batch["ref_logps"] = self.logps(model, on_device)[0].cpu()
        return batch

    # -- the loss ------------------------------------------------------------------------------

    def logps(self, model: Any, batch: Batch, entropy: bool = False) -> tuple[Any, Any, Any]:
        """Each answer token's log-probability, the answer mask and (where asked) the policy's entropy per position."""
        from mmcore.train.grpo import token_entropy, token_logps

        # the distribution the answers were sampled from, as TRL and verl score them: a temperature
        # of 0.3 samples from softmax(logits / 0.3), and that is the policy whose ratio and KL count
        logits = self.family.forward_logits(model, batch) / self.settings.temperature
        return (*token_logps(logits, batch["labels"]), token_entropy(logits) if entropy else None)

    def loss(self, model: Any, batch: Batch) -> Any:
        if "advantages" not in batch:  # a warm-up step: the supervised loss on the references
            return super().loss(model, batch)
        from mmcore.framework.faults import crash_point
        from mmcore.train.grpo import grpo_terms

        settings = self.settings
        logps, mask, entropy = self.logps(model, batch, entropy=settings.entropy_coef > 0)
        terms = grpo_terms(
            logps,
            mask,
            batch["advantages"],
            old_logps=batch.get("old_logps"),
            ref_logps=batch.get("ref_logps"),
            epsilon=settings.epsilon,
            beta=settings.beta,
            averaging=settings.loss_averaging,
            entropy=entropy,
            entropy_coef=settings.entropy_coef,
        )
        crash_point("grpo-update", self.updates)  # the crash tests' kill point: in an update's forward
        self.updates += 1
        self.add("kl", terms.kl_sum, terms.tokens)
        self.add("clip_fraction", terms.clipped_sum, terms.tokens)
        if terms.entropy_sum is not None:
            self.add("entropy", terms.entropy_sum, terms.tokens)
        return terms.loss_sum

    def add(self, name: str, total: Any, count: Any) -> None:
        old = self.sums.get(name, (0.0, 0.0))
        self.sums[name] = (old[0] + float(total), old[1] + float(count))

    def step_metrics(self) -> dict[str, Any]:
        sums, self.sums = self.sums, {}
        return sums

    # -- held out ------------------------------------------------------------------------------

    def evaluate(self, ctx: StageContext, model: Any, step: int) -> dict[str, float]:
        """Greedy answers to the first ``eval_prompts`` held-out prompts (split across ranks):
        their mean reward (``reward``) and each function's (``rewards/<name>``)."""
        import torch
        import torch.distributed as dist

        from mmcore.backends.fsdp2 import local_forwards
        from mmcore.engines.generation import generate_tokens

        held = self.held_split[0]
        count = min(self.settings.eval_prompts, len(held))
        if not count:
            return {}
        world = ctx.world
        mine = [self.prompt(held[i]) for i in range(world.rank, count, world.world_size)]
        names = list(self.rewards.functions)
        sums = torch.zeros(2 + len(names), dtype=torch.float64)
        with local_forwards(model):  # every rank gathers and reshards alike, with prompts or not
            tokens = (
                generate_tokens(
                    model,
                    mine,
                    lambda chosen: self.family.generation_inputs(model, [p["inputs"] for p in chosen], self.ids),
                    length=lambda p: len(p["inputs"]["input_ids"]),
                    end_ids=self.end_ids,
                    pad_id=self.ids["pad_id"],
                    max_new_tokens=self.settings.max_new_tokens,
                    batch_size=self.generation_batch,
                    options={"suppress_tokens": self.suppressed},
                )
                if mine
                else []
            )
        if mine:
            totals, each = self.rewards.score([self.decode(t) for t in tokens], [p["reference"] for p in mine], [p["question"] for p in mine])
            sums[0], sums[1] = sum(totals), len(mine)
            for k, name in enumerate(names):
                sums[2 + k] = sum(each[name])
        if world.distributed:
            sums = sums.to(self.device)
            dist.all_reduce(sums)
        values = sums.tolist()
        return {"reward": values[0] / values[1], **{f"rewards/{name}": values[2 + k] / values[1] for k, name in enumerate(names)}}


def prompt_of(sample: dict[str, Any]) -> dict[str, Any]:
    """A stored sample cut at its last assistant turn: ``inputs`` (the prompt's ids and media,
    what ``generation_inputs`` takes), ``reference_ids`` (the answer's tokens, its end token
    included) and ``index`` (the sample's, for its seed)."""
    from mmcore.train.grpo import answer_span

    span = answer_span(sample["labels"])
    if span is None:
        raise StageError(f"training.method=grpo: sample {sample.get(INDEX)} has no assistant turn to take the reference answer from")
    start, end = span
    inputs = {k: v for k, v in sample.items() if k not in ("input_ids", "labels", INDEX)}
    inputs["input_ids"] = sample["input_ids"][:start]
    return {"inputs": inputs, "reference_ids": sample["input_ids"][start:end].tolist(), "index": sample.get(INDEX, -1)}


__all__ = ["VLMGRPORecipe", "IndexedSamples", "prompt_of"]
