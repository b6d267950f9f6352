"""The kernels this pack registers, per device: the Qwen text kernels (``mm_qwen_vision.kernels``)
under this pack's names, ``qwen2vl.rms_norm`` and ``qwen2vl.rotary``.

They are wired into the model (``family.apply_kernels``) where the device has its own; packed
attention is the core's ``varlen_attention`` kernel (:mod:`mmcore.train.attention`), wired by the VLM kit.
"""

from mm_qwen_vision.kernels import qwen_kernels

KERNELS = qwen_kernels("qwen2vl")
