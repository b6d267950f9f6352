"""Reading and writing Step-LLM folders (:class:`mm_pack_stepvideo.stepllm.StepLLM`) in the
release's layout (hub ``stepfun-ai/stepvideo-t2v``, ``step_llm/``).

The reference loads the folder with transformers' ``PreTrainedModel.from_pretrained`` under a bare
``PretrainedConfig``: ``config.json`` (the fields its modules read: ``hidden_size``,
``num_attention_heads``, ``num_attention_groups``, ``ffn_hidden_size``, ``num_layers``,
``padded_vocab_size``, ``layernorm_epsilon``), the weights as transformers writes them (one
``model.safetensors``, or shards named by ``model.safetensors.index.json``; ``pytorch_model.bin``
and its index are read too) under the module's own names, and ``step1_chat_tokenizer.model``,
the SentencePiece model its wrapper opens. The release's files were not seen here (no hub):
names come from the reference code. Loading is strict: a missing field, file, tensor name or
shape is one line naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmcore.engines import load_strictly

TOKENIZER = "step1_chat_tokenizer.model"
FIELDS = ("hidden_size", "num_attention_heads", "num_attention_groups", "ffn_hidden_size", "num_layers", "padded_vocab_size", "layernorm_epsilon")
DESCRIBED = "the Step-LLM its config.json describes"
WEIGHTS = "model.safetensors"


def is_stepllm_folder(folder: Path) -> bool:
    """A folder with Step-LLM's tokenizer file, or a ``config.json`` with its grouped-attention field."""
    if (folder / TOKENIZER).is_file():
        return True
    try:
        return "num_attention_groups" in json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False


def folder_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable Step-LLM config ({type(exc).__name__})") from None
    missing = [f for f in FIELDS if f not in raw]
    if missing:
        raise ValueError(f"{path}: Step-LLM's config needs {', '.join(missing)} (the fields the reference's modules read)")
    return {f: raw[f] for f in FIELDS}


def weight_files(folder: Path) -> list[Path]:
    """The folder's weight files, as transformers' ``from_pretrained`` finds them."""
    for index, single in (("model.safetensors.index.json", WEIGHTS), ("pytorch_model.bin.index.json", "pytorch_model.bin")):
        if (folder / index).is_file():
            try:
                shards = sorted(set(json.loads((folder / index).read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError) as exc:
                raise ValueError(f"{folder / index}: not a readable weights index ({type(exc).__name__})") from None
            absent = [s for s in shards if not (folder / s).is_file()]
            if absent:
                raise ValueError(f"{folder / index}: names {absent[0]}, which is not in the folder ({len(absent)} shard(s) missing)")
            return [folder / s for s in shards]
        if (folder / single).is_file():
            return [folder / single]
    raise ValueError(f"{folder}: no Step-LLM weights ({WEIGHTS}, its sharded index, or pytorch_model.bin)")


def read_tensors(files: list[Path], meta: bool = False) -> dict[str, Any]:
    """Every tensor of the files (``meta``: shapes and dtypes only, from the headers)."""
    import torch
    from safetensors import safe_open

    out: dict[str, Any] = {}
    for path in files:
        if path.suffix == ".bin":
            out.update(torch.load(path, map_location="meta" if meta else "cpu", weights_only=True, mmap=not meta))
            continue
        with safe_open(path, "pt") as f:
            for name in f.keys():
                if meta:
                    piece = f.get_slice(name)
                    dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}.get(piece.get_dtype(), torch.float32)
                    out[name] = torch.empty(piece.get_shape(), dtype=dtype, device="meta")
                else:
                    out[name] = f.get_tensor(name)
    return out


def build(config: dict[str, Any], device: Any = None) -> Any:
    import torch

    from mm_pack_stepvideo.stepllm import StepLLM

    with torch.device(device or "cpu"):
        return StepLLM(**config)


def check_stepllm_folder(folder: Path) -> None:
    """The folder's config, weights (names, shapes, from the headers onto a meta model) and tokenizer file."""
    config = folder_config(folder)
    files = weight_files(folder)
    load_strictly(build(config, "meta"), read_tensors(files, meta=True), files[0] if len(files) == 1 else folder, DESCRIBED, error=ValueError, assign=True)
    if not (folder / TOKENIZER).is_file():
        raise ValueError(f"{folder}: Step-LLM's folder needs its SentencePiece model {TOKENIZER}")


def load_stepllm(folder: Path, dtype: Any = None) -> Any:
    """A :class:`StepLLM` from ``folder``, strictly, in eval mode, with its tokenizer (``dtype``: cast after loading)."""
    config = folder_config(folder)
    files = weight_files(folder)
    if not (folder / TOKENIZER).is_file():
        raise ValueError(f"{folder}: Step-LLM's folder needs its SentencePiece model {TOKENIZER}")
    model = build(config)
    load_strictly(model, read_tensors(files), files[0] if len(files) == 1 else folder, DESCRIBED, error=ValueError)
    model.set_tokenizer((folder / TOKENIZER).read_bytes())
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def save_released(model: Any, folder: Path) -> None:
    """``model`` in the release's layout: ``config.json`` (the reference's fields), ``model.safetensors``
    (each tensor in its own dtype) and the tokenizer file."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {f: model.config[f] for f in FIELDS}
    (folder / "config.json").write_text(json.dumps({"architectures": ["Step1Model"], **config}, indent=2) + "\n")
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, folder / WEIGHTS, metadata={"format": "pt"})
    if getattr(model, "sentencepiece_proto", None) is not None:
        (folder / TOKENIZER).write_bytes(model.sentencepiece_proto)


def check_pipeline_parts(folder: Path) -> None:
    """The download stage's check (``check_parts``): the pipeline folder's own-layout parts, each
    where it is Step-Video's own -- ``vae/`` (:func:`~mm_pack_stepvideo.stepvae_io.check_pipeline_vae`)
    and a Step-LLM ``text_encoder/`` (:func:`check_stepllm_folder`); a transformers text encoder
    there needs its ``tokenizer/``."""
    from mm_pack_stepvideo.stepvae_io import check_pipeline_vae

    check_pipeline_vae(folder)
    if is_stepllm_folder(folder / "text_encoder"):
        check_stepllm_folder(folder / "text_encoder")
    elif not (folder / "tokenizer").is_dir():
        raise ValueError(f"{folder}: missing tokenizer/: its text_encoder/ is not Step-LLM's (which carries {TOKENIZER}), so it needs one")
