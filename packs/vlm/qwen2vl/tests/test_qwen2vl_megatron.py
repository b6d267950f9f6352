"""Qwen2-VL / Qwen2.5-VL on megatron-core (CPU, gloo): the language model as a ``GPTModel``
loaded through the pack's table, the vision tower as transformers has it; its logits equal the
transformers model's, with images, at tensor-parallel sizes 1 and 2.

Run as a script under torchrun, this file is the worker: it builds both models on every rank
and writes rank 0's largest logit difference to a JSON file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmcore.megatron import status

USABLE, WHY = status()
needs_megatron = pytest.mark.skipif(not USABLE, reason=WHY)


@needs_megatron
@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny", "tiny-2.5"])
def test_megatron_logits_equal_transformers_with_images(preset: str, tmp_path: Path) -> None:
    """A batch of two rows with an image each (4 merged vision tokens between
    vision_start/vision_end): megatron-core's logits equal transformers' to 1e-5 (fp32; measured
    ~2e-7: the attention and row-parallel sums run in another order), at TP=1 and TP=2."""
    from mm_pack_qwen2vl.tiny import build_init_checkpoint

    build_init_checkpoint(preset, tmp_path / "model", seed=0)
    for tp in (1, 2):
        out = tmp_path / f"tp{tp}.json"
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp), __file__,
                               str(tmp_path / "model"), str(out)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(out.read_text())
        assert result["shape"] == [2, 20, 391] and result["max_logit"] > 0.1
        assert result["max_abs_diff"] <= 1e-5, result


@needs_megatron
@pytest.mark.slow
def test_a_megatron_checkpoint_saved_at_one_tp_size_loads_at_another(tmp_path: Path) -> None:
    """Reshard on load: the model converted at TP=2 into megatron-core's dist_checkpointing
    format loads at TP=1 (and one saved at TP=1 loads at TP=2) with every parameter equal to
    the table's own split and the logits still equal to transformers'."""
    from mm_pack_qwen2vl.tiny import build_init_checkpoint

    build_init_checkpoint("tiny", tmp_path / "model", seed=0)
    for saved_at, loaded_at in ((2, 1), (1, 2)):
        checkpoint = tmp_path / f"saved-tp{saved_at}"
        for tp, mode in ((saved_at, "save"), (loaded_at, "load")):
            out = tmp_path / f"{mode}-{saved_at}-{loaded_at}.json"
            proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp), __file__,
                                   str(tmp_path / "model"), str(out), mode, str(checkpoint)], capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(out.read_text())
        assert result["parameters_differing"] == [] and result["parameters"] > 20, result
        assert result["max_abs_diff"] <= 1e-5, result


def _worker(model_dir: Path, out: Path, mode: str = "compare", checkpoint: Path | None = None) -> None:
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForImageTextToText

    from mmcore.megatron import checkpoint as megatron_checkpoint
    from mmcore.megatron.gpt import init_model_parallel
    from mm_pack_qwen2vl.megatron import MegatronQwen2VL, load_megatron_model

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    init_model_parallel(tensor_parallel=world)
    config = AutoConfig.from_pretrained(model_dir)
    ours = load_megatron_model(model_dir, world, rank)
    differing: list[str] = []
    if mode == "save":  # convert: the table's split into megatron-core's checkpoint
        megatron_checkpoint.save(ours, checkpoint)
        dist.barrier()
        dist.destroy_process_group()
        return
    if mode == "load":  # a model at this TP size, uninitialised, filled from a checkpoint of another
        reference, ours = ours, MegatronQwen2VL(config, world)
        megatron_checkpoint.load(ours, checkpoint)
        ours.eval()
        mine = reference.state_dict()
        differing = [k for k, v in ours.state_dict().items() if isinstance(v, torch.Tensor) and not torch.equal(v, mine[k])]
    theirs = AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 380, (2, 20), generator=generator)
    ids[:, 3], ids[:, 4:8], ids[:, 8] = config.vision_start_token_id, config.image_token_id, config.vision_end_token_id
    grid = torch.tensor([[1, 4, 4], [1, 4, 4]])  # 16 patches of 14x14 (x2 frames) each, merged 2x2 into 4 tokens
    pixels = torch.randn(32, 3 * 2 * 14 * 14, generator=generator)
    types = (ids == config.image_token_id).long()
    with torch.no_grad():
        expected = theirs(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=types).logits
        got = ours(ids, types, pixel_values=pixels, image_grid_thw=grid)
    if rank == 0:
        out.write_text(json.dumps({"shape": list(got.shape), "max_abs_diff": float((got - expected).abs().max()),
                                   "max_logit": float(expected.abs().max()), "parameters_differing": differing,
                                   "parameters": len(ours.state_dict())}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:4], *(Path(a) for a in sys.argv[4:5]))
