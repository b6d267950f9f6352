"""The released weights as this pack reads them: LanguageBind/Open-Sora-Plan-v1.5.0's
``model_ema.pt`` (a torch pickle; the state dict at its top level or under ``ema_state_dict``,
names as :class:`~mm_pack_opensoraplan.transformer.OpenSoraPlanTransformer3DModel` has them) into
the ``transformer/`` folder of a pipeline, loaded strictly.

``python -m mm_pack_opensoraplan.public import model_ema.pt predictor.json OUT`` writes
``OUT/config.json`` and ``OUT/diffusion_pytorch_model.safetensors``; put OUT as ``transformer/``
beside a VAE, T5, CLIP and scheduler (see the README) and point ``model.source`` at that folder.
``python -m mm_pack_opensoraplan.public export EXPORT/pipeline/transformer model_ema.pt`` writes
a trained transformer back as the released file is: the same names, shapes and dtypes, one
flat state dict (which MindSpeed-MM's converter and :func:`public_state_dict` read).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def public_state_dict(path: Path) -> dict[str, Any]:
    """The tensors of a released ``model_ema.pt`` (``ema_state_dict`` or ``state_dict`` where nested;
    a ``module.`` prefix from data-parallel training dropped)."""
    import torch

    blob = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    for key in ("ema_state_dict", "state_dict", "model"):
        if isinstance(blob, dict) and isinstance(blob.get(key), dict) and blob[key]:
            blob = blob[key]
            break
    return {k.removeprefix("module."): v for k, v in blob.items()}


def import_public(weights: Path, config: Path, out: Path) -> Any:
    """The transformer of ``config`` (its fields: the reference's predictor section) with the
    released ``weights``, saved as a diffusers model folder ``out``; returns the model."""
    import inspect

    import torch

    from mmcore.engines import load_strictly
    from mm_pack_opensoraplan.transformer import OpenSoraPlanTransformer3DModel

    allowed = set(inspect.signature(OpenSoraPlanTransformer3DModel.__init__).parameters) - {"self"}
    fields = {k: v for k, v in json.loads(Path(config).read_text()).items() if k in allowed}  # model_id, dtype ... dropped
    with torch.device("meta"):
        model = OpenSoraPlanTransformer3DModel(**fields)
    load_strictly(model, public_state_dict(weights), weights, f"the Open-Sora Plan transformer {Path(config).name} describes", assign=True)
    model.save_pretrained(out)
    return model


def export_public(transformer: Path, out: Path) -> dict[str, Any]:
    """The diffusers folder ``transformer`` (an export's) as a released-style ``model_ema.pt``; returns its tensors."""
    import torch
    from safetensors.torch import load_file

    files = sorted(Path(transformer).glob("*.safetensors"))
    state = {k: v for f in files for k, v in load_file(f).items()}
    torch.save(state, out)
    return state


if __name__ == "__main__":  # pragma: no cover - a user's one-off conversion
    verb, *paths = sys.argv[1:]
    (import_public if verb == "import" else export_public)(*map(Path, paths))
