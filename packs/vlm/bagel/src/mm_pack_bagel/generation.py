"""Generating with BAGEL: text answers (greedy, or sampled at ``generation.temperature``) and
pictures by the reference's Euler flow sampling (``Bagel.generate_image``).

Both recompute the whole packed row at every step instead of keeping a KV cache: the same
attention pattern as the reference's cached inference (a query text token reads the prompt
causally; the latent split reads the prompt and itself whole), fine at the tiny sizes these run
at on CPU, slow for the released model.

Pictures: ``x`` starts as Gaussian noise of the latent's patch tokens; over ``num_inference_steps``
times ``t`` from 1 to 0, shifted by ``timestep_shift`` (the reference's inferencer: 3.0),
``x <- x - v(x, t) * dt``. With ``guidance_scale`` > 1 (the reference's ``cfg_text_scale``),
the velocity is also predicted without the caption and mixed as
``v_u + s * (v_c - v_u)``, rescaled so its norm does not exceed the conditional one (the
reference's ``cfg_renorm_type="global"``), inside ``cfg_interval`` (0.4, 1].
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

TIMESTEP_SHIFT = 3.0
CFG_INTERVAL = (0.4, 1.0)


def _pack(model: Any, samples: list[list[dict[str, Any]]], ids: Mapping[str, int]) -> dict[str, Any]:
    from mm_pack_bagel.packing import pack

    c = model.config
    return pack(samples, ids, vit_patch=c.vit.patch_size, vit_max_per_side=c.vit_max_num_patch_per_side, latent_patch=c.latent_patch_size, max_latent_size=c.max_latent_size)


@torch.no_grad()
def answer(model: Any, prompt: list[dict[str, Any]], ids: Mapping[str, int], *, max_new_tokens: int, temperature: float = 0.0, generator: torch.Generator | None = None) -> list[int]:
    """The answer's token ids after ``prompt``'s items, up to ``<|im_end|>``."""
    out: list[int] = []
    for _ in range(max_new_tokens):
        batch = _pack(model, [[*prompt, {"type": "text", "ids": out, "open": True}]], ids)
        hidden = model.decode_row(model.embed_row(batch), batch, torch.zeros(0, dtype=torch.long))
        logits = model.language_model.lm_head(hidden[-1]).float()
        token = int(logits.argmax()) if temperature <= 0 else int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator))
        if token == ids["eos"]:
            break
        out.append(token)
    return out


def _velocity(model: Any, prompt: list[dict[str, Any]], ids: Mapping[str, int], x: torch.Tensor, t: float, h: int, w: int) -> torch.Tensor:
    p = model.config.latent_patch_size
    placeholder = torch.zeros(model.config.latent_channels, h * p, w * p)
    batch = _pack(model, [[*prompt, {"type": "vae", "latent": placeholder, "loss": True, "timestep": 0.0}]], ids)
    sequence = model.embed_row(batch)
    gen = batch["packed_vae_token_indexes"]
    times = torch.full((x.shape[0],), t)
    sequence[gen] = model.latent_tokens(x, times, batch["packed_latent_position_ids"]).to(sequence.dtype)
    return model.llm2vae(model.decode_row(sequence, batch, gen)[gen])


@torch.no_grad()
def picture(model: Any, prompt: list[dict[str, Any]], ids: Mapping[str, int], *, size: int, steps: int, guidance: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """A latent ``[c, size/8*.., ..]`` drawn for ``prompt`` (the caption's items)."""
    c = model.config
    h = w = size // c.latent_downsample
    x = torch.randn(h * w, c.patch_latent_dim, generator=generator)
    times = torch.linspace(1, 0, steps)
    times = TIMESTEP_SHIFT * times / (1 + (TIMESTEP_SHIFT - 1) * times)
    for t, dt in zip(times[:-1].tolist(), (times[:-1] - times[1:]).tolist()):
        v = _velocity(model, prompt, ids, x, t, h, w)
        if guidance > 1.0 and CFG_INTERVAL[0] < t <= CFG_INTERVAL[1]:
            unconditional = _velocity(model, [], ids, x, t, h, w)
            mixed = unconditional + guidance * (v - unconditional)
            v = mixed * (v.norm() / mixed.norm()).clamp(max=1.0)
        x = x - v * dt
    return model.unpatchify_latent(x, h, w)


def infer(ctx: Any, upstream: Mapping[str, Any], model: Any, requests: list[Any]) -> list[dict[str, Any]]:
    """``mmcore infer``: text answers, or (``generation.output=image``) a PNG per prompt."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from mm_pack_bagel.data import pixels
    from mm_pack_bagel.stages import trained_model
    from mm_pack_bagel.tiny import token_ids
    from mm_pack_bagel.vae import decode, load_vae

    folder = Path(upstream["download"].output("model"))
    bagel = trained_model(ctx, upstream, model).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    ids = token_ids(tok)
    gen = ctx.config.generation
    seed = gen.seed if gen.seed is not None else ctx.seed
    cfg = ctx.config.data
    results, vae = [], None
    for n, request in enumerate(requests):
        images = list(request.media.get("images", []))
        items: list[dict[str, Any]] = []
        for role, text in request.turns:
            for i, piece in enumerate(text.split("<image>")):
                if i:
                    if not images:
                        raise ValueError(f"{request.where}: more <image> placeholders than images")
                    items.append({"type": "vit", "image": pixels(images.pop(0), cfg.vit_image_size)})
                if piece.strip():
                    items.append({"type": "text", "ids": tok(piece.strip(), add_special_tokens=False)["input_ids"], "loss": False})
        g = torch.Generator().manual_seed(seed + n)
        if gen.output == "image":
            latent = picture(bagel, items, ids, size=cfg.vae_image_size, steps=gen.num_inference_steps or 25, guidance=gen.guidance_scale or 1.0, generator=g)
            vae = vae or load_vae(folder / "ae.safetensors")
            image = decode(vae, latent[None])[0]
            path = ctx.stage_dir / f"image-{n:03d}.png"
            _save_png(image, path)
            results.append({"image": str(path)})
        else:
            out = answer(bagel, items, ids, max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, generator=g)
            results.append({"text": tok.decode(out, skip_special_tokens=True).strip()})
    return results


def _save_png(image: torch.Tensor, path: Any) -> Any:
    """Write ``image`` (``[3, H, W]`` in [-1, 1]) as a PNG; returns its uint8 ``[H, W, 3]`` pixels."""
    from PIL import Image

    array = ((image.clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).numpy()
    Image.fromarray(array).save(path)
    return array


def evaluate(ctx: Any, upstream: Mapping[str, Any]) -> Any:
    """The export on the held-out split preprocess made: each text item with a loss answered
    greedily after the items before it (exact match against the stored answer), each picture
    drawn from its caption (a PNG in the report; ``generation.guidance_scale`` > 1: with CFG) and,
    for the demo's captions ("a red circle"), checked against what its pixels show
    (``caption_agreement``: colour and, where the shape is big enough to judge, shape; also
    ``colour_agreement``, ``shape_agreement``), beside the demo VAE's ``reconstruction_psnr``.
    ``evaluate.datasets`` is not read here."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from mmcore import StageResult
    from mmcore.data import ShardDataset
    from mmcore.engines import exact_match, write_results
    from mm_pack_bagel.checkpoint import load_model
    from mm_pack_bagel.data import items_of
    from mmcore.data import caption_agreement
    from mmcore.engines import demo_vae_report
    from mm_pack_bagel.vae import decode, load_vae

    folder = Path(upstream["download"].output("model"))
    export = Path(upstream["export"].output("model"))
    gen = ctx.config.generation
    model = load_model(export).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    data = ShardDataset(upstream["preprocess"].output("dataset")).split("eval")
    ids = {k: int(v) for k, v in data.index["tokens"].items()}
    vae = None
    rows, images, right, asked = [], [], 0, 0
    about_images: list[bool] = []
    checks: list[dict[str, Any]] = []
    for n in range(min(ctx.config.evaluate.limit, len(data))):
        items = items_of(data[n], ids)
        last = items[-1]
        prompt = [dict(item, loss=False) for item in items[:-1]]
        caption = " ".join(tok.decode(item["ids"]) for item in prompt if item["type"] == "text")
        if last["type"] == "vae":
            vae = vae or load_vae(folder / "ae.safetensors")
            latent = picture(
                model,
                prompt,
                ids,
                size=last["latent"].shape[-1] * model.config.vae["downsample"],
                steps=gen.num_inference_steps or 25,
                guidance=gen.guidance_scale or 1.0,
                generator=torch.Generator().manual_seed(ctx.seed + n),
            )
            name = f"picture-{n:03d}.png"
            drawn = _save_png(decode(vae, latent[None])[0], ctx.stage_dir / name)
            check = caption_agreement(drawn, caption)  # None: not a demo caption, not counted
            if check is not None:
                checks.append(check)
            images.append((name, caption))
            rows.append({"prompt": caption, "picture": name, **({"agrees": check["agrees"], "seen": f"{check['seen']['colour']} {check['seen']['shape']}"} if check else {})})
        elif last["type"] == "text" and last["loss"]:
            reference = tok.decode(last["ids"]).strip()
            got = tok.decode(answer(model, prompt, ids, max_new_tokens=gen.max_new_tokens), skip_special_tokens=True).strip()
            asked += 1
            right += int(exact_match(got, reference))
            seen = any(item["type"] == "vit" for item in prompt)
            if seen:
                about_images.append(exact_match(got, reference))
            rows.append({"prompt": ("<image>" if seen else "") + caption, "answer": got, "reference": reference, "correct": exact_match(got, reference)})
    metrics = {"items": len(rows), "answers": asked, "accuracy": right / asked if asked else 0.0, "pictures": len(images)}
    # the answers that needed the tower (a text-only question may carry its answer in the prompt)
    metrics["image_answers"], metrics["image_accuracy"] = len(about_images), sum(about_images) / len(about_images) if about_images else 0.0
    if checks:  # the demo's captions: what each picture shows, read from its pixels
        metrics["caption_agreement"], metrics["agreement_checked"] = sum(c["agrees"] for c in checks) / len(checks), len(checks)
        for part in ("colour", "shape"):
            judged = [c[part] for c in checks if part in c]
            if judged:
                metrics[f"{part}_agreement"] = sum(judged) / len(judged)
    vae_report = demo_vae_report(folder)
    if vae_report and "reconstruction_psnr" in vae_report:
        metrics["reconstruction_psnr"] = vae_report["reconstruction_psnr"]
    columns = ("prompt", "answer", "reference", "correct", "picture", *(("agrees", "seen") if checks else ()))
    write_results(ctx.stage_dir, rows, metrics, title=f"{ctx.pack}: evaluation", columns=columns, images=images, ctx=ctx)
    agreement = f" ({metrics['caption_agreement']:.0%} show their caption)" if checks else ""
    notes = [f"{asked} held-out answers, {right} exact; {len(images)} pictures drawn{agreement}"]
    return StageResult(outputs={"results": "results.jsonl", "metrics": "metrics.json"}, metrics=metrics, notes=notes)
