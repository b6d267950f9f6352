"""Encoded samples: media fields join only when their shapes agree."""

from __future__ import annotations

import numpy as np
import pytest

from mmcore.data.chatml import Encoded


def test_media_items_of_one_kind_join_along_their_first_axis() -> None:
    enc = Encoded([1, 2], [1, 2], {"pixel_values": [np.ones((4, 6)), np.zeros((2, 6))], "image_grid_thw": [[1, 2, 2], [1, 1, 2]]})
    assert tuple(enc.tensors["pixel_values"].shape) == (6, 6)
    assert enc.tensors["image_grid_thw"].tolist() == [1, 2, 2, 1, 1, 2]


@pytest.mark.parametrize("items", [[np.ones((4, 6)), np.ones((4, 5))], [np.ones(6), np.ones(6)]])
def test_media_items_that_cannot_join_are_an_error_naming_the_field(items: list) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match="media field 'pixel_values': items of shapes"):
        Encoded([1], [1], {"pixel_values": items}).tensors
