"""The diffusion kit: the stages of a diffusers text-to-video (or -image) model trained by flow
matching, from one declaration.

A pack describes its family once, as a :class:`DiffusionFamily` (the denoiser and pipeline
classes, how the frozen VAE and text encoder encode, how the denoiser is called); the family's
methods are the stage functions and parts its declared stages bind::

    FAMILY = DiffusionFamily(transformer_class="WanTransformer3DModel", pipeline_class="WanPipeline", ...)

    STAGES = {
        "convert": Stage("mmcore.convert:convert_stage", parts={"adapter": "mm_pack_x.family:FAMILY.adapter",
                                                               "build_model": "mm_pack_x.family:FAMILY.build_model"},
                         options={"subfolder": "transformer", "what": "transformer"}),
        "preprocess": "mm_pack_x.family:FAMILY.preprocess",
        "extract": "mm_pack_x.family:FAMILY.extract",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_x.family:FAMILY.recipe"}),
        "export": "mm_pack_x.family:FAMILY.export",
        "evaluate": "mm_pack_x.family:FAMILY.evaluate",
        "infer": "mm_pack_x.family:FAMILY.infer",
    }

What the kit does with it:

* **preprocess**: captioned videos or images (:mod:`mmcore.data.captions`) probed, put in the
  bucket of the closest aspect ratio they are long enough for, sampled at ``data.fps``, scaled
  and centre-cropped; uint8 frames stored with the caption.
* **extract**: VAE latents and text embeddings of every clip into the feature cache
  (:mod:`mmcore.data.feature_cache`), keyed by content and the checkpoint's fingerprint;
  resumable after a kill.
* **train**: the family's objective: flow matching (noise levels drawn uniform or logit-normal
  and shifted, ``training.flow_shift``; the velocity ``noise - data`` regressed) or a DDPM
  scheduler's v / epsilon prediction (:class:`NoiseSchedule`), captions dropped with
  ``training.caption_dropout`` for classifier-free guidance, each sample's draws from its own
  seed (so 2 ranks train as 1 does); from the cache, or encoding each batch afresh without an
  extract stage (the same numbers either way). With
  ``data.eval_fraction``, the held-out clips' velocity error at fixed noise levels and noise
  (``eval/loss``): what says a run learns where the training loss is noisy.
* **export**: the trained denoiser into a copy of the downloaded pipeline folder under
  diffusers' names; reloaded, every weight must be bit-identical and its output equal.
* **evaluate**: sample videos (mp4) of the export and a contact sheet for the held-out captions
  (``evaluate.datasets``, else ``export.sample_prompts``), with a report page.
* **infer**: ``mmcore infer --prompt`` writes a video and its frames to the run's ``infer/``.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, Mapping, Sequence

from pydantic import Field, field_validator

from mmcore.config import DataSection, ExportSection, TrainingSection
from mmcore.context import StageContext
from mmcore.errors import StageError
from mmcore.generation import ModelSource, Request, generation_dtype
from mmcore.kits import blocks_at
from mmcore.pack import StageResult
from mmcore.rundir import Manifest


#: the file diffusers' ``save_lora_weights`` writes and ``load_lora_weights`` reads
LORA_WEIGHTS = "pytorch_lora_weights.safetensors"


class VideoData(DataSection):
    """Captioned videos (or images: one-frame buckets) sampled into size buckets.

    A family's subclass states what its VAE and patching need of a bucket (class variables):
    sides a multiple of ``size_multiple`` (``size_reason`` says why), frames ``frame_stride``
    x k + 1 (the VAE's temporal compression; 0: images, one frame)."""

    size_multiple: ClassVar[int] = 1
    size_reason: ClassVar[str] = ""
    frame_stride: ClassVar[int] = 1

    fps: float = Field(8.0, gt=0, description="Frames per second sampled from each video.")
    buckets: list[tuple[int, int, int]] = Field(default_factory=lambda: [(32, 32, 9)], description="(height, width, frames) buckets.")
    max_sequence_length: int = Field(32, ge=4, description="Text tokens per caption.")
    demo_samples: int = Field(0, ge=0, description="Generate the pack's synthetic dataset with this many clips (the demo).")
    ranking: bool = Field(False, description="The datasets are preference pairs (a caption with chosen and rejected videos), for training.method: dpo.")
    eval_fraction: float = Field(0.0, ge=0, lt=1, description="The fraction of clips (with ranking: pairs) held out: training reports their velocity error at fixed noise (eval/loss), or preference accuracy.")

    @field_validator("buckets")
    @classmethod
    def _buckets_fit_the_model(cls, buckets: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        for h, w, f in buckets:
            if h % cls.size_multiple or w % cls.size_multiple:
                raise ValueError(f"bucket {h}x{w}: height and width must be multiples of {cls.size_multiple} ({cls.size_reason})")
            if cls.frame_stride == 0 and f != 1:
                raise ValueError(f"bucket frames {f}: this family makes images, a bucket has 1 frame")
            if cls.frame_stride > 1 and (f - 1) % cls.frame_stride:
                raise ValueError(f"bucket frames {f}: must be {cls.frame_stride}k+1 (the VAE compresses time by {cls.frame_stride})")
        return buckets


class DiffusionTraining(TrainingSection):
    caption_dropout: float = Field(0.1, ge=0, le=1, description="Probability of training on the empty caption (for classifier-free guidance).")


class FlowMatchingTraining(DiffusionTraining):
    flow_shift: float = Field(3.0, gt=0, description="Timestep shift of the flow-matching schedule.")
    timestep_sampling: Literal["uniform", "logit_normal"] = Field("logit_normal", description="How training draws noise levels before the shift: logit_normal (sigmoid of a standard normal: more weight on middle levels, as SD3) or uniform.")
    expert: Literal["none", "high_noise", "low_noise"] = Field("none", description="A pipeline of two denoisers split at a noise level (Wan2.2: model_index.json boundary_ratio): which one this run trains, on its own noise levels (high_noise: transformer, levels >= the boundary; low_noise: transformer_2, below). Export writes it beside the other, as downloaded.")


class GuidanceEmbeddingTraining(FlowMatchingTraining):
    """For a guidance-distilled denoiser (FLUX.1-dev, HunyuanVideo): it embeds a guidance value
    beside the timestep, and training states which one (:func:`guidance_option` binds it)."""

    guidance: float = Field(1.0, ge=0, description="The value the guidance embedding is given in training (models without the embedding ignore it).")


def guidance_option(ctx: StageContext) -> Mapping[str, Any]:
    """``DiffusionFamily.predict_options`` of a guidance-distilled family: ``training.guidance``."""
    return {"guidance": ctx.config.training.guidance}


#: ``training.expert`` -> the pipeline's subfolder of that denoiser (Wan2.2)
EXPERTS = {"high_noise": "transformer", "low_noise": "transformer_2"}


class SampleExport(ExportSection):
    sample_prompts: list[str] = Field(default_factory=list, description="Captions the evaluate stage generates samples for (unless evaluate.datasets gives some).")
    sample_steps: int = Field(20, ge=1, description="Denoising steps of the samples export and evaluate generate (generation.num_inference_steps overrides it).")
    guidance_scale: float = Field(4.0, ge=1.0, description="Classifier-free guidance of those samples (1: none; generation.guidance_scale overrides it).")


#: the noise levels a held-out clip is measured at (one fixed noise draw each)
EVAL_SIGMAS = (0.2, 0.4, 0.6, 0.8)


def sigmas(batch: int, cfg: Any, generator: Any = None, within: tuple[float, float] = (0.0, 1.0)) -> Any:
    """Noise levels in (0, 1): uniform or logit-normal, then shifted as flow-matching schedulers
    shift them. ``within``: only levels in [lo, hi) (one expert's), drawn from the same
    distribution cut to that range (its inverse CDF over the range's share)."""
    import torch

    shift = cfg.flow_shift
    if within != (0.0, 1.0):
        unshift = lambda s: s / (shift - (shift - 1) * s)  # noqa: E731 - the inverse of the shift below
        lo, hi = (torch.tensor(unshift(x), dtype=torch.float64) for x in within)
        if cfg.timestep_sampling == "logit_normal":
            cdf = lambda u: torch.special.ndtr(torch.logit(u))  # noqa: E731
            p = cdf(lo) + (cdf(hi) - cdf(lo)) * torch.rand(batch, generator=generator, dtype=torch.float64)
            u = torch.sigmoid(torch.special.ndtri(p)).float()
        else:
            u = (lo + (hi - lo) * torch.rand(batch, generator=generator, dtype=torch.float64)).float()
        return (shift * u / (1 + (shift - 1) * u)).clamp(within[0], within[1])
    u = torch.sigmoid(torch.randn(batch, generator=generator)) if cfg.timestep_sampling == "logit_normal" else torch.rand(batch, generator=generator)
    return shift * u / (1 + (shift - 1) * u)


def _per_sample(latents: Any) -> Any:
    return tuple(range(1, latents.dim()))


def _generated(output: Any) -> tuple[Any, Any]:
    """``predict``'s output as (prediction, mask of what the pipeline generates or None)."""
    return output if isinstance(output, tuple) else (output, None)


def _mean_error(squared: Any, generated: Any = None) -> Any:
    """Per-sample mean of ``squared``; with a ``generated`` mask (1 where the pipeline generates
    the latents, 0 where a condition gives them: Wan2.2 TI2V's first frame), over those only."""
    if generated is None:
        return squared.mean(dim=_per_sample(squared))
    generated = generated.to(squared.dtype).expand_as(squared)
    return (squared * generated).sum(dim=_per_sample(squared)) / generated.sum(dim=_per_sample(squared))


class FlowMatching:
    """Rectified flow (Wan, FLUX, HunyuanVideo): ``x_s = (1 - s) x + s n`` at a noise level
    ``s`` in (0, 1), the velocity ``n - x`` regressed; levels drawn uniform or logit-normal and
    shifted (``training.flow_shift``, ``training.timestep_sampling``). ``predict`` gets ``s``.
    ``within``: one expert's levels [lo, hi) only (drawn and held out there)."""

    def __init__(self, within: tuple[float, float] = (0.0, 1.0)) -> None:
        self.within = within

    def draw(self, batch: int, cfg: Any, generator: Any = None) -> Any:
        return sigmas(batch, cfg, generator, self.within)

    def eval_levels(self) -> Any:
        import torch

        lo, hi = self.within
        return torch.tensor([lo + (hi - lo) * s for s in EVAL_SIGMAS])

    def errors(self, predict: Callable[..., Any], model: Any, latents: Any, noise: Any, levels: Any, text: Any) -> Any:
        """Per-sample mean squared error of the predicted velocity."""
        s = levels.view(-1, *[1] * (latents.dim() - 1))
        prediction, generated = _generated(predict(model, (1 - s) * latents + s * noise, levels, text))
        return _mean_error((prediction.float() - (noise - latents).float()) ** 2, generated)


class NoiseSchedule:
    """A diffusers DDPM-family scheduler's discrete schedule (CogVideoX: ``CogVideoXDDIMScheduler``,
    v-prediction with zero terminal SNR), trained as the model's own trainers train it:
    timesteps uniform in [0, T), ``x_t = scheduler.add_noise(x, n, t)``; for ``v_prediction`` the
    model's output is turned into its estimate of ``x`` (``scheduler.get_velocity(output, x_t,
    t)``) and the squared error weighted by ``1 / (1 - alphas_cumprod[t])`` (which equals the
    squared error of the velocity itself); for ``epsilon`` the noise is regressed. ``predict``
    gets the integer timesteps. Held-out levels: ``EVAL_SIGMAS`` x T."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.steps = int(scheduler.config.num_train_timesteps)
        self.prediction_type = scheduler.config.prediction_type
        if self.prediction_type not in ("v_prediction", "epsilon"):
            raise StageError(f"scheduler prediction_type {self.prediction_type!r}: the diffusion kit trains v_prediction and epsilon")

    @classmethod
    def of(cls, model_dir: Path) -> "NoiseSchedule":
        """The schedule of the pipeline folder's ``scheduler/`` (its class as its config names it)."""
        import json

        import diffusers

        folder = model_dir / "scheduler"
        name = json.loads((folder / "scheduler_config.json").read_text()).get("_class_name", "")
        if not hasattr(diffusers, name):
            raise StageError(f"{folder / 'scheduler_config.json'}: scheduler class {name!r} is not one diffusers has")
        return cls(getattr(diffusers, name).from_pretrained(folder))

    within = (0.0, 1.0)

    def draw(self, batch: int, cfg: Any, generator: Any = None) -> Any:
        import torch

        return torch.randint(0, self.steps, (batch,), generator=generator)

    def eval_levels(self) -> Any:
        import torch

        return torch.tensor([int(s * self.steps) for s in EVAL_SIGMAS])

    def errors(self, predict: Callable[..., Any], model: Any, latents: Any, noise: Any, levels: Any, text: Any) -> Any:
        noisy = self.scheduler.add_noise(latents, noise, levels)
        output, generated = _generated(predict(model, noisy, levels, text))
        output = output.float()
        if self.prediction_type == "epsilon":
            return _mean_error((output - noise.float()) ** 2, generated)
        estimate = self.scheduler.get_velocity(output, noisy.float(), levels)
        weights = (1 / (1 - self.scheduler.alphas_cumprod[levels.cpu()])).float().to(latents.device)  # the schedule is float64
        return _mean_error(weights.view(-1, *[1] * (latents.dim() - 1)) * (estimate - latents.float()) ** 2, generated)


#: the default objective of a family
FLOW_MATCHING = FlowMatching()


def diffusion_loss(objective: Any, predict: Callable[..., Any], model: Any, latents: Any, text: Any, empty_text: Any, cfg: Any, seeds: Any = None) -> Any:
    """Summed per-sample error of ``objective`` (:class:`FlowMatching`, :class:`NoiseSchedule`)
    at random noise levels, captions dropped with ``training.caption_dropout``.

    ``predict(model, noisy, level, text)`` is the family's call of its denoiser. ``seeds`` (one
    per sample, the engine's ``sample_seeds``): each sample's caption dropout, noise level and
    noise drawn from its own generator, so they do not depend on the micro-batch or rank it
    lands in; without, from torch's global generator.
    """
    import torch

    batch = latents.shape[0]
    if seeds is None:
        drop = torch.rand(batch) < cfg.caption_dropout
        levels = objective.draw(batch, cfg)
        noise = torch.randn(latents.shape)
    else:
        generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
        drop = torch.cat([torch.rand(1, generator=g) for g in generators]) < cfg.caption_dropout
        levels = torch.cat([objective.draw(1, cfg, g) for g in generators])
        noise = torch.stack([torch.randn(latents.shape[1:], generator=g) for g in generators])
    text = torch.where(drop.view(-1, *[1] * (text.dim() - 1)).to(text.device), empty_text.to(text.device).expand_as(text), text)
    return objective.errors(predict, model, latents, noise.to(latents.device), levels.to(latents.device), text).sum()


def flow_matching_loss(predict: Callable[..., Any], model: Any, latents: Any, text: Any, empty_text: Any, cfg: Any, seeds: Any = None) -> Any:
    """:func:`diffusion_loss` of :class:`FlowMatching`: the velocity error (``noise - data``)."""
    return diffusion_loss(FLOW_MATCHING, predict, model, latents, text, empty_text, cfg, seeds)


def content_key(*parts: Any) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else str(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass(frozen=True, eq=False)
class DiffusionFamily:
    """One diffusers flow-matching family, as the diffusion kit needs to know it.

    Attributes:
        transformer_class: the diffusers denoiser class (``"WanTransformer3DModel"``).
        pipeline_class: the diffusers pipeline class the export loads in (``"WanPipeline"``).
        adapter: the pack's state-dict adapter for the denoiser.
        encoders: ``(model dir, max text length) -> encoders`` with ``latents(frames)`` (uint8
            [F, H, W, 3] -> normalised latents) and ``text(caption)`` (-> embeddings), the frozen
            VAE and text encoder used exactly as the pipeline uses them.
        predict: ``(model, noisy latents, sigma, text) -> prediction`` of the denoiser, or
            ``(prediction, generated)`` where a condition gives part of the latents (Wan2.2
            TI2V's first frame): ``generated`` (broadcastable to the latents) is 1 where the
            pipeline generates them, 0 where it does not, and the error counts there only.
        probe: ``(model, ctx, generator) -> inputs`` of one denoiser call, for the export check.
        sample: ``(pipeline, ctx, prompt, generator) -> frames`` float [F, H, W, 3] in [0, 1].
        freeze_groups: ``training.freeze`` names -> parameter globs.
        shard_layers: dotted paths of the block lists FSDP shards one by one.
        subfolder: the denoiser's folder in a pipeline checkpoint.
        weights_name: diffusers' name for its weights file.
        demo: ``(folder, samples, seed) -> captions file`` of the pack's synthetic dataset.
        preference_demo: the same for its synthetic preference pairs (``data.ranking``), the
            DPO demo's data.
        predict_options: ``ctx -> keyword arguments`` the kit adds to every ``predict`` call
            in training, from the run's config (FLUX: the guidance value it trains with).
        checkpoint_options: ``pipeline folder -> keyword arguments`` the kit adds to every
            ``predict`` call, for what the checkpoint decides (Wan2.2 TI2V: ``expand_timesteps``
            in ``model_index.json``, a timestep per token).
        flops: ``() -> (model, batch) -> FLOPs`` of a step, for a denoiser that is not a video
            transformer over patches of [B, C, F, H, W] latents (default :func:`denoiser_flops`).
        objective: ``model dir -> objective`` the denoiser is trained with (default flow
            matching; :meth:`NoiseSchedule.of` for a DDPM-family scheduler's v or epsilon
            prediction, as the checkpoint's ``scheduler/`` says).
        conditions: names of the per-clip tensors the denoiser is conditioned on besides the
            caption (image-to-video: the first frame's latents and mask, its image features):
            the encoders' ``conditions(frames) -> {name: tensor}`` makes them as the pipeline
            does, extract caches them, and ``predict`` gets them as keyword arguments; such a
            family generates from a first frame (``sample(..., image=)``, ``mmcore infer
            --image``; evaluate takes the held-out clips' first frames).
    """

    transformer_class: str
    pipeline_class: str
    adapter: Any
    encoders: Callable[[Path, int], Any]
    predict: Callable[[Any, Any, Any, Any], Any]
    probe: Callable[[Any, StageContext, Any], dict[str, Any]]
    sample: Callable[[Any, StageContext, str, Any], Any] | None = None
    freeze_groups: Mapping[str, Sequence[str]] = field(default_factory=dict)
    shard_layers: Sequence[str] = ("blocks",)
    subfolder: str = "transformer"
    weights_name: str = "diffusion_pytorch_model.safetensors"
    demo: Callable[[Path, int, int], Path] | None = None
    preference_demo: Callable[[Path, int, int], Path] | None = None
    predict_options: Callable[[StageContext], Mapping[str, Any]] | None = None
    checkpoint_options: Callable[[Path], Mapping[str, Any]] | None = None
    flops: Callable[[], Callable[[Any, dict[str, Any]], float]] | None = None
    objective: Callable[[Path], Any] = lambda model_dir: FLOW_MATCHING
    conditions: Sequence[str] = ()

    # -- the model ---------------------------------------------------------------------------

    def _class(self, name: str) -> Any:
        import diffusers

        return getattr(diffusers, name)

    def build_model(self, model_dir: Path, checkpoint: Path | None = None, subfolder: str | None = None) -> Any:
        """The denoiser of ``model_dir``'s config (in ``subfolder``, default the family's), weights
        from a DCP ``checkpoint`` (convert's or train's)."""
        from mmcore.checkpointing import load_converted

        cls = self._class(self.transformer_class)
        model = cls.from_config(cls.load_config(model_dir / (subfolder or self.subfolder)))
        if checkpoint is not None:
            load_converted(model, checkpoint)
        return model

    def expert(self, ctx: StageContext, model_dir: Path) -> tuple[str, tuple[float, float]]:
        """(the subfolder of the denoiser this run trains, its noise levels): the family's one, all
        levels; in a pipeline of two experts (``boundary_ratio`` in ``model_index.json``, Wan2.2)
        the one ``training.expert`` names and its side of the boundary."""
        import json

        index = model_dir / "model_index.json"
        boundary = json.loads(index.read_text()).get("boundary_ratio") if index.is_file() else None
        chosen = getattr(ctx.config.training, "expert", "none")
        if boundary is None:
            if chosen != "none":
                raise StageError(f"training.expert={chosen}: {model_dir} has one denoiser (no boundary_ratio in model_index.json); leave training.expert at none")
            return self.subfolder, (0.0, 1.0)
        if chosen == "none":
            raise StageError(f"{index}: two denoisers split at noise level {boundary} (boundary_ratio): set training.expert to high_noise "
                             f"(transformer, levels >= {boundary}) or low_noise (transformer_2, below); a run trains one")
        return EXPERTS[chosen], ((float(boundary), 1.0) if chosen == "high_noise" else (0.0, float(boundary)))

    def convert(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        """The convert stage (:func:`mmcore.convert.convert_stage`) on the denoiser this run trains."""
        from mmcore.convert import convert_stage

        subfolder, _ = self.expert(ctx, upstream["download"].output("model"))
        return convert_stage(ctx, upstream, adapter=self.adapter, build_model=lambda folder: self.build_model(folder, subfolder=subfolder),
                             subfolder=subfolder, what=subfolder)

    def predictor(self, ctx: StageContext, model_dir: Path | None = None) -> Callable[..., Any]:
        """``predict`` with the run's ``predict_options`` and, given the pipeline folder
        ``model_dir``, the checkpoint's ``checkpoint_options`` bound."""
        import functools

        options = {**(self.predict_options(ctx) if self.predict_options else {}),
                   **(self.checkpoint_options(model_dir) if self.checkpoint_options and model_dir is not None else {})}
        return functools.partial(self.predict, **options) if options else self.predict

    # -- stages ------------------------------------------------------------------------------

    def preprocess(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        from mmcore.data.clips import preprocess_captioned_videos

        ranking = getattr(ctx.config.data, "ranking", False)
        return preprocess_captioned_videos(ctx, demo=self.preference_demo if ranking else self.demo)

    def extract(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        from mmcore.data.feature_cache import FeatureCacheWriter
        from mmcore.data.shards import ShardDataset

        data = ShardDataset(upstream["preprocess"].output("dataset"))
        identity = upstream["download"].fingerprint
        length = ctx.config.data.max_sequence_length
        encoders = self.encoders(upstream["download"].output("model"), length)
        cache = FeatureCacheWriter(ctx.stage_dir / "features")
        empty = cache.add(content_key("text", "", length, identity), lambda: encoders.text(""))
        for i in ctx.progress(range(len(data)), description="extract", unit="clip"):
            meta, frames = data.meta(i), data[i]["frames"]
            latents = cache.add(content_key("latents", frames.numpy().tobytes(), meta["bucket"], identity), lambda: encoders.latents(frames))
            text = cache.add(content_key("text", meta["caption"], length, identity), lambda: encoders.text(meta["caption"]))
            refs = {"latents": [latents], "text": [text], **self._cached_conditions(cache, encoders, frames, meta["bucket"], identity)}
            if "rejected_frames" in data[i]:  # a preference pair: its other video too
                other = data[i]["rejected_frames"]
                refs["rejected_latents"] = [cache.add(content_key("latents", other.numpy().tobytes(), meta["bucket"], identity), lambda: encoders.latents(other))]
            cache.add_sample(refs)
        cache.close(empty_text=empty)
        return StageResult(
            outputs={"features": "features"},
            metrics={"clips": len(data), "encoded": cache.encoded, "reused": cache.reused},
            notes=[f"cached latents, text embeddings{''.join(', ' + c for c in self.conditions)} of {len(data)} clips ({cache.encoded} encoded, {cache.reused} reused)"],
        )

    def _cached_conditions(self, cache: Any, encoders: Any, frames: Any, bucket: Any, identity: str) -> dict[str, list[str]]:
        """The clip's conditioning tensors in the cache (made together, once, where any is missing)."""
        made: dict[str, Any] = {}

        def part(name: str) -> Any:
            if not made:
                made.update(encoders.conditions(frames))
            return made[name]

        content = frames.numpy().tobytes()
        return {name: [cache.add(content_key(name, content, bucket, identity), lambda name=name: part(name))] for name in self.conditions}

    def samples(self, ctx: StageContext, upstream: Mapping[str, Manifest], data: Any) -> tuple[Any, Any, Any]:
        """(samples of ``data``, the empty caption's embedding, the live encoders or None): from
        the feature cache after an extract stage, else frames and captions encoded per batch."""
        if "extract" in upstream:
            from mmcore.data.feature_cache import CachedSamples

            samples: Any = CachedSamples(data, upstream["extract"].output("features"), replaces={"latents": "frames", "rejected_latents": "rejected_frames"})
            return samples, samples.cache.get(samples.index["empty_text"]), None
        encoders = self.encoders(upstream["download"].output("model"), ctx.config.data.max_sequence_length)
        return FreshSamples(data), encoders.text(""), encoders

    def recipe(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        """With a finished extract stage, train from its cache; without, encode every batch
        afresh. ``training.method: dpo``: Diffusion-DPO on preference pairs
        (:func:`mmcore.kits.diffusion_dpo.dpo_recipe`)."""
        from mmcore.data.shards import ShardDataset
        from mmcore.train import TrainRecipe

        cfg = ctx.config.training
        data = ShardDataset(upstream["preprocess"].output("dataset"))
        model_dir = upstream["download"].output("model")
        subfolder, levels = self.expert(ctx, model_dir)
        if cfg.method == "dpo":
            from mmcore.kits.diffusion_dpo import dpo_recipe

            if self.conditions:
                raise StageError(f"training.method=dpo: Diffusion-DPO of a family conditioned on {', '.join(self.conditions)} is not supported yet")

            return dpo_recipe(self, ctx, upstream, data)
        if data.index.get("ranking"):
            raise StageError("the dataset holds preference pairs (data.ranking): train them with training.method: dpo")
        train = data.split("train")
        samples, empty, encoders = self.samples(ctx, upstream, train)
        held = data.split("eval")
        held_samples, _, held_encoders = self.samples(ctx, upstream, held) if len(held) else (None, None, None)
        predict = self.predictor(ctx, model_dir)
        objective = self.objective(model_dir)
        if levels != (0.0, 1.0):
            if not isinstance(objective, FlowMatching):
                raise StageError("training.expert: only flow-matching families have experts split by noise level")
            objective = FlowMatching(levels)

        def encoded(batch: dict[str, Any], encoders: Any) -> None:
            import torch

            if encoders is not None:  # in place: the step's FLOPs read the latents' shape
                batch.update(latents=torch.stack([encoders.latents(f) for f in batch["frames"]]),
                             text=torch.stack([encoders.text(c) for c in batch["captions"]]))
                if self.conditions:
                    made = [encoders.conditions(f) for f in batch["frames"]]
                    batch.update({name: torch.stack([m[name] for m in made]) for name in self.conditions})

        def conditioned(batch: dict[str, Any], device: Any, repeat: int = 1) -> Callable[..., Any]:
            """``predict`` with the batch's conditions bound (each sample's ``repeat`` times in a row)."""
            if not self.conditions:
                return predict
            import functools

            return functools.partial(predict, **{name: batch[name].to(device).repeat_interleave(repeat, dim=0) for name in self.conditions})

        def loss(model: Any, batch: dict[str, Any]) -> Any:
            encoded(batch, encoders)
            device = next(model.parameters()).device
            return diffusion_loss(objective, conditioned(batch, device), model, batch["latents"].to(device), batch["text"].to(device), empty, cfg, batch.get("sample_seeds"))

        def evaluate(ctx: StageContext, model: Any, step: int) -> dict[str, float]:
            """The objective's error on held-out clips at fixed noise levels (``EVAL_SIGMAS``) with
            fixed noise per clip: comparable across steps and runs, unlike the training loss."""
            import torch

            if held_samples is None:
                return {}
            device = next(model.parameters()).device
            count, total = min(len(held_samples), 256), 0.0
            with torch.no_grad():
                for i in range(count):
                    batch = collate([held_samples[i]])
                    encoded(batch, held_encoders)
                    latents, text = batch["latents"].to(device), batch["text"].to(device)
                    levels = objective.eval_levels().to(device)
                    count_levels = len(levels)
                    noise = torch.randn((count_levels, *latents.shape[1:]), generator=torch.Generator().manual_seed(ctx.seed * 100_003 + i)).to(device)
                    clean = latents.expand(count_levels, *latents.shape[1:])
                    total += float(objective.errors(conditioned(batch, device, count_levels), model, clean, noise, levels, text.expand(count_levels, *text.shape[1:])).mean())
            return {"loss": total / count}

        return TrainRecipe(
            build_model=lambda ctx, upstream: self.build_model(model_dir, subfolder=subfolder),
            weights=lambda ctx, upstream: upstream["convert"].output("checkpoint"),
            flops=(self.flops or denoiser_flops)(),
            dataset=lambda ctx, upstream: samples,
            collate=collate,
            loss=loss,
            shard_modules=lambda model: blocks_at(model, self.shard_layers),
            freeze_groups=self.freeze_groups,
            loss_unit="samples",
            group_of=lambda i: tuple(train.meta(i)["bucket"]),  # latents of one micro-batch must stack
            evaluate=evaluate,
            sample_seeds=True,  # 2 ranks draw what 1 does
        )

    def export(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        """The pipeline folder with the trained denoiser, proven equal to training; after LoRA
        training, the adapter as diffusers' ``load_lora_weights`` reads it (and with
        ``export.merge_lora`` the pipeline with the adapters merged)."""
        from mmcore.export import trained_checkpoint
        from mmcore.lora import LoraPlan

        source = upstream["download"].output("model")
        checkpoint = trained_checkpoint(ctx, upstream)
        plan = LoraPlan.read(checkpoint)
        if plan is not None:
            return self._export_lora(ctx, source, checkpoint, plan)
        subfolder, _ = self.expert(ctx, source)
        trained = self.build_model(source, checkpoint, subfolder).eval()
        metrics, notes = self._write_pipeline(ctx, source, checkpoint, trained, subfolder)
        return StageResult(outputs={"model": "pipeline"}, metrics=metrics, notes=notes)

    def _write_pipeline(self, ctx: StageContext, source: Path, checkpoint: Path, trained: Any, subfolder: str | None = None) -> tuple[dict[str, Any], list[str]]:
        """A copy of the downloaded pipeline with the denoiser of ``checkpoint`` (DCP) in it (in
        ``subfolder``, default the family's: the other expert stays as downloaded); every weight
        reloaded must equal ``trained``'s, and its output too."""
        import torch

        from mmcore.convert import dcp_to_hf, refuse_links_out

        subfolder = subfolder or self.subfolder
        out = ctx.stage_dir / "pipeline"
        if out.exists():
            shutil.rmtree(out)
        weights = (self.weights_name, self.weights_name + ".index.json")
        refuse_links_out(source)
        shutil.copytree(source, out, ignore=lambda folder, names: [n for n in names if n in weights and Path(folder).name == subfolder])
        stats = dcp_to_hf(checkpoint, out / subfolder, self.adapter)
        if stats["shards"] > 1:  # diffusers' shard names
            raise StageError("multi-shard denoiser export is not supported yet; raise export max_shard_bytes")
        (out / subfolder / "model.safetensors").rename(out / subfolder / self.weights_name)

        # The export must be the trained denoiser exactly: every weight bit-identical once loaded.
        loaded = self._class(self.transformer_class).from_pretrained(out / subfolder).eval()
        ours, theirs = trained.state_dict(), loaded.state_dict()
        differing = [k for k in ours if k not in theirs or not torch.equal(ours[k], theirs[k])]
        if differing or set(theirs) != set(ours):
            raise StageError(f"the exported denoiser's weights differ from the trained ones: {(differing or sorted(set(theirs) ^ set(ours)))[0]}")
        diff = self._output_diff(ctx, trained, loaded)
        metrics: dict[str, Any] = {**stats, "weights_identical": True, "max_abs_diff": diff}
        return metrics, [f"diffusers pipeline at {out}; weights bit-identical to training, output max |diff| {diff:.2g}"]

    def _output_diff(self, ctx: StageContext, trained: Any, loaded: Any) -> float:
        import torch

        inputs = self.probe(trained, ctx, torch.Generator().manual_seed(0))
        with torch.no_grad():
            a, b = trained(**inputs, return_dict=False)[0], loaded(**inputs, return_dict=False)[0]
        # Same weights, same inputs; CPU kernels may still round differently with the buffers'
        # alignment (mmap-loaded vs. allocated), so outputs are compared with a tolerance.
        diff = float((a - b).abs().max())
        if diff > 1e-4:
            raise StageError(f"the exported denoiser computes differently from the trained one (max |diff| {diff:.3g})")
        return diff

    def _export_lora(self, ctx: StageContext, source: Path, checkpoint: Path, plan: Any) -> StageResult:
        import tempfile

        import torch.distributed.checkpoint as dcp

        from mmcore.lora import diffusers_lora_state, merged_state

        subfolder, _ = self.expert(ctx, source)
        trained = self.build_model(source, checkpoint, subfolder).eval()
        out = ctx.stage_dir / "lora"
        shutil.rmtree(out, ignore_errors=True)
        state = diffusers_lora_state(trained, plan)
        pipeline_class = self._class(self.pipeline_class)
        if hasattr(pipeline_class, "save_lora_weights"):
            pipeline_class.save_lora_weights(str(out), transformer_lora_layers=state, transformer_lora_adapter_metadata=plan.peft_config().to_dict())
        else:  # a pipeline without a LoRA loader (HunyuanVideo 1.5): the same file, which its denoiser's load_lora_adapter reads
            from diffusers.loaders.lora_base import LoraBaseMixin

            LoraBaseMixin._save_lora_weights(save_directory=str(out), lora_layers={"transformer": state}, lora_metadata={"transformer": plan.peft_config().to_dict()})
        pipe = self.lora_pipeline(source, out, subfolder)
        diff = self._output_diff(ctx, trained, getattr(pipe, subfolder).eval())
        metrics: dict[str, Any] = {"adapter_tensors": len(state), "adapter_parameters": int(sum(t.numel() for t in state.values())),
                                   "max_abs_diff": diff, "lora_r": plan.r}
        how = (f"{self.pipeline_class}.load_lora_weights" + (", load_into_transformer_2=True" if subfolder == "transformer_2" else "")
               if hasattr(pipeline_class, "load_lora_weights") else f"pipe.{subfolder}.load_lora_adapter(folder, prefix='transformer')")
        notes = [f"LoRA adapter of {subfolder} for {how} at {out}: {metrics['adapter_parameters']:,} parameters; "
                 f"loaded into the downloaded pipeline, the denoiser's output max |diff| {diff:.2g}"]
        outputs = {"model": "lora", "adapter": "lora"}
        if ctx.config.export.merge_lora:
            weights = merged_state(self.build_model(source, checkpoint, subfolder))  # in fp32
            merged = self.build_model(source, subfolder=subfolder).eval()
            merged.load_state_dict(weights, strict=True)
            with tempfile.TemporaryDirectory(dir=ctx.stage_dir) as tmp:
                dcp.save({f"model.{k}": v for k, v in weights.items()}, checkpoint_id=tmp, no_dist=True)
                more, merged_notes = self._write_pipeline(ctx, source, Path(tmp), merged, subfolder)
            metrics.update({f"merged_{k}": v for k, v in more.items()})
            notes += merged_notes
            outputs["model"] = "pipeline"
        return StageResult(outputs=outputs, metrics=metrics, notes=notes)

    def lora_pipeline(self, source: Path, adapter: Path, subfolder: str | None = None) -> Any:
        """The downloaded pipeline with a LoRA adapter folder loaded by diffusers (into
        ``subfolder``'s denoiser: Wan2.2's low-noise expert is ``transformer_2``)."""
        pipe = self._class(self.pipeline_class).from_pretrained(source)
        if not hasattr(pipe, "load_lora_weights"):  # no LoRA loader in the pipeline: its denoiser loads the file
            getattr(pipe, subfolder or self.subfolder).load_lora_adapter(str(adapter), prefix="transformer", weight_name=LORA_WEIGHTS)
            return pipe
        pipe.load_lora_weights(str(adapter), **({"load_into_transformer_2": True} if subfolder == "transformer_2" else {}))
        return pipe

    # -- generation: infer and evaluate -------------------------------------------------------

    def pipeline(self, ctx: StageContext, upstream: Mapping[str, Manifest], source: ModelSource) -> Any:
        """The diffusers pipeline of ``source``: a training checkpoint's denoiser in the downloaded
        pipeline, or a pipeline folder (the export's, or any)."""
        if source.kind == "train":
            subfolder, _ = self.expert(ctx, upstream["download"].output("model"))
            denoiser = self.build_model(upstream["download"].output("model"), source.path, subfolder).eval()
            pipe = self._class(self.pipeline_class).from_pretrained(upstream["download"].output("model"), **{subfolder: denoiser})
        elif (source.path / LORA_WEIGHTS).is_file():  # a LoRA export: the downloaded pipeline plus the adapter
            subfolder, _ = self.expert(ctx, upstream["download"].output("model"))
            pipe = self.lora_pipeline(upstream["download"].output("model"), source.path, subfolder)
        else:
            pipe = self._class(self.pipeline_class).from_pretrained(source.path)
        pipe.set_progress_bar_config(disable=True)
        dtype = generation_dtype(ctx)
        # casting to the dtype the weights have already only draws diffusers' warning about casting
        return pipe.to(ctx.accelerator.device()) if pipe.dtype == dtype else pipe.to(ctx.accelerator.device(), dtype)

    def render(self, ctx: StageContext, pipe: Any, prompts: list[str], folder: Path, names: list[str], images: list[Any] | None = None) -> list[dict[str, str]]:
        """One video per prompt (``<name>.mp4`` and its frames as ``<name>.png``), seeded by
        ``generation.seed`` (default ``run.seed``) plus the prompt's position; steps and guidance
        from ``generation`` where set, else ``export.sample_steps`` / ``export.guidance_scale``;
        ``images``: each prompt's first frame (PIL), for a family with ``conditions``."""
        import dataclasses

        import torch

        from mmcore.data.video import contact_sheet, write_mp4

        gen, export = ctx.config.generation, ctx.config.export
        chosen = export.model_copy(update={"sample_steps": gen.num_inference_steps or export.sample_steps,
                                           "guidance_scale": gen.guidance_scale or export.guidance_scale})
        sampling = dataclasses.replace(ctx, config=ctx.config.model_copy(update={"export": chosen}))
        seed = gen.seed if gen.seed is not None else ctx.seed
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for i, (prompt, name) in enumerate(ctx.progress(list(zip(prompts, names)), description=ctx.stage, unit="video")):
            first_frame = {"image": images[i]} if images is not None else {}
            frames = self.sample(pipe, sampling, prompt, torch.Generator().manual_seed(seed + i), **first_frame)  # type: ignore[misc]
            pixels = (frames.clip(0, 1) * 255).round().astype("uint8")
            write_mp4(folder / f"{name}.mp4", pixels, ctx.config.data.fps)
            contact_sheet(folder / f"{name}.png", [pixels], scale=4)
            written.append({"video": str(folder / f"{name}.mp4"), "contact_sheet": str(folder / f"{name}.png"), "pixels": pixels})
        return written

    def infer(self, ctx: StageContext, upstream: Mapping[str, Manifest], model: ModelSource, requests: list[Request]) -> list[dict[str, Any]]:
        """A video for each request's prompt, written to ``infer/`` under a new number."""
        if self.sample is None:
            return [{"error": f"the {ctx.pack} pack cannot generate samples"} for _ in requests]
        from mmcore.data.video import MediaError, load_image

        pipe = self.pipeline(ctx, upstream, model)
        answers: list[dict[str, Any]] = [{} for _ in requests]
        wanted = {"images": 1} if self.conditions else {}
        runnable = [i for i, r in enumerate(requests) if r.prompt and {k: len(v) for k, v in r.media.items() if v} == wanted]
        images: list[Any] = []
        for i, request in enumerate(requests):
            if i not in runnable:
                answers[i] = {"error": "give a caption (--prompt) and one first frame (--image): this pack generates video from an image and text" if self.conditions
                              else "give a caption (--prompt) and no media: this pack generates video from text"}
            elif self.conditions:
                try:
                    images.append(load_image(request.media["images"][0]))
                except MediaError as exc:
                    answers[i] = {"error": str(exc)}
        runnable = [i for i in runnable if not answers[i]]
        first = 1 + max((int(p.stem) for p in ctx.stage_dir.glob("[0-9]*.mp4") if p.stem.isdigit()), default=0)
        names = [f"{first + k:04d}" for k in range(len(runnable))]
        done_all = self.render(ctx, pipe, [requests[i].prompt for i in runnable], ctx.stage_dir, names, images if self.conditions else None)
        for i, done in zip(runnable, done_all):
            answers[i] = {"video": done["video"], "contact_sheet": done["contact_sheet"]}
        return answers

    def evaluate(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        """Sample videos of the export for the held-out captions (``evaluate.datasets``, else
        ``export.sample_prompts``) and one contact sheet of them all; no number stands for quality."""
        from mmcore.data.video import contact_sheet
        from mmcore.generation import ModelSource, empty_evaluation, write_results

        captions, images = self.held_out_captions(ctx), None
        if self.conditions:  # generated from the held-out clips' first frames and captions
            captions, images = self.held_out_first_frames(ctx, upstream)
        if not captions or self.sample is None:
            return empty_evaluation(ctx)
        pipe = self.pipeline(ctx, upstream, ModelSource("export", upstream["export"].output("model")))
        folder = ctx.stage_dir / "samples"
        written = self.render(ctx, pipe, captions, folder, [f"sample-{i}" for i in range(len(captions))], images)
        contact_sheet(folder / "contact_sheet.png", [w.pop("pixels") for w in written], scale=4)
        for i, image in enumerate(images or []):  # the first frame it was given, beside what it made of it
            image.save(folder / f"sample-{i}-first-frame.png")
        rows = [{"item": i, "caption": c, "video": str(Path(w["video"]).relative_to(ctx.stage_dir)),
                 "media": ([{"kind": "image", "src": f"samples/sample-{i}-first-frame.png"}] if images else []) + [{"kind": "video", "src": str(Path(w["video"]).relative_to(ctx.stage_dir))}]}
                for i, (c, w) in enumerate(zip(captions, written))]
        metrics = {"items": len(rows), "samples": len(rows)}
        write_results(ctx.stage_dir, rows, metrics, title=f"{ctx.pack}: samples of the export for the held-out captions", columns=("item", "caption", "video"),
                      images=[("samples/contact_sheet.png", "one row per caption, in order: " + "; ".join(captions))], ctx=ctx,
                      dataset="the held-out clips' first frames and captions" if self.conditions else None if ctx.config.evaluate.datasets else "export.sample_prompts")
        note = f"{len(rows)} sample video(s) of the export and a contact sheet in {folder} (no metric: look at them, report.html)"
        return StageResult(outputs={"results": "results.jsonl", "samples": "samples", "report": "report.html"}, metrics=metrics, notes=[note])

    def held_out_first_frames(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> tuple[list[str], list[Any]]:
        """(captions, first frames as PIL images) of the held-out clips preprocess made (at most ``evaluate.limit``)."""
        from PIL import Image

        from mmcore.data.shards import ShardDataset

        held = ShardDataset(upstream["preprocess"].output("dataset")).split("eval")
        count = min(len(held), ctx.config.evaluate.limit)
        return [held.meta(i)["caption"] for i in range(count)], [Image.fromarray(held[i]["frames"][0].numpy()) for i in range(count)]

    def held_out_captions(self, ctx: StageContext) -> list[str]:
        """Captions from ``evaluate.datasets`` (JSON/JSONL records with ``cap``, ``caption`` or
        ``prompt``; videos beside them are not needed), else ``export.sample_prompts``; at most
        ``evaluate.limit``."""
        from mmcore.data.mllm import BadJSON, load_records

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


class FreshSamples:
    """Preprocessed clips with their captions, encoded during training (no extract stage)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.data[i]
        return {**{k: item[k] for k in ("frames", "rejected_frames") if k in item}, "caption": self.data.meta(i)["caption"]}


def text_to_video_sample(pipe: Any, ctx: StageContext, prompt: str, generator: Any) -> Any:
    """``DiffusionFamily.sample`` of a text-to-video pipeline called as diffusers' video pipelines
    are (Wan, CogVideoX, HunyuanVideo): the first bucket's size, the export's steps and guidance,
    the data's text length; frames [F, H, W, 3] in [0, 1]."""
    height, width, frames = ctx.config.data.buckets[0]
    return pipe(prompt, height=height, width=width, num_frames=frames, num_inference_steps=ctx.config.export.sample_steps,
                guidance_scale=ctx.config.export.guidance_scale, max_sequence_length=ctx.config.data.max_sequence_length,
                generator=generator, output_type="np").frames[0]


def denoiser_flops(joint_text: bool = False, layers: Sequence[str] = ("num_layers",), side_rows: int | Callable[[Any, int], int] = 0) -> Callable[[Any, dict[str, Any]], float]:
    """``(model, batch) -> FLOPs`` of a diffusion transformer's step on latents [B, C, F, H, W]
    (or [B, C, H, W]): its weights on every patch token, self-attention over each sample's
    tokens, cross-attention to the caption (config: ``patch_size`` (and ``patch_size_t``),
    ``num_attention_heads`` x ``attention_head_dim``, as diffusers' transformers name them).
    ``joint_text``: the caption's tokens join the image's in one sequence (CogVideoX, FLUX,
    HunyuanVideo) instead: the weights see them too and attention runs over both. ``layers``:
    the config's block counts (FLUX and HunyuanVideo: double- and single-stream).
    ``side_rows``: rows of the cached text that are not tokens (a pooled vector, a mask), or
    ``(model, rows) -> that count``."""
    import math

    from mmcore.flops import StepFlops, attention_flops, dense_flops

    seen = StepFlops()

    def flops(model: Any, batch: dict[str, Any]) -> float:
        config = model.config
        patch = config.patch_size if isinstance(config.patch_size, (tuple, list)) else (getattr(config, "patch_size_t", None) or 1, config.patch_size, config.patch_size)
        samples, _, *grid = batch["latents"].shape
        tokens = math.prod(n // p for n, p in zip(grid, patch[-len(grid):]))
        width = config.num_attention_heads * config.attention_head_dim
        rows = batch["text"].shape[1]
        caption = rows - (side_rows(model, rows) if callable(side_rows) else side_rows)
        blocks = sum(getattr(config, name) for name in layers)
        if joint_text:
            return dense_flops(seen.counts("", model), samples * (tokens + caption)) + attention_flops(blocks, width, [tokens + caption] * samples)
        return (dense_flops(seen.counts("", model), samples * tokens)
                + attention_flops(blocks, width, [tokens] * samples)
                + attention_flops(blocks, width, [tokens] * samples, [caption] * samples))

    return flops


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    shapes = {tuple(s["latents"].shape if "latents" in s else s["frames"].shape) for s in samples}
    if len(shapes) > 1:
        raise StageError(f"a micro-batch mixes shapes {sorted(shapes)}; the sampler groups by bucket, so the cache and the preprocessed data disagree: rerun preprocess and extract with --force")
    batch: dict[str, Any] = {"num_loss_tokens": len(samples)}  # the loss is per sample
    if "latents" in samples[0]:  # cached: latents, text and any conditions, stacked
        for name, value in samples[0].items():
            if isinstance(value, torch.Tensor):
                batch[name] = torch.stack([s[name] for s in samples])
    else:
        batch["frames"] = [s["frames"] for s in samples]
        batch["captions"] = [s["caption"] for s in samples]
        if "rejected_frames" in samples[0]:
            batch["rejected_frames"] = [s["rejected_frames"] for s in samples]
    return batch


__all__ = ["DiffusionFamily", "VideoData", "DiffusionTraining", "FlowMatchingTraining", "EXPERTS", "SampleExport", "sigmas", "FlowMatching", "NoiseSchedule", "FLOW_MATCHING",
           "diffusion_loss", "flow_matching_loss", "content_key", "collate"]
