"""Peak memory of converting a multi-GB checkpoint: streaming engine vs. load-everything baseline.

Makes random weights in the real Qwen2-VL-2B shape (bf16, hub key names, ~1 GB shards; written
one shard at a time), then converts HF -> DCP and DCP -> HF in child processes and reads each
child's peak RSS. The baseline does what a naive converter does: load every tensor, then save.

    python bench/convert_memory.py [--workdir /tmp/mmcore-bench] [--keep]

Prints one JSON line per measurement and a summary; numbers go into issue notes, never tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

QWEN2VL_2B = dict(
    text_config=dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                     num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}),
    vision_config=dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4),
    tie_word_embeddings=True,
)


def make_checkpoint(out: Path, shard_bytes: int = 1 << 30) -> int:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from mm_pack_qwen2vl.adapter import ADAPTER
    from mmcore.convert import TensorInfo

    with torch.device("meta"):
        model = Qwen2VLForConditionalGeneration(Qwen2VLConfig(**QWEN2VL_2B))
    shapes = {k: TensorInfo(tuple(v.shape), torch.bfloat16) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    hub = ADAPTER.to_hf(shapes)
    out.mkdir(parents=True, exist_ok=True)
    shard: dict[str, torch.Tensor] = {}
    size = total = n = 0
    gen = torch.Generator().manual_seed(0)
    for key, recipe in hub.items():
        shard[key] = (torch.randn(recipe.info.shape, generator=gen) * 0.02).to(torch.bfloat16)
        size += shard[key].numel() * 2
        if size >= shard_bytes:
            n += 1
            save_file(shard, str(out / f"model-{n:05d}.safetensors"))
            total += size
            shard, size = {}, 0
    if shard:
        n += 1
        save_file(shard, str(out / f"model-{n:05d}.safetensors"))
        total += size
    return total


CHILD = {
    "stream_hf_to_dcp": "from mmcore.convert import hf_to_dcp; from mm_pack_qwen2vl.adapter import ADAPTER; from pathlib import Path; hf_to_dcp(Path({src!r}), Path({dst!r}), ADAPTER)",
    "stream_dcp_to_hf": "from mmcore.convert import dcp_to_hf; from mm_pack_qwen2vl.adapter import ADAPTER; from pathlib import Path; dcp_to_hf(Path({src!r}), Path({dst!r}), ADAPTER, max_shard_bytes=1<<30)",
    "naive_hf_to_dcp": (
        "import torch.distributed.checkpoint as dcp; from safetensors.torch import load_file; from pathlib import Path\n"
        "from mm_pack_qwen2vl.adapter import ADAPTER\n"
        "sd = {{}}\n"
        "for f in sorted(Path({src!r}).glob('*.safetensors')): sd.update(load_file(str(f)))\n"
        "sd = {{'model.' + ADAPTER._rename(k, True): v for k, v in sd.items()}}\n"
        "dcp.save(sd, checkpoint_id={dst!r}, no_dist=True)"
    ),
    "compare_round_trip": "from mmcore.convert import compare_hf; from pathlib import Path; p = compare_hf(Path({src!r}), Path({dst!r})); assert not p, p[:3]",
}


# The child reports its own high-water mark (VmHWM, per address space, reset at exec). The
# rusage a parent gets from wait4 is not usable here: Linux carries the forking parent's RSS
# peak into the child's ru_maxrss, and this parent has just made a multi-GB checkpoint.
REPORT = "\nimport re, torch\nprint('VMHWM_KIB', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))"
BASELINE = "import torch, safetensors, torch.distributed.checkpoint, mmcore.convert, mm_pack_qwen2vl.adapter"


def run_child(name: str, src: Path, dst: Path) -> dict[str, float]:
    code = (CHILD[name].format(src=str(src), dst=str(dst)) if name in CHILD else BASELINE) + REPORT
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-2000:]}")
    hwm = int(proc.stdout.split("VMHWM_KIB")[-1].split()[0])
    return {"seconds": round(time.perf_counter() - start, 2), "peak_rss_mib": round(hwm / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default="/tmp/mmcore-bench")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    total = make_checkpoint(work / "hf")
    print(json.dumps({"checkpoint_gib": round(total / 2**30, 2), "made_in_s": round(time.perf_counter() - t0, 1)}), flush=True)
    results = {
        "imports_only": run_child("imports_only", work, work),
        "stream_hf_to_dcp": run_child("stream_hf_to_dcp", work / "hf", work / "dcp"),
        "stream_dcp_to_hf": run_child("stream_dcp_to_hf", work / "dcp", work / "back"),
        "compare_round_trip": run_child("compare_round_trip", work / "hf", work / "back"),
        "naive_hf_to_dcp": run_child("naive_hf_to_dcp", work / "hf", work / "dcp-naive"),
    }
    for name, r in results.items():
        print(json.dumps({"step": name, **r}), flush=True)
    ckpt_mib = total / 2**20
    base = results["imports_only"]["peak_rss_mib"]
    print(json.dumps({
        "checkpoint_mib": round(ckpt_mib),
        "imports_mib": base,
        "largest_tensor_mib": round(151936 * 1536 * 2 / 2**20),
        "convert_peak_above_imports_over_checkpoint": round((results["stream_hf_to_dcp"]["peak_rss_mib"] - base) / ckpt_mib, 3),
        "export_peak_above_imports_over_checkpoint": round((results["stream_dcp_to_hf"]["peak_rss_mib"] - base) / ckpt_mib, 3),
        "naive_peak_above_imports_over_checkpoint": round((results["naive_hf_to_dcp"]["peak_rss_mib"] - base) / ckpt_mib, 3),
        "round_trip_bit_identical": True,
    }))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
