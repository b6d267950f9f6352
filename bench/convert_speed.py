"""Conversion speed and memory, HF <-> DCP, on a Qwen2-VL-2B-shaped checkpoint (4.1 GiB, bf16,
hub key names, ~1 GB shards, random weights written one shard at a time), against ``cp``.

Each repetition, from a warm page cache (the source files are read once beforehand; this
container cannot drop caches, so no cold figure):

* ``cp -r`` of the HF folder, then ``sync``: the disk's copy speed, the baseline;
* mmcore HF -> DCP (``mmcore.engines.convert.hf_to_dcp``) and DCP -> HF (``dcp_to_hf``), each in a
  fresh process, timed whole (imports included, as a user waits for them) and without imports.
  Qwen2-VL's adapter only renames, so both copy bytes without importing torch
  (``mmcore.engines.convert_bytes``); DCP -> HF and the ``cp`` of the DCP folder take turns
  going first (repetitions alternate, as the other rows'); every timer starts after a `sync`,
  so a removed folder's discards and earlier writes land in neither side;
* the naive converter: load every tensor, rename, ``dcp.save``, same process setup.

Speed figures are ``cp seconds / converter seconds`` (goal >= 0.6). Memory figures are the
child's peak RSS against ``import baseline + 2 x largest tensor`` (goal <= 1). The round trip is
checked bit-identical once.

    python bench/convert_speed.py [--quick] [--reps 3] [--workdir /tmp]
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import emit, figure, parser, reps_of

QWEN2VL_2B = dict(
    text_config=dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
    ),
    vision_config=dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4),
    tie_word_embeddings=True,
)


def shape(quick: bool) -> dict:
    """The full 2B shape, or (quick) 4 decoder layers and 4 vision blocks: ~0.8 GiB, the same
    largest tensor (the embedding)."""
    if not quick:
        return QWEN2VL_2B
    small = copy.deepcopy(QWEN2VL_2B)
    small["text_config"]["num_hidden_layers"] = 4
    small["vision_config"]["depth"] = 4
    return small


def make_checkpoint(out: Path, config: dict, shard_bytes: int = 1 << 30) -> int:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from mm_pack_qwen2vl.adapter import ADAPTER
    from mmcore.engines.convert import TensorInfo

    with torch.device("meta"):
        model = Qwen2VLForConditionalGeneration(Qwen2VLConfig(**config))
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


# Each child prints its own figures: seconds after its imports, and its high-water mark (VmHWM,
# per address space, reset at exec). The rusage a parent gets from wait4 is not usable here:
# Linux carries the forking parent's RSS peak into the child's ru_maxrss.
CHILD = {
    "stream_hf_to_dcp": "from mmcore.engines.convert import hf_to_dcp; from mm_pack_qwen2vl.adapter import ADAPTER; from pathlib import Path\nT0 = time.perf_counter(); hf_to_dcp(Path({src!r}), Path({dst!r}), ADAPTER)",
    "stream_dcp_to_hf": "from mmcore.engines.convert import dcp_to_hf; from mm_pack_qwen2vl.adapter import ADAPTER; from pathlib import Path\nT0 = time.perf_counter(); dcp_to_hf(Path({src!r}), Path({dst!r}), ADAPTER, max_shard_bytes=1<<30)",
    "naive_hf_to_dcp": (
        "import torch.distributed.checkpoint as dcp; from safetensors.torch import load_file; from pathlib import Path\n"
        "from mm_pack_qwen2vl.adapter import ADAPTER\n"
        "T0 = time.perf_counter()\n"
        "sd = {{}}\n"
        "for f in sorted(Path({src!r}).glob('*.safetensors')): sd.update(load_file(str(f)))\n"
        "sd = {{'model.' + ADAPTER._rename(k, True): v for k, v in sd.items()}}\n"
        "dcp.save(sd, checkpoint_id={dst!r}, no_dist=True)"
    ),
    "compare_round_trip": "from mmcore.engines.convert import compare_hf; from pathlib import Path\nT0 = time.perf_counter(); p = compare_hf(Path({src!r}), Path({dst!r})); assert not p, p[:3]",
}
# Each child imports what it uses: the converters of a renaming adapter copy bytes without torch
# (mmcore.engines.convert_bytes), the naive one imports torch's DCP itself.
PRELUDE = "import time, warnings; warnings.filterwarnings('ignore')\n"
REPORT = "\nimport os, re\nprint('WORK_S', time.perf_counter() - T0)\nprint('VMHWM_KIB', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))"
BASELINE = "import torch, safetensors, torch.distributed.checkpoint, mmcore.engines.convert, mm_pack_qwen2vl.adapter\nT0 = time.perf_counter()"


def run_child(name: str, src: Path, dst: Path) -> dict[str, float]:
    """Run one converter in a fresh process; wall seconds (imports included), seconds after
    imports, peak RSS."""
    if name != "compare_round_trip":
        shutil.rmtree(dst, ignore_errors=True)
        settle()
    code = PRELUDE + (CHILD[name].format(src=str(src), dst=str(dst)) if name in CHILD else BASELINE) + REPORT
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-2000:]}")
    work = float(proc.stdout.split("WORK_S")[-1].split()[0])
    hwm = int(proc.stdout.split("VMHWM_KIB")[-1].split()[0])
    return {"wall_s": wall, "work_s": work, "peak_rss_mib": hwm / 1024}


def settle() -> None:
    """Write back what is dirty and commit the journal before a timer starts: a removed folder's
    blocks are discarded at the next journal commit (this disk is mounted with ``discard``), which
    otherwise landed inside whichever side ran next."""
    os.sync()


def copy_seconds(src: Path, dst: Path) -> float:
    shutil.rmtree(dst, ignore_errors=True)
    settle()
    start = time.perf_counter()
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - start


def warm(folder: Path) -> None:
    for f in folder.rglob("*"):
        if f.is_file():
            with open(f, "rb") as handle:
                while handle.read(64 << 20):
                    pass


def main() -> None:
    args = parser(__doc__).parse_args()
    reps = reps_of(args)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        config = shape(args.quick)
        total = make_checkpoint(work / "hf", config)
        settle()
        largest_mib = config["text_config"]["vocab_size"] * config["text_config"]["hidden_size"] * 2 / 2**20
        gib = total / 2**30
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in ("imports_only", "stream_hf_to_dcp", "stream_dcp_to_hf", "naive_hf_to_dcp")}
        cp: dict[str, list[float]] = {"hf": [], "dcp": []}
        for rep in range(reps):
            warm(work / "hf")
            cp["hf"].append(copy_seconds(work / "hf", work / "cp"))
            runs["imports_only"].append(run_child("imports_only", work, work / "nothing"))
            warm(work / "hf")
            runs["stream_hf_to_dcp"].append(run_child("stream_hf_to_dcp", work / "hf", work / "dcp"))
            # DCP -> HF and its cp take turns going first: the one run second finds the other's
            # 4 GiB just written in the page cache and its blocks just freed (this disk discards)
            for side in ("cp", "mmcore") if rep % 2 == 0 else ("mmcore", "cp"):
                warm(work / "dcp")
                if side == "cp":
                    cp["dcp"].append(copy_seconds(work / "dcp", work / "cp"))
                else:
                    runs["stream_dcp_to_hf"].append(run_child("stream_dcp_to_hf", work / "dcp", work / "back"))
            warm(work / "hf")
            runs["naive_hf_to_dcp"].append(run_child("naive_hf_to_dcp", work / "hf", work / "dcp-naive"))
            shutil.rmtree(work / "dcp-naive", ignore_errors=True)
            shutil.rmtree(work / "cp", ignore_errors=True)
        run_child("compare_round_trip", work / "hf", work / "back")  # raises unless bit-identical
        how = f"{gib:.2f} GiB Qwen2-VL-2B-shaped bf16 checkpoint{' (4 layers, quick)' if args.quick else ''}, warm page cache, {reps} repetitions, each converter a fresh process"
        imports = [r["peak_rss_mib"] for r in runs["imports_only"]]
        for direction, key, source in (("HF -> DCP", "stream_hf_to_dcp", "hf"), ("DCP -> HF", "stream_dcp_to_hf", "dcp")):
            tag = key.removeprefix("stream_")
            emit(
                figure(
                    f"convert/{tag}-speed",
                    f"convert {direction}, whole process (imports included)",
                    "s",
                    [r["wall_s"] for r in runs[key]],
                    cp[source],
                    baseline_name="cp -r + sync of the source",
                    ratio_is="baseline/mmcore",
                    goal=(">=", 0.6),
                    how=how,
                    work_s=[round(r["work_s"], 2) for r in runs[key]],
                    gib=round(gib, 2),
                )
            )
            emit(
                figure(
                    f"convert/{tag}-speed-after-imports",
                    f"convert {direction}, after imports",
                    "s",
                    [r["work_s"] for r in runs[key]],
                    cp[source],
                    baseline_name="cp -r + sync of the source",
                    ratio_is="baseline/mmcore",
                    goal=(">=", 0.6),
                    how=how,
                )
            )
            bound = [i + 2 * largest_mib for i in imports]
            emit(
                figure(
                    f"convert/{tag}-peak-rss",
                    f"convert {direction}: peak RSS against imports + 2 x largest tensor",
                    "MiB",
                    [r["peak_rss_mib"] for r in runs[key]],
                    bound,
                    baseline_name=f"imports + 2 x {largest_mib:.0f} MiB",
                    goal=("<=", 1.0),
                    how=how,
                )
            )
        emit(
            figure(
                "convert/naive-vs-stream-hf_to_dcp",
                "HF -> DCP: naive load-all-then-save vs mmcore, whole process",
                "s",
                [r["wall_s"] for r in runs["stream_hf_to_dcp"]],
                [r["wall_s"] for r in runs["naive_hf_to_dcp"]],
                baseline_name="naive load-all + dcp.save",
                ratio_is="baseline/mmcore",
                how=how,
                naive_peak_rss_mib=round(sorted(r["peak_rss_mib"] for r in runs["naive_hf_to_dcp"])[reps // 2]),
            )
        )


if __name__ == "__main__":
    main()
