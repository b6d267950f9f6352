"""Decoder fine-tuning from the extract stage's encoder cache vs. running the frozen encoder,
at real Whisper sizes (random weights built from config), same process.

    python bench/whisper_encoder_cache.py [--quick] [--size base] [--batch 4] [--steps 5] [--reps 5]

Times a training step (forward + backward on the decoder) both ways on a batch of 30 s log-mel
windows: each repetition times ``--steps`` steps of each path (order alternating) after a
warm-up step; the figure is the median of live / cached. Goal (issue 20): >= 3. The two paths
compute the same loss (checked).
"""

from __future__ import annotations

import time

from common import emit, figure, parser, pin_threads, reps_of

SIZES = {  # d_model, layers, heads, ffn (the openai/whisper-* configs)
    "tiny": (384, 4, 6, 1536),
    "base": (512, 6, 8, 2048),
    "small": (768, 12, 12, 3072),
}


def main() -> None:
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    from transformers.modeling_outputs import BaseModelOutput

    p = parser(__doc__)
    p.add_argument("--size", choices=sorted(SIZES), default="base")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    if args.quick:
        args.size, args.steps = "tiny", 3
    pin_threads(args.threads)
    reps = reps_of(args)
    d, layers, heads, ffn = SIZES[args.size]
    config = WhisperConfig(
        d_model=d, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, num_mel_bins=80
    )
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

    step(False)  # warm-up, both paths
    step(True)
    times: dict[bool, list[float]] = {False: [], True: []}
    losses: dict[bool, float] = {}
    for rep in range(reps):
        for cached in (False, True) if rep % 2 == 0 else (True, False):
            measured = [step(cached) for _ in range(args.steps)]
            times[cached].append(sum(t for t, _ in measured) / args.steps)
            losses[cached] = measured[0][1]
    assert abs(losses[False] - losses[True]) < 1e-5 * abs(losses[False]), losses
    emit(
        figure(
            f"caches/whisper-{args.size}-encoder",
            f"whisper-{args.size} decoder step: encoder outputs from the cache vs the frozen encoder every step",
            "s/step",
            times[True],
            times[False],
            baseline_name="frozen encoder every step",
            ratio_is="baseline/mmcore",
            goal=(">=", 3.0),
            how=f"random weights at the openai/whisper-{args.size} sizes, batch {args.batch} x 30 s, forward + backward, mean of {args.steps} steps, "
            f"{reps} repetitions alternating, {args.threads} threads",
            cache_mib_per_clip=round(1500 * d * 4 / 2**20, 2),
        )
    )


if __name__ == "__main__":
    main()
