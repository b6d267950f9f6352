"""Decoder fine-tuning from the extract stage's encoder cache vs. running the frozen encoder,
at real Whisper sizes (random weights built from config), same process.

    python bench/whisper_encoder_cache.py [--size base] [--batch 4] [--steps 5] [--threads 2]

Times one training step (forward + backward + AdamW on the decoder) both ways on a batch of
30 s log-mel windows and reports the mean step times (first step excluded) and their ratio,
plus the cache's size per clip. The two paths compute the same loss (checked).
"""

from __future__ import annotations

import argparse
import time

SIZES = {  # d_model, layers, heads, ffn (the openai/whisper-* configs)
    "tiny": (384, 4, 6, 1536),
    "base": (512, 6, 8, 2048),
    "small": (768, 12, 12, 3072),
}


def main() -> None:
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    from transformers.modeling_outputs import BaseModelOutput

    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    d, layers, heads, ffn = SIZES[args.size]
    config = WhisperConfig(d_model=d, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
                           decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, num_mel_bins=80)
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config)
    model.model.encoder.requires_grad_(False)
    features = torch.randn(args.batch, 80, 3000)
    labels = torch.randint(0, config.vocab_size, (args.batch, 24))
    with torch.no_grad():
        states = model.model.encoder(features).last_hidden_state
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def step(cached: bool) -> tuple[float, float]:
        t0 = time.perf_counter()
        inputs = {"encoder_outputs": BaseModelOutput(last_hidden_state=states)} if cached else {"input_features": features}
        loss = model(**inputs, decoder_input_ids=labels[:, :-1], labels=None).logits.float().log_softmax(-1).mean()
        loss.backward()
        optimizer.zero_grad(set_to_none=True)  # no update: both paths keep timing the same weights
        return time.perf_counter() - t0, loss.item()

    results = {}
    for cached in (False, True):
        times, losses = zip(*[step(cached) for _ in range(args.steps + 1)])
        results[cached] = (sum(times[1:]) / args.steps, losses[0])
    (live, live_loss), (fast, cached_loss) = results[False], results[True]
    assert abs(live_loss - cached_loss) < 1e-5 * abs(live_loss), (live_loss, cached_loss)
    print(f"whisper-{args.size} random weights, batch {args.batch} x 30 s, {args.threads} threads, mean of {args.steps} steps")
    print(f"  frozen encoder run every step: {live * 1000:.0f} ms/step")
    print(f"  encoder outputs from the cache: {fast * 1000:.0f} ms/step")
    print(f"  speed-up {live / fast:.1f}x; cache {1500 * d * 4 / 2**20:.2f} MiB per clip (float32)")


if __name__ == "__main__":
    main()
