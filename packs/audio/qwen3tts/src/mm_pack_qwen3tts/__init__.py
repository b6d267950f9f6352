"""mmcore pack for Qwen3-TTS (Qwen): text -> 12.5 Hz multi-codebook speech codes by the talker
(a Qwen3 decoder stack + a code predictor) -> a 24 kHz waveform (the 12 Hz speech tokenizer's decoder).

Model-specific code only: the config reader (``config``), the talker with the public parameter
names (``talker``), the prompt layout, loss and code generation (``speech``), strict loading
(``model``), the codec decoder (``codec``), synthesis (``synth``), the download check
(``stages``), the adapter and the tiny test checkpoint (``tiny``).
"""
