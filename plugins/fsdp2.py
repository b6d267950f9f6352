"""The FSDP2 distributed backend (torch.distributed ``fully_shard``).

Shards each module the recipe names (decoder layers, vision blocks), then the root. The backend
owns mixed precision whatever the number of processes (as torchtitan does): with bf16 it shards
over a one-process group too, so one and N processes compute alike: fp32 parameters and
optimizer state, bf16 compute, fp32 gradient reduction. With ``parallel.replicate`` > 1 the
mesh is 2-D (HSDP): replicas across its first dimension, shards within each.
"""

from __future__ import annotations

from typing import Any, Mapping

from mmcore import hookimpl
from mmcore.errors import StageError
from mmcore.registry import BackendSpec
from mmcore.sharded_load import on_meta


class FSDP2Backend:
    name = "fsdp2"

    def handles_precision(self, world: Any) -> bool:
        return True

    def wants_process_group(self, world: Any, *, bf16: bool, offload: bool) -> bool:
        """Whether this process shards (and so needs a process group) for these options."""
        return bool(world.distributed or bf16 or offload)

    def prepare(self, model: Any, shard_modules: list[Any], *, device: Any, bf16: bool, world: Any,
                offload: bool = False, replicate: int = 1) -> Any:
        import torch

        if not self.wants_process_group(world, bf16=bf16, offload=offload):
            return model if on_meta(model) else model.to(device)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        if world.world_size % replicate:
            raise StageError(f"parallel.replicate={replicate} does not divide the {world.world_size} processes")
        shape = (replicate, world.world_size // replicate) if replicate > 1 else (world.world_size,)
        names = ("replicate", "shard") if replicate > 1 else ("shard",)
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
        options = {"mesh": mesh, "mp_policy": policy, "offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy()}
        if not on_meta(model) and not offload:
            model = model.to(device)
        for module in shard_modules:
            fully_shard(module, **options)
        fully_shard(model, **options)
        # before FSDP's own post-forward hook (registered by fully_shard, not prepended)
        model.register_forward_hook(root_output_without_views, prepend=True)
        return model


#: Fields of transformers' multimodal outputs (``MultimodalModelOutput``) that hold the towers'
#: own outputs: their ``pooler_output`` is the image/video/audio embeddings ``torch.split`` per
#: item, views of one tensor.
TOWER_OUTPUTS = ("image_outputs", "video_outputs", "audio_outputs")


def root_output_without_views(module: Any, args: Any, output: Any) -> Any:
    """The sharded root's output with no view among its grad-requiring tensors.

    FSDP2 registers its pre-backward hook on every grad-requiring tensor a sharded module
    returns, and warns for each view among them ("... can cause backward to fail or produce
    wrong gradients": an in-place op on a view, ``out += y``, would drop the hook and skip the
    all-gather); it warned on every rank at every step. The views were (1) transformers'
    multimodal outputs' ``image_outputs``/``video_outputs``/``audio_outputs``, the towers'
    embeddings split per item, which the language model has consumed and no loss reads: dropped;
    (2) diffusers' transformers' prediction, unpatchified by ``reshape`` (a view of the permuted
    tensor): cloned, one copy of a latent-sized tensor per forward, so whatever the loss does
    with it the hook stays. Neither changes a number: 2 ranks still equal 1.
    """
    if isinstance(output, Mapping):
        for name in TOWER_OUTPUTS:
            if output.get(name) is not None:
                output[name] = None
        for name, value in list(output.items()):
            if is_grad_view(value):
                output[name] = value.clone()
        return output
    if type(output) in (tuple, list):
        return type(output)(value.clone() if is_grad_view(value) else value for value in output)
    return output.clone() if is_grad_view(output) else output


def is_grad_view(value: Any) -> bool:
    return getattr(value, "_base", None) is not None and value.requires_grad


@hookimpl
def mmcore_register_backends(register):
    register(BackendSpec("fsdp2", "mmcore_plugins.fsdp2:FSDP2Backend", summary="PyTorch FSDP2 (fully_shard; HSDP with parallel.replicate), reshardable DCP checkpoints"))
