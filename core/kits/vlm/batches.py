"""What the VLM kit does with samples and batches, as methods of :class:`~mmcore.kits.vlm.VLMFamily`:
the token ids, collation (right-padded rows, or packed ones), the model's forward on a batch,
the summed loss, the modules FSDP shards, the FLOPs of a step and which samples batch apart.

* **collate**: right-padded rows, or with ``training.packing`` one row of samples back to back
  (``segments``) with restarting positions (``packed_positions`` where the family's positions
  are not 1-D, e.g. M-RoPE); every ``media_fields`` tensor concatenated in sample order.
* **loss**: summed next-token loss, plus a mixture of experts' load-balancing loss
  (``router_aux_loss``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from mmcore.train.causal_lm import count_loss_tokens, next_token_loss_sum, packed_rows, padded_rows
from mmcore.kits import blocks_at
from mmcore.kits.vlm.pairs import chosen_view

if TYPE_CHECKING:
    from mmcore.kits.vlm.family import VLMFamily

Batch = dict[str, Any]
#: ``(batch, samples, ids) -> None``: the family's own fields, added to a collated batch in place
CollateExtra = Callable[[Batch, list[dict[str, Any]], Mapping[str, int]], None]


class VLMBatches:
    """The batch methods of :class:`~mmcore.kits.vlm.VLMFamily` (a mixin: the fields are the family's)."""

    # -- token ids ---------------------------------------------------------------------------

    def token_ids_of(self: "VLMFamily", tokenizer: Any) -> dict[str, int]:
        """``pad_id`` and the ids of ``tokens``, from the tokenizer (what preprocess records)."""
        return {"pad_id": tokenizer.pad_token_id, **{key: tokenizer.convert_tokens_to_ids(token) for key, token in self.tokens.items()}}

    def token_ids(self: "VLMFamily", data: Any) -> dict[str, int]:
        """The ids preprocess recorded in the dataset index (``pad_id`` and ``tokens``)."""
        return {key: int(data.index[key]) for key in ("pad_id", *self.tokens)}

    # -- batches -----------------------------------------------------------------------------

    def collate(self: "VLMFamily", samples: list[dict[str, Any]], ids: Mapping[str, int], pack: bool = False) -> Batch:
        """Token rows plus every media field concatenated in sample order (as processors do).

        Rows are right-padded, or with ``pack`` one row without padding whose ``segments``
        keep the samples' lengths. The first token of every sample is never supervised: no
        loss crosses samples.
        """
        batch = packed_rows(samples, dict(self.packed_counts)) if pack else padded_rows(samples, ids["pad_id"])
        self.add_media(batch, samples, ids)
        batch["num_loss_tokens"] = count_loss_tokens(batch["labels"])
        return batch

    def add_media(self: "VLMFamily", batch: Batch, samples: list[dict[str, Any]], ids: Mapping[str, int]) -> None:
        """Every media field of ``samples`` concatenated in sample order (as processors do), then
        the family's own fields (``collate_extra``), into ``batch``."""
        import torch

        for name in self.media_fields:
            parts = [s[name] for s in samples if name in s]
            if parts:
                batch[name] = torch.cat(parts)
        if self.collate_extra is not None:
            self.collate_extra(batch, samples, ids)

    def group_of(self: "VLMFamily", data: Any) -> Callable[[int], tuple[bool, ...]]:
        """``sample index -> which of batch_apart's fields it has`` (from the dataset index,
        where preprocess recorded the sample's media fields; else from the sample)."""

        def key(i: int) -> tuple[bool, ...]:
            if not self.batch_apart:
                return ()
            media = data.meta(i).get("media")
            present = set(media) if media is not None else set(data[i])
            return tuple(name in present for name in self.batch_apart)

        return key

    def tower_tokens(self: "VLMFamily", sample: dict[str, Any], ids: Mapping[str, int]) -> float:
        """Tokens through the towers (``towers``) of one stored sample (a pair: its chosen answer's)."""
        import torch

        view = chosen_view(sample)
        batch: Batch = {"input_ids": view["input_ids"][None], "attention_mask": torch.ones_like(view["input_ids"])[None]}
        self.add_media(batch, [view], ids)
        return float(sum(tokens(batch) for tokens in self.towers.values()))

    # -- the model on a batch ----------------------------------------------------------------

    def forward(self: "VLMFamily", model: Any, batch: Batch, **options: Any) -> Any:
        """The model's output on a collated batch (packed rows get their positions)."""
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", *self.model_inputs, *self.media_fields) if k in batch}
        if "segments" in batch:
            inputs["position_ids"] = (self.packed_positions or restarting_positions)(model, batch)
        return model(**inputs, use_cache=False, **options)

    def forward_logits(self: "VLMFamily", model: Any, batch: Batch) -> Any:
        return self.forward(model, batch).logits

    def loss_sum(self: "VLMFamily", model: Any, batch: Batch, aux_coef: float | None = None) -> Any:
        """Summed next-token loss, plus the router's load-balancing loss of a mixture of experts
        (``aux_coef``, default its config's ``router_aux_loss_coef``; see ``router_aux_loss``)."""
        coef = getattr(model.config.get_text_config(), "router_aux_loss_coef", None) if self.router_aux_loss else None
        coef = coef if aux_coef is None or coef is None else aux_coef
        if not coef:
            return next_token_loss_sum(self.forward_logits(model, batch), batch["labels"])
        out = self.forward(model, batch, output_router_logits=True)
        aux = out.aux_loss if not batch.get("filler_tokens") else balance_loss_without_fillers(model, out, batch)
        return next_token_loss_sum(out.logits, batch["labels"]) + coef * aux * batch["num_loss_tokens"]

    def shard_modules(self: "VLMFamily", model: Any) -> list[Any]:
        return blocks_at(model, self.shard_layers)

    def step_flops(self: "VLMFamily") -> Callable[[Any, Batch], float]:
        """``(model, batch) -> FLOPs`` of a forward and backward: towers on their tokens, the
        rest on the text tokens, the decoder's attention per sample."""
        from mmcore.train.flops import attention_flops, dense_flops, parameter_counts

        # What does not change in a run (parameter counts, the decoder's shape), read at the first
        # step: walking the modules and the config each step cost the loop ~0.25 ms a step.
        fixed: list[Any] = []

        def flops(model: Any, batch: Batch) -> float:
            if not fixed:
                trained, frozen = parameter_counts(model)
                towers = []
                for path, tokens in self.towers.items():
                    tower = parameter_counts(model.get_submodule(path))
                    trained, frozen = trained - tower[0], frozen - tower[1]
                    towers.append((tower, tokens))
                text = model.config.get_text_config()
                width = text.num_attention_heads * (getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
                fixed.extend([(trained, frozen), towers, text.num_hidden_layers, width])
            rest, towers, layers, width = fixed
            lengths = (batch["segments"] if "segments" in batch else batch["attention_mask"].sum(1)).tolist()
            total = sum(dense_flops(tower, tokens(batch)) for tower, tokens in towers)
            return total + dense_flops(rest, float(sum(lengths))) + attention_flops(layers, width, lengths)

        return flops


def with_tail(samples: list[dict[str, Any]], fillers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``samples`` with ``fillers`` appended to the last one (:func:`mmcore.data.fillers.append_fillers`)."""
    from mmcore.data.fillers import append_fillers

    return [*samples[:-1], append_fillers(samples[-1], fillers)] if fillers else samples


def balance_loss_without_fillers(model: Any, out: Any, batch: Batch) -> Any:
    """The router's load-balancing loss as the family's transformers module computes it, over
    the batch's tokens less the filler's tail (:mod:`mmcore.data.fillers`): filler tokens would
    otherwise move the routers' balance, and through it send gradients into the towers."""
    import sys

    import torch

    mask = batch["attention_mask"].clone() if "attention_mask" in batch else torch.ones_like(batch["input_ids"])
    end = int(mask[-1].sum())  # the last row's tokens; the filler is the tail of its last sample
    mask[-1, end - int(batch["filler_tokens"]) : end] = 0
    family = next(c for c in type(model).__mro__ if c.__module__.startswith("transformers.models."))
    balance = sys.modules[family.__module__].load_balancing_loss_func
    return balance(out.router_logits, out.router_logits[0].shape[-1], model.config.get_text_config().num_experts_per_tok, mask)


def rows_of(*fields: str) -> Callable[[Batch], float]:
    """``batch -> tokens``: the rows of those batch fields (patches of ``pixel_values``)."""
    return lambda batch: float(sum(batch[f].shape[0] for f in fields if f in batch))


def restarting_positions(model: Any, batch: Batch) -> Any:
    """1-D positions restarting at every sample of a packed row ([1, total]); transformers reads
    the restarts to keep the samples' attention apart."""
    import torch

    return torch.cat([torch.arange(int(n)) for n in batch["segments"]])[None].to(batch["input_ids"].device)


__all__ = ["VLMBatches", "Batch", "CollateExtra", "with_tail", "balance_loss_without_fillers", "rows_of", "restarting_positions"]
