"""Preference pairs and the DPO loss (mmcore.train.preference): LLaMA-Factory's ranking formats as
they are written, bad pairs named, and the loss and its gradients against a direct
implementation. The DPO demo (held-out reward accuracy 0.5 -> >= 0.9) is qwen2vl's test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from mmcore.data.badsamples import BadSample  # noqa: E402
from mmcore.data.mllm import MLLMDataSection  # noqa: E402
from mmcore.train.preference import Pair, dpo_terms, read_pairs, reward_sums, sequence_logps  # noqa: E402


def write(path: Path, records: list) -> Path:  # type: ignore[type-arg]
    path.write_text(json.dumps(records))
    return path


def test_llama_factory_ranking_formats_read_as_two_samples_differing_in_the_answer(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"png")
    sharegpt = write(
        tmp_path / "sharegpt.json",
        [
            {
                "conversations": [{"from": "human", "value": "<image>What is it?"}],
                "chosen": {"from": "gpt", "value": "A cat."},
                "rejected": {"from": "gpt", "value": "A dog."},
                "images": ["a.png"],
                "system": "Be brief.",
            },
            {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}, {"from": "human", "value": "2+2?"}], "chosen": "4", "rejected": "5"},
        ],
    )
    alpaca = write(tmp_path / "alpaca.json", [{"instruction": "Add", "input": "2 and 2", "chosen": "4", "rejected": "22"}])
    messages = write(tmp_path / "messages.jsonl", [])
    messages.write_text(
        json.dumps({"messages": [{"role": "user", "content": "Colour?"}], "chosen": {"role": "assistant", "content": "red"}, "rejected": {"role": "assistant", "content": "blue"}}) + "\n"
    )
    section = MLLMDataSection(ranking=True)
    first, second = list(read_pairs(sharegpt, section))
    assert isinstance(first, Pair) and [t.role for t in first.chosen.turns] == ["system", "user", "assistant"]
    assert first.chosen.turns[:-1] == first.rejected.turns[:-1] and (first.chosen.turns[-1].content, first.rejected.turns[-1].content) == ("A cat.", "A dog.")
    assert first.chosen.images == first.rejected.images == [(tmp_path / "a.png").resolve()]
    assert [t.role for t in second.rejected.turns] == ["user", "assistant", "user", "assistant"] and second.rejected.turns[-1].content == "5"
    (pair,) = read_pairs(alpaca, section)
    assert pair.chosen.turns[0].content == "Add\n2 and 2" and pair.rejected.turns[-1].content == "22"  # LLaMA-Factory joins them so
    (pair,) = read_pairs(messages, section)
    assert (pair.chosen.turns[-1].content, pair.rejected.turns[-1].content) == ("red", "blue")


def test_bad_pairs_are_named(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"png")
    bad = write(
        tmp_path / "bad.json",
        [
            {"conversations": [{"from": "human", "value": "Q"}], "chosen": "yes"},
            {"conversations": [{"from": "human", "value": "Q"}], "chosen": "same", "rejected": " same"},
            {"conversations": [{"from": "human", "value": "<image>Q"}], "chosen": "a", "rejected": "<image>b", "images": ["a.png"]},
            {"conversations": [{"from": "human", "value": "<image>Q"}], "chosen": "a", "rejected": "b", "images": []},
            {"conversations": [{"from": "human", "value": "Q"}], "chosen": {"from": "gpt"}, "rejected": "b"},
            {"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}], "chosen": "a", "rejected": "b"},
            {"answer": "no prompt"},
        ],
    )
    found = list(read_pairs(bad, MLLMDataSection(ranking=True)))
    assert all(isinstance(b, BadSample) for b in found)
    reasons = [b.reason for b in found]  # type: ignore[union-attr]
    assert reasons == [
        "field 'rejected' is missing: a preference pair needs a chosen and a rejected answer",
        "chosen and rejected are the same answer",
        "the rejected answer holds a <image> placeholder: media belong to the prompt, the same for both answers",
        "1 <image> placeholder(s) but 0 images",
        "field 'chosen' is missing or is neither a string nor a message with 'value'",
        "turn 2 is from assistant, expected user (turns alternate, user first)",
        "no prompt: neither 'conversations' nor 'instruction'",
    ]


def direct_logps(logits, labels) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Sum of log p(label) over supervised next tokens, one sequence at a time, position by position."""
    out = []
    for row in range(labels.shape[0]):
        total = torch.zeros(())
        for t in range(labels.shape[1] - 1):
            if labels[row, t + 1] != -100:
                total = total + torch.log_softmax(logits[row, t].double(), -1)[labels[row, t + 1]].float()
        out.append(total)
    return torch.stack(out)


