"""The diffusion kit's declaration of a family: :class:`DiffusionFamily`, what a pack states once
about its diffusers denoiser, and whose methods are the stages its pack binds.

Each stage method hands the work to the module that does it: :mod:`.extract`, :mod:`.recipe`
(and :mod:`.dpo`), :mod:`.export`, :mod:`.sampling` (infer and evaluate).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from mmcore.framework.context import StageContext
from mmcore.errors import StageError
from mmcore.engines.generation import ModelSource, Request
from mmcore.kits.diffusion.export import LORA_WEIGHTS, PipelineExport
from mmcore.kits.diffusion.extract import FeatureExtraction
from mmcore.kits.diffusion.objectives import flow_matching_objective
from mmcore.kits.diffusion.sampling import VideoSampling
from mmcore.kits.diffusion.sections import EXPERTS
from mmcore.framework.pack import StageResult
from mmcore.run.rundir import Manifest


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
            transformer over patches of [B, C, F, H, W] latents (default
            :func:`~mmcore.kits.diffusion.flops.denoiser_flops`).
        objective: ``model dir -> objective`` the denoiser is trained with (default flow
            matching; :meth:`NoiseSchedule.of` for a DDPM-family scheduler's v or epsilon
            prediction, as the checkpoint's ``scheduler/`` says).
        conditions: names of the per-clip tensors the denoiser is conditioned on besides the
            caption (image-to-video: the first frame's latents and mask, its image features):
            the encoders' ``conditions(frames) -> {name: tensor}`` makes them as the pipeline
            does, extract caches them, and ``predict`` gets them as keyword arguments; such a
            family generates from a first frame (``sample(..., image=)``, ``mmcore infer
            --image``; evaluate takes the held-out clips' first frames).
        demo_checker: ``(frames, caption) -> {"agrees": bool, ...} or None`` deciding whether a
            generated sample (uint8 [F, H, W, 3]) shows what its caption says, None for a caption
            it cannot read (:func:`mmcore.data.caption_agreement`, the synthetic demos'); with it
            evaluate samples the held-out clips' captions and reports ``caption_agreement``.
        sound_checker: the same for a family whose ``sample`` also makes sound (LTX-2):
            ``(sound, caption) -> {"agrees": bool, ...} or None``, ``sound`` the sample's dict
            less its frames (``audio``, ``audio_rate`` and whatever else the family adds);
            evaluate reports ``sound_agreement``.
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
    objective: Callable[[Path], Any] = flow_matching_objective
    conditions: Sequence[str] = ()
    demo_checker: Callable[[Any, str], Mapping[str, Any] | None] | None = None
    sound_checker: Callable[[Mapping[str, Any], str], Mapping[str, Any] | None] | None = None

    # -- the model ---------------------------------------------------------------------------

    def diffusers_class(self, name: str) -> Any:
        """The diffusers class of that name (the denoiser's, the pipeline's)."""
        import diffusers

        return getattr(diffusers, name)

    def build_model(self, model_dir: Path, checkpoint: Path | None = None, subfolder: str | None = None) -> Any:
        """The denoiser of ``model_dir``'s config (in ``subfolder``, default the family's), weights
        from a DCP ``checkpoint`` (convert's or train's)."""
        from mmcore.checkpoint.training import load_converted

        cls = self.diffusers_class(self.transformer_class)
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
            raise StageError(
                f"{index}: two denoisers split at noise level {boundary} (boundary_ratio): set training.expert to high_noise "
                f"(transformer, levels >= {boundary}) or low_noise (transformer_2, below); a run trains one"
            )
        return EXPERTS[chosen], ((float(boundary), 1.0) if chosen == "high_noise" else (0.0, float(boundary)))

    def predictor(self, ctx: StageContext, model_dir: Path | None = None) -> Callable[..., Any]:
        """``predict`` with the run's ``predict_options`` and, given the pipeline folder
        ``model_dir``, the checkpoint's ``checkpoint_options`` bound."""
        import functools

        options = {**(self.predict_options(ctx) if self.predict_options else {}), **(self.checkpoint_options(model_dir) if self.checkpoint_options and model_dir is not None else {})}
        return functools.partial(self.predict, **options) if options else self.predict

    def samples(self, ctx: StageContext, upstream: Mapping[str, Manifest], data: Any) -> tuple[Any, Any, Any]:
        """(samples of ``data``, the empty caption's embedding, the live encoders or None): from
        the feature cache after an extract stage, else frames and captions encoded per batch."""
        if "extract" in upstream:
            from mmcore.data.feature_cache import CachedSamples

            samples: Any = CachedSamples(data, upstream["extract"].output("features"), replaces={"latents": "frames", "rejected_latents": "rejected_frames"})
            return samples, samples.cache.get(samples.index["empty_text"]), None
        from mmcore.kits.diffusion.batches import FreshSamples

        encoders = self.encoders(upstream["download"].output("model"), ctx.config.data.max_sequence_length)
        return FreshSamples(data), encoders.text(""), encoders

    def lora_pipeline(self, source: Path, adapter: Path, subfolder: str | None = None) -> Any:
        """The downloaded pipeline with a LoRA adapter folder loaded by diffusers (into
        ``subfolder``'s denoiser: Wan2.2's low-noise expert is ``transformer_2``)."""
        pipe = self.diffusers_class(self.pipeline_class).from_pretrained(source)
        if not hasattr(pipe, "load_lora_weights"):  # no LoRA loader in the pipeline: its denoiser loads the file
            getattr(pipe, subfolder or self.subfolder).load_lora_adapter(str(adapter), prefix="transformer", weight_name=LORA_WEIGHTS)
            return pipe
        pipe.load_lora_weights(str(adapter), **({"load_into_transformer_2": True} if subfolder == "transformer_2" else {}))
        return pipe

    # -- the stages --------------------------------------------------------------------------

    def convert(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        """The convert stage (:func:`mmcore.engines.convert.convert_stage`) on the denoiser this run trains."""
        from mmcore.engines.convert import convert_stage

        subfolder, _ = self.expert(ctx, upstream["download"].output("model"))
        return convert_stage(ctx, upstream, adapter=self.adapter, build_model=lambda folder: self.build_model(folder, subfolder=subfolder), subfolder=subfolder, what=subfolder)

    def preprocess(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        """Captioned clips in size buckets (:func:`mmcore.data.clips.preprocess_captioned_videos`);
        without datasets, the family's demo data (with ``data.ranking``, its preference pairs)."""
        from mmcore.data.clips import preprocess_captioned_videos

        ranking = getattr(ctx.config.data, "ranking", False)
        return preprocess_captioned_videos(ctx, demo=self.preference_demo if ranking else self.demo)

    def extract(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        """Latents, caption embeddings and conditions into the feature cache (:mod:`.extract`)."""
        return FeatureExtraction(self).run(ctx, upstream)

    def recipe(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        """The train stage's recipe: :class:`~mmcore.kits.diffusion.recipe.DiffusionRecipe`, or
        with ``training.method: dpo`` Diffusion-DPO on preference pairs
        (:class:`~mmcore.kits.diffusion.dpo.DiffusionDPORecipe`), with ``training.method: grpo``
        Flow-GRPO on the captions (:class:`~mmcore.kits.diffusion.grpo.DiffusionGRPORecipe`). With a finished extract stage
        it trains from its cache; without, it encodes every batch afresh."""
        from mmcore.data.shards import ShardDataset

        data = ShardDataset(upstream["preprocess"].output("dataset"))
        if data.index.get("audio_rate") and ctx.config.training.method in ("dpo", "grpo"):
            raise StageError(f"training.method={ctx.config.training.method}: clips with sound (named video and audio latents) train with sft only for now")
        if ctx.config.training.method == "grpo":
            from mmcore.kits.diffusion.grpo import DiffusionGRPORecipe

            return DiffusionGRPORecipe(self, ctx, upstream, data)
        if ctx.config.training.method != "dpo":
            from mmcore.kits.diffusion.recipe import DiffusionRecipe

            return DiffusionRecipe(self, ctx, upstream, data)
        from mmcore.kits.diffusion.dpo import DiffusionDPORecipe

        self.expert(ctx, upstream["download"].output("model"))  # training.expert checked as for SFT; DPO trains the family's denoiser
        if self.conditions:
            raise StageError(f"training.method=dpo: Diffusion-DPO of a family conditioned on {', '.join(self.conditions)} is not supported yet")
        return DiffusionDPORecipe(self, ctx, upstream, data)

    def export(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        """The pipeline folder with the trained denoiser, proven equal to training; after LoRA
        training, the adapter (:class:`~mmcore.kits.diffusion.export.PipelineExport`)."""
        return PipelineExport(self, ctx).run(upstream)

    def evaluate(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        """Sample videos of the export for the held-out captions and a contact sheet
        (:meth:`~mmcore.kits.diffusion.sampling.VideoSampling.evaluate`)."""
        return VideoSampling(self, ctx, upstream).evaluate()

    def infer(self, ctx: StageContext, upstream: Mapping[str, Manifest], model: ModelSource, requests: list[Request]) -> list[dict[str, Any]]:
        """A video for each request's prompt, in ``infer/`` (:meth:`~mmcore.kits.diffusion.sampling.VideoSampling.infer`)."""
        return VideoSampling(self, ctx, upstream).infer(model, requests)


__all__ = ["DiffusionFamily"]
