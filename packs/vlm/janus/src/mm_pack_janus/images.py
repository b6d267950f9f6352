"""Janus's second direction, text -> image tokens, on the VLM kit.

**Data.** A sample whose last turn is the assistant's and is exactly ``<image>`` (one picture,
LLaMA-Factory's MLLM JSON as it is: ``{"messages": [{"role": "user", "content": "a red
square"}, {"role": "assistant", "content": "<image>"}], "images": ["red.png"]}``) is a
*generation* sample. Preprocess writes what JanusProcessor's image mode writes for the prompt
(the begin-of-sentence token, the conversation up to the assistant's generation prompt, then
``<begin_of_image>``; no default system prompt) followed by the picture as the frozen VQ model
encodes it: its codebook ids, row by row. They are stored in ``input_ids`` and ``labels`` offset
by the text vocabulary's size ``V`` (id ``V + code``), so they survive padding, packing,
fillers and truncation checks like any token, and are told apart from text by their range.

**Loss.** For a batch that holds image tokens, :meth:`JanusFamily.forward_logits` embeds text
ids with the text embedding and image ids with the generation embeddings and aligner (what
``generate(generation_mode="image")`` feeds back), runs the decoder once, and returns the text
head's logits and the generation head's side by side ``[.., V + codebook]``, each masked out
(``-1e9``) where the next token is of the other kind. The kit's summed next-token cross-entropy
over that is exactly the text head's cross-entropy on text targets plus the generation head's
on image targets, as Janus trains (one loss token per image token); batches without image tokens
take the model's own forward unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore.data import ChatTemplateEncoder
from mmcore.kits import VLMFamily

IGNORE = -100
#: the logit of the other head's ids (finite: the export compares logits by difference)
NEVER = -1e9


class VQTokens:
    """The checkpoint's VQ model (frozen): pictures -> codebook ids, read from the folder's
    safetensors (``model.vqmodel.*``) without building the rest of the model."""

    def __init__(self, model_dir: Path, image_processor: Any) -> None:
        import torch
        from safetensors import safe_open
        from transformers import AutoConfig
        from transformers.models.janus.modeling_janus import JanusVQVAE

        config = AutoConfig.from_pretrained(model_dir)
        self.vocab = config.text_config.vocab_size
        self.vq = JanusVQVAE(config.vq_config)
        state = {}
        for file in sorted(Path(model_dir).glob("*.safetensors")):
            with safe_open(file, "pt") as f:
                state.update({k.removeprefix("model.vqmodel."): f.get_tensor(k) for k in f.keys() if k.startswith("model.vqmodel.")})
        self.vq.load_state_dict(state)
        self.vq.eval()
        self.image_processor = image_processor
        self.torch = torch

    def codes(self, path: Path) -> list[int]:
        """The picture's codebook ids (row-major grid), as ``JanusVQVAE.encode`` gives them."""
        from mmcore.data.video import load_image

        pixels = self.image_processor(load_image(path), return_tensors="pt")["pixel_values"]
        with self.torch.no_grad():
            return [int(c) for c in self.vq.encode(pixels.float()).image_tokens.flatten()]


