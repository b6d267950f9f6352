"""The talker: the teacher-forced loss on a padded batch, and KV-cached code generation equal to
a full recompute of the same sequence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mm_pack_qwen3tts.speech import Sampling, embed, generate_codes, layout, loss

TEXT = [280, 7, 8, 11, 12, 13, 14]  # role (3 ids) + text
SPEAKER = 36


def _frames(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 32, (n, 4), generator=torch.Generator().manual_seed(seed))


def test_the_layout_is_the_reference_non_streaming_one(tiny_model) -> None:  # type: ignore[no-untyped-def]
    ids = tiny_model.ids
    lay = layout(ids, TEXT, _frames(3, 0), speaker=SPEAKER)
    assert lay.text.tolist() == TEXT[:3] + [290] * 4 + [291] + TEXT[3:] + [292] + [290] * 5
    assert lay.codec.tolist() == [-1] * 3 + [47, 48, 49, 36, 40] + [40] * 5 + [41] + [-1] * 3 + [42]
    assert lay.first_frame == 14 and lay.speaker_at == 6
    with_language = layout(ids, TEXT, speaker=None, language=34)
    assert with_language.codec.tolist()[3:8] == [46, 48, 34, 49, 40]
    streaming = layout(ids, TEXT, _frames(5, 0), speaker=SPEAKER, streaming=True)
    assert streaming.text.tolist() == TEXT[:3] + [290] * 4 + [291] + TEXT[3:4] + TEXT[4:] + [292] + [290] * 2
    assert streaming.codec.tolist() == [-1] * 3 + [47, 48, 49, 36, 40] + [41] + [-1] * 5 + [42]
    assert streaming.first_frame == 9 and streaming.trailing == TEXT[4:] + [292]


def test_loss_is_the_mean_cross_entropy_of_the_next_frame_and_is_padding_invariant(tiny_model) -> None:  # type: ignore[no-untyped-def]
    talker, ids = tiny_model.talker, tiny_model.ids
    short, long = layout(ids, TEXT, _frames(3, 1), speaker=SPEAKER), layout(ids, TEXT + [20, 21], _frames(5, 2), language=34)
    batch = loss(talker, [short, long])
    # by hand, one sequence at a time: position p predicts codebook 0 of position p + 1
    logits = talker.codec_head(talker.hidden(embed(talker, short)[None]))[0]
    targets = torch.cat([short.frames[:, 0], torch.tensor([42])])
    first = short.first_frame
    ce = F.cross_entropy(logits[first - 1 : first + 3], targets)
    alone = loss(talker, [short])
    torch.testing.assert_close(alone["talker_loss"], ce, rtol=1e-5, atol=1e-6)
    n_short, n_long = 4, 6  # codebook-0 targets, eos included
    mixed = (alone["talker_loss"] * n_short + loss(talker, [long])["talker_loss"] * n_long) / (n_short + n_long)
    torch.testing.assert_close(batch["talker_loss"], mixed, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(batch["loss"], batch["talker_loss"] + 0.3 * batch["sub_talker_loss"])
    batch["loss"].backward()
    assert talker.code_predictor.lm_head[2].weight.grad.abs().sum() > 0
    assert talker.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    talker.zero_grad(set_to_none=True)


def test_the_code_predictor_accuracy_counts_what_its_greedy_steps_pick_on_the_target_frames(tiny_model) -> None:  # type: ignore[no-untyped-def]
    talker, ids = tiny_model.talker, tiny_model.ids
    short, long = layout(ids, TEXT, _frames(3, 1), speaker=SPEAKER), layout(ids, TEXT + [20, 21], _frames(5, 2), language=34)
    out = loss(talker, [short, long])
    picked_right = 0
    with torch.no_grad():
        for lay in (short, long):  # decoding's own steps (generate_codes), each fed the target's codes
            hidden = talker.hidden(embed(talker, lay)[None])
            for p, frame in enumerate(lay.frames.tolist()):
                h = hidden[:, lay.first_frame - 1 + p][:, None]
                sub_in, cache = torch.cat([h, talker.model.codec_embedding(torch.tensor([[frame[0]]]))], dim=1), None
                for k in range(1, talker.groups):
                    sub_hidden, cache = talker.code_predictor.step(sub_in, cache)
                    picked_right += int(talker.code_predictor.lm_head[k - 1](sub_hidden[0, -1]).argmax()) == frame[k]
                    sub_in = talker.code_predictor.embed(k, torch.tensor([[frame[k]]]))
    assert out["sub_targets"] == (3 + 5) * (talker.groups - 1)
    assert int(out["sub_hits"]) == picked_right


@pytest.mark.parametrize("streaming", [False, True])
def test_kv_cached_greedy_generation_equals_a_full_recompute(tiny_model, streaming: bool) -> None:  # type: ignore[no-untyped-def]
    talker, ids = tiny_model.talker, tiny_model.ids
    codes = generate_codes(talker, ids, TEXT, speaker=SPEAKER, max_frames=6, repetition_penalty=1.0, streaming=streaming)
    assert codes.shape[1] == 4 and 2 <= len(codes) <= 6 and int(codes.max()) < 32
    lay = layout(ids, TEXT, codes, speaker=SPEAKER, streaming=streaming)
    with torch.no_grad():
        hidden = talker.hidden(embed(talker, lay)[None])[0]
        logits = talker.codec_head(hidden)
        logits[:, 32:] = float("-inf")  # the suppressed ids ...
        logits[:, 42] = talker.codec_head(hidden)[:, 42]  # ... but eos
        before = torch.arange(lay.first_frame - 1, lay.first_frame - 1 + len(codes))
        steps = logits[before]
        steps[:2, 42] = float("-inf")  # eos masked for the first two frames
        assert steps.argmax(-1).tolist() == codes[:, 0].tolist()
        sub = talker.code_predictor.teacher_forced_logits(hidden[before], codes, talker.model.codec_embedding(codes[:, 0]))
        assert sub.argmax(-1).tolist() == codes[:, 1:].tolist()


def test_sampled_generation_is_seeded(tiny_model) -> None:  # type: ignore[no-untyped-def]
    talker, ids = tiny_model.talker, tiny_model.ids

    def draw(seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return generate_codes(talker, ids, TEXT, language=34, max_frames=5, sampling=Sampling(), sub_sampling=Sampling(), generator=gen)

    a, b = draw(3), draw(3)
    assert torch.equal(a, b) and len(a) >= 2 and int(a.max()) < 32
