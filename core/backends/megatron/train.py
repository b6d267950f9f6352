"""One training step of a megatron-core model, the engine's way: micro-batches through Megatron's
forward-backward schedule (pipeline stages or none), the loss a sum over tokens divided by the
step's tokens across data-parallel ranks, gradients summed over data-parallel ranks, clipped by
their norm over the whole model (each tensor-parallel shard counted, each replica once).

Optimizer: any torch optimizer over the rank's own parameters (AdamW is elementwise, so a shard's
update is the whole tensor's update cut the same way). Megatron's distributed optimizer and its
fused gradient clipping need CUDA (the GPU script runs them).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence


def forward_backward(model: Any, batches: Sequence[dict[str, Any]], loss_sum: Callable[[Any, dict[str, Any]], Any], total_tokens: float) -> float:
    """Run ``batches`` (micro-batches of one step) forward and backward through Megatron's schedule
    (``model``: this rank's module, or its list of virtual-stage chunks).

    ``loss_sum(output, batch)``: the summed loss of a micro-batch from the last stage's output.
    The gradients are those of (sum over micro-batches) / ``total_tokens``. Returns the summed
    loss of this data-parallel rank's micro-batches (on every rank of its pipeline)."""

    def measure(output: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        summed = loss_sum(output, batch)
        return summed / total_tokens, {"loss_sum": summed.detach()}

    results = _schedule(model, batches, measure, forward_only=False)
    return float(_on_every_stage([sum(float(r["loss_sum"]) for r in results)])[0])


def forward_scores(model: Any, batches: Sequence[dict[str, Any]], score: Callable[[Any, dict[str, Any]], Mapping[str, tuple[float, float]]], names: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Held-out figures of ``batches`` (this data-parallel rank's), forward only: ``score(output,
    batch)`` on the last stage gives ``name -> (numerator, denominator)`` of a micro-batch; the
    sums over the micro-batches of every data-parallel rank, on every rank, for ``names``."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    def measure(output: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        figures, weight = score(output, batch), batch.get("_weight", 1.0)
        return torch.zeros(()), {name: torch.tensor([weight * float(figures[name][0]), weight * float(figures[name][1])]) for name in names}

    stages = parallel_state.get_pipeline_model_parallel_world_size()
    if isinstance(model, (list, tuple)) and len(model) > 1 and 0 < len(batches) < stages:
        # the interleaved schedule takes at least PP micro-batches: repeats of the first, not counted
        batches = [*batches, *({**batches[0], "_weight": 0.0} for _ in range(stages - len(batches)))]
    with torch.no_grad():
        results = _schedule(model, batches, measure, forward_only=True) if batches else []
    sums = [sum(float(r[name][i]) for r in results) for name in names for i in (0, 1)]
    total = torch.tensor(_on_every_stage(sums), dtype=torch.float64)
    dist.all_reduce(total, group=parallel_state.get_data_parallel_group())
    return {name: (float(total[2 * i]), float(total[2 * i + 1])) for i, name in enumerate(names)}


def _schedule(model: Any, batches: Sequence[dict[str, Any]], measure: Callable[[Any, dict[str, Any]], tuple[Any, dict[str, Any]]], forward_only: bool) -> list[dict[str, Any]]:
    """``batches`` through Megatron's forward-backward schedule (1F1B over pipeline stages,
    interleaved when ``model`` is a list of virtual-stage chunks, or none); ``measure(output,
    batch) -> (loss to differentiate, figures)`` on the last stage, whose figures it returns (an
    empty list on the other stages). Keys of a batch starting with ``_`` are not the model's."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    stages = parallel_state.get_pipeline_model_parallel_world_size()
    for config in {id(c.config): c.config for c in chunks}.values():
        # activations between stages have the weights' dtype (bf16 inside Bf16Compute.step)
        config.pipeline_dtype = next(chunks[0].parameters()).dtype
        config.calculate_per_token_loss = True  # the loss is already per step token; no division by micro-batches
        config.deallocate_pipeline_outputs = False
        # micro-batches are padded to their own longest sample: between pipeline stages each
        # activation's shape is sent ahead of it (else the receiver assumes the first's shape)
        config.variable_seq_lengths = len(chunks) == 1
        if len(chunks) > 1:  # interleaved: run the micro-batches through each chunk in groups of PP (all at once when PP does not divide them)
            config.microbatch_group_size_per_vp_stage = stages if len(batches) % stages == 0 else len(batches)
            # it sends to the previous and the next stage at once: at PP=2 one peer, and only
            # Megatron's unbatched transfers tell the two apart (a second group); they need
            # one activation shape for the step's micro-batches
            config.batch_p2p_comm = False
    if len(chunks) > 1:  # one length for the step (what the family pads each sequence to as well: its multiple)
        from mmcore.backends.megatron.context import context_multiple

        batches = _same_length(batches, context_multiple(parallel_state.get_tensor_model_parallel_world_size()))

    def forward_step(data: Any, module: Any) -> Any:
        batch = next(data)

        def loss_func(output: Any) -> Any:
            loss, figures = measure(output, batch)
            return loss, torch.tensor(1, dtype=torch.int), figures

        inputs = {k: v for k, v in batch.items() if k not in ("labels", "num_loss_tokens") and not k.startswith("_")}
        return module(**inputs), loss_func

    first = batches[0]["input_ids"]
    return get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=[iter(batches) for _ in chunks],
        model=chunks,
        num_microbatches=len(batches),
        seq_length=first.shape[1],
        micro_batch_size=first.shape[0],
        forward_only=forward_only,
    )


def _same_length(batches: Sequence[dict[str, Any]], multiple: int) -> list[dict[str, Any]]:
    """The micro-batches padded at the end of the sequence to one length (a multiple of
    ``multiple``): every token-level tensor (integer, shaped [B, S, ...] as ``input_ids``), with
    ``labels`` -100 (not learned), the rest 0. Causal attention: the real tokens see none of it."""
    import torch.nn.functional as F

    from mmcore.train.causal_lm import IGNORE

    longest = max(b["input_ids"].shape[1] for b in batches)
    longest += -longest % multiple
    out = []
    for batch in batches:
        rows, length = batch["input_ids"].shape[:2]
        out.append(
            {
                k: F.pad(v, [0, 0] * (v.dim() - 2) + [0, longest - length], value=IGNORE if k == "labels" else 0)
                if hasattr(v, "shape") and v.dim() >= 2 and tuple(v.shape[:2]) == (rows, length) and not v.is_floating_point() and longest > length
                else v
                for k, v in batch.items()
            }
        )
    return out


def _on_every_stage(sums: list[float]) -> list[float]:
    """The last pipeline stage's sums, on every stage (the others hold zeros)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    total = torch.tensor(sums, dtype=torch.float64)
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        dist.all_reduce(total, group=parallel_state.get_pipeline_model_parallel_group())
    return total.tolist()


def vocab_parallel_loss_sum(logits: Any, labels: Any, vocab_size: int) -> Any:
    """Summed next-token cross-entropy from this tensor-parallel rank's slice of the logits
    ``[B, S, padded vocab / TP]`` (Megatron's vocab-parallel cross entropy: no rank holds a row's
    whole vocabulary). The padding columns (the zero rows a TP size adds to the vocabulary) are
    left out of the softmax, as the HF model, which has none, leaves them. Context-parallel: the
    logits of this rank's tokens, ``labels`` the whole sequence's (:func:`_next_tokens`); the
    sum is this rank's tokens', which the engine sums over the context-parallel group."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    from mmcore.train.causal_lm import IGNORE

    shard, targets = _next_tokens(logits, labels)
    width = shard.shape[-1]
    first = parallel_state.get_tensor_model_parallel_rank() * width
    padding = torch.arange(first, first + width, device=shard.device) >= vocab_size
    if bool(padding.any()):
        shard = shard.masked_fill(padding, float("-inf"))
    supervised = targets != IGNORE
    # Megatron's layout is [S, B, V]; it returns the per-token loss [S, B]
    losses = vocab_parallel_cross_entropy(shard.transpose(0, 1).contiguous(), targets.clamp(min=0).transpose(0, 1).contiguous())
    return (losses.transpose(0, 1) * supervised).sum()


def vocab_parallel_exact_match(logits: Any, labels: Any, vocab_size: int) -> Any:
    """Per row: every supervised next token is the argmax over the whole vocabulary (what greedy
    decoding would answer; :func:`mmcore.train.causal_lm.exact_match`), from this tensor-parallel
    rank's slice of the logits: each rank's best (value, token) of its slice, the ranks' best
    taken (the lowest token among equal values, as ``argmax`` over the whole row takes)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    from mmcore.train.causal_lm import IGNORE

    shard, targets = _next_tokens(logits, labels)
    width = shard.shape[-1]
    first = parallel_state.get_tensor_model_parallel_rank() * width
    shard = shard.masked_fill(torch.arange(first, first + width, device=shard.device) >= vocab_size, float("-inf"))
    value, token = shard.max(-1)
    token = token + first
    group = parallel_state.get_tensor_model_parallel_group()
    ranks = dist.get_world_size(group)
    if ranks > 1:
        values, tokens = [torch.empty_like(value) for _ in range(ranks)], [torch.empty_like(token) for _ in range(ranks)]
        dist.all_gather(values, value, group=group)
        dist.all_gather(tokens, token, group=group)
        best = torch.stack(values).argmax(0, keepdim=True)  # the first rank holding the maximum: the lowest token
        token = torch.stack(tokens).gather(0, best)[0]
    right = ((token == targets) | (targets == IGNORE)).all(dim=1)
    from mmcore.backends.megatron.context import context_size

    if context_size() > 1:  # each rank saw its tokens of the row: right where right on every rank
        wrong = (~right).to(torch.float32)
        dist.all_reduce(wrong, group=parallel_state.get_context_parallel_group())
        right = wrong == 0
    return right


def _next_tokens(logits: Any, labels: Any) -> tuple[Any, Any]:
    """(logits that predict a next token, in float32; their targets): every position but the
    last, and ``labels`` shifted by one; context-parallel, every position this rank holds, and
    the whole sequence's shifted labels cut as its tokens are
    (:func:`mmcore.backends.megatron.context.context_targets`)."""
    from mmcore.backends.megatron.context import context_size, context_targets
    from mmcore.train.causal_lm import IGNORE

    if context_size() > 1:
        return logits.float(), context_targets(labels, logits.shape[1], IGNORE)
    return logits[:, :-1].float(), labels[:, 1:]


def reduce_gradients(parameters: Iterable[Any]) -> None:
    """Sum each gradient over the data-parallel ranks and the context-parallel ranks of each
    (each rank's loss is already divided by the step's tokens across all of them); under sequence parallelism first the gradient of each
    weight marked ``sequence_parallel`` (a norm's: each tensor-parallel rank saw only its part
    of the sequence) over the tensor-parallel ranks.

    A parameter has a gradient on some data-parallel ranks only where their micro-batches
    differ in media (a vision tower no sample of one rank used): every rank reduces the same
    parameters, zeros standing in where its own gradient is None, so the collectives agree; a
    parameter no rank has a gradient for stays None, as in one process (AdamW skips it)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    parameters = list(parameters)
    tensor_group = parallel_state.get_tensor_model_parallel_group()
    if dist.get_world_size(tensor_group) > 1:  # tensor-parallel ranks share their micro-batches: the same gradients exist
        for parameter in parameters:
            if parameter.grad is not None and getattr(parameter, "sequence_parallel", False):
                dist.all_reduce(parameter.grad, group=tensor_group)
    group = parallel_state.get_data_parallel_group(with_context_parallel=True)  # context-parallel ranks: the same weights, their own tokens' gradients
    if dist.get_world_size(group) == 1:
        return
    held = torch.tensor([float(p.grad is not None) for p in parameters], device=parameters[0].device if parameters else None)
    dist.all_reduce(held, group=group)
    for parameter, anywhere in zip(parameters, held.tolist()):
        if not anywhere:
            continue
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
        dist.all_reduce(parameter.grad, group=group)


def sum_tied_gradients(gpt: Any) -> None:
    """A tied output layer over several pipeline stages: the last stage holds a copy of the
    embedding (:meth:`mmcore.backends.megatron.tensor_map.ParallelMap.split_pp`); sum the two gradients
    between the first and last stage, so both copies take the same update and stay equal."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if parallel_state.get_pipeline_model_parallel_world_size() == 1 or not gpt.share_embeddings_and_output_weights:
        return
    if not parallel_state.is_rank_in_embedding_group(ignore_virtual=True):
        return
    weight = gpt.shared_embedding_or_output_weight()
    if weight is not None and weight.grad is not None:
        dist.all_reduce(weight.grad, group=parallel_state.get_embedding_group())


def grad_norm(parameters: Iterable[Any]) -> float:
    """The gradients' L2 norm over the whole model: tensor-parallel shards summed across their
    ranks, a tensor every tensor-parallel rank holds whole counted once, stages summed."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    squares = torch.zeros(1, dtype=torch.float64)
    for parameter in parameters:
        # a tied output layer's copy on the last stage (``shared``) is the embedding: counted there
        if parameter.grad is not None and param_is_not_tensor_parallel_duplicate(parameter) and not getattr(parameter, "shared", False):
            squares += parameter.grad.detach().double().pow(2).sum().cpu()
    dist.all_reduce(squares, group=parallel_state.get_model_parallel_group())
    return float(squares.sqrt())


def clip_gradients(parameters: Sequence[Any], max_norm: float | None) -> float:
    """Scale the gradients so their model-wide norm (:func:`grad_norm`) is at most ``max_norm``
    (None: no clipping, as ``training.max_grad_norm: null`` says); returns the norm before."""
    norm = grad_norm(parameters)
    scale = max_norm / (norm + 1e-6) if max_norm else 1.0  # torch.nn.utils.clip_grad_norm_'s formula
    if scale < 1.0:
        for parameter in parameters:
            if parameter.grad is not None:
                parameter.grad.mul_(scale)
    return norm


__all__ = ["forward_backward", "forward_scores", "vocab_parallel_loss_sum", "vocab_parallel_exact_match", "reduce_gradients", "sum_tied_gradients", "grad_norm", "clip_gradients"]