def tiny_lm(seed: int):  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.Qwen2ForCausalLM(config)


def test_dpo_loss_and_gradients_equal_a_direct_implementation() -> None:
    """Two pairs, right-padded rows (chosen, chosen, rejected, rejected), prompt tokens unsupervised."""
    policy, reference = tiny_lm(0), tiny_lm(1)
    ids = torch.tensor([[3, 7, 9, 11, 4, 0], [5, 6, 8, 12, 13, 2], [3, 7, 9, 15, 0, 0], [5, 6, 8, 17, 18, 19]])
    mask = (torch.arange(6)[None] < torch.tensor([[5], [6], [4], [6]])).long()
    labels = torch.where(mask.bool(), ids, -100)
    labels[:, :3] = -100  # the prompt
    beta, n = 0.3, 2

    def ours() -> torch.Tensor:
        sums, counts = sequence_logps(policy(input_ids=ids, attention_mask=mask).logits, labels)
        with torch.no_grad():
            ref, _ = sequence_logps(reference(input_ids=ids, attention_mask=mask).logits, labels)
        losses, chosen, rejected = dpo_terms(sums[:n], sums[n:], ref[:n], ref[n:], beta)
        assert counts.tolist() == [2, 3, 1, 3]
        return losses.sum()

    def direct() -> torch.Tensor:
        pi = direct_logps(policy(input_ids=ids, attention_mask=mask).logits, labels)
        with torch.no_grad():
            ref = direct_logps(reference(input_ids=ids, attention_mask=mask).logits, labels)
        logits = beta * ((pi[0:2] - ref[0:2]) - (pi[2:4] - ref[2:4]))
        return -torch.nn.functional.logsigmoid(logits).sum()

    a = ours()
    a.backward()
    grads = {k: p.grad.clone() for k, p in policy.named_parameters()}
    policy.zero_grad()
    b = direct()
    b.backward()
    # The same formula summed in another order (and log-softmax in float64 above): equal to fp32 rounding.
    assert float(a.detach()) == pytest.approx(float(b.detach()), rel=1e-5)
    for name, p in policy.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_packed_rows_give_each_segment_its_own_sum() -> None:
    logits = torch.randn(1, 9, 7, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[-100, 2, 3, -100, -100, 5, 6, 1, -100]])  # two segments: 3 and 6 tokens
    sums, counts = sequence_logps(logits, labels, torch.tensor([3, 6]))
    padded = torch.full((2, 6), -100)
    padded[0, :3], padded[1, :6] = labels[0, :3], labels[0, 3:]
    rows = torch.zeros(2, 6, 7)
    rows[0, :3], rows[1, :6] = logits[0, :3], logits[0, 3:]
    expected, expected_counts = sequence_logps(rows, padded)
    torch.testing.assert_close(sums, expected)
    assert counts.tolist() == expected_counts.tolist() == [2, 3]


def test_reward_accuracy_counts_a_tie_as_half() -> None:
    sums = reward_sums(torch.tensor([0.0, 1.0, -1.0]), torch.tensor([0.0, 0.5, 0.0]))
    assert float(sums["rewards/accuracy"]) == 1.5 and float(sums["rewards/margin"]) == pytest.approx(-0.5)


