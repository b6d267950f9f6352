"""One training step of a megatron-core model, the engine's way: micro-batches through Megatron's
forward-backward schedule (pipeline stages or none), the loss a sum over tokens divided by the
step's tokens across data-parallel ranks, gradients summed over data-parallel ranks, clipped by
their norm over the whole model (each tensor-parallel shard counted, each replica once).

Optimizer: any torch optimizer over the rank's own parameters (AdamW is elementwise, so a shard's
update is the whole tensor's update cut the same way). Megatron's distributed optimizer and its
fused gradient clipping need CUDA (the GPU script runs them).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence


def forward_backward(model: Any, batches: Sequence[dict[str, Any]], loss_sum: Callable[[Any, dict[str, Any]], Any], total_tokens: float,
                     *, forward_only: bool = False) -> float:
    """Run ``batches`` (micro-batches of one step) forward and backward through Megatron's schedule.

    ``loss_sum(output, batch)``: the summed loss of a micro-batch from the last stage's output.
    The gradients are those of (sum over micro-batches) / ``total_tokens``. Returns the summed
    loss of this data-parallel rank's micro-batches (on every rank of its pipeline)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    config = model.config
    config.calculate_per_token_loss = True  # the loss below is already per step token; no division by micro-batches
    config.deallocate_pipeline_outputs = False
    # micro-batches are padded to their own longest sample: between pipeline stages each
    # activation's shape is sent ahead of it (else the receiver assumes the first's shape)
    config.variable_seq_lengths = True
    feed = iter(batches)

    def forward_step(data: Any, module: Any) -> Any:
        batch = next(data)

        def loss_func(output: Any) -> Any:
            summed = loss_sum(output, batch)
            return summed / total_tokens, torch.tensor(1, dtype=torch.int), {"loss_sum": summed.detach()}

        inputs = {k: v for k, v in batch.items() if k not in ("labels", "num_loss_tokens")}
        return module(**inputs), loss_func

    first = batches[0]["input_ids"]
    results = get_forward_backward_func()(forward_step_func=forward_step, data_iterator=feed, model=[model], num_microbatches=len(batches),
                                          seq_length=first.shape[1], micro_batch_size=first.shape[0], forward_only=forward_only)
    total = torch.tensor([sum(float(r["loss_sum"]) for r in results)] if results else [0.0])
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:  # the last stage has it; every stage reports it
        dist.all_reduce(total, group=parallel_state.get_pipeline_model_parallel_group())
    return float(total)


def vocab_parallel_loss_sum(logits: Any, labels: Any, vocab_size: int) -> Any:
    """Summed next-token cross-entropy from this tensor-parallel rank's slice of the logits
    ``[B, S, padded vocab / TP]`` (Megatron's vocab-parallel cross entropy: no rank holds a row's
    whole vocabulary). The padding columns (the zero rows a TP size adds to the vocabulary) are
    left out of the softmax, as the HF model, which has none, leaves them."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    from mmcore.causal_lm import IGNORE

    shard = logits[:, :-1].float()
    width = shard.shape[-1]
    first = parallel_state.get_tensor_model_parallel_rank() * width
    padding = torch.arange(first, first + width, device=shard.device) >= vocab_size
    if bool(padding.any()):
        shard = shard.masked_fill(padding, float("-inf"))
    targets = labels[:, 1:]
    supervised = targets != IGNORE
    # Megatron's layout is [S, B, V]; it returns the per-token loss [S, B]
    losses = vocab_parallel_cross_entropy(shard.transpose(0, 1).contiguous(), targets.clamp(min=0).transpose(0, 1).contiguous())
    return (losses.transpose(0, 1) * supervised).sum()


def reduce_gradients(parameters: Iterable[Any]) -> None:
    """Sum each gradient over the data-parallel ranks (each rank's loss is already divided by
    the step's tokens across all of them); under sequence parallelism first the gradient of each
    weight marked ``sequence_parallel`` (a norm's: each tensor-parallel rank saw only its part
    of the sequence) over the tensor-parallel ranks."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    parameters = [p for p in parameters if p.grad is not None]
    tensor_group = parallel_state.get_tensor_model_parallel_group()
    if dist.get_world_size(tensor_group) > 1:
        for parameter in parameters:
            if getattr(parameter, "sequence_parallel", False):
                dist.all_reduce(parameter.grad, group=tensor_group)
    group = parallel_state.get_data_parallel_group()
    if dist.get_world_size(group) == 1:
        return
    for parameter in parameters:
        dist.all_reduce(parameter.grad, group=group)


def sum_tied_gradients(gpt: Any) -> None:
    """A tied output layer over several pipeline stages: the last stage holds a copy of the
    embedding (:meth:`mmcore.parallel_map.ParallelMap.split_pp`); sum the two gradients
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


def clip_gradients(parameters: Sequence[Any], max_norm: float) -> float:
    """Scale the gradients so their model-wide norm (:func:`grad_norm`) is at most ``max_norm``
    (0: no clipping, as ``training.max_grad_norm`` says); returns the norm before."""
    norm = grad_norm(parameters)
    scale = max_norm / (norm + 1e-6) if max_norm else 1.0  # torch.nn.utils.clip_grad_norm_'s formula
    if scale < 1.0:
        for parameter in parameters:
            if parameter.grad is not None:
                parameter.grad.mul_(scale)
    return norm


__all__ = ["forward_backward", "vocab_parallel_loss_sum", "reduce_gradients", "sum_tied_gradients", "grad_norm", "clip_gradients"]
