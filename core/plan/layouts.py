"""Candidate layouts of a cluster and each one's per-rank memory and step time.

Memory per rank follows what mmcore's backends hold (their docstrings say so):

* FSDP2 (``parallel.backend: fsdp2``; HSDP with ``parallel.replicate``): fp32 weights (they are
  the master copy: bf16 exists only as compute copies), fp32 gradients and AdamW's two fp32
  moments, each parameter split along its first dimension over the shard group (the first rank
  holds ``ceil(dim0 / shards)`` rows: counted per parameter, exactly). Buffers: the unsharded
  compute copies of the block being run and the one prefetched (``2 x largest block`` at the
  compute dtype) and that block's full-size fp32 gradient before its reduce-scatter; none on a
  single fp32 process (the engine does not shard it). With CPU offload the sharded weights,
  gradients and moments live in host memory.
* megatron (``parallel.backend: megatron``; tensor x pipeline parallel): the same fp32 state
  (mmcore's megatron backend keeps fp32 weights, no distributed optimizer), the decoder layers
  over ``tp x pp``, embeddings and head over ``tp``, the towers whole (the first stage holds the
  vision tower as transformers builds it): the first stage's share; plus a bf16 compute copy of
  the local weights. Activations: a pipeline's first stage holds ``pp``
  micro-batches of its ``layers / pp`` layers (1F1B), so all layers' worth; tensor parallel with
  sequence parallel divides them by ``tp``; context parallel (``parallel.context_parallel``) by
  ``cp`` (each rank runs the layers on 1/cp of the tokens; the weights are replicated over the
  group), its key/value all-gathers, :func:`context_bytes`, added to the step time.
* Ulysses sequence parallel (``parallel.ulysses``: the VLM kit's text decoder; a diffusers
  denoiser with a context-parallel plan, e.g. Wan, FLUX): activations
  divided by ``sp`` (the towers, run whole on every rank of a group, are not in the formula);
  the model state sharded over the sequence group's ranks too; its all-to-alls add
  :func:`ulysses_bytes` over the device's ``peer_link`` to the step time.
* Expert parallel (``parallel.expert_parallel``: a transformers MoE model on the VLM kit): the
  model state per rank as FSDP over every process (the experts split over an EP group and
  sharded over its copies hold the same share); what changes is the buffer (a block's experts are
  gathered over their ``efsdp`` copies only: ``1 / ep`` of them) and the step time (each MoE
  layer's token all-to-alls, :func:`expert_bytes`, over ``peer_link``).

Every rank adds a fixed :data:`RUNTIME_BYTES` (CUDA/CANN context, NCCL/HCCL buffers, allocator
fragmentation), an assumption, not a measurement.

Step time: the step's model FLOPs (the engine's MFU count) on one rank, plus one more forward
(a third of a step) with full recompute, over the device's peak times :data:`EFFICIENCY`; a
pipeline's bubble ``(pp - 1) / micro-batches``; offload adds its transfers over the host link
and the optimizer step in host memory. Ulysses' and the experts' all-to-alls are added whole
(they sit between the layers' matmuls). The data-parallel collectives (:func:`fsdp_seconds`:
FSDP2's weight all-gathers and gradient reduce-scatter, HSDP's all-reduce over replicas,
megatron's gradient all-reduce) overlap the compute as FSDP2's prefetch and bucketed reductions
let them: only the part longer than the compute adds to the step. They run over ``peer_link``
where the group fits a node and over ``node_link`` where it spans nodes (a ring is as fast as
its slowest link), which is what makes HSDP (shard in a node, replicate across) win on
clusters of many nodes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterator

from mmcore.plan.devices import GIB, Device
from mmcore.plan.model import Planned

#: the fraction of peak FLOP/s a step's matmuls and attention reach: dense 7B-70B training with
#: FSDP or Megatron reports 38-55 % MFU (torchtitan's Llama 3 tables, Megatron-LM's papers)
EFFICIENCY = 0.40
#: per rank: device runtime context, collective buffers, allocator fragmentation (assumed)
RUNTIME_BYTES = 3 * GIB
#: host memory bandwidth for an offloaded optimizer step (reads and writes 16 bytes a parameter)
HOST_BANDWIDTH = 40e9
#: AdamW's state: two fp32 moments per trained parameter
ADAM_BYTES = 8


@dataclass(frozen=True)
class Layout:
    """One way to lay the model over the cluster."""

    shard: int  # data-parallel ranks of an FSDP shard group; with sp, shard x sp ranks split the model state
    replicate: int = 1  # HSDP replicas
    tp: int = 1
    pp: int = 1
    sp: int = 1  # Ulysses sequence parallel
    cp: int = 1  # megatron's context parallel
    ep: int = 1  # expert parallel (an MoE model's experts)
    recompute: bool = False
    offload: bool = False
    sync_every: bool = False  # parallel.gradient_sync: micro_batch (set by estimate where needed)

    @property
    def backend(self) -> str:
        return "megatron" if self.tp * self.pp * self.cp > 1 else "fsdp2"

    def name(self) -> str:
        sharded = self.shard * self.sp  # a sequence group's ranks hold shards too (mmcore.backends.ulysses)
        parts = [f"fsdp{sharded}" if self.replicate == 1 else f"hsdp{self.replicate}x{sharded}"] if self.backend == "fsdp2" else [f"dp{self.shard * self.replicate}"]
        parts += [f"{k}{v}" for k, v in (("tp", self.tp), ("pp", self.pp), ("cp", self.cp), ("sp", self.sp), ("ep", self.ep)) if v > 1]
        parts += ["recompute"] if self.recompute else []
        parts += ["offload"] if self.offload else []
        parts += ["sync-mb"] if self.sync_every else []
        return " ".join(parts)


@dataclass(frozen=True)
class Estimate:
    """A layout's per-rank memory (bytes), step time and whether it runs in mmcore and fits."""

    layout: Layout
    weights: float
    grads: float
    optimizer: float
    activations: float
    activations_other: float  # the same layout's activations with recompute the other way
    buffers: float
    host: float  # offloaded state, in host memory
    step_s: float
    mfu: float
    runnable: str  # "" or why mmcore cannot run it yet
    fits: bool

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.buffers


