"""mmcore pack for Fun-ASR-Nano (pack ``funasr``): FunAudioLLM's LLM-based speech recognition.

Model-specific code only: the audio front end (``features``: Kaldi fbank + LFR without
torchaudio), the checkpoint's chat template and the ``<audio>`` expander (``data``), the
state-dict adapter (``adapter``), the family as the VLM kit sees it (``family``), tiny presets
(``tiny``) and the spoken-digits demo (``demo``).
"""
