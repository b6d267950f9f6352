"""A CosyVoice3 checkpoint folder in its public layout, loaded strictly, and its convert.

The public layout (Fun-CosyVoice3-0.5B-2512)::

    cosyvoice3.yaml          HyperPyYAML: the llm / flow / hift constructors and their fields
    llm.pt  flow.pt  hift.pt torch state dicts (hift.pt keys may carry a ``generator.`` prefix)
    CosyVoice-BlankEN/       the Qwen2 config.json (and tokenizer) the LM backbone is built from

The training model (:class:`CosyVoice3`) holds ``llm``, ``flow`` and ``hift``; its fqns are
``<part>.<public key>``, which is also the key of each tensor in the safetensors file the
convert stage reads (one ``model.safetensors``, the LM's tied ``lm_head`` stored once).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from torch import nn

from mmcore.engines import load_strictly
from mm_pack_cosyvoice3.config import CosyVoice3Config, parse_config
from mm_pack_cosyvoice3.flow import CausalMaskedDiffWithDiT
from mm_pack_cosyvoice3.hift import CausalHiFTGenerator
from mm_pack_cosyvoice3.lm import CosyVoice3LM

YAML, QWEN_DIR = "cosyvoice3.yaml", "CosyVoice-BlankEN"
PARTS = ("llm", "flow", "hift")
TIED = {"llm": {"llm.model.lm_head.weight": "llm.model.model.embed_tokens.weight"}}


class CheckpointError(ValueError):
    """A checkpoint folder that is not a loadable CosyVoice3 checkpoint; the message is one line."""


class CosyVoice3(nn.Module):
    def __init__(self, cfg: CosyVoice3Config, qwen_config) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.cfg = cfg
        self.llm = CosyVoice3LM(cfg.lm, qwen_config)
        self.flow = CausalMaskedDiffWithDiT(cfg.flow)
        self.hift = CausalHiFTGenerator(cfg.hift)

    def forward(self, text, text_len, speech_token, speech_token_len, speech_feat=None, speech_feat_len=None, embedding=None, parts=("llm", "flow"), rng=None, streaming=False):  # type: ignore[no-untyped-def]
        """The training losses of ``parts``: the LM's (teacher-forced, the reference's
        label-smoothed loss; ``llm_acc`` its speech-token accuracy) and the flow's CFM loss on
        the mel, its noise and prompt draws from torch's global RNG. One call through the root
        module, so a sharded model gathers every part's parameters."""
        out: dict[str, torch.Tensor] = {}
        if "llm" in parts:
            lm = self.llm(text, text_len, speech_token, speech_token_len, rng=rng)
            out.update(llm_loss=lm["loss"], llm_acc=lm["acc"], llm_tokens=(lm["target"] != -1).sum())
        if "flow" in parts:
            frames = torch.minimum(speech_feat_len, speech_token_len * self.cfg.flow.token_mel_ratio)
            tokens = frames // self.cfg.flow.token_mel_ratio
            feat = speech_feat[:, : int(frames.max())]
            out["flow_loss"] = self.flow(speech_token[:, : int(tokens.max())], tokens, feat, tokens * self.cfg.flow.token_mel_ratio, embedding, streaming=streaming)["loss"]
        return out


