"""Reading ``cosyvoice3.yaml`` (HyperPyYAML) without HyperPyYAML: the model fields, nothing executed.

The public file builds objects with tags (``!new:cosyvoice.llm.llm.CosyVoice3LM``,
``!name:...``, ``!apply:...``) and references (``!ref <llm_input_size>``, also arithmetic such as
``!ref <chunk_size> * <token_mel_ratio>``). This reader keeps each tagged mapping as a dict
(the tag under ``"__tag__"``), resolves references against the top-level keys, and never imports
or calls what a tag names.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

_REF = re.compile(r"<([A-Za-z_][\w.]*)>")


class _Ref(str):
    """The text of a ``!ref`` tag, resolved after the whole file is read."""


class _Loader(yaml.SafeLoader):
    pass


def _tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    tag = node.tag
    if tag == "!ref":
        return _Ref(loader.construct_scalar(node))  # type: ignore[arg-type]
    if isinstance(node, yaml.MappingNode):
        value = loader.construct_mapping(node, deep=True)
        return {"__tag__": tag, **value}
    if isinstance(node, yaml.SequenceNode):
        return {"__tag__": tag, "args": loader.construct_sequence(node, deep=True)}
    return {"__tag__": tag, "value": loader.construct_scalar(node)}  # type: ignore[arg-type]


_Loader.add_multi_constructor("!", _tagged)
# YAML 1.2 floats (``1e-06`` without a dot), as ruamel, HyperPyYAML's parser, reads them
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)?(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."),
)

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv}


def _arith(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arith(node.operand)
    raise ValueError("only + - * / on numbers")


def _resolve(value: Any, top: dict[str, Any], seen: tuple[str, ...] = ()) -> Any:
    if isinstance(value, _Ref):
        names = _REF.findall(value)
        if value.strip() == f"<{names[0]}>" and len(names) == 1:
            name = names[0]
            if name in seen or name not in top:
                raise ValueError(f"!ref {value}: unknown or circular reference")
            return _resolve(top[name], top, (*seen, name))
        text = _REF.sub(lambda m: repr(_resolve(_Ref(f"<{m.group(1)}>"), top, seen)), value)
        return _arith(ast.parse(text, mode="eval"))
    if isinstance(value, dict):
        return {k: _resolve(v, top, seen) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, top, seen) for v in value]
    return value


def read_hyperpyyaml(path: Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The file as plain data: tagged nodes as dicts with ``__tag__``, references resolved."""
    raw = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a mapping")
    raw.update(overrides or {})
    return {k: _resolve(v, raw, (k,)) for k, v in raw.items()}


@dataclass
class LMConfig:
    llm_input_size: int = 896
    llm_output_size: int = 896
    speech_token_size: int = 6561
    length_normalized_loss: bool = True
    lsm_weight: float = 0.0
    mix_ratio: list[int] = field(default_factory=lambda: [5, 15])
    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1


@dataclass
class FlowConfig:
    input_size: int = 80
    output_size: int = 80
    spk_embed_dim: int = 192
    vocab_size: int = 6561
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3
    pre_lookahead_channels: int = 1024
    # CausalConditionalCFM.cfm_params
    sigma_min: float = 1e-6
    t_scheduler: str = "cosine"
    training_cfg_rate: float = 0.2
    inference_cfg_rate: float = 0.7
    # DiT estimator
    dim: int = 1024
    depth: int = 22
    heads: int = 16
    dim_head: int = 64
    ff_mult: int = 2
    mel_dim: int = 80
    mu_dim: int = 80
    spk_dim: int = 80
    static_chunk_size: int = 50
    num_decoding_left_chunks: int = -1


@dataclass
class HiftConfig:
    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10
    upsample_rates: list[int] = field(default_factory=lambda: [8, 5, 3])
    upsample_kernel_sizes: list[int] = field(default_factory=lambda: [16, 11, 7])
    n_fft: int = 16
    hop_len: int = 4
    resblock_kernel_sizes: list[int] = field(default_factory=lambda: [3, 7, 11])
    resblock_dilation_sizes: list[list[int]] = field(default_factory=lambda: [[1, 3, 5]] * 3)
    source_resblock_kernel_sizes: list[int] = field(default_factory=lambda: [7, 7, 11])
    source_resblock_dilation_sizes: list[list[int]] = field(default_factory=lambda: [[1, 3, 5]] * 3)
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    conv_pre_look_right: int = 4
    f0_cond_channels: int = 512
    f0_num_class: int = 1

    @property
    def hop_size(self) -> int:
        """Waveform samples per mel frame (480 at 24 kHz: upsample rates times the ISTFT hop)."""
        n = self.hop_len
        for rate in self.upsample_rates:
            n *= rate
        return n


