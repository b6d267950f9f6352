"""mmcore pack for CosyVoice3 (FunAudioLLM): text -> speech tokens (a Qwen2 LM) -> mel (a DiT
flow-matching model) -> waveform (the HiFT vocoder).

Model-specific code only: the three models with the public checkpoint's parameter names
(``lm``, ``flow``, ``hift``), the yaml reader (``config``), strict loading and the convert
helpers (``model``), synthesis (``synth``) and the tiny test checkpoint (``tiny``).
"""
