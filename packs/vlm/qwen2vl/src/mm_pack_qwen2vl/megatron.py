"""Qwen2-VL and Qwen2.5-VL in Megatron's names, as MindSpeed-MM lays them out: one table
(:class:`mmcore.backends.megatron.tensor_map.ParallelMap`) that converts the hub checkpoint both ways and splits
it over tensor-parallel ranks and pipeline stages.

The language model is ``text_decoder`` (Megatron's ``GPTModel``: q, k and v fused per query
group, gate and up fused, the norms before attention and MLP); the vision tower is
``image_encoder.encoder`` (its qkv regrouped per head) and the merger
``image_encoder.projector``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore.backends.megatron import LayerStack, ParallelMap, Rule

TEXT = "text_decoder.decoder.layers."
VISION = "image_encoder.encoder.blocks.layers."


def parallel_map(config: Any) -> ParallelMap:
    """The table of a Qwen2-VL or Qwen2.5-VL config (``transformers``' composite config)."""
    text, vision = config.get_text_config(), config.vision_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    q_rows = head_dim * text.num_attention_heads // text.num_key_value_heads
    vision_width = getattr(vision, "embed_dim", None) or vision.hidden_size
    vision_head = vision_width // vision.num_heads
    two_five = config.model_type == "qwen2_5_vl"  # its vision MLP is gated (gate/up/down), its norms RMSNorm

    def both(megatron: str, hf: str, kind: Any = "replicated", bias: Any = "replicated", **more: Any) -> list[Rule]:
        """A layer's weight and (where the checkpoint has one) its bias."""
        return [Rule(megatron + ".weight", tuple(h + ".weight" for h in hf.split("|")), kind, **more), Rule(megatron + ".bias", tuple(h + ".bias" for h in hf.split("|")), bias, optional=True, **more)]

    block, layer = "visual.blocks.{n}.", "model.layers.{n}."
    vblock, tlayer = VISION + "{n}.", TEXT + "{n}."
    vision_mlp = (
        (both(vblock + "mlp.linear_fc1", f"{block}mlp.gate_proj|{block}mlp.up_proj", "gate_up", "gate_up") + both(vblock + "mlp.linear_fc2", block + "mlp.down_proj", "row"))
        if two_five
        else (both(vblock + "mlp.linear_fc1", block + "mlp.fc1", "column", "column") + both(vblock + "mlp.linear_fc2", block + "mlp.fc2", "row"))
    )
    rules = [
        Rule("image_encoder.encoder.patch_embed.proj.weight", ("visual.patch_embed.proj.weight",)),
        *both(vblock + "input_layernorm", block + "norm1"),
        *both(vblock + "self_attention.linear_qkv", block + "attn.qkv", "heads_qkv", "heads_qkv", sizes=(vision_head,) * 3),
        *both(vblock + "self_attention.linear_proj", block + "attn.proj", "row"),
        *both(vblock + "pre_mlp_layernorm", block + "norm2"),
        *vision_mlp,
        *both("image_encoder.projector.layernorm", "visual.merger.ln_q"),
        *both("image_encoder.projector.encoder.linear_fc1", "visual.merger.mlp.0", "column", "column"),
        *both("image_encoder.projector.encoder.linear_fc2", "visual.merger.mlp.2", "row"),
        Rule("text_decoder.embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "column", vocab=True),
        Rule(tlayer + "input_layernorm.weight", (layer + "input_layernorm.weight",)),
        *both(tlayer + "self_attention.linear_qkv", f"{layer}self_attn.q_proj|{layer}self_attn.k_proj|{layer}self_attn.v_proj", "qkv", "qkv", sizes=(q_rows, head_dim, head_dim)),
        *both(tlayer + "self_attention.linear_proj", layer + "self_attn.o_proj", "row"),
        Rule(tlayer + "pre_mlp_layernorm.weight", (layer + "post_attention_layernorm.weight",)),
        Rule(tlayer + "mlp.linear_fc1.weight", (layer + "mlp.gate_proj.weight", layer + "mlp.up_proj.weight"), "gate_up"),
        Rule(tlayer + "mlp.linear_fc2.weight", (layer + "mlp.down_proj.weight",), "row"),
        Rule("text_decoder.decoder.final_layernorm.weight", ("model.norm.weight",)),
        Rule("text_decoder.output_layer.weight", ("lm_head.weight",), "column", optional=bool(config.tie_word_embeddings), vocab=True),
    ]
    stacks = (
        LayerStack(VISION, first=("image_encoder.encoder.patch_embed.",), last=("image_encoder.projector.",)),
        LayerStack(TEXT, first=("text_decoder.embedding.",), last=("text_decoder.decoder.final_layernorm.", "text_decoder.output_layer.")),
    )
    tied = ("text_decoder.output_layer.weight", "text_decoder.embedding.word_embeddings.weight") if config.tie_word_embeddings else None
    return ParallelMap(tuple(rules), stacks, tied=tied, vocab_size=text.vocab_size)


def of_checkpoint(model_dir: Path) -> ParallelMap:
    """The table of the checkpoint folder ``model_dir`` (its ``config.json``)."""
    from transformers import AutoConfig

    return parallel_map(AutoConfig.from_pretrained(model_dir))


def rope_index(config: Any, input_ids: Any, mm_token_type_ids: Any, image_grid_thw: Any = None, video_grid_thw: Any = None) -> Any:
    """M-RoPE positions [3, B, S] from the transformers model's own ``get_rope_index`` (it reads
    only the config), without building that model."""
    from transformers import Qwen2_5_VLModel, Qwen2VLModel

    model_class = Qwen2_5_VLModel if config.model_type == "qwen2_5_vl" else Qwen2VLModel
    reader = object.__new__(model_class)  # the class's methods over the config alone, no weights
    reader.__dict__["config"] = config
    positions, _ = reader.get_rope_index(input_ids, mm_token_type_ids, image_grid_thw=image_grid_thw, video_grid_thw=video_grid_thw)
    return positions


class MegatronQwen2VL:
    """Qwen2-VL / Qwen2.5-VL on megatron-core, one (tensor-parallel rank, pipeline stage) of it:
    the vision tower as transformers has it (on the first stage, replicated over tensor-parallel
    ranks), its features scattered into the decoder's input embeddings at the image/video
    tokens, the language model a ``GPTModel`` with M-RoPE positions from the model's own
    rope-index function. ``forward`` returns the logits [B, S, vocab] (the tensor-parallel
    vocabulary padding stripped; with ``parallel_output`` this rank's slice of the padded
    vocabulary, for Megatron's vocab-parallel cross entropy) on the last stage, the hidden states [S, B, H] it hands on
    elsewhere; a later stage gets its input through ``set_input_tensor`` (Megatron's schedules).
    With ``virtual_pipeline`` > 1 it is one chunk (``chunk``) of the stage: the vision tower and
    embedding on the first stage's first chunk, the logits from the last stage's last.
    With ``sequence_parallel`` the sequence is padded to a length the TP size divides and the
    decoder input scattered over the TP ranks after the image features are in; the logits
    are cut back to the batch's length. With ``context_parallel`` > 1 the sequence is padded to
    2 x CP chunks (x TP under sequence parallelism), the rope index and the image features
    computed over the whole of it, and the decoder given this rank's chunks of its input and
    of the positions; the logits are those of this rank's tokens (the loss cuts the labels
    alike)."""

    def __new__(
        cls,
        config: Any,
        tensor_parallel: int,
        pipeline_parallel: int = 1,
        stage: int = 0,
        parallel_output: bool = False,
        sequence_parallel: bool = False,
        virtual_pipeline: int = 1,
        chunk: int = 0,
        context_parallel: int = 1,
    ) -> Any:
        import torch
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

        from mmcore.backends.megatron import context_multiple, even_layers, gpt_model, pad_sequence, scatter_sequence, to_context_rank

        text = config.get_text_config()
        vision_class = Qwen2_5_VisionTransformerPretrainedModel if config.model_type == "qwen2_5_vl" else Qwen2VisionTransformerPretrainedModel
        first, last = stage == 0 and chunk == 0, stage == pipeline_parallel - 1 and chunk == virtual_pipeline - 1

        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.hf_config = config
                if first:
                    self.visual = vision_class._from_config(config.vision_config)
                self.language_model = gpt_model(
                    text,
                    tensor_parallel,
                    tied=config.tie_word_embeddings,
                    mrope_section=text.rope_parameters["mrope_section"],
                    pipeline_parallel=pipeline_parallel,
                    stage_layers=even_layers(text.num_hidden_layers, pipeline_parallel),
                    pre_process=first,
                    post_process=last,
                    parallel_output=parallel_output,
                    sequence_parallel=sequence_parallel,
                    virtual_pipeline=virtual_pipeline,
                    chunk=chunk,
                    context_parallel=context_parallel,
                )
                # what Megatron's schedules read of a model
                self.config, self.model_type = self.language_model.config, self.language_model.model_type

            def set_input_tensor(self, tensor: Any) -> None:
                self.language_model.set_input_tensor(tensor)

            def forward(self, input_ids: Any, mm_token_type_ids: Any, pixel_values: Any = None, image_grid_thw: Any = None, pixel_values_videos: Any = None, video_grid_thw: Any = None) -> Any:
                length = input_ids.shape[1]
                multiple = context_multiple(tensor_parallel if sequence_parallel else 1)
                if multiple > 1:
                    input_ids, mm_token_type_ids = pad_sequence(input_ids, multiple), pad_sequence(mm_token_type_ids, multiple)
                positions = to_context_rank(rope_index(config, input_ids, mm_token_type_ids, image_grid_thw, video_grid_thw), dim=2)
                embeds = None
                if first:
                    embeds = self.language_model.embedding(input_ids=input_ids, position_ids=None).transpose(0, 1)  # [B, S, H]
                    for pixels, grid, token in ((pixel_values, image_grid_thw, config.image_token_id), (pixel_values_videos, video_grid_thw, config.video_token_id)):
                        if pixels is not None:
                            features = self.visual(pixels.to(self.visual.dtype), grid_thw=grid).pooler_output.to(embeds.dtype)
                            embeds = embeds.masked_scatter((input_ids == token)[..., None].expand_as(embeds), features)
                    embeds = scatter_sequence(to_context_rank(embeds.transpose(0, 1), dim=0).contiguous(), self.config)
                out = self.language_model(input_ids=None, position_ids=positions, attention_mask=None, decoder_input=embeds)
                if not last or context_parallel > 1:  # context-parallel: this rank's tokens, padding and all
                    return out
                return out[:, :length] if parallel_output else out[:, :length, : text.vocab_size]

        return Model()


def load_megatron_model(model_dir: Path, tensor_parallel: int, rank: int, pipeline_parallel: int = 1, stage: int = 0) -> Any:
    """:class:`MegatronQwen2VL` of a hub checkpoint folder: tensor-parallel ``rank``'s shard of
    pipeline ``stage``, cut by the table (the vision tower whole, on the first stage), as the
    engine fills a rank (:func:`mmcore.backends.megatron.engine.fill_rank`)."""
    from safetensors import safe_open
    from transformers import AutoConfig

    from mmcore.backends.megatron import Layout, fill_rank

    files = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            files.update(dict.fromkeys(f.keys(), path))

    def read(names: set[str]) -> dict[str, Any]:
        out = {}
        for name in names:
            with safe_open(files[name], "pt") as f:
                out[name] = f.get_tensor(name)
        return out

    model = MegatronQwen2VL(AutoConfig.from_pretrained(model_dir), tensor_parallel, pipeline_parallel, stage)
    fill_rank(model, megatron_family(model_dir), Layout(tensor_parallel, pipeline_parallel, 1, rank, stage, 0), list(files), read)
    return model.eval()


def megatron_family(model_dir: Path) -> Any:
    """The family on megatron-core for ``parallel.backend: megatron`` (the train engine's
    :class:`mmcore.backends.megatron.engine.MegatronFamily`) of the checkpoint folder ``model_dir``."""
    from transformers import AutoConfig

    from mmcore.backends.megatron import MegatronFamily, vocab_parallel_exact_match, vocab_parallel_loss_sum
    from mm_pack_qwen2vl.adapter import ADAPTER
    from mm_qwen_vision import use_cached_vision

    config = AutoConfig.from_pretrained(model_dir)
    vocab = config.get_text_config().vocab_size
    return MegatronFamily(
        build=lambda layout: MegatronQwen2VL(
            config,
            layout.tp,
            layout.pp,
            layout.stage,
            parallel_output=True,
            sequence_parallel=layout.sequence_parallel,
            virtual_pipeline=layout.virtual,
            chunk=layout.chunk,
            context_parallel=layout.cp,
        ),
        parallel_map=parallel_map(config),
        adapter=ADAPTER,
        whole={"visual.": "visual"},
        inputs=("input_ids", "mm_token_type_ids", "pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"),
        loss_sum=lambda logits, batch: vocab_parallel_loss_sum(logits, batch["labels"], vocab),
        # the held-out exact-match accuracy the FSDP2 loop logs (mmcore.train.causal_lm.exact_match)
        score=lambda logits, batch: {"accuracy": (float(vocab_parallel_exact_match(logits, batch["labels"], vocab).sum()), len(logits))},
        score_names=("accuracy",),
        use_cache=lambda first: use_cached_vision(first.visual),
        context_parallel=True,  # MegatronQwen2VL cuts its sequences per context-parallel rank
    )  # the extract stage's cache: only the merger runs
