"""The caption-agreement checker of the synthetic demos (mmcore.data.caption_agreement): what
the demo writers draw agrees with its own caption and not with another's; static, blank and
non-demo captions are not judged as agreeing."""

from __future__ import annotations

import random

import numpy as np

from mmcore.data import COLOURS, MOVES, MOVING_SHAPES, SHAPE_COLOURS, SHAPES, caption_agreement, moving_shape, shape_image, what_is_drawn


def test_moving_shapes_agree_with_their_caption_and_not_with_others() -> None:
    rng = random.Random(0)
    for colour in SHAPE_COLOURS:
        for shape in MOVING_SHAPES:
            for move in MOVES:
                clip = moving_shape(shape, SHAPE_COLOURS[colour], MOVES[move], rng)
                assert caption_agreement(clip, f"a {colour} {shape} moves {move}")["agrees"], (colour, shape, move, what_is_drawn(clip))
                other_way = next(m for m in MOVES if m != move)
                other_colour = next(c for c in SHAPE_COLOURS if c != colour)
                assert not caption_agreement(clip, f"a {colour} {shape} moves {other_way}")["agrees"]
                assert not caption_agreement(clip, f"a {other_colour} {shape} moves {move}")["agrees"]
                assert "shape" not in caption_agreement(clip, f"a {colour} {shape} moves {move}")  # 12 px: not judged


def test_pictures_agree_on_colour_and_shape() -> None:
    rng = random.Random(1)
    for colour in COLOURS:
        for shape in SHAPES:
            picture = np.asarray(shape_image(shape, COLOURS[colour], rng, size=64, radius=(16, 26)))
            result = caption_agreement(picture[None], f"a {colour} {shape}")
            assert result["agrees"] and result["shape"], (colour, shape, result)


def test_static_and_other_captions_are_not_judged_as_agreeing() -> None:
    static = np.random.default_rng(0).integers(100, 156, (9, 32, 32, 3)).astype(np.uint8)  # grey noise
    assert caption_agreement(static, "a red square moves left")["agrees"] is False
    assert caption_agreement(np.full((9, 32, 32, 3), 255, np.uint8), "a blue circle moves up")["agrees"] is False
    assert caption_agreement(static, "a cat walks across the room") is None
    assert caption_agreement(static, "a purple square moves left") is None
