"""Typed run configuration: the sections of a run's config, validated by pydantic.

Where values come from and in what order (defaults < preset < ``--config FILE`` < options <
``key.path=value`` overrides) is :mod:`mmcore.config.layers`'.

A pack extends :class:`RunConfig` by subclassing its sections::

    class Qwen2VLData(DataSection):
        image_max_pixels: int = 1024 * 28 * 28

    class Qwen2VLConfig(RunConfig):
        data: Qwen2VLData = Qwen2VLData()
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from mmcore.config.base import MAX_STEPS, Section, Steps  # noqa: F401  (MAX_STEPS: its old place)
from mmcore.config.methods import DpoSection, GrpoSection


class RunSection(Section):
    name: str | None = Field(None, description="Run name; default: <pack>-<preset or config file stem>.")
    seed: int = Field(0, description="Seed for every random number generator of every stage.")
    device: str = Field("auto", description="Accelerator: auto, cpu, cuda, npu, ...")
    offline: bool = Field(False, description="Never touch the network; use only local files and caches.")


class ModelSection(Section):
    source: str | None = Field(None, description="Hub id (org/name), local directory, or init:<preset> for random weights.")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit) to pin.")
    allow_patterns: list[str] | None = Field(None, description="Only download files matching these globs.")
    trust_remote_code: bool = Field(False, description="Allow code from the checkpoint to run (opt-in).")


class DataSection(Section):
    datasets: list[str] = Field(default_factory=list, description="Dataset files or directories.")
    on_bad_sample: Literal["error", "skip"] = Field("error", description="Stop at the first bad sample, or skip, count and list them.")
    num_workers: int = Field(0, ge=0, description="Worker processes for preprocessing (0: in-process).")
    max_image_pixels: int = Field(89_478_485, ge=1, description="An image or video frame larger than this (width x height) is a bad sample, not a decompression bomb (PIL's default limit).")
    max_media_seconds: float = Field(3600.0, gt=0, description="Audio or video longer than this is a bad sample, found before decoding where the container says its duration.")


class ConvertSection(Section):
    verify: bool = Field(False, description="Convert back and check every tensor is bit-identical.")


class ExtractSection(Section):
    enabled: bool = Field(True, description="Run the extract stage when the pack offers it.")
    batch_size: int = Field(1, ge=1, description="Not used: the extract stage encodes one sample at a time (kept so that configs and run directories that set it still load).")


class LoraSection(Section):
    """Low-rank adapters (LoRA, through peft) instead of full fine-tuning: the base weights stay
    frozen and bit-identical; only the adapters (and ``modules_to_save``) train and are saved."""

    r: int = Field(0, ge=0, description="Rank of the adapters; 0: no LoRA (full fine-tuning).")
    alpha: float = Field(16.0, gt=0, description="Scaling numerator: the adapter's output is multiplied by alpha / r.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input while training.")
    target_modules: list[str] = Field(
        default_factory=list, description="Module-name globs or pack groups whose linear (and conv/embedding) layers get adapters; empty: the pack's default (its repeated blocks' linear layers)."
    )
    modules_to_save: list[str] = Field(default_factory=list, description="Module-name globs or pack groups trained in full beside the adapters (e.g. a new output head), saved with them.")
    init: Literal["default", "gaussian"] = Field(
        "default", description="Adapter A's initialisation (B starts at zero, so training starts at the base model): default = kaiming-uniform as nn.Linear, gaussian = normal with std 1/r."
    )


class TrainingSection(Section):
    method: Literal["sft", "dpo", "grpo"] = Field(
        "sft",
        description="sft: the pack's own loss on its samples; dpo: preference optimisation on pairs (data.ranking); grpo: online RL, rewards on the model's own sampled answers (training.grpo).",
    )
    steps: Steps = Field(100, ge=0, description="Optimizer steps (at most 100,000,000); unused with training.epochs.")
    epochs: int | None = Field(
        None,
        strict=True,
        ge=1,
        le=100_000,
        description="Train this many passes over the data instead of training.steps: steps = epochs x the micro-batches the sampler deals per epoch (samples / (data-parallel processes x micro_batch_size), or training.max_tokens' packed rows) / grad_accum_steps, rounded down; null: training.steps.",
    )
    optimizer: Literal["adamw", "sgd", "adafactor"] = Field(
        "adamw",
        description="adamw (torch.optim.AdamW, with training.betas and eps); sgd (with training.momentum); adafactor (torch.optim.Adafactor, factored second moments: little optimizer memory; torch's own betas and eps; unsharded parameters only: one process, fp32, not megatron).",
    )
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.999), description="adamw: decay rates of the moving averages of the gradient and of its square."
    )
    eps: float = Field(1e-8, gt=0, allow_inf_nan=False, description="adamw: added to the denominator for numerical stability.")
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd: momentum (0: plain SGD, no optimizer state).")
    lr: float = Field(1e-4, gt=0, allow_inf_nan=False, description="Peak learning rate (after warmup, before decay).")
    lr_schedule: Literal["cosine", "linear", "constant"] = Field("cosine", description="Decay after warmup to min_lr_ratio x lr at the last step: cosine, linear, or none (constant).")
    warmup_steps: Steps = Field(0, ge=0, description="Steps of linear warmup from lr / warmup_steps to lr.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="The learning rate at the last step, as a fraction of lr (cosine and linear).")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay (adamw; sgd and adafactor as torch applies it).")
    micro_batch_size: int = Field(1, ge=1, description="Samples per process per micro step.")
    grad_accum_steps: Steps = Field(
        1,
        ge=1,
        description="Micro-batches per optimizer step; gradients are reduced once per step, after the last one. Samples per step = micro_batch_size x grad_accum_steps x data-parallel processes.",
    )
    max_grad_norm: float | None = Field(1.0, gt=0, allow_inf_nan=False, description="Clip gradients to this norm (> 0: a negative one would flip the gradient); null: no clipping.")
    on_nonfinite: Literal["stop", "skip"] = Field(
        "stop",
        description="A step whose loss or gradient norm is not finite (nan, inf): stop the run with an error naming the step (the last checkpoint stays the last good one), or skip the step (no update; counted in the skipped_steps metric).",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="auto: bf16 where the device supports it. bf16: bf16 compute, fp32 weights, gradient reduction and optimizer state, on any number of processes (the backend's mixed-precision policy).",
    )
    recompute: Literal["none", "full", "selective"] = Field(
        "none", description="Activation recompute of the pack's blocks: full keeps only block inputs; selective keeps matmul and attention outputs and recomputes the cheap ops."
    )
    cpu_offload: bool = Field(False, description="Keep sharded parameters, gradients and optimizer state in host memory between uses (FSDP2's offload policy; needs an accelerator).")
    freeze: list[str] = Field(default_factory=list, description="Parameter-name globs or pack groups to freeze.")
    packing: bool = Field(False, description="Pack each micro-batch into one sequence, attention isolated per sample, no padding (where the pack supports it).")
    max_tokens: int | None = Field(
        None, ge=1, description="With packing: fill each micro-batch's row to this many tokens from a length-aware sampler (micro_batch_size is then unused); null: micro_batch_size samples per row."
    )
    balance_towers: bool = Field(
        True,
        description="Where samples differ in media (vision patches, audio frames), give the data-parallel ranks of a step alike tower work: samples are sorted by it within windows of 64 global micro-batches before these are cut and shuffled, and dealt largest first (the global micro-batches stay the same at any number of processes); false: plain shuffling. The tower_balance metric says how alike.",
    )
    prefetch: bool = Field(
        True,
        description="Read and collate the next step's micro-batches on a thread while this step computes (the data_time_s metric is then the wait for them); the batches and the run are the same either way. Where the step computes on the CPU the thread runs its torch ops on one core (a second OpenMP team beside the step's slowed it). false: read them at the start of each step.",
    )
    checkpoint_every: Steps = Field(0, ge=0, description="Save a resumable checkpoint every N steps (0: only at the end).")
    log_every: Steps = Field(1, ge=1, description="Write a metrics row (metrics.jsonl, TensorBoard) every N steps, and at the last step.")
    eval_every: Steps = Field(0, ge=0, description="Measure the held-out split (eval/* metrics) every N steps and at the end (0: never during training; the evaluate stage still runs after export).")
    moe_aux_loss_coef: float | None = Field(
        None, ge=0, description="Mixture-of-experts models: weight of the router's load-balancing loss, per loss token (null: the model config's router_aux_loss_coef; 0: left out)."
    )
    ema: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Keep an exponential moving average of the trained weights with this decay (e.g. 0.999; 0: none), in every checkpoint; export writes it (export.weights). Its first updates decay less, as diffusers' EMAModel's.",
    )
    lora: LoraSection = Field(default_factory=LoraSection)
    dpo: DpoSection = Field(default_factory=DpoSection)
    grpo: GrpoSection = Field(default_factory=GrpoSection)


class ParallelSection(Section):
    backend: str = Field("fsdp2", description="Distributed backend (fsdp2, megatron, ...).")
    nproc_per_node: int = Field(1, ge=1, description="Processes per machine for the distributed stages (train; one per accelerator); > 1 runs them under torchrun. Also --nproc-per-node.")
    nnodes: int = Field(
        1,
        ge=1,
        description="Machines in the run (each runs the same command with its --node-rank; the run directory on a file system they share). Given by this command, not kept in the run directory.",
    )
    node_rank: int = Field(0, ge=0, description="This machine's number, 0 .. nnodes - 1; node 0 runs the single-process stages. Given by this command, not kept in the run directory.")
    rdzv_endpoint: str | None = Field(None, description="host:port of the rendezvous; default: a free local port.")
    rdzv_timeout_s: int = Field(900, ge=1, description="How long a node waits for the others: node 0's announcement in the shared run directory, and torchrun's rendezvous.")
    collective_timeout_s: int = Field(
        1800,
        ge=1,
        description="How long a process waits in a collective (an all-gather, a gradient reduction, a barrier) for the others before the run stops with an error naming the stage: a rank that stalls or hangs ends the run in bounded time.",
    )
    replicate: int = Field(
        1,
        ge=1,
        description="HSDP: replicas of the model, each sharded over world / replicate processes (e.g. the number of nodes: shard within a node, replicate across); 1: shard over every process.",
    )
    ulysses: int = Field(
        1,
        ge=1,
        description="backend fsdp2, supervised fine-tuning: Ulysses sequence parallelism: groups of this many processes share each sample, each running the VLM's text decoder (with training.packing) or the diffusion transformer (a diffusers class with a context-parallel plan: Wan, FLUX) on 1/ulysses of its tokens, an all-to-all over attention heads around attention; data-parallel replicas = processes / ulysses; the same losses; a run resumes at another Ulysses size with the same replicas (e.g. 2 processes at ulysses=2 as 1 process).",
    )
    expert_parallel: int = Field(
        1,
        ge=1,
        description="backend fsdp2, MoE models: the experts of each MoE layer split over groups of this many processes (transformers' expert-parallel plan: each token sent to its expert's rank and back by all-to-all); the other weights shard over every process as before; the same losses.",
    )
    gradient_sync: Literal["step", "micro_batch"] = Field(
        "step",
        description="backend fsdp2, with gradient accumulation: reduce-scatter the gradients once a step (step: each rank accumulates its micro-batches' gradients unsharded, a full fp32 copy of the trained weights, and reduces once) or after every micro-batch (micro_batch: the gradients stay sharded, one reduction per micro-batch); micro_batch is what a model whose fp32 gradients do not fit one device needs (mmcore plan says which).",
    )
    tensor_parallel: int = Field(1, ge=1, description="backend megatron: tensor-parallel ranks each layer is split over (attention heads, MLP columns, the vocabulary).")
    pipeline_parallel: int = Field(
        1, ge=1, description="backend megatron: pipeline stages the layers are placed on (the vision tower on the first); data-parallel replicas = processes / (tensor_parallel x pipeline_parallel)."
    )
    virtual_pipeline: int = Field(
        1,
        ge=1,
        description="backend megatron, pipeline_parallel > 1: model chunks per pipeline rank, run by Megatron's interleaved 1F1B schedule (a smaller pipeline bubble for more transfers); the layers must divide into pipeline_parallel x virtual_pipeline equal runs, and training.grad_accum_steps >= pipeline_parallel.",
    )
    sequence_parallel: bool = Field(
        False,
        description="backend megatron, tensor_parallel > 1: between the split layers each tensor-parallel rank keeps 1/tensor_parallel of the sequence (norms, residuals, dropout: their activation memory / tensor_parallel); the same losses.",
    )
    context_parallel: int = Field(
        1,
        ge=1,
        description="backend megatron: context parallelism: groups of this many processes share each sample, the sequence cut into 2 x context_parallel chunks (rank r holds chunks r and 2 x context_parallel - 1 - r: even causal work), each rank running every layer on its tokens and gathering the keys and values of the whole sequence for attention; data-parallel replicas = processes / (tensor_parallel x pipeline_parallel x context_parallel); sequences padded to a multiple of 2 x context_parallel; M-RoPE language models (qwen2vl); the same losses.",
    )


class ExportSection(Section):
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field("auto", description="dtype of the exported weights; auto: as trained (float32 master weights).")
    merge_lora: bool = Field(False, description="After LoRA training, also write the full model with the adapters merged into the base weights (merged in fp32, then cast to export.dtype).")
    weights: Literal["ema", "last"] = Field(
        "ema", description="After training with training.ema: export the moving average of the weights (ema) or the last step's (last). Without training.ema, the last step's."
    )


class MegatronConvertSection(ConvertSection):
    """``convert`` of a pack with a Megatron table (:mod:`mmcore.backends.megatron.tensor_map`)."""

    mindspeed_mm: str | None = Field(
        None,
        description="Import the weights of this MindSpeed-MM (Megatron) checkpoint folder (the one with latest_checkpointed_iteration.txt, any TP/PP) instead of the downloaded ones; model.source still gives the config, tokenizer and processor (the HF model it was converted from).",
    )


class MegatronExportSection(ExportSection):
    """``export`` of a pack with a Megatron table: also MindSpeed-MM's layout, at any TP/PP."""

    format: Literal["hf", "mindspeed-mm"] = Field(
        "hf",
        description="hf: the transformers folder; mindspeed-mm: that, plus MindSpeed-MM's Megatron layout (export/mindspeed-mm) at export.tensor_parallel x export.pipeline_parallel, read back and checked bit-identical.",
    )
    tensor_parallel: int = Field(1, ge=1, description="mindspeed-mm: tensor-parallel ranks to split the weights over.")
    pipeline_parallel: int = Field(1, ge=1, description="mindspeed-mm: pipeline stages (the vision tower on the first).")
    pipeline_layers: list[int] = Field(
        default_factory=list,
        description="mindspeed-mm: the language model's layers on each pipeline stage (MindSpeed-MM's llm pipeline_num_layers); empty: as even as they go, the later stages taking the remainder.",
    )


