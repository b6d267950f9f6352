"""Lumina-mGPT's text -> image direction on the VLM kit.

**Layout** (Lumina-mGPT's ``FlexARItemProcessor``, written here from its description): a
generated picture is ``<racm3:break>``, the height and the width in size units
(``<reserved08800+n>``; a unit is two latent cells, 32 pixels for the released 16x VQ model),
then the VQ codes row by row as their vocabulary tokens (``IMGIMG...Z``), each row closed by the
new-line token ``<reserved08799>``, then ``<eoss>``. The picture is first cropped to the size
among those of at most ``(target / unit)^2`` units (aspect ratio up to 4) that keeps most of it
(Lumina picks among the best at random; here the best, centred, so preprocessing is reproducible).

**Data.** A sample whose last turn is the assistant's and is exactly ``<image>`` (LLaMA-Factory's
JSON unedited) is a generation sample: the conversation up to it as Lumina's template writes it,
then the picture's tokens and the separator, learnt. Image questions (``<image>`` in a user
turn) stay transformers' layout (``ChameleonProcessor``: ``<racm3:break>``, ``<image>`` x N,
``<eoss>``, the VQ model run inside the model's forward).

**Logits.** ``ChameleonForConditionalGeneration`` sets the logits of every image-code token to
the dtype's minimum (it generates text only). Lumina-mGPT trains with that mask off
(``mask_image_logits=False``). :meth:`LuminaFamily.forward_logits` keeps transformers' mask where
the input token is not part of a picture -- so text and image-question batches give exactly
transformers' logits -- and lifts it where the input is a picture's size, code or new-line
token, the positions that predict a picture's codes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore.data import ChatTemplateEncoder
from mmcore.kits import VLMFamily

IGNORE = -100


def crop_size(width: int, height: int, units: int, unit: int, max_ratio: float = 4.0) -> tuple[int, int]:
    """(width, height) in pixels: of the sizes of at most ``units`` units, the one keeping most of the picture."""
    best, kept = (unit, unit), -1.0
    for w in range(1, units + 1):
        for h in range(1, units // w + 1):
            if max(w, h) / min(w, h) > max_ratio or (w + 1) * h <= units and (h + 1) * w <= units:
                continue  # too elongated, or not maximal
            sw, sh = w * unit / width, h * unit / height
            share = min(sw, sh) / max(sw, sh)
            if share > kept:
                best, kept = (w * unit, h * unit), share
    return best


def center_crop(image: Any, size: tuple[int, int]) -> Any:
    """Scale ``image`` to cover ``size`` and cut out its centre."""
    from PIL import Image

    scale = max(size[0] / image.size[0], size[1] / image.size[1])
    image = image.resize((max(size[0], round(image.size[0] * scale)), max(size[1], round(image.size[1] * scale))), resample=Image.BICUBIC)
    left, top = (image.size[0] - size[0]) // 2, (image.size[1] - size[1]) // 2
    return image.crop((left, top, left + size[0], top + size[1]))


class PictureTokens:
    """The checkpoint's VQ encoder (frozen) and vocabulary mapping: a picture -> Lumina's token layout."""

    def __init__(self, model_dir: Path, tokenizer: Any, image_processor: Any) -> None:
        import torch
        from safetensors import safe_open
        from transformers import AutoConfig
        from transformers.models.chameleon.modeling_chameleon import ChameleonImageVocabularyMapping, ChameleonVQVAE

        config = AutoConfig.from_pretrained(model_dir)
        self.vq = ChameleonVQVAE(config.vq_config)
        state = {}
        for file in sorted(Path(model_dir).glob("*.safetensors")):
            with safe_open(file, "pt") as f:
                state.update({k.removeprefix("model.vqmodel."): f.get_tensor(k) for k in f.keys() if k.startswith("model.vqmodel.")})
        self.vq.load_state_dict(state)
        self.vq.eval()
        self.mapping = ChameleonImageVocabularyMapping(config.vocabulary_map)
        self.compression = 2 ** (len(config.vq_config.channel_multiplier) - 1)
        self.unit = 2 * self.compression
        self.units = (config.vq_config.resolution // self.unit) ** 2
        self.tok, self.image_processor, self.torch = tokenizer, image_processor, torch

    def ids(self, path: Path) -> list[int]:
        from mmcore.data.video import load_image

        from mm_pack_lumina_mgpt.tiny import BOI, EOI, NEWLINE, size_token

        image = load_image(path)
        image = center_crop(image, crop_size(image.size[0], image.size[1], self.units, self.unit))
        pixels = self.image_processor(image, do_resize=False, do_center_crop=False, return_tensors="pt")["pixel_values"]
        with self.torch.no_grad():
            codes = self.mapping.convert_img2bpe(self.vq.encode(pixels.float()).image_tokens)
        rows, cols = image.size[1] // self.compression, image.size[0] // self.compression
        grid = codes.view(rows, cols).tolist()
        t = self.tok.convert_tokens_to_ids
        body = [c for row in grid for c in (*row, t(NEWLINE))]
        return [t(BOI), t(size_token(image.size[1] // self.unit)), t(size_token(image.size[0] // self.unit)), *body, t(EOI)]


class LuminaEncoder(ChatTemplateEncoder):
    """The kit's chat-template encoder; generation samples get the picture in Lumina's layout."""

    def __init__(self, *args: Any, model_dir: Path, image_processor: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model_dir, self.image_processor = model_dir, image_processor
        self._pictures: PictureTokens | None = None

    @property
    def pictures(self) -> PictureTokens:
        if self._pictures is None:  # loaded when a generation sample first needs it
            self._pictures = PictureTokens(self.model_dir, self.tok, self.image_processor)
        return self._pictures

    def prompt_ids(self, turns: Any) -> list[int]:
        """The conversation before the picture, as Lumina's template writes it (each turn then the separator)."""
        messages = [{"role": t.role, "content": t.content} for t in turns]
        return list(self.tok(self.render(messages), add_special_tokens=False)["input_ids"])

    def encode(self, sample: Any) -> Any:
        if not sample.asks_for_picture:
            return super().encode(sample)
        from mmcore.data.chat_template import ChatTemplateError, Encoded

        pictures = list(sample.media.get("images", []))
        if len(pictures) != 1 or any("<image>" in t.content for t in sample.turns[:-1]):
            raise ChatTemplateError("a Lumina-mGPT generation sample has one picture, the assistant's whole last turn (<image>), and no image in the prompt")
        prompt = self.prompt_ids(sample.turns[:-1])
        answer = [*self.pictures.ids(pictures[0]), self.tok.convert_tokens_to_ids(self.tok.sep_token)]
        return Encoded(prompt + answer, [IGNORE] * len(prompt) + answer, {})


