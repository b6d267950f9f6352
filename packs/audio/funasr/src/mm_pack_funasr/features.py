"""Fun-ASR-Nano's audio front end without torchaudio: Kaldi log-mel filterbanks, then low frame
rate (LFR) stacking, as transformers' ``FunAsrNanoFeatureExtractor`` computes them.

That extractor calls ``torchaudio.compliance.kaldi.fbank``; torchaudio has no wheel for this
torch on CPU-only machines, so :func:`kaldi_fbank` is the same computation in plain torch with
the arguments the extractor passes (25 ms Hamming frames every 10 ms, ``snip_edges``, DC offset
removed, pre-emphasis 0.97, power spectrum over a 512-point FFT, triangular mel bins from
20 Hz to Nyquist, natural log floored at float32's epsilon; no dither). :func:`stack_lfr` is
the extractor's LFR step: ``num_frames_lfr`` frames centred on every ``stride_lfr``-th frame,
edges repeated, so a clip of F frames gives ceil(F / stride) rows of ``mels x num_frames_lfr``.
The tests compare both, through the family's own extractor and processor, with transformers'.
The computation lives in the core since SDK 1.33 (:mod:`mmcore.data.lfr`, Ming-Lite-Omni's
front end too); this module keeps its names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore.data import LFR_DEFAULTS as DEFAULTS, kaldi_fbank, lfr_features, mel_banks, stack_lfr

__all__ = ["DEFAULTS", "kaldi_fbank", "lfr_features", "mel_banks", "stack_lfr", "fbank_like_torchaudio", "family_feature_extractor"]


def fbank_like_torchaudio(waveform: Any, num_mel_bins: int, frame_length: float, frame_shift: float, sample_frequency: float, window_type: str = "hamming") -> Any:
    """``torchaudio.compliance.kaldi.fbank`` as the family's extractor calls it ([1, samples])."""
    if window_type != "hamming":
        raise ValueError(f"only the Hamming window Fun-ASR uses is implemented, not {window_type}")
    return kaldi_fbank(waveform[0], num_mel_bins, frame_length, frame_shift, sample_frequency)


def family_feature_extractor(**settings: Any) -> Any:
    """transformers' own ``FunAsrNanoFeatureExtractor``. Without torchaudio its module cannot be
    imported through transformers (it requires the backend); it is then loaded from its file
    with :func:`fbank_like_torchaudio` standing in for ``torchaudio.compliance.kaldi.fbank``, so
    everything else it does (LFR, padding, the mask, its saved config) is the family's code."""
    import importlib.util
    import sys
    from types import SimpleNamespace

    from transformers.utils import is_torchaudio_available

    if is_torchaudio_available():
        from transformers import FunAsrNanoFeatureExtractor

        return FunAsrNanoFeatureExtractor(**settings)
    name = "transformers.models.fun_asr_nano.feature_extraction_fun_asr_nano"
    module = sys.modules.get(name)
    if module is None or not hasattr(module, "FunAsrNanoFeatureExtractor"):
        import transformers.models.fun_asr_nano as family

        spec = importlib.util.spec_from_file_location(name, Path(family.__file__).parent / "feature_extraction_fun_asr_nano.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        sys.modules[name] = module
    module.torchaudio = SimpleNamespace(compliance=SimpleNamespace(kaldi=SimpleNamespace(fbank=fbank_like_torchaudio)))
    return module.FunAsrNanoFeatureExtractor(**settings)
