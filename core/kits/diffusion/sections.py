"""The diffusion kit's config sections, which a family's config subclasses: the data (captioned
clips in size buckets), training (caption dropout, the flow-matching schedule, the expert, the
guidance value) and the export's samples."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Mapping

from pydantic import Field, field_validator

from mmcore.config import DataSection, ExportSection, GrpoSection, TrainingSection
from mmcore.framework.context import StageContext


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
    demo_samples: int = Field(0, ge=0, description="Without data.datasets, generate the pack's synthetic dataset with this many clips (the demo; ignored when datasets are given).")
    ranking: bool = Field(False, description="The datasets are preference pairs (a caption with chosen and rejected videos), for training.method: dpo.")
    eval_fraction: float = Field(
        0.0, ge=0, lt=1, description="The fraction of clips (with ranking: pairs) held out: training reports their velocity error at fixed noise (eval/loss), or preference accuracy."
    )
    audio_rate: int | None = Field(
        None,
        gt=0,
        description="Keep each clip's sound track beside its frames, mono at this sample rate, over the frames' time span (a clip without one: silence); for families that generate sound with the video (LTX-2). None: frames only.",
    )

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


class FlowGrpoSection(GrpoSection):
    """GRPO for a flow-matching denoiser (Flow-GRPO / DanceGRPO, ``training.method: grpo`` in the
    diffusion kit): each step generates ``group_size`` samples per caption by the flow's ODE run as
    an SDE (every denoising step a Gaussian with a log-probability), scores the decoded pictures
    with image rewards and trains on ``train_timesteps`` of the steps. The answer-sampling keys
    (max_new_tokens, temperature, top_p, min_p, format_pattern, loss_averaging) are the VLM kit's
    and unused here; top_k, entropy_coef and skip_uniform_groups are refused."""

    rewards: dict[str, float] = Field(
        default_factory=lambda: {"colour": 1.0},
        description="Reward function name -> weight; a sample's reward is the weighted sum. Rewards that score images (built in: colour, brightness; more from plugins); a text reward is refused. A mapping given in a file or on the command line merges into the preset's: weight 0 takes a preset's reward out of the sum (it is still scored and logged).",
    )
    sample_steps: int = Field(10, ge=2, le=1000, description="Denoising steps of each rollout sample and of the held-out samples (levels 1 to 0, shifted by training.flow_shift).")
    sde_noise_level: float = Field(
        0.7,
        ge=0,
        le=10,
        allow_inf_nan=False,
        description="a in the SDE's noise sigma_t = a * sqrt(t / (1 - t)) (Flow-GRPO's noise level): how far the rollouts explore around the ODE's path; must be > 0.",
    )
    train_timesteps: int = Field(
        0,
        ge=0,
        description="Denoising steps each sample is trained on (DanceGRPO's timestep subsampling: a seeded draw per sample and rollout); 0: all sample_steps of them.",
    )
    eval_prompts: int = Field(
        16,
        ge=0,
        description="Samples of held-out captions (deterministic ODE, fixed noise per sample) at every evaluation for eval/reward and eval/rewards/<name>; cycles over the held-out captions with new noise where they are fewer.",
    )


class FlowMatchingTraining(DiffusionTraining):
    flow_shift: float = Field(3.0, gt=0, description="Timestep shift of the flow-matching schedule.")
    timestep_sampling: Literal["uniform", "logit_normal"] = Field(
        "logit_normal", description="How training draws noise levels before the shift: logit_normal (sigmoid of a standard normal: more weight on middle levels, as SD3) or uniform."
    )
    grpo: FlowGrpoSection = Field(default_factory=FlowGrpoSection)
    expert: Literal["none", "high_noise", "low_noise"] = Field(
        "none",
        description="A pipeline of two denoisers split at a noise level (Wan2.2: model_index.json boundary_ratio): which one this run trains, on its own noise levels (high_noise: transformer, levels >= the boundary; low_noise: transformer_2, below). Export writes it beside the other, as downloaded.",
    )


class GuidanceEmbeddingTraining(FlowMatchingTraining):
    """For a guidance-distilled denoiser (FLUX.1-dev, HunyuanVideo): it embeds a guidance value
    beside the timestep, and training states which one (:func:`guidance_option` binds it)."""

    guidance: float = Field(1.0, ge=0, description="The value the guidance embedding is given in training (models without the embedding ignore it).")


def guidance_option(ctx: StageContext) -> Mapping[str, Any]:
    """``DiffusionFamily.predict_options`` of a guidance-distilled family: ``training.guidance``."""
    return {"guidance": ctx.config.training.guidance}


#: the pipeline call's arguments the kit's samplers set themselves (not ``export.pipeline_options``)
KIT_CALL_OPTIONS = ("prompt", "height", "width", "num_frames", "num_inference_steps", "guidance_scale", "max_sequence_length", "generator", "output_type", "image")

#: ``training.expert`` -> the pipeline's subfolder of that denoiser (Wan2.2)
EXPERTS = {"high_noise": "transformer", "low_noise": "transformer_2"}


class SampleExport(ExportSection):
    sample_prompts: list[str] = Field(default_factory=list, description="Captions the evaluate stage generates samples for (unless evaluate.datasets gives some).")
    sample_steps: int = Field(20, ge=1, description="Denoising steps of the samples export and evaluate generate (generation.num_inference_steps overrides it).")
    guidance_scale: float = Field(4.0, ge=1.0, description="Classifier-free guidance of those samples (1: none; generation.guidance_scale overrides it).")
    pipeline_options: dict[str, Any] = Field(
        default_factory=dict,
        description="More keyword arguments of the pipeline's own __call__ for evaluate's and infer's samples (LTX-Video: {frame_rate: 25}); each must be one its __call__ takes.",
    )

    def call_options(self, pipe: Any, chosen: tuple[str, ...] = KIT_CALL_OPTIONS) -> dict[str, Any]:
        """``pipeline_options`` checked against ``pipe``'s ``__call__``: an option it does not take,
        or one the kit sets itself (``chosen``: sizes, steps, guidance, text length), is a
        one-line config error naming it."""
        import inspect

        from mmcore.errors import ConfigError

        params = inspect.signature(type(pipe).__call__).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        for name in self.pipeline_options:
            if name in chosen:
                raise ConfigError(f"export.pipeline_options.{name}: the kit sets {name} itself (data.buckets, data.max_sequence_length, export.sample_steps / guidance_scale); leave it out")
            if name not in params and not takes_any:
                raise ConfigError(f"export.pipeline_options.{name}: {type(pipe).__name__}.__call__ takes no such argument (it takes: {', '.join(n for n in params if n != 'self')})")
        return dict(self.pipeline_options)


__all__ = ["VideoData", "DiffusionTraining", "FlowGrpoSection", "FlowMatchingTraining", "GuidanceEmbeddingTraining", "guidance_option", "EXPERTS", "SampleExport"]