def test_diffusion_dpo_loss_and_gradients_equal_a_direct_implementation() -> None:
    """The kit's Diffusion-DPO (reference = the LoRA base with adapters off) against the
    paper's formula with an explicit frozen copy of the base as the reference."""
    pytest.importorskip("peft")
    import copy

    from mmcore.config import LoraSection
    from mmcore.kits.diffusion import FLOW_MATCHING
    from mmcore.kits.diffusion_dpo import TIMESTEPS, diffusion_dpo_terms
    from mmcore.train.lora import init_adapters, inject, plan_lora

    class Denoiser(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(12, 12), torch.nn.Linear(12, 12)])

        def forward(self, x, text):  # type: ignore[no-untyped-def]
            h = x.flatten(1) + text
            for block in self.blocks:
                h = h + torch.tanh(block(h))
            return h.view_as(x)

    torch.manual_seed(0)
    model = Denoiser()
    base = copy.deepcopy(model)
    plan = plan_lora(model, LoraSection(r=2, alpha=4.0), groups={}, default_targets=(), blocks=list(model.blocks), frozen=[])
    inject(model, plan)
    init_adapters(model, plan, 0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)

    def predict(m, noisy, sigma, text):  # type: ignore[no-untyped-def]
        return m(noisy, text)

    g = torch.Generator().manual_seed(1)
    winners, losers = torch.randn(3, 3, 4, generator=g), torch.randn(3, 3, 4, generator=g)
    text, noise = torch.randn(3, 12, generator=g), torch.randn(3, 3, 4, generator=g)
    sigma = torch.tensor([0.2, 0.5, 0.9])
    beta = 0.01
    losses, inside = diffusion_dpo_terms(FLOW_MATCHING, predict, model, winners, losers, text, sigma, noise, beta)
    losses.sum().backward()
    ours = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    def err(m, x):  # type: ignore[no-untyped-def]
        s = sigma.view(-1, 1, 1)
        return ((m((1 - s) * x + s * noise, text) - (noise - x)) ** 2).mean(dim=(1, 2))

    with torch.no_grad():
        ref_w, ref_l = err(base, winners), err(base, losers)
    direct = -torch.nn.functional.logsigmoid(-beta * TIMESTEPS / 2 * ((err(model, winners) - ref_w) - (err(model, losers) - ref_l)))
    direct.sum().backward()
    torch.testing.assert_close(losses.detach(), direct.detach(), rtol=1e-5, atol=1e-7)
    assert set(ours) == {k for k, p in model.named_parameters() if p.grad is not None} and ours
    for name, p in model.named_parameters():
        if name in ours:
            torch.testing.assert_close(ours[name], p.grad, rtol=1e-4, atol=1e-7, msg=name)
    assert not torch.equal(inside, torch.zeros(3))  # the adapters moved the policy away from the reference


def test_caption_pairs_are_read_and_bad_ones_named(tmp_path: Path) -> None:
    from mmcore.data.captions import read_caption_pairs

    for name in ("w.mp4", "l.mp4"):
        (tmp_path / name).write_bytes(b"mp4")
    found = list(
        read_caption_pairs(
            write(
                tmp_path / "pairs.json",
                [
                    {"cap": "a red square", "chosen": "w.mp4", "rejected": "l.mp4"},
                    {"caption": "x", "chosen": "w.mp4"},
                    {"cap": "x", "chosen": "w.mp4", "rejected": "w.mp4"},
                    {"cap": "x", "chosen": "../w.mp4", "rejected": "l.mp4"},
                    {"chosen": "w.mp4", "rejected": "l.mp4"},
                ],
            )
        )
    )
    assert found[0].chosen == (tmp_path / "w.mp4").resolve() and found[0].caption == "a red square"  # type: ignore[union-attr]
    assert [b.reason for b in found[1:]] == [  # type: ignore[union-attr]
        "needs a string 'rejected' path",
        "chosen and rejected are the same file",
        f"chosen path '../w.mp4' escapes the dataset folder {tmp_path.resolve()}",
        "needs a caption 'cap'",
    ]
