"""Pictures from Janus: ``mmcore infer ... generation.output=image`` and the evaluate stage's
held-out generation items, through transformers' own image generation
(``JanusForConditionalGeneration.generate(generation_mode="image")``: classifier-free guidance
over the prompt and its unconditional twin, the generation head's ids fed back through the
generation embeddings) and the VQ model's decoder (``decode_image_tokens``), post-processed as
``JanusProcessor.post_process_multimodal_output`` does, written as PNGs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

IGNORE = -100


def picture_model(family: Any, ctx: Any, upstream: Any, source: Any) -> tuple[Any, Path, Any, Any]:
    """(model, its folder, tokenizer, processor) for generating pictures, in float32 on CPU as the kit generates."""
    from transformers import AutoTokenizer

    from mm_pack_janus.family import processor

    model, folder = family.generation_model(ctx, upstream, source)
    tokenizer, proc = AutoTokenizer.from_pretrained(folder), processor(folder)
    # transformers' image generation reads <begin_of_image> from generation_kwargs (it keeps the
    # unconditional prompt's bos and boi): a checkpoint whose generation config lacks it gets the tokenizer's
    config = model.generation_config
    config.generation_kwargs = {**(getattr(config, "generation_kwargs", None) or {}), "boi_token_id": tokenizer.convert_tokens_to_ids(proc.image_start_token)}
    if config.pad_token_id is None:
        config.pad_token_id = tokenizer.pad_token_id
    return model, folder, tokenizer, proc


def generate_pictures(cfg: Any, model: Any, proc: Any, prompts: list[list[int]], seed: int) -> tuple[list[list[int]], list[Any]]:
    """(image ids, PIL pictures) for each tokenized image-mode prompt (ending with ``<begin_of_image>``),
    by the ``generation`` section ``cfg``: greedy at temperature 0, else sampled; guidance as
    ``guidance_scale`` says, else the checkpoint's generation config (the released one: 5)."""
    import torch

    device = next(model.parameters()).device
    codes, pictures = [], []
    for i, ids in enumerate(prompts):
        torch.manual_seed(seed + i)
        input_ids = torch.tensor([ids], device=device)
        options: dict[str, Any] = {"do_sample": cfg.temperature > 0}
        if cfg.temperature > 0:
            options.update(temperature=cfg.temperature, top_p=cfg.top_p)
        if cfg.guidance_scale is not None:
            options["guidance_scale"] = cfg.guidance_scale
        generated = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_mode="image", **options)
        decoded = model.decode_image_tokens(generated)
        codes.append([int(c) for c in generated[0]])
        # decode_image_tokens gives [B, H, W, 3] in the normalised range, undone as the processor
        # does; handed over channels first: the PIL image processor's normalize (transformers
        # 5.25) assumes that layout whatever the input's, and fails on channels-last arrays
        planes = decoded.permute(0, 3, 1, 2).float().cpu()
        pictures.append(proc.postprocess(list(planes), return_tensors="PIL.Image.Image", input_data_format="channels_first")["pixel_values"][0])
    return codes, pictures


def infer_pictures(family: Any, ctx: Any, upstream: Any, source: Any, requests: list[Any]) -> list[dict[str, Any]]:
    """A picture per request's prompt, ``infer/<n>.png``."""
    from transformers import AutoTokenizer

    from mmcore.data import Turn

    model, folder, tokenizer, proc = picture_model(family, ctx, upstream, source)
    encoder = family.encoder(ctx, folder, AutoTokenizer.from_pretrained(folder))
    answers: list[dict[str, Any]] = [{} for _ in requests]
    runnable = []
    for i, request in enumerate(requests):
        if not request.prompt or any(request.media.values()):
            answers[i] = {"error": "give a caption (--prompt) and no media: generation.output=image draws a picture from text"}
        else:
            runnable.append(i)
    prompts = [encoder.prompt_ids([Turn(role, text) for role, text in requests[i].turns]) for i in runnable]
    seed = ctx.config.generation.seed if ctx.config.generation.seed is not None else ctx.seed
    _, pictures = generate_pictures(ctx.config.generation, model, proc, prompts, seed)
    ctx.stage_dir.mkdir(parents=True, exist_ok=True)
    first = 1 + max((int(p.stem) for p in ctx.stage_dir.glob("[0-9]*.png") if p.stem.isdigit()), default=0)
    for k, (i, picture) in enumerate(zip(runnable, pictures)):
        path = ctx.stage_dir / f"{first + k:04d}.png"
        picture.save(path)
        answers[i] = {"image": str(path)}
    return answers


def evaluate_pictures(family: Any, ctx: Any, upstream: Any, text_result: Any) -> Any:
    """``text_result`` (the kit's evaluate of the text items) with the held-out generation items'
    greedy pictures added: ``pictures/<item>.png``, ``image_token_accuracy`` (the target's ids
    reproduced) and ``pictures`` (how many)."""
    from mmcore import StageResult
    from mmcore.engines import ModelSource

    from mm_pack_janus.images import has_image_tokens

    from mmcore.kits import VLMFamily

    vocab = family.config(upstream["download"].output("model")).text_config.vocab_size
    items, _ = VLMFamily.held_out(family, ctx, upstream)  # every held-out item (the family's own held_out keeps the text ones)
    items = [(name, s) for name, s in items if has_image_tokens(s, vocab)]
    if not items:
        return text_result
    model, _, _, proc = picture_model(family, ctx, upstream, ModelSource("export", upstream["export"].output("model")))
    prompts, targets = [], []
    for _, sample in items:
        image = (sample["input_ids"] >= vocab).nonzero().flatten()
        prompts.append(sample["input_ids"][: int(image[0])].tolist())
        targets.append((sample["input_ids"][image] - vocab).tolist())
    seed = ctx.config.generation.seed if ctx.config.generation.seed is not None else ctx.seed
    codes, pictures = generate_pictures(ctx.config.generation.model_copy(update={"temperature": 0.0}), model, proc, prompts, seed)
    folder = ctx.stage_dir / "pictures"
    folder.mkdir(parents=True, exist_ok=True)
    hits = 0.0
    for (name, _), picture, got, want in zip(items, pictures, codes, targets):
        picture.save(folder / f"{name.replace('/', '_').replace(':', '_')}.png")
        hits += sum(a == b for a, b in zip(got, want)) / len(want)
    metrics = {**dict(text_result.metrics), "pictures": len(items), "image_token_accuracy": hits / len(items)}
    outputs = {**dict(text_result.outputs), "pictures": "pictures"}
    note = f"{len(items)} held-out picture(s) drawn greedily by the export into {folder}: {metrics['image_token_accuracy']:.1%} of their target image tokens reproduced"
    return StageResult(outputs=outputs, metrics=metrics, notes=[*text_result.notes, note])
