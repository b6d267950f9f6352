"""The frozen vision tower's cache at Qwen2-VL-2B's real widths: a training step that reads the
tower's features from the cache vs one that runs the tower, same process, random weights built
from config.

    python bench/vision_tower_cache.py [--quick] [--depth-fraction 0.25] [--image 448] [--steps 1] [--reps 5]

The model is Qwen2-VL-2B's config (language model: width 1536, MLP 8960, 12 heads, 2 KV heads,
vocabulary 151,936, tied embeddings; vision tower: width 1280, 16 heads, MLP ratio 4, patch 14,
2 x 2 merge), at ``--depth-fraction`` of its depth (28 decoder layers and 32 tower blocks: a
quarter by default, 7 and 8, since the whole model's gradients do not fit this machine beside its
other work); both stacks shrink alike, and the embedding and output layer, which do not shrink,
weigh more in the step than at full depth, so the figure slightly understates the full model's.
A sample is one ``--image`` x ``--image`` picture (448: 1024 patches, 256 image tokens) and 64
text tokens, every text token trained. With the tower frozen (``training.freeze=[vision]``, what
the extract stage caches), a step is the tower's forward (no graph: its weights do not train) and
the language model's forward and backward; from the cache only the latter, the features given as
transformers' ``mm_encoder_outputs`` (what mmcore's cached batches do). The two paths' losses are
checked equal.

At full depth the count gives 1.49x for a 448 x 448 image (the tower's forward a third of the
step's FLOPs), 1.75x at 896 and 2.03x at 1344: a ratio of 3 needs the frozen tower to be two
thirds of the step, which this model, whose tower is a third the size of its language model,
does not reach at any image size a user trains on.

So the goal is not issue 47's first ">= 3" but what a cache can give: the measured ratio at
least 0.9 of the FLOP count's, i.e. the cache removes the tower's whole cost, bar a tenth.

Figures: the ratio live / cached step time, and what the FLOPs allow:
(tower forward + language model step) / language model step, counted from the config (matrix
products and attention's two products only: the tower's softmaxes, norms and activations over
1024 patches cost a CPU more than their FLOPs say, so the measured ratio can exceed it a little;
quarter depth, 448 pixels: 1.35 counted, 1.44 measured). Each
repetition times ``--steps`` steps of each path (order alternating) after a warm-up step; the
figure is the median over repetitions.
"""

from __future__ import annotations

import statistics
import time

from common import emit, figure, parser, pin_threads, reps_of

TEXT = dict(hidden=1536, mlp=8960, heads=12, kv_heads=2, vocab=151936, layers=28)
VISION = dict(width=1280, heads=16, mlp_ratio=4, layers=32, patch=14, merge=2, temporal=2)
TEXT_TOKENS = 64


def model_config(fraction: float):  # type: ignore[no-untyped-def]
    from transformers import Qwen2VLConfig

    layers, depth = max(1, round(TEXT["layers"] * fraction)), max(1, round(VISION["layers"] * fraction))
    text = dict(
        vocab_size=TEXT["vocab"],
        hidden_size=TEXT["hidden"],
        intermediate_size=TEXT["mlp"],
        num_hidden_layers=layers,
        num_attention_heads=TEXT["heads"],
        num_key_value_heads=TEXT["kv_heads"],
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
        tie_word_embeddings=True,
    )
    vision = dict(
        depth=depth,
        embed_dim=VISION["width"],
        hidden_size=TEXT["hidden"],
        num_heads=VISION["heads"],
        mlp_ratio=VISION["mlp_ratio"],
        patch_size=VISION["patch"],
        spatial_merge_size=VISION["merge"],
        temporal_patch_size=VISION["temporal"],
    )
    ids = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653)
    return Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids), layers, depth


def flops(layers: int, depth: int, patches: int, tokens: int) -> tuple[float, float]:
    """(the tower's forward, the language model's forward + backward) in FLOPs: 2 per
    multiply-add of every matrix product, attention's two products included; backward twice
    the forward."""
    h, m, kv = TEXT["hidden"], TEXT["mlp"], TEXT["kv_heads"] * TEXT["hidden"] // TEXT["heads"]
    per_token = 2 * (h * h + 2 * h * kv + h * h + 3 * h * m)  # q, k, v, o projections; gate, up, down
    lm_forward = layers * (tokens * per_token + 2 * 2 * tokens * tokens * h) + 2 * tokens * h * TEXT["vocab"]
    w = VISION["width"]
    block = 2 * (3 * w * w + w * w + 2 * w * w * VISION["mlp_ratio"])  # qkv, proj; fc1, fc2
    merged = patches // VISION["merge"] ** 2
    merger = 2 * merged * ((w * 4) ** 2 + w * 4 * h)  # the patch merger's two linears
    tower = depth * (patches * block + 2 * 2 * patches * patches * w) + merger + 2 * patches * (3 * VISION["temporal"] * VISION["patch"] ** 2) * w
    return float(tower), float(3 * lm_forward)