def read_configs(model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import Qwen2Config

    model_dir = Path(model_dir)
    for need in (model_dir / YAML, model_dir / QWEN_DIR / "config.json"):
        if not need.is_file():
            raise CheckpointError(f"{model_dir}: no {need.relative_to(model_dir)} (a CosyVoice3 folder holds {YAML}, llm.pt, flow.pt, hift.pt and {QWEN_DIR}/)")
    try:
        cfg = parse_config(model_dir / YAML)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{model_dir / YAML}: {exc}") from None
    qwen = Qwen2Config(**json.loads((model_dir / QWEN_DIR / "config.json").read_text()))
    return cfg, qwen


def build_model(model_dir: Path, checkpoint: Path | None = None) -> CosyVoice3:
    """The training model from a folder's configs (random weights); with ``checkpoint``, its DCP loaded."""
    cfg, qwen = read_configs(model_dir)
    model = CosyVoice3(cfg, qwen)
    if checkpoint is not None:
        from mmcore.train import load_converted

        load_converted(model, Path(checkpoint))
    return model


def public_keys(part: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The reference's own key fixes: hift.pt's ``generator.`` prefix, and the pre-2.1 weight-norm
    names (``weight_g``/``weight_v``) as torch's parametrizations name them."""
    out = {}
    for key, value in state.items():
        if part == "hift":
            key = key.removeprefix("generator.")
            key = re.sub(r"\.weight_g$", ".parametrizations.weight.original0", key)
            key = re.sub(r"\.weight_v$", ".parametrizations.weight.original1", key)
        out[key] = value
    return out


def read_part(model_dir: Path, part: str) -> dict[str, torch.Tensor]:
    path = Path(model_dir) / f"{part}.pt"
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (a CosyVoice3 checkpoint has llm.pt, flow.pt and hift.pt)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 (torch raises many kinds for a bad file)
        raise CheckpointError(f"{path}: not a torch state dict ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a state dict")
    return public_keys(part, state)


def load_pretrained(model_dir: Path) -> CosyVoice3:
    """The three public state dicts loaded with strict=True into the model the folder describes."""
    model = build_model(model_dir)
    for part in PARTS:
        load_strictly(getattr(model, part), read_part(model_dir, part), Path(model_dir) / f"{part}.pt", f"the model {YAML} describes", error=CheckpointError)
    return model.eval()


class CosyVoice3Folder:
    """``from_pretrained(folder)``: :func:`load_pretrained`, under the name loaders call (peft's
    ``PeftModel.from_pretrained`` puts an exported LoRA adapter on the model it returns)."""

    @staticmethod
    def from_pretrained(folder: Path, **_: object) -> CosyVoice3:
        return load_pretrained(Path(folder))


def save_public(model: CosyVoice3, out_dir: Path) -> None:
    """Write ``llm.pt`` / ``flow.pt`` / ``hift.pt`` as the reference's torch.save of each state dict."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        torch.save(getattr(model, part).state_dict(), out_dir / f"{part}.pt")


def pt_to_safetensors(model_dir: Path, out_dir: Path) -> dict[str, int]:
    """The public folder as one ``model.safetensors`` (keys ``<part>.<key>``, tied tensors once)
    beside the same yaml and Qwen folder: what the engine's safetensors <-> DCP convert reads."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for part in PARTS:
        state = read_part(model_dir, part)
        for key, value in state.items():
            tied_to = TIED.get(part, {}).get(key)
            if tied_to in state and value.data_ptr() == state[tied_to].data_ptr() and value.shape == state[tied_to].shape:
                continue
            tensors[f"{part}.{key}"] = value.contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt", "source": "cosyvoice3"})
    _copy_side_files(Path(model_dir), out_dir)
    return {"tensors": len(tensors)}


def safetensors_to_pt(st_dir: Path, out_dir: Path) -> None:
    """Back to the public layout: the three .pt files, the tied ``lm_head`` sharing the embedding again."""
    from safetensors.torch import load_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = sorted(Path(st_dir).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{st_dir}: no .safetensors files")
    merged: dict[str, torch.Tensor] = {}
    for f in files:
        merged.update(load_file(str(f)))
    for part in PARTS:
        state = {k.split(".", 1)[1]: v for k, v in merged.items() if k.split(".", 1)[0] == part}
        for alias, target in TIED.get(part, {}).items():
            if alias not in state and target in state:
                state[alias] = state[target]
        torch.save(state, out_dir / f"{part}.pt")
    _copy_side_files(Path(st_dir), out_dir)


def _copy_side_files(src: Path, dst: Path) -> None:
    if src.resolve() == dst.resolve():
        return
    if (src / YAML).is_file():
        shutil.copy2(src / YAML, dst / YAML)
    if (src / QWEN_DIR).is_dir():
        shutil.copytree(src / QWEN_DIR, dst / QWEN_DIR, dirs_exist_ok=True)