@dataclass
class MelConfig:
    """``feat_extractor`` (matcha's ``mel_spectrogram``): the flow's 80-bin log mel."""

    n_fft: int = 1920
    num_mels: int = 80
    sampling_rate: int = 24000
    hop_size: int = 480
    win_size: int = 1920
    fmin: float = 0
    fmax: float | None = None
    center: bool = False


@dataclass
class CosyVoice3Config:
    sample_rate: int
    lm: LMConfig
    flow: FlowConfig
    hift: HiftConfig
    mel: MelConfig = field(default_factory=MelConfig)
    token_frame_rate: int = 25


def _pick(cls: type, node: dict[str, Any], **extra: Any) -> Any:
    names = cls.__dataclass_fields__  # type: ignore[attr-defined]
    return cls(**{k: v for k, v in {**node, **extra}.items() if k in names})


def parse_config(path: Path) -> CosyVoice3Config:
    """The model fields of a ``cosyvoice3.yaml``; a missing section fails in one line."""
    data = read_hyperpyyaml(path, overrides={"qwen_pretrain_path": ""})
    for section in ("llm", "flow", "hift"):
        if not isinstance(data.get(section), dict):
            raise ValueError(f"{path}: no '{section}:' section (is this a CosyVoice3 cosyvoice3.yaml?)")
    llm, flow, hift = data["llm"], data["flow"], data["hift"]
    sampling = llm.get("sampling") or {}
    lm = _pick(LMConfig, llm, **{k: sampling[k] for k in ("top_p", "top_k", "win_size", "tau_r") if k in sampling})
    decoder = flow.get("decoder") or {}
    cfm = ((decoder.get("cfm_params") or {}).get("content")) or {}
    dit = decoder.get("estimator") or {}
    look = flow.get("pre_lookahead_layer") or {}
    fl = _pick(FlowConfig, {**flow, **cfm, **dit}, pre_lookahead_channels=look.get("channels", 1024))
    istft = hift.get("istft_params") or {}
    f0 = hift.get("f0_predictor") or {}
    hf = _pick(HiftConfig, hift, n_fft=istft.get("n_fft", 16), hop_len=istft.get("hop_len", 4), f0_cond_channels=f0.get("cond_channels", 512), f0_num_class=f0.get("num_class", 1))
    sample_rate = int(data.get("sample_rate", hf.sampling_rate))
    mel = _pick(MelConfig, {"sampling_rate": sample_rate, **(data.get("feat_extractor") or {})})
    return CosyVoice3Config(sample_rate=sample_rate, lm=lm, flow=fl, hift=hf, mel=mel, token_frame_rate=int(data.get("token_frame_rate", 25)))


# ---------------------------------------------------------------- the run configuration (mmcore)

from pydantic import Field  # noqa: E402

from mmcore.config import RunConfig, Section, TrainingSection  # noqa: E402
from mmcore.data import MLLMDataSection  # noqa: E402


class SpeechData(MLLMDataSection):
    """Records ``{"audio": "a.wav", "text": "..."}`` (JSON list or JSONL); optional
    ``speech_token`` (ids a real speech tokenizer gave) and ``embedding`` (a speaker vector)."""

    eval_fraction: float = Field(0.1, ge=0, lt=1, description="Fraction of training records held out for evaluation.")


class SpeechTraining(TrainingSection):
    parts: list[Literal["llm", "flow"]] = Field(
        default_factory=lambda: ["llm", "flow"],
        description="Which models train: llm (the speech-token LM), flow (the flow-matching mel decoder), or both (their losses summed; their parameters are disjoint). HiFT never trains here.",
    )


class SpeechGeneration(Section):
    sampling: Literal["greedy", "ras"] = Field("greedy", description="The LM's decoding: greedy, or CosyVoice's repetition-aware sampling (seeded).")
    flow_steps: int = Field(10, ge=1, description="Euler steps of the flow's ODE solve.")
    cfg_rate: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="The flow's classifier-free guidance strength at inference; null: the checkpoint yaml's inference_cfg_rate (0.7 in CosyVoice3's)."
    )
    vocoder: Literal["hift", "griffin_lim"] = Field(
        "hift",
        description="What turns the flow's mel into a waveform: the checkpoint's HiFT, or Griffin-Lim (no learned weights; for a checkpoint whose HiFT is untrained, as the demo's).",
    )


class CosyVoice3RunConfig(RunConfig):
    data: SpeechData = Field(default_factory=SpeechData)
    training: SpeechTraining = Field(default_factory=SpeechTraining)
    speech: SpeechGeneration = Field(default_factory=SpeechGeneration)