def main() -> None:
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    p = parser(__doc__)
    p.add_argument("--depth-fraction", type=float, default=0.25)
    p.add_argument("--image", type=int, default=448)
    p.add_argument("--steps", type=int, default=1)
    args = p.parse_args()
    if args.quick:
        args.depth_fraction = 1 / 14  # 2 decoder layers, 2 tower blocks
    pin_threads(args.threads)
    reps = reps_of(args)
    config, layers, depth = model_config(args.depth_fraction)
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config)
    model.model.visual.requires_grad_(False)
    side = args.image // VISION["patch"]
    grid = torch.tensor([[1, side, side]])
    patches = side * side
    pixels = torch.randn(patches, 3 * VISION["temporal"] * VISION["patch"] ** 2)
    image_tokens = patches // VISION["merge"] ** 2
    text = torch.randint(0, 151000, (TEXT_TOKENS,))
    ids = torch.cat(
        [
            text[: TEXT_TOKENS // 2],
            torch.tensor([config.vision_start_token_id]),
            torch.full((image_tokens,), config.image_token_id),
            torch.tensor([config.vision_end_token_id]),
            text[TEXT_TOKENS // 2 :],
        ]
    )[None]
    types = (ids == config.image_token_id).int()  # the processor's mm_token_type_ids: image tokens 1, text 0
    labels = torch.full_like(ids, -100)
    labels[0, -TEXT_TOKENS // 2 :] = ids[0, -TEXT_TOKENS // 2 :]
    labels[0, : TEXT_TOKENS // 2] = ids[0, : TEXT_TOKENS // 2]
    with torch.no_grad():
        cached = model.model.get_image_features(pixels, grid, return_dict=True)  # what extract writes

    def step(from_cache: bool) -> tuple[float, float]:
        t0 = time.perf_counter()
        inputs = {"mm_encoder_outputs": {"image": cached}} if from_cache else {"pixel_values": pixels}
        loss = model(input_ids=ids, image_grid_thw=grid, mm_token_type_ids=types, labels=labels, **inputs).loss
        loss.backward()
        model.zero_grad(set_to_none=True)  # no update: both paths keep timing the same weights
        return time.perf_counter() - t0, loss.item()

    (_, live_loss), (_, cached_loss) = step(False), step(True)  # warm-up, both paths
    assert abs(live_loss - cached_loss) <= 1e-5 * abs(live_loss), (live_loss, cached_loss)  # the same computation
    live_times, cached_times = [], []
    for rep in range(reps):
        times = {}
        for from_cache in (False, True) if rep % 2 == 0 else (True, False):
            times[from_cache] = statistics.median(step(from_cache)[0] for _ in range(args.steps))
        live_times.append(times[False])
        cached_times.append(times[True])
    tower, lm = flops(layers, depth, patches, ids.shape[1])
    shape = f"Qwen2-VL-2B widths at {layers}/28 decoder layers and {depth}/32 tower blocks, one {args.image}x{args.image} image ({patches} patches, {image_tokens} image tokens) + {TEXT_TOKENS} text tokens, fp32, {args.threads} threads"
    emit(
        figure(
            "caches/qwen2vl-2b-widths",
            "Qwen2-VL-2B-shaped train step: frozen vision tower from the cache vs run every step",
            "s/step",
            cached_times,
            live_times,
            baseline_name="frozen vision tower every step",
            how=f"{shape}; median of {args.steps} steps a repetition, {reps} repetitions alternating; losses equal",
            ratio_is="baseline/mmcore",
            goal=(">=", round(0.9 * (tower + lm) / lm, 3)),
            flops_ratio=round((tower + lm) / lm, 3),
            tower_share_of_flops=round(tower / (tower + lm), 3),
        )
    )
    print(f"# FLOPs: tower forward {tower / 1e12:.3f} T, language model step {lm / 1e12:.3f} T: {(tower + lm) / lm:.2f}x by the count at these shapes")


if __name__ == "__main__":
    main()
