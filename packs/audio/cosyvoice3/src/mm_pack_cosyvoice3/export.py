"""Export: the trained checkpoint -> the public folder (``cosyvoice3.yaml``, ``llm.pt``, ``flow.pt``,
``hift.pt``, ``CosyVoice-BlankEN/``; the demo's speech tokenizer beside them where the download
had one), LoRA adapters merged in.

Checked before the stage succeeds: every ``.pt`` has the download's key set, shapes and dtypes
(``lm_head`` tied again where it was); the folder loads with ``strict=True`` through the pack's
own loader (what CosyVoice's ``cosyvoice/cli/model.py`` does); and the reloaded model gives the
trained model's outputs exactly in fp32 -- the LM's teacher-forced logits, the flow's DiT
estimate and HiFT's waveform on a fixed probe.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from mmcore import Manifest, StageContext, StageError, StageResult


def probe_outputs(model: Any) -> dict[str, torch.Tensor]:
    """Each part on a fixed probe (seeded inputs; fp32, eval mode)."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    vocab = model.llm.llm.model.config.vocab_size
    text = torch.randint(0, vocab, (1, 6), generator=g)
    speech = torch.randint(0, cfg.lm.speech_token_size, (1, 10), generator=g)
    mel = torch.randn(1, 80, 20, generator=g)
    model.eval()
    with torch.no_grad():
        lm = model.llm(text, torch.tensor([6]), speech, torch.tensor([10]))
        h, mask, spks = model.flow.encode(speech, torch.tensor([10]), torch.randn(1, cfg.flow.spk_embed_dim, generator=g))
        mu = h.transpose(1, 2)
        est = model.flow.decoder.estimator(torch.randn(mu.shape, generator=g), mask[:, None], mu, torch.tensor([0.3]), spks, torch.zeros_like(mu))
        wav, _ = model.hift(mel)
    return {"llm logits": lm["logits"], "flow estimator": est, "hift waveform": wav}


def export(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    from mmcore.engines import trained_checkpoint
    from mmcore.train import LoraPlan, load_converted, merged_state, write_peft_adapter

    from mm_pack_cosyvoice3.features import DEMO_TOKENIZER
    from mm_pack_cosyvoice3.model import PARTS, CheckpointError, build_model, load_pretrained, read_part, save_public

    source = Path(upstream["download"].output("model"))
    out = ctx.stage_dir / "cosyvoice3"
    shutil.rmtree(out, ignore_errors=True)
    trained = build_model(source)
    checkpoint = trained_checkpoint(ctx, upstream)
    load_converted(trained, checkpoint)
    outputs, metrics = {"model": "cosyvoice3"}, {}
    plan = LoraPlan.read(checkpoint)
    if plan is not None:  # the adapters as peft saves them (on the download's folder), then merged into the public files
        shutil.rmtree(ctx.stage_dir / "adapter", ignore_errors=True)
        metrics.update(write_peft_adapter(trained, plan, ctx.stage_dir / "adapter", base_model=source))
        outputs["adapter"] = "adapter"
        merged = merged_state(trained)
        trained = build_model(source)
        trained.load_state_dict(merged, strict=False)
        missing = set(trained.state_dict()) - set(merged) - {"llm.llm.model.lm_head.weight"}
        if missing:
            raise StageError(f"merging LoRA left {len(missing)} tensors unset (first {sorted(missing)[0]})")
    save_public(trained, out)
    shutil.copy2(source / "cosyvoice3.yaml", out / "cosyvoice3.yaml")
    shutil.copytree(source / "CosyVoice-BlankEN", out / "CosyVoice-BlankEN")
    for side in (DEMO_TOKENIZER,):
        if (source / side).is_file():
            shutil.copy2(source / side, out / side)
    problems = []
    for part in PARTS:
        a, b = read_part(source, part), read_part(out, part)
        if set(a) != set(b):
            problems.append(f"{part}.pt: keys differ ({sorted(set(a) ^ set(b))[0]})")
        problems += [f"{part}.pt: {k}: {tuple(b[k].shape)} {b[k].dtype} (was {tuple(a[k].shape)} {a[k].dtype})" for k in a if k in b and (a[k].shape != b[k].shape or a[k].dtype != b[k].dtype)]
    if problems:
        raise StageError(f"the export's layout differs from the download's: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
    try:
        reloaded = load_pretrained(out)
    except CheckpointError as exc:
        raise StageError(f"the export does not load strictly: {exc}") from None
    before, after = probe_outputs(trained), probe_outputs(reloaded)
    for name in before:
        if not torch.equal(before[name], after[name]):
            raise StageError(f"the export's {name} differ from the trained model's by up to {float((before[name] - after[name]).abs().max()):.3g}")
    notes = [
        f"{out}: cosyvoice3.yaml, llm.pt, flow.pt, hift.pt, CosyVoice-BlankEN/ (keys, shapes and dtypes as the download's)",
        "loaded strictly by the pack's loader; LM logits, flow estimate and HiFT waveform equal the trained model's exactly (fp32)",
    ]
    if plan is not None:
        notes.append(f"LoRA: the adapters as peft saves them in {ctx.stage_dir / 'adapter'} (on the download's folder), merged into the .pt files")
    return StageResult(outputs=outputs, metrics={**metrics, "tensors": sum(len(read_part(out, p)) for p in PARTS)}, notes=notes)
