"""Checks every VLM-kit pack makes of its sequence packing, written once.

A packed row (samples side by side, positions restarting, the core's ``varlen_attention``)
must train exactly as the padded batch and give each sample the logits it has alone. The
tolerances are the same for every family, so they are stated here once: fp32, loss rel 1e-5,
gradients rtol 1e-4 / atol 1e-6 of the tensor's largest entry (at least 1e-6), logits atol 1e-5 -- the packed row and the padded batch run
the same arithmetic in matrix products of other shapes (and MoE experts' ``index_add`` in
another order), so sums differ in the last bits, not more.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

if TYPE_CHECKING:  # importing this module needs no torch (the SDK's rule); its functions import it
    import torch

#: loss rel, gradient (rtol, atol), logits atol: fp32 (see the module docstring)
LOSS_REL, GRAD_TOL, LOGITS_ATOL = 1e-5, (1e-4, 1e-6), 1e-5


def encoded(encoder: Any, samples: Iterable[Any]) -> list[dict[str, Any]]:
    """Each sample through the family's encoder, as the collate takes it."""
    import torch

    rows = []
    for sample in samples:
        enc = encoder.encode(sample)
        rows.append({"input_ids": torch.tensor(enc.input_ids), "labels": torch.tensor(enc.labels), **enc.tensors})
    return rows


def mixed_rows(
    family: Any,
    encoder: Any,
    config: Any,
    model_dir: Path,
    media: Path,
    *,
    wide: tuple[int, int] = (200, 90),
    small: tuple[int, int] = (60, 50),
    question: str = "What colour?",
    picture_answer: bool = False,
) -> tuple[list[dict[str, Any]], Any]:
    """A packing check's batch, as a family's encoder makes it, and the family's token ids: an
    image question on a ``wide`` noise picture (width, height; ``question`` asked), with
    ``picture_answer`` a text -> picture sample ("a blue circle" -> the ``small`` picture), a
    text-only sample, and an image question on the ``small`` picture. ``encoder(ctx, model_dir,
    tokenizer)`` is the family's encoder factory and ``config`` its run config (``ctx.config``);
    the pictures are written under ``media``."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from mmcore.data import Sample, Turn
    from mmcore.testing.media import write_noise

    write_noise(media / "wide.png", wide, 0)
    write_noise(media / "small.png", small, 1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    turns = [
        ([Turn("user", f"<image>{question}"), Turn("assistant", "red")], {"images": [media / "wide.png"]}),
        *([([Turn("user", "a blue circle"), Turn("assistant", "<image>")], {"images": [media / "small.png"]})] if picture_answer else []),
        ([Turn("user", "Hello there, what colour is the square?"), Turn("assistant", "blue")], {}),
        ([Turn("user", "<image>What colour?"), Turn("assistant", "green")], {"images": [media / "small.png"]}),
    ]
    samples = [Sample("f", i, conversation, media_of) for i, (conversation, media_of) in enumerate(turns)]
    rows = encoded(encoder(SimpleNamespace(config=config), model_dir, tokenizer), samples)
    return rows, family.token_ids_of(tokenizer)


def packed_copy(model: torch.nn.Module, *also: Callable[[torch.nn.Module], Any]) -> torch.nn.Module:
    """A copy of ``model`` on the core's varlen attention, then each of ``also`` applied (a
    family's own per-sample isolation, e.g. of linear-attention state)."""
    from mmcore.attention import use_packed_attention, varlen_attention

    packed = copy.deepcopy(model)
    use_packed_attention(packed, varlen_attention)
    for step in also:
        step(packed)
    return packed


def loss_and_gradients(family: Any, network: torch.nn.Module, batch: dict[str, Any], **loss_kw: Any) -> tuple[float, dict[str, torch.Tensor]]:
    """The summed loss of ``batch`` and the gradients it leaves, by parameter name."""
    loss = family.loss_sum(network, batch, **loss_kw)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in network.named_parameters() if p.grad is not None}