class EvaluateSection(Section):
    enabled: bool = Field(True, description="Run the evaluate stage when the pack offers it.")
    datasets: list[str] = Field(default_factory=list, description="Held-out files in the training data's format (default: the held-out split preprocess made).")
    limit: int = Field(256, ge=1, description="Evaluate at most this many held-out items (the first ones).")


class GenerationSection(Section):
    """How ``mmcore infer`` and the evaluate stage generate. Greedy by default, so that a result
    can be reproduced and compared; ``temperature`` > 0 samples."""

    max_new_tokens: int = Field(64, ge=1, description="Tokens to generate at most per answer or transcript.")
    temperature: float = Field(0.0, ge=0, description="0: greedy decoding; > 0: sample at this temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling: keep the smallest set of tokens with this much probability (when sampling).")
    batch_size: int = Field(16, ge=1, description="Requests generated together (left-padded, with the KV cache).")
    num_inference_steps: int | None = Field(None, ge=1, description="Denoising steps of a generated image or video (default: the pack's).")
    guidance_scale: float | None = Field(None, ge=1.0, description="Classifier-free guidance of a generated image or video (default: the pack's).")
    seed: int | None = Field(None, description="Seed of sampling and of generated videos' noise (default: run.seed).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights and compute while generating; auto: bfloat16 on an accelerator that supports it, float32 on CPU (where the evaluate stage's figures are exact)."
    )