class JanusEncoder(ChatTemplateEncoder):
    """The kit's chat-template encoder, and for generation samples the image-mode prompt and
    the target picture's VQ ids (offset by the text vocabulary)."""

    def __init__(self, *args: Any, model_dir: Path, image_prompt_template: str, image_processor: Any, boi: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model_dir, self.image_prompt_template, self.boi = model_dir, image_prompt_template, boi
        self.image_processor = image_processor
        self._vq: VQTokens | None = None

    @property
    def vq(self) -> VQTokens:
        if self._vq is None:  # loaded when a generation sample first needs it
            self._vq = VQTokens(self.model_dir, self.image_processor)
        return self._vq

    def encode(self, sample: Any) -> Any:
        if not sample.asks_for_picture:
            return super().encode(sample)
        from mmcore.data.chat_template import ChatTemplateError, Encoded

        pictures = list(sample.media.get("images", []))
        if len(pictures) != 1 or any("<image>" in t.content for t in sample.turns[:-1]):
            raise ChatTemplateError("a Janus generation sample has one picture, the assistant's whole last turn (<image>), and no image in the prompt")
        ids = self.prompt_ids(sample.turns[:-1])
        codes = [self.vq.vocab + c for c in self.vq.codes(pictures[0])]
        # image_tokens: how many (a field the model does not take: the dataset index then says
        # which samples are pictures without reading them, see mm_pack_janus.family.prepare_model)
        return Encoded(ids + codes, [IGNORE] * len(ids) + codes, {"image_tokens": [[len(codes)]]})

    def prompt_ids(self, turns: Any) -> list[int]:
        """JanusProcessor's image-mode prompt: the conversation, the generation prompt, ``<begin_of_image>``."""
        messages = [{"role": t.role, "content": [{"type": "text", "text": t.content}]} for t in turns]
        text = self.tok.apply_chat_template(messages, chat_template=self.image_prompt_template, tokenize=False, add_generation_prompt=True)
        return list(self.tok(text + self.boi, add_special_tokens=False)["input_ids"])

    def truncate(self, enc: Any, limit: int) -> Any:
        cut = enc.input_ids[limit:]
        if self._vq is not None and any(i >= self._vq.vocab for i in cut):  # only a generation sample loaded the VQ model
            return f"{len(enc.input_ids)} tokens, and cutoff_len={limit} would cut through the target picture's image tokens"
        return super().truncate(enc, limit)


def both_heads(model: Any) -> None:
    """Hooks on the decoder (once per model) that, for a call :meth:`JanusFamily.forward_logits`
    describes in ``model.janus_call``, put the generation embeddings of the image ids in place
    of their input embeddings and run the generation head on the decoder's output. They run
    inside the model's own forward, where FSDP2 has gathered the root's parameters (the
    embeddings, aligners and heads are the root's). ``touch`` (a batch without image tokens, in
    a run whose data has some) adds the generation path times zero, so every rank's step gives
    the same parameters gradients whatever its batch holds."""
    import torch

    if getattr(model, "janus_hooked", False):
        return

    def before(module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        model = module.janus_root[0]
        call = getattr(model, "janus_call", None)
        if call is not None and call["image"] is not None:
            embeds = kwargs["inputs_embeds"]
            generated = model.prepare_embeddings_for_image_generation(call["codes"]).to(embeds.dtype)
            kwargs["inputs_embeds"] = torch.where(call["image"][..., None], generated, embeds)
        return args, kwargs

    def after(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> Any:
        model = module.janus_root[0]
        call = getattr(model, "janus_call", None)
        if call is None:
            return output
        if call["image"] is not None:
            call["image_logits"] = model.model.generation_head(output.last_hidden_state)
        elif call["touch"]:
            unused = model.model.generation_head(model.prepare_embeddings_for_image_generation(call["codes"][:1, :1] * 0))
            output.last_hidden_state = output.last_hidden_state + 0.0 * unused.sum().to(output.last_hidden_state.dtype)
        return output

    decoder = model.model.language_model
    decoder.janus_root = [model]  # not a submodule; a copy of the model (deepcopy) gets its own
    decoder.register_forward_pre_hook(before, with_kwargs=True)
    decoder.register_forward_hook(after, with_kwargs=True)
    model.janus_hooked = True


def has_image_tokens(sample: dict[str, Any], vocab: int) -> bool:
    """Whether a stored sample is a generation sample: its labels hold image tokens (past the text vocabulary)."""
    return bool((sample["labels"] >= vocab).any())


class JanusFamily(VLMFamily):
    """The VLM kit's family with Janus's generation head beside the text head."""

    def forward_logits(self, model: Any, batch: dict[str, Any]) -> Any:
        import torch

        vocab = model.config.text_config.vocab_size
        ids = batch["input_ids"]
        image = ids >= vocab
        touch = model.training and torch.is_grad_enabled() and getattr(model, "janus_both_heads", False)
        if not bool(image.any()) and not touch:
            return super().forward_logits(model, batch)  # the model's own forward, untouched
        both_heads(model)
        model.janus_call = {"image": image if bool(image.any()) else None, "codes": (ids - vocab).clamp(min=0), "touch": touch}
        try:
            text = super().forward_logits(model, dict(batch, input_ids=ids.masked_fill(image, 0)))
            call = model.janus_call
        finally:
            model.janus_call = None
        if call["image"] is None:
            return text
        next_is_image = torch.zeros_like(image)
        next_is_image[:, :-1] = image[:, 1:]
        codes = call["image_logits"].to(text.dtype)
        return torch.cat([text.masked_fill(next_is_image[..., None], NEVER), codes.masked_fill(~next_is_image[..., None], NEVER)], dim=-1)

    def held_out(self, ctx: Any, upstream: Any) -> tuple[list[tuple[str, dict[str, Any]]], int]:
        """The kit's held-out text items (answers scored by their words); generation items are
        :meth:`evaluate`'s pictures."""
        items, skipped = super().held_out(ctx, upstream)
        vocab = self.config(upstream["download"].output("model")).text_config.vocab_size
        return [(name, s) for name, s in items if not has_image_tokens(s, vocab)], skipped

    def evaluate(self, ctx: Any, upstream: Any) -> Any:
        """The kit's scored answers for text items, and for generation items (held-out pictures)
        the export's greedy pictures: PNGs, and how many of the target's image tokens it reproduced."""
        from mm_pack_janus.picture import evaluate_pictures

        return evaluate_pictures(self, ctx, upstream, super().evaluate(ctx, upstream))

    def infer(self, ctx: Any, upstream: Any, model: Any, requests: list[Any]) -> list[dict[str, Any]]:
        if ctx.config.generation.output != "image":
            return super().infer(ctx, upstream, model, requests)
        from mm_pack_janus.picture import infer_pictures

        return infer_pictures(self, ctx, upstream, model, requests)


__all__ = ["JanusEncoder", "JanusFamily", "VQTokens"]
