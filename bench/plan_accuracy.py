"""``mmcore plan``'s per-rank memory against one measured training step, at CPU scale.

For each layout the tests run (``tests/test_plan_measured.py``), one real step through the
engine's own pieces (``python -m mmcore.plan.measure``: the family's model, recompute, the FSDP2
backend's sharding and mixed precision, the optimizer, the kit's loss) on tiny qwen2vl and wan
models, each in a fresh process (two through torchrun): a rank's parameter, gradient and
optimizer-state bytes after the step and the bytes autograd saves for backward, beside the
plan's prediction for the same layout. A row is a layout's **worst** part: the one whose
predicted / measured ratio is farthest from 1 (the goal: within 15 %); the others are in the
row's ``parts``. Bytes are exact counts (no timing): the same on any machine. The plan's FLOPs
must equal the engine's MFU accounting on the same batch, or the benchmark fails.

    python bench/plan_accuracy.py [--quick]      # quick: the one-process layouts only
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import emit, figure, parser

#: pack -> (its tiny preset's builder, the measure arguments the tests use)
PACKS = {
    "qwen2vl": ("mm_pack_qwen2vl.tiny", {"seq": 64, "freeze": ["vision", "projector"]}),
    "wan": ("mm_pack_wan.tiny", {"frames": 9, "height": 64, "width": 64, "caption": 8}),
}
#: layout name -> (pack, processes, measure arguments over the pack's)
LAYOUTS = {
    "qwen2vl-1p": ("qwen2vl", 1, {}),
    "qwen2vl-1p-recompute": ("qwen2vl", 1, {"recompute": "full"}),
    "qwen2vl-1p-bf16": ("qwen2vl", 1, {"bf16": True}),
    "qwen2vl-fsdp2-recompute": ("qwen2vl", 2, {"recompute": "full"}),
    "qwen2vl-ulysses2-256": ("qwen2vl", 2, {"seq": 256, "ulysses": 2}),
    "wan-1p": ("wan", 1, {}),
    "wan-1p-recompute": ("wan", 1, {"recompute": "full"}),
    "wan-1p-bf16": ("wan", 1, {"bf16": True}),
    "wan-fsdp2": ("wan", 2, {}),
}
TOLERANCE = 0.15
PARTS = ("weights", "grads", "optimizer", "activations")


def run_layout(folder: Path, pack: str, processes: int, changes: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's measure() result for one layout, from a fresh process (or two)."""
    args = {**PACKS[pack][1], **changes}
    if processes == 1:
        code = "import json, sys; from mmcore.plan.measure import measure; print(json.dumps(measure(sys.argv[1], sys.argv[2], **json.loads(sys.argv[3]))))"
        cmd = [sys.executable, "-c", code, pack, str(folder), json.dumps(args)]
    else:
        from mmcore.run.launch import free_port

        flags = [f"--{k}={v}" for k, v in args.items() if k not in ("freeze", "bf16")] + [f"--freeze={g}" for g in args.get("freeze", [])]
        flags += ["--bf16"] if args.get("bf16") else []
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={processes}", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-backend=c10d"]
        cmd += ["-m", "mmcore.plan.measure", "--pack", pack, "--model", str(folder), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    if proc.returncode != 0:
        raise SystemExit(f"plan_accuracy: {pack} {changes}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    from mmcore.plan.measure import printed_results

    results = printed_results(proc.stdout)
    if sorted(r["rank"] for r in results) != list(range(processes)):
        raise SystemExit(f"plan_accuracy: {pack} {changes}: expected {processes} ranks' results, got {proc.stdout[-500:]!r}")
    return results


def main() -> None:
    import importlib

    p = parser(__doc__)
    args = p.parse_args()
    layouts = {name: spec for name, spec in LAYOUTS.items() if not (args.quick and spec[1] > 1)}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        folders = {}
        for pack, (module, _) in PACKS.items():
            folders[pack] = Path(tmp) / pack
            importlib.import_module(module).build_init_checkpoint("tiny", folders[pack], 0)
        for name, (pack, processes, changes) in layouts.items():
            results = run_layout(folders[pack], pack, processes, changes)
            for result in results:
                if result["plan_flops"] != result["engine_flops"]:
                    raise SystemExit(f"plan_accuracy: {name}: the plan's FLOPs {result['plan_flops']} != the engine's {result['engine_flops']}")
            # the worst part over every rank: predicted / measured farthest from 1
            rank, part = max(((r, part) for r in results for part in PARTS if r["measured"][part]), key=lambda rp: abs(rp[0]["predicted"][rp[1]] / rp[0]["measured"][rp[1]] - 1))
            parts = {part: round(rank["predicted"][part] / rank["measured"][part], 4) for part in PARTS if rank["measured"][part]}
            mib = 1024 * 1024
            emit(
                figure(
                    f"plan/{name}",
                    f"mmcore plan vs one measured step, {processes} process(es): the worst of a rank's weights, grads, optimizer state, saved activations ({part})",
                    "MiB",
                    [rank["predicted"][part] / mib],
                    [rank["measured"][part] / mib],
                    baseline_name=f"measured {part} (rank {rank['rank']})",
                    ratio_is="mmcore/baseline",
                    goal=("within", TOLERANCE),
                    how=f"python -m mmcore.plan.measure {pack} tiny preset {json.dumps({**PACKS[pack][1], **changes})}, one step, fp32 unless bf16, exact byte counts; "
                    f"every part's predicted/measured on that rank: {parts}; the plan's FLOPs equal the engine's",
                    parts=parts,
                )
            )


if __name__ == "__main__":
    main()
