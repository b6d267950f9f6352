"""Ming's export: the kit's (the trained checkpoint written, reloaded and checked logit for logit;
LoRA as a PEFT adapter folder), then the weights laid out as the release has them.

The kit writes ``<stage>/hf`` in its own shards and ``export.dtype``; the release's readers
expect its own files. So the full export is rewritten with :func:`mm_pack_ming.checkpoint.export`:
each tensor under its name into the shard and dtype the downloaded folder has it in, the
talker's tensors (not trained, not built) copied from there unchanged, the index and every
other file and subfolder copied. The rewrite is checked tensor by tensor (each the kit's
trained one in the file's dtype) and the reload's logits are compared on the kit's probe batch
(bfloat16 files: near, not equal, to float32 training).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping

from mmcore import Manifest, StageContext, StageResult


def export(family: Any, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    import torch
    from safetensors.torch import load_file

    from mmcore.data import ShardDataset
    from mmcore.errors import StageError
    from mmcore.kits import VLMFamily
    from mm_pack_ming import checkpoint

    result = VLMFamily.export(family, ctx, upstream)
    hf = ctx.stage_dir / "hf"
    if result.outputs.get("model") != "hf" or not hf.is_dir():
        return result  # LoRA kept as an adapter folder: nothing of the release's layout to write
    source = Path(upstream["download"].output("model"))
    trained = checkpoint.load_model(hf).eval()
    staging = ctx.stage_dir / "release-layout"
    shutil.rmtree(staging, ignore_errors=True)
    checkpoint.export(trained, source, staging)
    written = {}
    for f in sorted(staging.glob("*.safetensors")):
        written.update(load_file(str(f)))
    state = trained.state_dict()
    for key, tensor in state.items():
        if not torch.equal(written[key], tensor.to(written[key].dtype)):
            raise StageError(f"{staging}: tensor {key} is not the trained one in the file's dtype")
    shutil.rmtree(hf)
    staging.rename(hf)
    again = checkpoint.load_model(hf).eval()
    data = ShardDataset(upstream["preprocess"].output("dataset"))
    held_out = data.split("eval")
    probe = held_out if len(held_out) else data
    batch = family.collate([probe[i] for i in range(min(2, len(probe)))], family.token_ids(data))
    with torch.no_grad():
        a, b = family.forward_logits(trained, batch), family.forward_logits(again, batch)
    diff = float((a - b).abs().max())
    kept = sum(1 for k in written if k.startswith(checkpoint.KEPT_PREFIXES))
    note = f"rewritten in the release's layout ({len(written)} tensors in {len(list(hf.glob('*.safetensors')))} file(s), the source's dtypes; {kept} talker tensor(s) copied unchanged): reload's logits max |diff| {diff:.3g} (the files' dtype)"
    return StageResult(outputs=result.outputs, metrics={**result.metrics, "release_layout_logits_max_abs_diff": diff}, notes=[*result.notes, note])