def packed_equals_padded(family: Any, model: torch.nn.Module, data: Sequence[dict[str, Any]], ids: Any, *, packed_net: torch.nn.Module | None = None, **loss_kw: Any) -> dict[str, torch.Tensor]:
    """Asserts one packed row of ``data`` trains as the padded batch: one row, the same loss
    tokens, the same loss and the same gradients (tolerances in the module docstring). Returns
    the gradients, for the family's own checks of which parameters learnt."""
    import torch

    packed_net = packed_net if packed_net is not None else packed_copy(model)
    padded, packed = family.collate(data, ids), family.collate(data, ids, pack=True)
    assert packed["input_ids"].shape[0] == 1 and packed["num_loss_tokens"] == padded["num_loss_tokens"]
    want, want_grads = loss_and_gradients(family, model, padded, **loss_kw)
    got, got_grads = loss_and_gradients(family, packed_net, packed, **loss_kw)
    assert abs(got - want) <= LOSS_REL * abs(want), (got, want)
    assert want_grads.keys() == got_grads.keys()
    for name, grad in want_grads.items():
        # atol scales with the tensor's largest entry: an entry summed from large terms can end
        # near zero, and only the terms' size bounds its rounding (janus: 5.7e-6 beside 25.5)
        scale = max(1.0, grad.abs().max().item())
        assert torch.allclose(got_grads[name], grad, rtol=GRAD_TOL[0], atol=GRAD_TOL[1] * scale), (name, (got_grads[name] - grad).abs().max().item(), scale)
    return want_grads


def row_and_alone(family: Any, model: torch.nn.Module, packed_net: torch.nn.Module, data: Sequence[dict[str, Any]], ids: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(logits of each sample's span in the packed row, its logits alone), in eval mode."""
    import torch

    model.eval()
    with torch.no_grad():
        alone = [family.forward_logits(model, family.collate([sample], ids))[0] for sample in data]
        row = family.forward_logits(packed_net.eval(), family.collate(data, ids, pack=True))[0]
    pairs, start = [], 0
    for want in alone:
        pairs.append((row[start : start + len(want)], want))
        start += len(want)
    assert start == row.shape[0], "the packed row is longer than its samples"
    return pairs


def each_sample_equals_it_alone(family: Any, model: torch.nn.Module, packed_net: torch.nn.Module, data: Sequence[dict[str, Any]], ids: Any) -> None:
    """Asserts every sample's logits in the packed row equal its logits alone (atol 1e-5)."""
    import torch

    for i, (got, want) in enumerate(row_and_alone(family, model, packed_net, data, ids)):
        assert torch.allclose(got, want, atol=LOGITS_ATOL), i


def stage_losses(pack: str, run_dir: Path, overrides: Sequence[str], *, preset: str = "tiny") -> list[float]:
    """The train stage's per-step losses of ``pack`` run in process (fresh, no resume)."""
    from mmcore.framework.plugins import Plugins
    from mmcore.testing import make_runner

    make_runner(Plugins.load(), pack, run_dir, preset=preset, overrides=list(overrides)).run_pipeline(resume="no")
    rows = [json.loads(line) for line in (Path(run_dir) / "train/metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


def packed_training_matches_padded(pack: str, tmp_path: Path, *, steps: int = 2, samples: int = 8) -> None:
    """Asserts the whole stage with ``training.packing`` runs the padded run's losses, step by
    step (rel 1e-5, fp32), on the pack's ``tiny`` preset and demo data."""
    common = [f"data.demo_samples={samples}", "convert.verify=false", f"training.steps={steps}", "evaluate.enabled=false"]
    padded = stage_losses(pack, tmp_path / "padded", common)
    packed = stage_losses(pack, tmp_path / "packed", [*common, "training.packing=true"])
    assert len(packed) == steps and len(padded) == steps
    for got, want in zip(packed, padded):
        assert abs(got - want) <= LOSS_REL * abs(want), (packed, padded)