def picture_token_ids(config: Any) -> tuple[list[int], list[int]]:
    """(the image-code ids, every id that is part of a picture's body: codes, size tokens, new-line)."""
    from mm_pack_lumina_mgpt.tiny import NEWLINE

    vocab = config.vocabulary_map
    codes = sorted(v for k, v in vocab.items() if k.startswith("IMGIMG"))
    layout = [v for k, v in vocab.items() if k == NEWLINE or (k.startswith("<reserved088") and k[9:14].isdigit() and int(k[9:14]) > 8800)]
    return codes, sorted(set(codes) | set(layout))


def keep_raw_logits(model: Any) -> None:
    """A hook on ``lm_head`` (once per model) that hands the model's forward a copy to mask and
    keeps the unmasked logits in ``model.lumina_raw``."""
    if getattr(model, "lumina_hooked", False):
        return

    def after(module: Any, args: Any, output: Any) -> Any:
        owner = module.lumina_root[0]
        if getattr(owner, "lumina_capture", False):
            owner.lumina_raw = output
            return output.clone()
        return output

    model.lm_head.lumina_root = [model]
    model.lm_head.register_forward_hook(after)
    model.lumina_hooked = True


def hand_on_positions(model: Any) -> Any:
    """Chameleon's attention takes ``position_ids`` itself and does not hand them to the
    attention function; a pre-hook on each adds them as ``packed_position_ids``, which packed
    attention reads (and others ignore), so a packed row's samples stay apart."""

    def before(module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        kwargs["packed_position_ids"] = kwargs.get("position_ids")
        return args, kwargs

    for layer in model.model.layers:
        layer.self_attn.register_forward_pre_hook(before, with_kwargs=True)
    return model


class LuminaFamily(VLMFamily):
    """The VLM kit's family with Lumina's unmasked image-code logits inside pictures."""

    def build_model(self, model_dir: Path, checkpoint: Path | None = None) -> Any:
        return hand_on_positions(super().build_model(model_dir, checkpoint))

    def forward_logits(self, model: Any, batch: dict[str, Any]) -> Any:
        import torch

        codes, body = picture_token_ids(model.config)
        ids = batch["input_ids"]
        inside = torch.isin(ids, torch.tensor(body, device=ids.device))
        if not bool(inside.any()):
            return super().forward_logits(model, batch)  # the model's own forward, untouched
        keep_raw_logits(model)
        model.lumina_capture = True
        try:
            super().forward_logits(model, batch)
            raw = model.lumina_raw
        finally:
            model.lumina_capture, model.lumina_raw = False, None
        masked = torch.zeros(raw.shape[-1], dtype=torch.bool, device=raw.device)
        masked[codes] = True
        return raw.masked_fill(masked & ~inside[..., None], torch.finfo(raw.dtype).min)

    def held_out(self, ctx: Any, upstream: Any) -> tuple[list[tuple[str, dict[str, Any]]], int]:
        """The kit's held-out text items; pictures are :func:`mm_pack_lumina_mgpt.draw.evaluate_pictures`'."""
        items, skipped = super().held_out(ctx, upstream)
        codes, _ = picture_token_ids(self.config(upstream["download"].output("model")))
        return [(n, s) for n, s in items if not torch_isin(s["labels"], codes)], skipped

    def evaluate(self, ctx: Any, upstream: Any) -> Any:
        from mm_pack_lumina_mgpt.draw import evaluate_pictures

        return evaluate_pictures(self, ctx, upstream, super().evaluate(ctx, upstream))


def torch_isin(labels: Any, ids: list[int]) -> bool:
    import torch

    return bool(torch.isin(labels, torch.tensor(ids)).any())