#: The experiment trackers ``logging.report_to`` may name (each a plugin in ``mmcore_plugins``).
TRACKER_NAMES = ("tensorboard", "wandb", "mlflow")


class LoggingSection(Section):
    """Where a run's metrics go besides ``metrics.jsonl`` (always written): the experiment
    trackers, each an observer plugin (docs/tracking.md). Not part of any stage's plan: turning a
    tracker on or off reruns nothing."""

    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["tensorboard"],
        description="Trackers that get the config, every training and held-out metric at its step, the plots and the evaluate results: tensorboard, wandb (pip install 'mmcore[wandb]'), mlflow (pip install 'mmcore[mlflow]'); [] or none: only metrics.jsonl.",
    )
    project: str | None = Field(None, description="The wandb project and the MLflow experiment; default: WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME where set, else mmcore.")
    run_name: str | None = Field(None, description="The run's name in wandb and MLflow; default: the run directory's name.")
    wandb_mode: Literal["online", "offline", "disabled"] | None = Field(
        None, description="wandb's mode; default: offline under run.offline, else what WANDB_MODE says, else online (which needs `wandb login` or WANDB_API_KEY)."
    )
    mlflow_tracking_uri: str | None = Field(
        None, description="Where MLflow records the run; default: MLFLOW_TRACKING_URI where set, else a local SQLite store in the run directory (mlflow.db, artifacts in mlflow-artifacts/)."
    )

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_or_none(cls, value: Any) -> Any:
        # `logging.report_to=wandb` on the command line is a string: one tracker; none: no tracker
        if isinstance(value, str):
            value = [] if value.strip().lower() == "none" else [value]
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str) and value[0].strip().lower() == "none":
            return []
        return value

    @field_validator("report_to")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))


