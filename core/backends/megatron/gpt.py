"""A megatron-core ``GPTModel`` for a transformers decoder (Llama / Qwen2 style: RMSNorm, SwiGLU,
rotary or multimodal rotary positions, optional q/k/v biases), and its weights from a family's
:class:`mmcore.backends.megatron.tensor_map.ParallelMap`.

The model is single-device code built per rank; tensor parallelism is Megatron's own layers
(column-/row-parallel linears, a vocab-parallel embedding and output layer), which the table's
split matches. Local layer spec (no Transformer Engine) with every fusion off, so the same
model runs on the CPU accelerator (:mod:`mmcore.backends.megatron.cpu`) and on CUDA.

Sequence parallelism (``sequence_parallel``): between the tensor-parallel regions (the norms,
the residual stream) each TP rank holds 1/TP of the sequence instead of all of it, so those
activations take 1/TP of the memory; the linears gather the sequence before and scatter it
after (Megatron's own layers). megatron-core's local spec norm refuses it ("not supported by
torch LayerNorm"), for the one reason that a norm's weight then sees only its rank's tokens:
:class:`SequenceParallelNorm` is the same ``torch.nn.RMSNorm`` with its weight marked
``sequence_parallel``, whose gradient the engine sums over the TP ranks
(:func:`mmcore.backends.megatron.train.reduce_gradients`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mmcore.errors import StageError


def init_model_parallel(tensor_parallel: int, pipeline_parallel: int = 1, seed: int = 0, virtual_pipeline: int = 1, timeout_s: int | None = None, context_parallel: int = 1) -> None:
    """Megatron's parallel groups over the default process group (already initialised: torchrun,
    or one process with world size 1), and its model-parallel RNG seeded. ``virtual_pipeline``:
    model chunks per pipeline rank (the interleaved schedule), > 1 only with pipeline stages.
    ``timeout_s``: how long the groups' collectives wait (``parallel.collective_timeout_s``,
    in whole minutes: Megatron's unit). ``context_parallel``: processes sharing each sample's
    sequence (:mod:`mmcore.backends.megatron.context`)."""
    import torch.distributed as dist

    from mmcore.backends.megatron.cpu import activate

    activate()
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    world = dist.get_world_size()
    if world % (tensor_parallel * pipeline_parallel * context_parallel):
        cp = f" x parallel.context_parallel={context_parallel}" if context_parallel > 1 else ""
        raise StageError(f"parallel.tensor_parallel={tensor_parallel} x parallel.pipeline_parallel={pipeline_parallel}{cp} does not divide the {world} processes")
    if not parallel_state.model_parallel_is_initialized():
        minutes = {"distributed_timeout_minutes": max(1, -(-timeout_s // 60))} if timeout_s else {}  # its groups' collectives wait as long
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tensor_parallel,
            pipeline_model_parallel_size=pipeline_parallel,
            context_parallel_size=context_parallel,
            virtual_pipeline_model_parallel_size=virtual_pipeline if virtual_pipeline > 1 else None,
            **minutes,
        )
    model_parallel_cuda_manual_seed(seed)


def padded_vocab(vocab_size: int, tensor_parallel: int) -> int:
    """The vocabulary rows each rank's shards add up to: the smallest multiple of the TP size
    (as :class:`mmcore.backends.megatron.tensor_map.Rule` pads ``vocab`` tensors)."""
    return -(-vocab_size // tensor_parallel) * tensor_parallel


def gpt_model(
    text_config: Any,
    tensor_parallel: int,
    *,
    tied: bool = False,
    mrope_section: Sequence[int] | None = None,
    qkv_bias: bool = True,
    dtype: Any = None,
    pipeline_parallel: int = 1,
    stage_layers: Sequence[int] | None = None,
    pre_process: bool = True,
    post_process: bool = True,
    parallel_output: bool = False,
    sequence_parallel: bool = False,
    virtual_pipeline: int = 1,
    chunk: int = 0,
    context_parallel: int = 1,
) -> Any:
    """This rank's ``GPTModel`` of a transformers text config (``hidden_size``,
    ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``,
    ``num_hidden_layers``, ``rms_norm_eps``, ``vocab_size``, rope theta), uninitialised (weights
    come from :func:`load_rank_state`); ``mrope_section``: Qwen2-VL's multimodal rotary sections.
    With ``pipeline_parallel`` > 1: this stage's layers (``stage_layers``: the count on each
    stage, as :func:`mmcore.backends.megatron.tensor_map.even_layers` places them), the embedding where
    ``pre_process``, the final norm and output layer where ``post_process``. ``parallel_output``:
    the last stage returns each tensor-parallel rank's slice of the (padded) vocabulary's
    logits, for :func:`mmcore.backends.megatron.train.vocab_parallel_loss_sum`; else the whole.
    ``sequence_parallel``: the layers take and give [S / TP, B, H] (the module docstring); the
    embedding is not scattered (the caller adds its own features first:
    :func:`scatter_sequence`). ``virtual_pipeline`` > 1: this is virtual stage ``chunk`` of the
    rank's stage (Megatron's interleaved placement: chunk v of stage s holds the (v x PP + s)-th
    of PP x V equal runs of layers; ``stage_layers`` is not used). ``context_parallel`` > 1: the
    layers take this rank's part of the sequence (:mod:`mmcore.backends.megatron.context`; its
    attention in the layer spec) and the multimodal rotary positions of those tokens (the
    caller cuts them: Megatron's own cut of the rotary table is CUDA code)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

    if getattr(text_config, "hidden_act", "silu") != "silu":
        raise StageError(f"text config hidden_act={text_config.hidden_act}: the Megatron GPT here is SwiGLU (silu) only")
    if context_parallel > 1 and not mrope_section:
        raise StageError("parallel.context_parallel: the Megatron GPT here splits the sequence for multimodal rotary positions (M-RoPE) only")
    rope = getattr(text_config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(text_config, "rope_theta", 10000.0))
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    if virtual_pipeline > 1:
        if text_config.num_hidden_layers % (pipeline_parallel * virtual_pipeline):
            raise StageError(
                f"parallel.virtual_pipeline={virtual_pipeline} x parallel.pipeline_parallel={pipeline_parallel} does not divide the "
                f"{text_config.num_hidden_layers} layers (the interleaved schedule places equal runs of layers)"
            )
        stage_layers = None
    config = TransformerConfig(
        num_layers=text_config.num_hidden_layers,
        hidden_size=text_config.hidden_size,
        ffn_hidden_size=text_config.intermediate_size,
        num_attention_heads=text_config.num_attention_heads,
        num_query_groups=text_config.num_key_value_heads,
        kv_channels=head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=text_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=qkv_bias,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        tensor_model_parallel_size=tensor_parallel,
        context_parallel_size=context_parallel,
        sequence_parallel=sequence_parallel,
        params_dtype=dtype or torch.float32,
        pipeline_model_parallel_size=pipeline_parallel,
        pipeline_dtype=dtype or torch.float32,
        **_stage_counts(stage_layers, pipeline_parallel),
        virtual_pipeline_model_parallel_size=virtual_pipeline if virtual_pipeline > 1 else None,
        mrope_section=list(mrope_section) if mrope_section else None,
        # fusions are CUDA kernels; the layers' plain torch paths compute the same
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        use_cpu_initialization=True,
        perform_initialization=False,
    )
    from mmcore.backends.megatron.cpu import tensor_cuda_stays

    with tensor_cuda_stays():  # a tied output layer's copy on the last stage is all-reduced as it is built
        model = GPTModel(
            config=config,
            transformer_layer_spec=_block_spec(config, chunk if virtual_pipeline > 1 else None),
            vocab_size=padded_vocab(text_config.vocab_size, tensor_parallel),
            max_sequence_length=text_config.max_position_embeddings,
            position_embedding_type="mrope" if mrope_section else "rope",
            rotary_base=int(theta),
            share_embeddings_and_output_weights=tied,
            parallel_output=parallel_output,
            pre_process=pre_process,
            post_process=post_process,
            scatter_embedding_sequence_parallel=False,
            vp_stage=chunk if virtual_pipeline > 1 else None,
        )
    if context_parallel > 1:  # the positions come cut to this rank's tokens (the caller's to_context_rank)
        model.rotary_pos_emb.cp_group = None
    mark_parallel_weights(model)
    return model


class SequenceParallelNorm:
    """megatron-core's norm protocol (``(config, hidden_size, eps) -> module``): ``torch.nn.RMSNorm``
    (what the local spec builds), its weight marked ``sequence_parallel`` when the config is, so
    its gradient, from this rank's part of the sequence only, is summed over the TP ranks."""

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> Any:
        import torch

        norm = torch.nn.RMSNorm(hidden_size, eps=eps)
        norm.weight.sequence_parallel = config.sequence_parallel
        return norm


def _block_spec(config: Any, vp_stage: int | None) -> Any:
    """The local layer spec with :class:`SequenceParallelNorm` for every norm (and at
    context-parallel size > 1 :mod:`mmcore.backends.megatron.context`'s attention), as the
    decoder block of this pipeline stage's layers."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    layer = get_gpt_layer_local_spec(normalization="RMSNorm")
    layer.submodules.input_layernorm = layer.submodules.pre_mlp_layernorm = SequenceParallelNorm
    if config.context_parallel_size > 1:
        from mmcore.backends.megatron.context import attention_class

        layer.submodules.self_attention.submodules.core_attention = attention_class()
    return TransformerBlockSubmodules(layer_specs=[layer] * get_num_layers_to_build(config, vp_stage), layer_norm=SequenceParallelNorm)


def pad_sequence(tensor: Any, tensor_parallel: int, dim: int = 1, value: int = 0) -> Any:
    """``tensor`` padded with ``value`` along ``dim`` to a length the TP size divides, as sequence
    parallelism cuts the sequence (causal attention: tokens after the last change nothing
    before them; the caller strips their outputs)."""
    import torch.nn.functional as F

    extra = -tensor.shape[dim] % tensor_parallel
    if not extra:
        return tensor
    pad = [0, 0] * (tensor.dim() - 1 - dim % tensor.dim()) + [0, extra]
    return F.pad(tensor, pad, value=value)


def scatter_sequence(embeds: Any, config: Any) -> Any:
    """Decoder input [S, B, H] -> this rank's part of the sequence under sequence parallelism
    (unchanged without); the backward gathers the gradient back."""
    if not config.sequence_parallel:
        return embeds
    from megatron.core.tensor_parallel import scatter_to_sequence_parallel_region

    return scatter_to_sequence_parallel_region(embeds)


def mark_parallel_weights(model: Any) -> None:
    """Mark each tensor-parallel weight as Megatron's initialisers would have (``tensor_model_parallel``,
    its partition dim). Without initialisation (``perform_initialization=False``: the weights are
    loaded) megatron-core 0.16 leaves them unmarked, and whatever tells shards from replicas
    (gradient norms, Megatron's optimizer) would take a shard for a replica."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, set_tensor_model_parallel_attributes

    for module in model.modules():
        dim = 0 if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)) else 1 if isinstance(module, RowParallelLinear) else None
        weight = getattr(module, "weight", None)
        if dim is not None and weight is not None and not getattr(weight, "tensor_model_parallel", False):
            set_tensor_model_parallel_attributes(weight, True, dim, 1)


