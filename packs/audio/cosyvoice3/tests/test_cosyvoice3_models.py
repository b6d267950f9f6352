"""The three models on the tiny checkpoint: the LM's teacher-forced loss, the flow's CFM loss,
the vocoder's waveform length, and text -> speech tokens -> mel -> a wav file."""

from __future__ import annotations

import wave
from pathlib import Path

import torch
import torch.nn.functional as F

from mm_pack_cosyvoice3.lm import IGNORE_ID


def test_lm_teacher_forced_loss_is_the_mean_cross_entropy_of_speech_tokens(tiny_model) -> None:  # type: ignore[no-untyped-def]
    lm = tiny_model.llm
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 100, (2, 6), generator=g)
    text_len = torch.tensor([6, 4])
    speech = torch.randint(0, 64, (2, 9), generator=g)
    speech_len = torch.tensor([9, 5])
    out = lm(text, text_len, speech, speech_len)
    target = out["target"]
    # sos + text + task_id are ignored; then the speech tokens and eos (S + 1) are predicted
    assert target[1, : 1 + 4 + 1 - 1].eq(IGNORE_ID).all() and target[1, 1 + 4 : 1 + 4 + 5].tolist() == speech[1, :5].tolist()
    assert target[1, 1 + 4 + 5].item() == lm.eos_token == 65
    keep = target != IGNORE_ID
    expected = F.cross_entropy(out["logits"][keep], target[keep])
    torch.testing.assert_close(out["loss"], expected)
    assert torch.isfinite(out["loss"]) and 0 < out["loss"].item() < 2 * torch.log(torch.tensor(264.0)).item()
    out["loss"].backward()
    assert lm.speech_embedding.weight.grad is not None and lm.llm.model.model.layers[0].self_attn.q_proj.weight.grad is not None
    lm.zero_grad(set_to_none=True)


def test_lm_bistream_sequences_interleave_5_text_and_15_speech_tokens(tiny_model) -> None:  # type: ignore[no-untyped-def]
    import random

    lm = tiny_model.llm
    text, speech = torch.randint(0, 100, (1, 7)), torch.randint(0, 64, (1, 30))
    inst = torch.randint(0, 100, (1, 2))
    args = (text, torch.tensor([7]), speech, torch.tensor([30]), inst, torch.tensor([2]))
    with torch.no_grad():
        embeds, lengths, target = lm.build_inputs(*args, rng=random.Random(1))  # first draw 0.13: bistream
        s = speech[0].tolist()
        expected = [IGNORE_ID] * 3 + [IGNORE_ID] * 4 + s[:15] + [lm.fill_token] + [IGNORE_ID] * 2 + s[15:] + [lm.eos_token]
        assert target[0].tolist() == expected and int(lengths[0]) == len(expected) == 41
        torch.testing.assert_close(embeds[0, 3 + 5 : 3 + 5 + 15], lm.speech_embedding(speech[0, :15]))  # after 5 text tokens
        torch.testing.assert_close(embeds[0, 3 + 20 + 2], lm.speech_embedding.weight[lm.task_id])  # the last text, then task_id
        unistream = lm.build_inputs(*args, rng=random.Random(0))[2]  # first draw 0.84: unistream
        assert torch.equal(unistream, lm.build_inputs(*args)[2])
        assert torch.isfinite(lm(*args, rng=random.Random(1))["loss"])


def test_lm_padding_does_not_change_an_utterances_logits(tiny_model) -> None:  # type: ignore[no-untyped-def]
    lm = tiny_model.llm
    text, speech = torch.randint(0, 100, (1, 5)), torch.randint(0, 64, (1, 7))
    alone = lm(text, torch.tensor([5]), speech, torch.tensor([7]))["logits"]
    padded = lm(torch.cat([text, torch.zeros(1, 3, dtype=torch.long)], 1).repeat(2, 1), torch.tensor([5, 8]), torch.cat([speech, speech], 0), torch.tensor([7, 7]))["logits"]
    torch.testing.assert_close(padded[0, : alone.shape[1]], alone[0], atol=1e-5, rtol=1e-5)


