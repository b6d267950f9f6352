"""State-dict adapter: Fun-ASR-Nano hub checkpoints <-> ``FunAsrNanoForConditionalGeneration``.

The transformers-format checkpoint (``FunAudioLLM/Fun-ASR-Nano-2512-hf``, written by
transformers' ``convert_fun_asr_nano_to_hf.py``) stores the model's own names: the SAN-M audio
tower ``model.audio_tower.layers.<i>`` (q/k/v/o projections, the FSMN memory as
``self_attn.fsmn.conv``, ``mlp.fc1/fc2``, ``input_layernorm``/``post_attention_layernorm`` and a
``final_layernorm`` on the last transcription layer and the last layer), the adaptor
``model.multi_modal_projector.{linear_1,linear_2,layers.<i>}`` and the Qwen3 decoder
``model.language_model.*``; transformers 5.25 has no conversion mapping for the family, so
nothing is renamed. ``lm_head.weight`` is tied to the token embedding: stored once (the
conversion script keeps an explicit copy, which is read as the embedding's and left out).
The original FunASR ``model.pt`` (a pickle with fused ``linear_q_k_v`` and ``llm.*`` names) is
not read: convert it with transformers' script first.
"""

from mmcore.engines import RenameAdapter

ADAPTER = RenameAdapter(
    rules=[(r"^model\.", "model.", r"^model\.", "model.")],
    tied=["lm_head.weight"],
    ignore=[r"^lm_head\.weight$"],
)
