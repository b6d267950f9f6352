"""Activation memory of a training step: the bytes autograd saves for backward, per layer, by formula.

The formulas count the tensors the blocks' forward saves for backward, op by op, as transformers'
and diffusers' implementations run them (pre-norm blocks, SDPA attention): the same quantity
:func:`mmcore.plan.measure.saved_activation_bytes` measures (unique storages, weights left out),
so the two can be compared exactly at small sizes. Per token, with ``a`` the compute dtype's
bytes (4 fp32, 2 bf16), ``h`` the hidden width, ``q``/``kv`` the query and key/value widths:

Decoder layer (Llama/Qwen2 style: RMSNorm, GQA attention with rotary, SwiGLU MLP), after
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", sec. 4)
re-derived without dropout and with fused attention (SDPA keeps no s x s scores):

* each RMSNorm (two): its input upcast to fp32 (``4h``), the fp32 ``1/rms`` (4), the normalised
  tensor before the weight (``a h``) and its output, the projections' input (``a h``);
* attention: SDPA's query, key, value and output (``a (2q + 2kv)``; the output is also the output
  projection's input) and its fp32 log-sum-exp (``4 heads``); rotary multiplies by cos/sin
  (not saved per layer: one pair per model, ``2 a head_dim`` per token);
* MLP: gate and up projections' outputs, SiLU's output and the product, the down projection's
  input (``4 a intermediate``).

Outside the layers: the final RMSNorm as above, the fp32 log-softmax of the logits
(``4 vocab`` per supervised position: the kit's loss upcasts logits), token ids and labels (8 each).

Diffusion transformer block (Wan2.1 as diffusers runs it: affine-free LayerNorm with adaLN
modulation, RMSNorm on queries and keys, self-attention with 3-D rotary, cross-attention to the
caption, GELU MLP). Its residual stream, norms and query/key norms run in fp32 whatever the
compute dtype, so per video token: each of the three norms saves its fp32 input, mean and rstd
and (two with modulation) the fp32 normalised tensor, ``8h + 8`` bytes, plus the next linear's
``a``-typed input; self-attention the raw and normalised q and k in fp32 (``16h + 8``), SDPA's q,
k, v and output (``4ah``) and fp32 lse (``4 heads``), the gated output (``ah``); the
cross-attention's query side likewise (``8h + 4 + 2ah + 4 heads``); the MLP its two ``a``-typed
``ffn``-wide activations and its fp32 gated output. Per caption token and block: the key raw and
normalised (fp32) with its rstd, SDPA's key and value. Per clip and block: the fp32 adaLN
modulation (``8h``). At fp32 every ``a`` is 4 and the totals are ``4 (23h + 9 + 2 heads +
2 ffn)`` per video token and ``4 (4h + 1)`` per caption token. Counted tensor by tensor from the
saved-tensor hooks of one tiny block, fp32 and bf16, then written per op.

With ``training.recompute: full`` a block keeps only its inputs: ``a h`` per token (the hidden
states; shared arguments such as rotary tables, caption and time embedding are counted once; the
last block's output is the final norm's saved input).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decoder:
    """The shape of a decoder-only language model (a VLM's text model)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    def layer_bytes(self, tokens: float, a: int, recompute: bool = False) -> float:
        """Saved bytes of one layer on ``tokens`` tokens at ``a`` bytes per element."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        if recompute:
            return tokens * a * h
        norm = h * (4 + 2 * a) + 4
        attention = a * (2 * q + 2 * kv) + 4 * self.heads
        mlp = 4 * a * self.intermediate
        return tokens * (2 * norm + attention + mlp)

    def step_bytes(self, rows: int, seq: int, a: int, recompute: bool = False, layers: int | None = None) -> float:
        """Saved bytes of a micro-batch of ``rows`` rows of ``seq`` tokens through ``layers``
        layers (default all) plus the model's head and inputs."""
        tokens = float(rows * seq)
        blocks = (self.layers if layers is None else layers) * self.layer_bytes(tokens, a, recompute)
        rotary = tokens * 2 * a * self.head_dim
        head = tokens * (self.hidden * (4 + 2 * a) + 4) + rows * (seq - 1) * 4 * self.vocab
        ids = tokens * 8 * 2  # input ids and labels
        return blocks + rotary + head + ids


@dataclass(frozen=True)
class DiT:
    """The shape of a video diffusion transformer with cross-attention to a caption (Wan)."""

    layers: int
    hidden: int
    heads: int
    head_dim: int
    ffn: int
    latent_channels: int
    patch_elements: int  # latents per patch token (channels x patch volume)
    freq_dim: int = 256  # the timestep's sinusoidal embedding

    def layer_bytes(self, tokens: float, caption: float, a: int, recompute: bool = False) -> float:
        h, heads = self.hidden, self.heads
        if recompute:
            return tokens * a * h
        # bytes per video token: diffusers keeps Wan's residual stream and norms in fp32 (4) whatever
        # the compute dtype (a): norm1 + modulation, self-attention, norm2, cross-attention's query
        # side, norm3 + modulation, MLP
        norms = 2 * (8 * h + 8) + 4 * h + 8  # two with modulation (the normalised tensor kept), one affine
        attention = 16 * h + 8 + 4 * heads + 8 * h + 4 + 4 * heads
        computed = a * (h + 5 * h + h + 2 * h + h) + 2 * a * self.ffn + 4 * h  # a-typed outputs; the gated MLP output in fp32
        copy = 4 * h if a == 4 else 0  # fp32: the cross-attention output's contiguous copy (measured on CPU SDPA)
        video = norms + attention + computed + copy
        # per caption token: key raw, normalised (fp32) and its rstd, SDPA's key and value; with bf16
        # each block's copy of the caption cast to bf16 (FSDP2 casts a sharded block's inputs)
        text = 8 * h + 4 + 2 * a * h + (a * h if a != 4 else 0)
        return tokens * video + caption * text

    def step_bytes(self, rows: int, tokens: int, caption: int, text_dim: int, a: int, recompute: bool = False, layers: int | None = None) -> float:
        """Saved bytes of ``rows`` clips of ``tokens`` patch tokens and ``caption`` caption rows."""
        n, c, h = float(rows * tokens), float(rows * caption), self.hidden
        blocks = (self.layers if layers is None else layers) * self.layer_bytes(n, c, a, recompute)
        latents = n * self.patch_elements * (a + 4)  # the patch embedding's input, the loss's fp32 difference
        caption_embed = c * (text_dim + 2 * h) * a  # the text embedder's input and its two activations
        rotary = n * 2 * a * self.head_dim  # cos and sin tables
        head = n * (8 * h + 8 + a * h)  # the output norm (fp32) and the projection's input
        # per clip: the timestep's embedding (sinusoid, its MLP, the projection's input, the head's
        # 1 + scale); fp32: each block's modulation (6h, its gates saved) and two (1 + scale), or
        # with recompute the projected modulation every block takes
        timestep = rows * a * (self.freq_dim + 5 * h)
        modulation = rows * 4 * (6 * h if recompute else (self.layers if layers is None else layers) * 8 * h)
        return blocks + latents + caption_embed + rotary + head + timestep + modulation


__all__ = ["Decoder", "DiT"]
