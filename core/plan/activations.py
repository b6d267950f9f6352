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

Diffusion transformer block (Wan2.1: affine-free LayerNorm with adaLN modulation, RMSNorm on
queries and keys, self-attention with 3-D rotary, cross-attention to the caption, GELU MLP), per
video token: norm + modulation ``3h + 2`` elements (input, mean, rstd, normed, modulated) twice
(attention, MLP); self-attention ``9h + 2 + heads`` (raw and normalised q and k with their rstd,
SDPA's q, k, v, output and lse, the gated output); the cross-attention's norm ``2h + 2`` and its
query side ``5h + 1 + heads``; the MLP ``2 ffn + h`` (first linear's output, GELU's output, the
gated output): ``23h + 9 + 2 heads + 2 ffn``; per caption token and block ``4h + 1`` (key raw,
normalised, rstd, SDPA's key and value); per clip and block ``8h`` (the adaLN modulation, fp32
in diffusers). Norm statistics stay fp32 under bf16 compute.

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
        h = self.hidden
        if recompute:
            return tokens * a * h
        # the elements counted above, their norm statistics in fp32
        video = a * (23 * h + 2 * self.heads + 2 * self.ffn) + 4 * 9
        text = a * 4 * h + 4
        return tokens * video + caption * text

    def step_bytes(self, rows: int, tokens: int, caption: int, text_dim: int, a: int, recompute: bool = False, layers: int | None = None) -> float:
        """Saved bytes of ``rows`` clips of ``tokens`` patch tokens and ``caption`` caption rows."""
        n, c, h = float(rows * tokens), float(rows * caption), self.hidden
        blocks = (self.layers if layers is None else layers) * self.layer_bytes(n, c, a, recompute)
        latents = 2 * n * self.patch_elements * 4  # the patch embedding's input and the loss's difference, fp32
        caption_embed = c * (text_dim + 2 * h) * a  # the text embedder's input and its two activations
        rotary = n * 2 * 4 * self.head_dim  # cos and sin tables
        head = n * (3 * h + 2) * a
        # per clip, fp32: the timestep's embedding (sinusoid, its MLP, the projection's input);
        # each block's modulation (6h, its gates saved) and two (1 + scale) terms, or with
        # recompute the projected modulation every block takes; the head's (1 + scale)
        timestep = rows * 4 * (self.freq_dim + 4 * h + h)
        modulation = rows * 4 * (6 * h if recompute else (self.layers if layers is None else layers) * 8 * h)
        return blocks + latents + caption_embed + rotary + head + timestep + modulation


__all__ = ["Decoder", "DiT"]