def test_lm_kv_cached_greedy_decoding_matches_full_recompute(tiny_model) -> None:  # type: ignore[no-untyped-def]
    lm = tiny_model.llm
    text = torch.randint(0, 100, (1, 4), generator=torch.Generator().manual_seed(1))
    tokens = list(lm.generate(text, sampling="greedy", min_token_text_ratio=2, max_token_text_ratio=3))
    assert 8 <= len(tokens) <= 12 and all(0 <= t < 64 for t in tokens)
    with torch.no_grad():  # the same tokens by re-running the whole prefix each step (no cache)
        embeds = lm.prompt_embeds(text)
        for i, token in enumerate(tokens):
            hidden = lm.llm(embeds, torch.tensor([embeds.shape[1]]))
            logp = lm.llm_decoder(hidden[:, -1]).log_softmax(-1)[0]
            if i < 8:
                logp[64:] = -float("inf")
            assert int(logp.argmax()) == token
            embeds = torch.cat([embeds, lm.speech_embedding.weight[token].reshape(1, 1, -1)], 1)


def test_lm_sampling_is_seeded(tiny_model) -> None:  # type: ignore[no-untyped-def]
    text = torch.randint(0, 100, (1, 3), generator=torch.Generator().manual_seed(2))

    def run(seed: int) -> list[int]:
        return list(tiny_model.llm.generate(text, sampling="ras", generator=torch.Generator().manual_seed(seed), max_token_text_ratio=4))

    assert run(0) == run(0)
    assert all(0 <= t < 64 for t in run(1))


def test_flow_cfm_loss_trains_and_inference_has_two_mel_frames_per_token(tiny_model) -> None:  # type: ignore[no-untyped-def]
    flow = tiny_model.flow
    g = torch.Generator().manual_seed(0)
    token, token_len = torch.randint(0, 64, (2, 10), generator=g), torch.tensor([10, 7])
    feat, feat_len = torch.randn(2, 20, 80, generator=g), token_len * 2
    emb = torch.randn(2, 16, generator=g)
    flow.train()
    loss = flow(token, token_len, feat, feat_len, emb, generator=torch.Generator().manual_seed(3))["loss"]
    again = flow(token, token_len, feat, feat_len, emb, generator=torch.Generator().manual_seed(3))["loss"]
    assert torch.isfinite(loss) and loss.item() > 0 and torch.equal(loss, again)
    loss.backward()
    assert flow.decoder.estimator.transformer_blocks[0].attn.to_q.weight.grad is not None
    flow.zero_grad(set_to_none=True)
    flow.eval()
    mel = flow.inference(token[:1, :6], token[:1, :3], feat[:1, :6], emb[:1], n_timesteps=3)
    assert mel.shape == (1, 80, 12) and torch.isfinite(mel).all()
    streamed = flow.inference(token[:1, :6], token[:1, :3], feat[:1, :6], emb[:1], n_timesteps=3, streaming=True)
    assert streamed.shape == mel.shape  # 18 frames < one 50-frame chunk: the same attention
    torch.testing.assert_close(streamed, mel)


def test_vocoder_turns_a_mel_into_480_samples_per_frame(tiny_model) -> None:  # type: ignore[no-untyped-def]
    hift = tiny_model.hift.eval()
    mel = torch.randn(1, 80, 7, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        wav, f0 = hift(mel)
        again, _ = hift(mel)
    assert wav.shape == (1, 7 * 480) and f0.shape == (1, 7)
    assert torch.isfinite(wav).all() and wav.abs().max() <= 0.99 and wav.std() > 0
    assert torch.equal(wav, again)  # eval-mode excitation noise is fixed, as in the reference
    assert hift.f0_predictor.classifier.weight.dtype == torch.float32  # float64 f0 did not cast the module


def test_text_to_wav_end_to_end(tiny_dir: Path, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from mm_pack_cosyvoice3.synth import synthesize, write_wav

    tok = AutoTokenizer.from_pretrained(tiny_dir / "CosyVoice-BlankEN")
    ids = tok("You are a helpful assistant.<|endofprompt|>hello world").input_ids
    assert tok.convert_tokens_to_ids("<|endofprompt|>") in ids
    for sampling, generator in (("greedy", None), ("ras", torch.Generator().manual_seed(0))):
        speech = synthesize(tiny_model, ids, sampling=sampling, generator=generator, n_timesteps=2, max_token_text_ratio=3)
        n = len(speech.tokens)
        assert 2 * len(ids) <= n <= 3 * len(ids)
        assert speech.mel.shape == (1, 80, 2 * n) and speech.wav.shape == (2 * n * 480,)
        path = write_wav(tmp_path / f"{sampling}.wav", speech.wav, speech.sample_rate)
        with wave.open(str(path)) as w:
            assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 24000, 2 * n * 480)
