"""Generation with a VLM-kit family's model, as methods of :class:`~mmcore.kits.vlm.VLMFamily`:
the evaluate stage and ``mmcore infer``.

* **evaluate**: the export's greedy answers to the held-out prompts (batched, left-padded,
  KV cache), scored by exact match and token F1; per-item results and a report.
* **infer**: ``mmcore infer`` requests encoded as training encoded them, then generated.

Samples with ``batch_apart`` fields (a kind of media the model cannot take beside another)
generate in batches of their own kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from mmcore.framework.context import StageContext
from mmcore.engines.generation import PLACEHOLDERS, ModelSource, Request, empty_evaluation, generation_dtype
from mmcore.engines.download import remote_code
from mmcore.kits.vlm.batches import Batch
from mmcore.kits.vlm.pairs import chosen_view
from mmcore.framework.pack import StageResult
from mmcore.run.rundir import Manifest

if TYPE_CHECKING:
    from mmcore.kits.vlm.family import VLMFamily


class VLMGeneration:
    """The generating methods of :class:`~mmcore.kits.vlm.VLMFamily` (a mixin)."""

    def generation_model(self: "VLMFamily", ctx: StageContext, upstream: Mapping[str, Manifest], source: ModelSource) -> tuple[Any, Path]:
        """(the model in eval mode on the run's device, the folder with its tokenizer and config)."""
        if source.kind == "train":
            folder = upstream["download"].output("model")
            model = self.build_model(folder, source.path)
        else:
            folder = source.path
            model = self.load_exported(folder)
        return model.eval().to(ctx.accelerator.device(), generation_dtype(ctx)), folder

    def generation_inputs(self: "VLMFamily", model: Any, prompts: list[dict[str, Any]], ids: Mapping[str, int]) -> Batch:
        """``generate()`` inputs of prompts (``input_ids`` and media fields): ids left-padded,
        media concatenated in order, the family's own fields added as collation adds them."""
        from mmcore.engines.generation import left_padded

        input_ids, mask = left_padded([p["input_ids"].tolist() for p in prompts], ids["pad_id"])
        batch: Batch = {"input_ids": input_ids, "attention_mask": mask}
        self.add_media(batch, prompts, ids)
        weight = next(model.parameters())
        return {k: v.to(weight.device, weight.dtype if v.is_floating_point() else None) for k, v in batch.items() if k in ("input_ids", "attention_mask", *self.model_inputs, *self.media_fields)}

    def generate(self: "VLMFamily", ctx: StageContext, model: Any, folder: Path, prompts: list[dict[str, Any]], *, what: str) -> tuple[list[list[int]], Any, dict[str, int]]:
        """(generated tokens per prompt, the tokenizer, its token ids), batched as ``generation`` says."""
        from transformers import AutoTokenizer

        from mmcore.engines.generation import generate_tokens, sampling_options

        tokenizer = AutoTokenizer.from_pretrained(folder, **remote_code())
        ids = self.token_ids_of(tokenizer)
        end = tokenizer.convert_tokens_to_ids(self.end_token) if self.end_token else tokenizer.eos_token_id
        cfg = ctx.config.generation
        kinds: dict[tuple[bool, ...], list[int]] = {}
        for i, prompt in enumerate(prompts):  # batch_apart: each kind generates in its own batches
            kinds.setdefault(tuple(name in prompt for name in self.batch_apart), []).append(i)
        tokens: list[list[int]] = [[] for _ in prompts]
        for members in kinds.values():
            generated = generate_tokens(
                model,
                [prompts[i] for i in members],
                lambda chosen: self.generation_inputs(model, chosen, ids),
                length=lambda p: len(p["input_ids"]),
                end_ids=sorted({end, tokenizer.eos_token_id} - {None}),
                pad_id=ids["pad_id"],
                max_new_tokens=cfg.max_new_tokens,
                batch_size=cfg.batch_size,
                options=sampling_options(cfg, ctx.seed),
                progress=lambda groups, total: ctx.progress(groups, total=total, description=what, unit="batch"),
            )
            for i, answer in zip(members, generated):
                tokens[i] = answer
        return tokens, tokenizer, ids

    def infer(self: "VLMFamily", ctx: StageContext, upstream: Mapping[str, Manifest], model: ModelSource, requests: list[Request]) -> list[dict[str, Any]]:
        """Answer each request: its turns encoded as training encoded them, up to the assistant's
        turn, then generated."""
        from transformers import AutoTokenizer

        from mmcore.data.media import MediaError
        from mmcore.data.mllm import Sample, Turn
        from mmcore.engines.generation import context_length

        network, folder = self.generation_model(ctx, upstream, model)
        encoder = self.encoder(ctx, folder, AutoTokenizer.from_pretrained(folder, **remote_code()))
        limit = context_length(network.config)
        prompts: list[dict[str, Any]] = []
        answers: list[dict[str, Any]] = [{} for _ in requests]
        where: list[int] = []
        for i, request in enumerate(requests):
            turns = [Turn(role, text) for role, text in request.turns] or [Turn("user", "")]  # type: ignore[arg-type]
            if not any(p in "".join(t.content for t in turns) for p in PLACEHOLDERS.values()):
                turns[-1] = Turn("user", "".join(PLACEHOLDERS[k] * len(v) for k, v in request.media.items()) + turns[-1].content)
            try:
                encoded = encoder.encode_prompt(Sample(request.where, i, turns, dict(request.media)))
            except (MediaError, ValueError) as exc:
                answers[i] = {"error": " ".join(str(exc).split())}
                continue
            if limit is not None and len(encoded.input_ids) >= limit:  # the model would answer from positions it never learnt
                answers[i] = {"error": f"the prompt is {len(encoded.input_ids)} tokens, the model's context is {limit} (max_position_embeddings in its config.json): shorten it"}
                continue
            prompts.append({"input_ids": torch_tensor(encoded.input_ids), **encoded.tensors})
            where.append(i)
        if prompts:
            tokens, tokenizer, _ = self.generate(ctx, network, folder, prompts, what="infer")
            for i, generated in zip(where, tokens):
                answers[i] = {"text": tokenizer.decode(generated, skip_special_tokens=True).strip()}
        return answers

    def evaluate(self: "VLMFamily", ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        """Greedy answers of the export to the held-out prompts, scored against the references:
        ``accuracy`` (normalised exact match), ``token_f1``, and ``token_accuracy`` (the answer's
        tokens reproduced exactly, what teacher-forced accuracy measures without teacher forcing)."""
        from mmcore.train.causal_lm import answer_span
        from mmcore.engines.generation import ModelSource, answer_scores, write_results
        from mmcore.engines.report import held_out_sources, keep_media, user_text

        items, skipped = self.held_out(ctx, upstream)
        if not items:
            return empty_evaluation(ctx, skipped)
        source = ModelSource("export", upstream["export"].output("model"))
        network, folder = self.generation_model(ctx, upstream, source)
        prompts, references = [], []
        for _, sample in items:
            start, answer = answer_span(sample)
            prompts.append({k: v for k, v in sample.items() if k != "labels"} | {"input_ids": sample["input_ids"][:start]})
            references.append(answer)
        tokens, tokenizer, _ = self.generate(ctx, network, folder, prompts, what="evaluate")
        ends = set(tokenizer.convert_tokens_to_ids([self.end_token]) if self.end_token else []) | {tokenizer.eos_token_id}
        sources, rows = held_out_sources(ctx, upstream, lambda path: held_out_records(path, ctx.config.data)), []
        for (name, _), prompt, answer, generated in zip(items, prompts, references, tokens):
            while answer and answer[-1] in ends:
                answer = answer[:-1]
            reference = tokenizer.decode(answer, skip_special_tokens=True).strip()
            prediction = tokenizer.decode(generated, skip_special_tokens=True).strip()
            said = sources.get(name)  # the user's words and media as written, not the template the model read
            rows.append(
                {
                    "item": name,
                    "prompt": user_text(said.turns) if said else tokenizer.decode(prompt["input_ids"], skip_special_tokens=True).strip()[-300:],
                    "media": keep_media(ctx.stage_dir, [f for files in said.media.values() for f in files]) if said else [],
                    "reference": reference,
                    "prediction": prediction,
                    **answer_scores(prediction, reference),
                    "token_match": float(generated == answer),
                }
            )
        n = len(rows)
        metrics = {
            "items": n,
            "skipped": skipped,
            "accuracy": sum(r["exact_match"] for r in rows) / n,
            "token_f1": sum(r["token_f1"] for r in rows) / n,
            "token_accuracy": sum(r["token_match"] for r in rows) / n,
            **(error_rates(rows) if self.error_rates else {}),
        }
        write_results(
            ctx.stage_dir,
            rows,
            metrics,
            title=f"{ctx.pack}: greedy answers of the export {folder.name}/ to the held-out prompts",
            columns=("item", "prompt", "reference", "prediction", "exact_match", "token_f1", *(("word_errors", "words") if self.error_rates else ())),
            ctx=ctx,
        )
        rates = f", WER {metrics['wer']:.1%}, CER {metrics['cer']:.1%}" if self.error_rates else ""
        note = (
            f"{n} held-out item(s), greedy generate() on the export: accuracy {metrics['accuracy']:.1%} "
            f"(exact tokens {metrics['token_accuracy']:.1%}), token F1 {metrics['token_f1']:.3f}{rates}; report in {ctx.stage_dir / 'report.html'}"
        )
        return StageResult(outputs={"results": "results.jsonl", "metrics": "metrics.json", "report": "report.html"}, metrics=metrics, notes=[note])

    def held_out(self: "VLMFamily", ctx: StageContext, upstream: Mapping[str, Manifest]) -> tuple[list[tuple[str, dict[str, Any]]], int]:
        """(name, encoded sample) of the held-out items, at most ``evaluate.limit``, and how many
        of ``evaluate.datasets`` were bad samples (skipped and counted when the data section says
        ``on_bad_sample: skip``)."""
        import torch
        from transformers import AutoTokenizer

        from mmcore.data.media import MediaError
        from mmcore.data.shards import ShardDataset
        from mmcore.engines.generation import read_held_out

        cfg = ctx.config.evaluate
        if not cfg.datasets:
            data = ShardDataset(upstream["preprocess"].output("dataset")).split("eval")  # pairs: their chosen answers
            return [(data.meta(i).get("source", str(i)), chosen_view(data[i])) for i in range(min(cfg.limit, len(data)))], 0
        folder = upstream["download"].output("model")
        encoder = self.encoder(ctx, folder, AutoTokenizer.from_pretrained(folder, **remote_code()))

        def encode(sample: Any) -> dict[str, Any]:
            encoded = encoder.encode(sample)
            return {"input_ids": torch.tensor(encoded.input_ids), "labels": torch.tensor(encoded.labels), **encoded.tensors}

        return read_held_out(ctx, lambda path: held_out_records(path, ctx.config.data), encode, (MediaError, ValueError))


def error_rates(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Adds each row's word and character errors (case-folded words without punctuation,
    :func:`mmcore.engines.evaluation.word_errors`) and returns the corpus ``wer`` and ``cer``."""
    from mmcore.engines.evaluation import char_errors, word_errors

    totals = [0, 0, 0, 0]
    for row in rows:
        (w, words), (c, chars) = word_errors(row["reference"], row["prediction"]), char_errors(row["reference"], row["prediction"])
        row.update(word_errors=w, words=words, char_errors=c, chars=chars)
        totals = [t + v for t, v in zip(totals, (w, words, c, chars))]
    return {"wer": totals[0] / max(totals[1], 1), "cer": totals[2] / max(totals[3], 1)}


def held_out_records(path: Path, section: Any) -> Any:
    """The raw items of one dataset file as the run read them: samples, or with ``data.ranking``
    each preference pair's prompt and chosen answer (what evaluate scores of a DPO run)."""
    if not getattr(section, "ranking", False):
        from mmcore.data.mllm import read_samples

        return read_samples(path, section)
    from mmcore.train.preference import Pair, read_pairs

    return (item.chosen if isinstance(item, Pair) else item for item in read_pairs(path, section))


def torch_tensor(values: list[int]) -> Any:
    import torch

    return torch.tensor(values, dtype=torch.long)


__all__ = ["VLMGeneration", "error_rates", "held_out_records", "torch_tensor"]
