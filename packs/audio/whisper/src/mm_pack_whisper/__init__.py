"""mmcore pack for Whisper (pack ``whisper``): encoder-decoder speech recognition.

Model-specific code only: tiny presets (``tiny``), transcript datasets and log-mel features
(``data``), batch -> loss, greedy decoding and WER (``model``), the frozen-encoder cache
(``extract``), the export check (``export``) and the synthetic spoken-digits demo (``demo``).
"""