def shard_elements(model: Any, shards: int, trained_only: bool = False) -> int:
    """Elements the first rank holds when every parameter is split along dim 0 over ``shards``."""
    total = 0
    for p in model.parameters():
        if trained_only and not p.requires_grad:
            continue
        if p.dim() == 0:
            total += 1
            continue
        total += math.ceil(p.shape[0] / shards) * (p.numel() // p.shape[0])
    return total


def state_bytes(plan: Planned, layout: Layout) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes of one rank."""
    if layout.backend == "megatron":
        local, trained = (whole + layers / (layout.tp * layout.pp) + rest / layout.tp for whole, layers, rest in (plan.megatron_split(), plan.megatron_split(True)))
    else:
        shards = layout.shard * layout.sp
        local, trained = shard_elements(plan.model, shards), shard_elements(plan.model, shards, True)
    return 4.0 * local, 4.0 * trained, float(ADAM_BYTES * trained)


def estimate(plan: Planned, layout: Layout, device: Device, *, micro_batch: int, global_batch: int, bf16: bool = True, runtime: float = RUNTIME_BYTES, per_node: int = 8) -> Estimate:
    """The memory and time of one step of ``global_batch`` rows, ``micro_batch`` rows at a time
    per data-parallel rank (gradient accumulation, or a pipeline's micro-batches, makes up the rest)."""
    a = 2 if bf16 else 4
    data_parallel = layout.shard * layout.replicate
    accum = max(1, math.ceil(global_batch / (data_parallel * micro_batch)))
    weights, grads, optimizer = state_bytes(plan, layout)
    layers = plan.shape.layers
    divide = layout.tp * layout.sp * layout.cp

    def acts(recompute: bool) -> float:
        return plan.activations(micro_batch, a, recompute, layers) / divide

    activations, other = acts(layout.recompute), acts(not layout.recompute)
    if layout.backend == "megatron":
        buffers = (a * weights / 4 if bf16 else 0.0) + runtime
    else:
        block = plan.largest_block()
        if layout.ep > 1:  # a block's experts are gathered over their copies only
            in_block = plan.moe()[2]
            block = block - in_block + in_block / layout.ep
        sharded = layout.shard * layout.replicate > 1 or bf16 or layout.offload
        buffers = (2 * a * block + 4 * block if sharded else 0.0) + runtime
        if sharded and accum > 1 and not layout.sync_every:
            # parallel.gradient_sync: step keeps every micro-batch's gradients unsharded, in fp32,
            # until the step's one reduction: a full copy of the trained weights' gradients
            buffers += 4 * shard_elements(plan.model, 1, True) - 4 * block
    host = 0.0
    seconds_extra = 0.0
    if layout.offload:
        host = weights + grads + optimizer
        seconds_extra = (2 * weights + grads) / device.host_link + 16 * grads / 4 / HOST_BANDWIDTH
        weights = grads = optimizer = 0.0
    if layout.sp > 1:
        seconds_extra += ulysses_bytes(plan, layout, micro_batch * accum, a) / device.peer_link
    if layout.cp > 1:
        seconds_extra += context_bytes(plan, layout, micro_batch * accum, a) / device.peer_link
    if layout.ep > 1:
        seconds_extra += expert_bytes(plan, layout, micro_batch * accum, a) / device.peer_link
    flops = plan.flops(micro_batch) * accum / (layout.tp * layout.pp * layout.sp * layout.cp)
    compute = flops * (4 / 3 if layout.recompute else 1.0) / (device.peak * EFFICIENCY)
    bubble = 1 + (layout.pp - 1) / accum if layout.pp > 1 else 1.0
    exposed = max(0.0, fsdp_seconds(plan, layout, device, per_node, accum, a) - compute)
    step = compute * bubble + seconds_extra + exposed
    runnable = runnable_in_mmcore(plan, layout)
    est = Estimate(layout, weights, grads, optimizer, activations, other, buffers, host, step, flops / (step * device.peak), runnable, False)
    est = Estimate(**{**est.__dict__, "fits": est.total <= device.memory})
    if not est.fits and accum > 1 and layout.backend == "fsdp2" and not layout.sync_every:
        # the unsharded gradients do not fit: the same layout reducing every micro-batch
        return estimate(plan, dataclasses.replace(layout, sync_every=True), device, micro_batch=micro_batch, global_batch=global_batch, bf16=bf16, runtime=runtime, per_node=per_node)
    return est


def fsdp_seconds(plan: Planned, layout: Layout, device: Device, per_node: int, accum: int, a: int) -> float:
    """Seconds of a step's data-parallel collectives on one rank, before overlap. FSDP2 over
    ``n = shard x sp`` ranks: each micro-batch all-gathers the weights at the compute dtype for
    its forward and again for its backward (blocks reshard after forward; an MoE block's experts
    over their ``n / ep`` copies only), and the step reduce-scatters the fp32 gradients once (the
    engine syncs on the last micro-batch), or after every micro-batch (``sync_every``); HSDP then all-reduces each shard over the replicas.
    Megatron all-reduces its local fp32 gradients over the data-parallel ranks (and the
    context-parallel ranks of each). A ring sends
    ``(k - 1) / k`` of the data over ``k`` ranks (an all-reduce twice that)."""

    def link(ranks: int) -> float:  # a group within a node, or spanning nodes
        return device.peer_link if ranks <= per_node else device.node_link

    def ring(k: int) -> float:
        return (k - 1) / k

    trained = shard_elements(plan.model, 1, True)
    if layout.backend == "megatron":
        data = layout.shard * layout.replicate * layout.cp
        return 2 * state_bytes(plan, layout)[1] * ring(data) / link(data * layout.tp * layout.pp) if data > 1 else 0.0
    n, r = layout.shard * layout.sp, layout.replicate
    weights = shard_elements(plan.model, 1)
    _, moe_layers, in_block, _ = plan.moe() if layout.ep > 1 else (0, 0, 0, 0)
    experts = moe_layers * in_block  # every MoE layer's experts, as many as the largest block's
    gathered = a * ((weights - experts) * ring(n) + experts / layout.ep * ring(max(1, n // layout.ep)))
    reductions = accum if layout.sync_every else 1
    seconds = (2 * accum * gathered + reductions * 4 * trained * ring(n)) / link(n)
    if r > 1:  # with each reduce-scatter
        seconds += reductions * 2 * 4 * trained / n * ring(r) / link(n * r)
    return seconds


def ulysses_bytes(plan: Planned, layout: Layout, rows: int, a: int) -> float:
    """Bytes one rank sends in a step's Ulysses all-to-alls, not overlapped with compute: per
    layer and row, query, key, value and output at full width (an upper bound where key/value
    have fewer heads) on its ``tokens / sp`` tokens, all but its own share of them, forward and
    backward (and the forward again with recompute)."""
    sp = layout.sp
    passes = 3 if layout.recompute else 2
    return rows * plan.shape.layers * 4 * plan.shape.hidden * plan.tokens / sp * a * (sp - 1) / sp * passes


def context_bytes(plan: Planned, layout: Layout, rows: int, a: int) -> float:
    """Bytes one rank receives in a step's context-parallel key/value all-gathers, not overlapped
    with compute (mmcore's attention gathers, then attends): per layer and row, keys and values
    of the other ranks' tokens at the key-value width over this rank's tensor-parallel heads,
    forward (again with recompute) and their gradients' reduction in the backward (twice: an all-reduce)."""
    shape = plan.shape
    width = 2 * getattr(shape, "kv_heads", shape.heads) * shape.head_dim / layout.tp
    passes = (2 if layout.recompute else 1) + 2
    return rows * shape.layers * width * plan.tokens * a * (layout.cp - 1) / layout.cp * passes


def expert_bytes(plan: Planned, layout: Layout, rows: int, a: int) -> float:
    """Bytes one rank sends in a step's expert all-to-alls, not overlapped with compute: per MoE
    layer and row, each token's hidden state to each of its routed experts and back (dispatch and
    combine), all but the share its own experts take, forward and backward (and the forward
    again with recompute)."""
    _, layers, _, routed = plan.moe()
    passes = 3 if layout.recompute else 2
    return rows * layers * 2 * routed * plan.shape.hidden * plan.tokens * a * (layout.ep - 1) / layout.ep * passes


def runnable_in_mmcore(plan: Planned, layout: Layout) -> str:
    if layout.ep > 1 and plan.kind != "vlm":
        return "not runnable in mmcore (expert parallel: the VLM kit's transformers MoE models)"
    if layout.sp > 1 and plan.kind != "vlm" and getattr(plan.model, "_cp_plan", None) is None:
        return f"not runnable in mmcore (Ulysses SP: diffusers has no context-parallel plan for {type(plan.model).__name__})"
    if layout.cp > 1 and not plan.megatron:
        return "not yet runnable in mmcore (context parallel: a pack with a megatron part whose language model has M-RoPE, qwen2vl)"
    if layout.backend == "megatron" and not plan.megatron:
        return "not yet runnable in mmcore (this pack has no megatron part for tensor / pipeline parallel)"
    if layout.backend == "megatron" and layout.offload:
        return "not runnable in mmcore (offload is FSDP2's)"
    return ""


def candidates(plan: Planned, nodes: int, per_node: int) -> Iterator[Layout]:
    """FSDP / HSDP x TP x PP x CP (a family on megatron) x SP x recompute x offload, the sizes
    that divide the model and the cluster; for an MoE model, FSDP with expert parallel as well."""
    world = nodes * per_node
    heads = plan.shape.heads
    for tp, pp, sp, cp in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)):
        inner = tp * pp * sp * cp
        if world % inner or tp * sp * cp > per_node or heads % (tp * sp) or plan.shape.layers % pp or (sp > 1 and tp * pp * cp > 1) or (cp > 1 and not plan.megatron):
            continue
        data = world // inner
        megatron = tp * pp * cp > 1
        splits = [(1, data)] if megatron else [(1, data)] + ([(nodes, data // nodes)] if nodes > 1 and data % nodes == 0 else [])
        for (replicate, shard), recompute, offload in itertools.product(splits, (False, True), (False, True)):
            if offload and megatron:
                continue
            yield Layout(shard=shard, replicate=replicate, tp=tp, pp=pp, sp=sp, cp=cp, recompute=recompute, offload=offload)
    experts = plan.moe()[0]
    for ep, sp, recompute in itertools.product((2, 4, 8), (1, 2, 4, 8), (False, True)):
        # mmcore splits experts within every process's FSDP, Ulysses beside it (no HSDP, TP, PP or offload)
        if experts and experts % ep == 0 and world % ep == 0 and ep <= per_node and world % sp == 0 and sp <= per_node and heads % sp == 0:
            yield Layout(shard=world // sp, sp=sp, ep=ep, recompute=recompute)


def ranked(plan: Planned, device: Device, nodes: int, per_node: int, *, micro_batch: int = 1, global_batch: int = 0, bf16: bool = True) -> list[Estimate]:
    """Every candidate's estimate for the same global batch (default: a micro-batch per rank),
    best first: fitting, runnable in mmcore, fastest, then the simplest (fewest model-parallel
    splits, no recompute, no offload), smallest."""
    rows = global_batch or nodes * per_node * micro_batch
    found = [estimate(plan, layout, device, micro_batch=micro_batch, global_batch=rows, bf16=bf16, per_node=per_node) for layout in candidates(plan, nodes, per_node)]
    return sorted(
        found, key=lambda e: (not e.fits, bool(e.runnable), round(e.step_s, 3), e.layout.tp * e.layout.pp * e.layout.sp * e.layout.cp * e.layout.ep, e.layout.recompute, e.layout.offload, e.total)
    )


__all__ = ["EFFICIENCY", "RUNTIME_BYTES", "Layout", "Estimate", "shard_elements", "state_bytes", "estimate", "fsdp_seconds", "context_bytes", "expert_bytes", "candidates", "ranked"]
