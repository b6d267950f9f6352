"""The pack conformance suite: the contract, checked by running the pack.

A pack's tests subclass :class:`PackConformance` and name the pack (and, where its tiny preset
needs it, overrides that make the run small)::

    from mmcore.testing.conformance import PackConformance

    class TestConformance(PackConformance):
        pack_name = "qwen2vl"
        overrides = ("data.demo_samples=8",)

The pack must be installed (its entry point is what users get). One tiny run of every stage
(``preset``, ``overrides``) is shared by the class's checks, run in the test process; one more
run, a real ``mmcore train`` process, is killed with SIGKILL during training and resumed. Each
failure starts with ``[rule] hook:``:

* import: the entry point imports neither torch nor transformers nor diffusers;
  the pack imports from mmcore only what :mod:`mmcore.sdk` lists.
* spec: name, category, stages, distribution; every preset validates.
* pipeline: every stage finishes (or declines) and records the outputs the engines read.
* convert: key coverage against the model and a bit-identical round trip (``convert.verify``).
* export: the exported folder loads in its library with nothing missing: the class it names
  itself (``config.json`` architectures, ``model_index.json``), or ``export_class``.
* kernels: each kernel has a reference; each implementation usable here matches it on the
  kernel's example input.
* bad input: a sample that is not a sample fails preprocess with one line naming the file.
* resume: training killed between checkpoints (one step after ``kill_step``'s) resumes to the
  uninterrupted losses, each step in ``metrics.jsonl`` once.
* mixed data: text-only samples beside images, videos and audio (``mixed_media``) train on two
  processes to the one-process losses, with a mixed held-out split evaluated on both.
* lora: ``training.lora`` trains adapters only (the checkpoint holds nothing else), a LoRA run
  killed with SIGKILL resumes to the uninterrupted losses, the adapter export loads in its
  library (peft's ``PeftModel.from_pretrained``, or diffusers' ``load_lora_weights``) with the
  trained tensors, nothing missing, and ``mmcore infer`` answers from its checkpoint and export.
* conditioning (generative): the trained tiny denoiser's held-out loss changes with other clips'
  captions (``eval/loss_shuffled`` against ``eval/loss``; ``data.eval_fraction`` holds clips out).
* global rng: with ``sample_seeds``, a training step draws nothing from torch's global RNG
  (checked by the train loop during the shared run, ``MMCORE_CHECK_GLOBAL_RNG=1``).
* two processes (generative, ``make test-matrix``): FSDP2 on two processes trains to the
  one-process losses, without FSDP2's view warning.
* export also: a diffusers pipeline folder opens in ``diffusers.DiffusionPipeline.from_pretrained``.

A rule that came with a later SDK than the pack declares (:data:`RULE_SINCE`) skips, saying so:
a pack that passed conformance keeps passing it on every later minor of its SDK.
"""

from __future__ import annotations

from mmcore.testing.conformance.base import RULE_SINCE, ConformanceBase
from mmcore.testing.conformance.contract import ContractRules
from mmcore.testing.conformance.generative import GenerativeRules
from mmcore.testing.conformance.stages import StageRules
from mmcore.testing.conformance.training import TrainingRules


class PackConformance(ContractRules, StageRules, TrainingRules, GenerativeRules, ConformanceBase):
    """Every rule; a pack's ``TestConformance`` subclasses this and sets ``pack_name``
    (the settings: :class:`~mmcore.testing.conformance.base.ConformanceBase`)."""


__all__ = ["PackConformance", "RULE_SINCE", "ConformanceBase"]