class RunConfig(Section):
    """The whole configuration of a run. Packs subclass it to add their own fields."""

    run: RunSection = Field(default_factory=RunSection)
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    convert: ConvertSection = Field(default_factory=ConvertSection)
    extract: ExtractSection = Field(default_factory=ExtractSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    parallel: ParallelSection = Field(default_factory=ParallelSection)
    export: ExportSection = Field(default_factory=ExportSection)
    evaluate: EvaluateSection = Field(default_factory=EvaluateSection)
    generation: GenerationSection = Field(default_factory=GenerationSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)

    def slice(self, sections: tuple[str, ...]) -> dict[str, Any]:
        """The parts of the config a stage reads (recorded in its manifest), plus the seed.

        ``sections`` are section names or dotted paths to single fields (``training.freeze``).
        """
        data = self.model_dump(mode="json")
        # a permission the user grants on each command, not something the stage computes: a run
        # continued without it (its run directory cannot grant it) must not count as changed
        data["model"].pop("trust_remote_code", None)
        for name in (
            "nnodes",
            "nproc_per_node",
            "node_rank",
            "rdzv_endpoint",
            "rdzv_timeout_s",
            "collective_timeout_s",
            "tensor_parallel",
            "pipeline_parallel",
            "sequence_parallel",
            "virtual_pipeline",
            "context_parallel",
            "expert_parallel",
            "ulysses",
        ):
            # how the processes are started and meet, which node reads the slice, how the model and
            # the samples are split over them: not what the stage computes (a run resumes at another
            # tensor/pipeline/context layout, expert split or Ulysses size, and 2 nodes of 1 process train
            # as 1 node of 2); how many data-parallel replicas there are is: they set the global
            # batch (tensor/pipeline/context groups and a Ulysses group share their samples)
            data["parallel"].pop(name, None)
        data["training"].pop("prefetch", None)  # when batches are read, not what they are: a run resumes with it either way
        parallel = self.parallel
        data["parallel"]["data_parallel_replicas"] = self.world_size // (parallel.tensor_parallel * parallel.pipeline_parallel * parallel.context_parallel * parallel.ulysses)
        if data["training"]["epochs"] is not None:
            data["training"]["steps"] = None  # not the user's: the epochs and the data set it
        out: dict[str, Any] = {}
        for path in sections:
            value: Any = data
            for part in path.split("."):
                value = value[part]
            out[path] = value
        out["seed"] = self.run.seed
        return out

    @property
    def world_size(self) -> int:
        return self.parallel.nproc_per_node * self.parallel.nnodes