def _stage_counts(stage_layers: Sequence[int] | None, stages: int) -> dict[str, int]:
    """Megatron's names for uneven stages: the first and last stage's layer counts (the middle
    ones share the rest evenly)."""
    if stages == 1 or not stage_layers or len(set(stage_layers)) == 1:
        return {}
    middle = set(stage_layers[1:-1])
    if len(middle) > 1:
        raise StageError(f"pipeline stages of {list(stage_layers)} layers: Megatron takes the first and last stage's counts and the same count on every middle stage")
    return {"num_layers_in_first_pipeline_stage": stage_layers[0], "num_layers_in_last_pipeline_stage": stage_layers[-1]}


def load_rank_state(model: Any, state: Mapping[str, Any], prefix: str = "") -> None:
    """This rank's tensors (a :meth:`ParallelMap.split_tp` shard) into ``model``, the names under
    ``prefix`` (``"text_decoder."``); every parameter must be given and every tensor used."""
    check_rank_names(model, [k for k in state if k.startswith(prefix)], prefix)
    copy_rank_state(model, state, prefix)


def check_rank_names(model: Any, names: Sequence[str], prefix: str = "") -> None:
    """The tensors a rank will be given (``names``, under ``prefix``) are exactly ``model``'s
    parameters and buffers: a one-line error naming the first missing or unexpected one."""
    given = {name[len(prefix) :] for name in names}
    expected = {k for k in model.state_dict() if not k.endswith("._extra_state")}
    missing, unexpected = sorted(expected - given), sorted(given - expected)
    if missing or unexpected:
        raise StageError(f"the Megatron model and the table disagree: {'missing ' + prefix + missing[0] if missing else 'unexpected ' + prefix + unexpected[0]}")


def copy_rank_state(model: Any, state: Mapping[str, Any], prefix: str = "") -> None:
    """Copy some of this rank's tensors (names under ``prefix``) into ``model``, shapes checked."""
    import torch

    own = model.state_dict()
    with torch.no_grad():
        for name, tensor in state.items():
            local = name[len(prefix) :]
            if own[local].shape != tensor.shape:
                raise StageError(f"{name}: the table gives {tuple(tensor.shape)}, the Megatron model has {tuple(own[local].shape)}")
            own[local].copy_(tensor)


__all__ = ["init_model_parallel", "padded_vocab", "gpt_model", "SequenceParallelNorm", "pad_sequence", "scatter_sequence", "load_rank_state", "check_rank_names", "copy_rank_state"]
