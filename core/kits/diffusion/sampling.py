"""Generating with a trained denoiser: the infer stage (``mmcore infer --prompt``: a video and its
frames in the run's ``infer/``) and the evaluate stage (sample videos of the export for the
held-out captions and a contact sheet, with a report page)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from mmcore.framework.context import StageContext
from mmcore.errors import StageError
from mmcore.engines.generation import ModelSource, Request, generation_dtype
from mmcore.kits.diffusion.export import LORA_WEIGHTS
from mmcore.framework.pack import StageResult
from mmcore.run.rundir import Manifest

if TYPE_CHECKING:
    from mmcore.kits.diffusion.family import DiffusionFamily


def text_to_video_sample(pipe: Any, ctx: StageContext, prompt: str, generator: Any) -> Any:
    """``DiffusionFamily.sample`` of a text-to-video pipeline called as diffusers' video pipelines
    are (Wan, CogVideoX, HunyuanVideo): the first bucket's size, the export's steps and guidance,
    the data's text length, and the pipeline's own further arguments from
    ``export.pipeline_options`` (LTX-Video's ``frame_rate``; one its ``__call__`` does not take
    is a config error); frames [F, H, W, 3] in [0, 1]."""
    height, width, frames = ctx.config.data.buckets[0]
    export = ctx.config.export
    more = export.call_options(pipe) if hasattr(export, "call_options") else {}
    return pipe(
        prompt,
        height=height,
        width=width,
        num_frames=frames,
        num_inference_steps=export.sample_steps,
        guidance_scale=export.guidance_scale,
        max_sequence_length=ctx.config.data.max_sequence_length,
        generator=generator,
        output_type="np",
        **more,
    ).frames[0]


class VideoSampling:
    """One family's pipeline generating videos in one stage (infer or evaluate) of a run."""

    def __init__(self, family: "DiffusionFamily", ctx: StageContext, upstream: Mapping[str, Manifest]) -> None:
        self.family = family
        self.ctx = ctx
        self.upstream = upstream

    def pipeline(self, source: ModelSource) -> Any:
        """The diffusers pipeline of ``source``: a training checkpoint's denoiser in the downloaded
        pipeline, or a pipeline folder (the export's, or any)."""
        family, ctx, downloaded = self.family, self.ctx, self.upstream["download"].output("model")
        if source.kind == "train":
            subfolder, _ = family.expert(ctx, downloaded)
            denoiser = family.build_model(downloaded, source.path, subfolder).eval()
            pipe = family.diffusers_class(family.pipeline_class).from_pretrained(downloaded, **{subfolder: denoiser})
        elif (source.path / LORA_WEIGHTS).is_file():  # a LoRA export: the downloaded pipeline plus the adapter
            subfolder, _ = family.expert(ctx, downloaded)
            pipe = family.lora_pipeline(downloaded, source.path, subfolder)
        else:
            pipe = family.diffusers_class(family.pipeline_class).from_pretrained(source.path)
        pipe.set_progress_bar_config(disable=True)
        dtype = generation_dtype(ctx)
        # casting to the dtype the weights have already only draws diffusers' warning about casting
        return pipe.to(ctx.accelerator.device()) if pipe.dtype == dtype else pipe.to(ctx.accelerator.device(), dtype)

    def render(self, pipe: Any, prompts: list[str], folder: Path, names: list[str], images: list[Any] | None = None) -> list[dict[str, str]]:
        """One video per prompt (``<name>.mp4`` and its frames as ``<name>.png``; a one-frame sample
        is an image, ``<name>.png``), seeded by
        ``generation.seed`` (default ``run.seed``) plus the prompt's position; steps and guidance
        from ``generation`` where set, else ``export.sample_steps`` / ``export.guidance_scale``;
        ``images``: each prompt's first frame (PIL), for a family with ``conditions``."""
        import dataclasses

        import torch

        from mmcore.data.video import contact_sheet, write_mp4

        ctx = self.ctx
        gen, export = ctx.config.generation, ctx.config.export
        chosen = export.model_copy(update={"sample_steps": gen.num_inference_steps or export.sample_steps, "guidance_scale": gen.guidance_scale or export.guidance_scale})
        sampling = dataclasses.replace(ctx, config=ctx.config.model_copy(update={"export": chosen}))
        seed = gen.seed if gen.seed is not None else ctx.seed
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for i, (prompt, name) in enumerate(ctx.progress(list(zip(prompts, names)), description=ctx.stage, unit="sample")):
            first_frame = {"image": images[i]} if images is not None else {}
            frames = self.family.sample(pipe, sampling, prompt, torch.Generator().manual_seed(seed + i), **first_frame)  # type: ignore[misc]
            sound, heard = None, None
            if isinstance(frames, dict):  # a family that generates sound too: {"frames", "audio" (mono), "audio_rate", ...}
                heard = {k: v for k, v in frames.items() if k != "frames"}
                frames, sound = frames["frames"], (frames["audio"], int(frames["audio_rate"]))
            pixels = (frames.clip(0, 1) * 255).round().astype("uint8")
            if len(pixels) == 1:  # an image model's picture: a PNG, not a one-frame clip
                from PIL import Image

                Image.fromarray(pixels[0]).save(folder / f"{name}.png")
                written.append({"image": str(folder / f"{name}.png"), "pixels": pixels})
                continue
            write_mp4(folder / f"{name}.mp4", pixels, ctx.config.data.fps, audio=sound)
            contact_sheet(folder / f"{name}.png", [pixels], scale=4)
            written.append({"video": str(folder / f"{name}.mp4"), "contact_sheet": str(folder / f"{name}.png"), "pixels": pixels})
            if sound is not None:  # the sound track also on its own, beside the video that carries it
                from mmcore.data.audio import write_audio

                written[-1]["audio"] = str(write_audio(folder / f"{name}.wav", sound[0], sound[1]))
                written[-1]["sound"] = heard
        return written

    def infer(self, model: ModelSource, requests: list[Request]) -> list[dict[str, Any]]:
        """A video for each request's prompt, written to ``infer/`` under a new number."""
        family, ctx = self.family, self.ctx
        if family.sample is None:
            return [{"error": f"the {ctx.pack} pack cannot generate samples"} for _ in requests]
        from mmcore.data.video import MediaError, load_image

        pipe = self.pipeline(model)
        answers: list[dict[str, Any]] = [{} for _ in requests]
        wanted = {"images": 1} if family.conditions else {}
        runnable = [i for i, r in enumerate(requests) if r.prompt and {k: len(v) for k, v in r.media.items() if v} == wanted]
        images: list[Any] = []
        for i, request in enumerate(requests):
            if i not in runnable:
                answers[i] = {
                    "error": "give a caption (--prompt) and one first frame (--image): this pack generates video from an image and text"
                    if family.conditions
                    else "give a caption (--prompt) and no media: this pack generates video from text"
                }
            elif family.conditions:
                try:
                    images.append(load_image(request.media["images"][0]))
                except MediaError as exc:
                    answers[i] = {"error": str(exc)}
        runnable = [i for i in runnable if not answers[i]]
        first = 1 + max((int(p.stem) for p in [*ctx.stage_dir.glob("[0-9]*.mp4"), *ctx.stage_dir.glob("[0-9]*.png")] if p.stem.isdigit()), default=0)
        names = [f"{first + k:04d}" for k in range(len(runnable))]
        done_all = self.render(pipe, [requests[i].prompt for i in runnable], ctx.stage_dir, names, images if family.conditions else None)
        for i, done in zip(runnable, done_all):
            answers[i] = {k: done[k] for k in ("image", "video", "contact_sheet", "audio") if k in done}
        return answers

    def evaluate(self) -> StageResult:
        """Sample videos (an image family: images) of the export for the held-out captions
        (``evaluate.datasets``; else, for a family with a ``demo_checker``, the held-out clips'
        captions; else ``export.sample_prompts``) and one contact sheet of them all. With a
        ``demo_checker``, ``caption_agreement``: the share of samples showing what their caption
        says (captions it cannot read are not counted); beside it the demo VAE's
        ``reconstruction_psnr`` and the train stage's last held-out ``caption_sensitivity``."""
        from mmcore.data.video import contact_sheet
        from mmcore.engines.generation import empty_evaluation, write_results

        family, ctx = self.family, self.ctx
        captions, images = self.held_out_captions(), None
        if family.conditions:  # generated from the held-out clips' first frames and captions
            captions, images = self.held_out_first_frames()
        elif family.demo_checker is not None and not ctx.config.evaluate.datasets and self.held_out_count():
            captions = self.held_out_first_frames()[0]
        if not captions or family.sample is None:
            return empty_evaluation(ctx)
        pipe = self.pipeline(ModelSource("export", self.upstream["export"].output("model")))
        folder = ctx.stage_dir / "samples"
        written = self.render(pipe, captions, folder, [f"sample-{i}" for i in range(len(captions))], images)
        pixels = [w.pop("pixels") for w in written]
        sounds = [w.pop("sound", None) for w in written]
        contact_sheet(folder / "contact_sheet.png", pixels, scale=4)
        for i, image in enumerate(images or []):  # the first frame it was given, beside what it made of it
            image.save(folder / f"sample-{i}-first-frame.png")
        kind = "image" if "image" in written[0] else "video"
        checks = [family.demo_checker(p, c) if family.demo_checker else None for p, c in zip(pixels, captions)]
        heard = [family.sound_checker(s, c) if family.sound_checker and s is not None else None for s, c in zip(sounds, captions)]
        rows = []
        for i, (c, w, check, sound) in enumerate(zip(captions, written, checks, heard)):
            src = str(Path(w[kind]).relative_to(ctx.stage_dir))
            media = ([{"kind": "image", "src": f"samples/sample-{i}-first-frame.png"}] if images else []) + [{"kind": kind, "src": src}]
            rows.append(
                {
                    "item": i,
                    "caption": c,
                    kind: src,
                    "media": media,
                    **({"agrees": check["agrees"], "seen": check["seen"]} if check else {}),
                    **({"sound_agrees": sound["agrees"], "heard": sound["heard"]} if sound else {}),
                }
            )
        metrics: dict[str, Any] = {"items": len(rows), "samples": len(rows), **self.demo_metrics(checks)}
        decided = [h for h in heard if h is not None]
        if decided:  # the sound's share that says what the caption says (LTX-2's demo: the tone's pitch)
            metrics["sound_agreement"] = sum(h["agrees"] for h in decided) / len(decided)
        what = "images" if kind == "image" else "videos"
        write_results(
            ctx.stage_dir,
            rows,
            metrics,
            title=f"{ctx.pack}: {what} the export made for the held-out captions",
            columns=("item", "caption", kind, *(("agrees",) if "caption_agreement" in metrics else ()), *(("sound_agrees",) if "sound_agreement" in metrics else ())),
            images=[("samples/contact_sheet.png", "one row per caption, in order: " + "; ".join(captions))],
            ctx=ctx,
            dataset="the held-out clips' first frames and captions"
            if family.conditions
            else None
            if ctx.config.evaluate.datasets
            else "the held-out clips' captions"
            if family.demo_checker is not None and self.held_out_count()
            else "export.sample_prompts",
        )
        said = [
            f"{metrics[k]:.0%} show what their caption says" if k == "caption_agreement" else f"{metrics[k]:.0%} sound as their caption says" if k == "sound_agreement" else f"{k} {metrics[k]:.2f}"
            for k in ("caption_agreement", "sound_agreement", "caption_sensitivity", "condition_sensitivity", "reconstruction_psnr")
            if k in metrics
        ]
        note = f"{len(rows)} sample {what[:-1]}(s) of the export and a contact sheet in {folder}" + (f": {', '.join(said)}" if said else " (no metric: look at them, report.html)")
        return StageResult(outputs={"results": "results.jsonl", "samples": "samples", "report": "report.html"}, metrics=metrics, notes=[note])

    def demo_metrics(self, checks: list[dict[str, Any] | None]) -> dict[str, Any]:
        """``caption_agreement`` (and per part: ``colour_agreement``, ``shape_agreement``,
        ``motion_agreement``) over the samples whose caption the demo checker read; the demo
        VAE's ``reconstruction_psnr`` (``demo_vae.json`` in the downloaded folder); the train
        stage's last held-out ``caption_sensitivity`` and ``loss_shuffled``/``loss`` (and, for a
        family with conditions, ``condition_sensitivity`` and ``loss_other_condition``)."""
        from mmcore.engines.demo_vae import demo_vae_report

        metrics: dict[str, Any] = {}
        decided = [c for c in checks if c is not None]
        if decided:
            metrics["caption_agreement"] = sum(c["agrees"] for c in decided) / len(decided)
            metrics["agreement_checked"] = len(decided)
            for part in ("colour", "shape", "motion"):
                judged = [c[part] for c in decided if part in c]
                if judged:
                    metrics[f"{part}_agreement"] = sum(judged) / len(judged)
        report = demo_vae_report(self.upstream["download"].output("model")) if "download" in self.upstream else None
        if report and "reconstruction_psnr" in report:
            metrics["reconstruction_psnr"] = report["reconstruction_psnr"]
        trained = self.upstream["train"].metrics if "train" in self.upstream else {}
        for key in ("caption_sensitivity", "condition_sensitivity", "loss_shuffled", "loss_other_condition", "loss"):
            if f"eval/{key}" in trained:
                metrics[key if key.endswith("_sensitivity") else f"held_out_{key}"] = trained[f"eval/{key}"]
        return metrics

    def held_out_count(self) -> int:
        """How many clips preprocess held out."""
        from mmcore.data.shards import ShardDataset

        return len(ShardDataset(self.upstream["preprocess"].output("dataset")).split("eval")) if "preprocess" in self.upstream else 0

    def held_out_first_frames(self) -> tuple[list[str], list[Any]]:
        """(captions, first frames as PIL images) of the held-out clips preprocess made (at most ``evaluate.limit``)."""
        from PIL import Image

        from mmcore.data.shards import ShardDataset

        held = ShardDataset(self.upstream["preprocess"].output("dataset")).split("eval")
        count = min(len(held), self.ctx.config.evaluate.limit)
        return [held.meta(i)["caption"] for i in range(count)], [Image.fromarray(held[i]["frames"][0].numpy()) for i in range(count)]

    def held_out_captions(self) -> list[str]:
        """Captions from ``evaluate.datasets`` (JSON/JSONL records with ``cap``, ``caption`` or
        ``prompt``; videos beside them are not needed), else ``export.sample_prompts``; at most
        ``evaluate.limit``."""
        from mmcore.data.mllm import BadJSON, load_records

        ctx = self.ctx
        if not ctx.config.evaluate.datasets:
            return list(ctx.config.export.sample_prompts)[: ctx.config.evaluate.limit]
        captions = []
        for path in map(Path, ctx.config.evaluate.datasets):
            ctx.record_input(path)
            for index, record in enumerate(load_records(path)):
                text = next((record.get(k) for k in ("cap", "caption", "prompt") if isinstance(record, dict) and k in record), None) if not isinstance(record, BadJSON) else None
                text = text[0] if isinstance(text, list) and text else text
                if not isinstance(text, str) or not text.strip():
                    raise StageError(f"{path}: record {index}: no caption (a 'cap', 'caption' or 'prompt' string)")
                captions.append(text.strip())
        return captions[: ctx.config.evaluate.limit]


__all__ = ["text_to_video_sample", "VideoSampling"]
