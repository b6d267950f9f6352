"""GRPO's parts without a model: the loss and its gradients against a direct float64 implementation
of the formula, group advantages, the reference answer's span, the built-in rewards and what a
failing reward function says. (A whole run: packs/vlm/qwen2vl/tests/test_qwen2vl_grpo.py.)"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mmcore.errors import StageError, UsageError  # noqa: E402
from mmcore.framework.registry import Registry, RewardSpec  # noqa: E402
from mmcore.train.grpo import IGNORE, answer_span, group_advantages, grpo_terms, token_entropy, token_logps  # noqa: E402
from mmcore.train.rewards import RewardSet, accuracy, edit_distance, exact, format_match, length, similarity  # noqa: E402


def direct_entropy(logits):  # type: ignore[no-untyped-def]
    """Each position's next-token entropy [rows][T-1], in float64 Python from the logits' lists."""
    out = []
    for row in logits:
        out.append([])
        for scores in row[:-1]:
            top = max(scores)
            z = sum(math.exp(s - top) for s in scores)
            probs = [math.exp(s - top) / z for s in scores]
            out[-1].append(-sum(p * math.log(p) for p in probs))
    return out


def direct_loss(logps, old, ref, adv, mask, eps, beta, averaging, entropy=None, coef=0.0):  # type: ignore[no-untyped-def]
    """The formula written out token by token in float64 Python (no torch ops)."""
    per_answer, total, units = [], 0.0, 0
    for i in range(len(logps)):
        row_sum, row_count = 0.0, 0
        for t in range(len(logps[i])):
            if not mask[i][t]:
                continue
            ratio = math.exp(logps[i][t] - old[i][t])
            clipped = min(max(ratio, 1 - eps), 1 + eps)
            value = -min(ratio * adv[i], clipped * adv[i])
            if beta:
                d = ref[i][t] - logps[i][t]
                value += beta * (math.exp(d) - d - 1)
            if coef:
                value -= coef * entropy[i][t]
            row_sum += value
            row_count += 1
        per_answer.append(row_sum / max(row_count, 1))
        total += row_sum
        units += row_count
    return (total, units) if averaging == "token" else (sum(per_answer), len(logps))


@pytest.mark.parametrize("averaging", ["token", "sequence"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("coef", [0.0, 0.05])
def test_grpo_loss_and_gradients_equal_the_formula_in_float64(averaging: str, beta: float, coef: float) -> None:
    gen = torch.Generator().manual_seed(3)
    rows, length_ = 6, 5
    logits = torch.randn(rows, length_ + 1, 11, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 11, (rows, length_ + 1), generator=gen)
    labels[:, :2] = IGNORE  # the prompt
    labels[1, 4:] = IGNORE  # a shorter answer
    policy = logits.clone().requires_grad_(True)
    logps, mask = token_logps(policy, labels)
    logps = logps.double()
    # the sampling policy a little away from the current one, so that some ratios leave the clip range
    old = (logps.detach() + 0.3 * torch.randn(logps.shape, generator=gen, dtype=torch.float64)).detach()
    ref = (logps.detach() + 0.2 * torch.randn(logps.shape, generator=gen, dtype=torch.float64)).detach()
    adv = torch.tensor([1.0, -0.5, 0.25, -1.5, 0.0, 2.0], dtype=torch.float64)
    entropy = token_entropy(policy)
    terms = grpo_terms(logps, mask.double(), adv, old_logps=old, ref_logps=ref, epsilon=0.2, beta=beta, averaging=averaging, entropy=entropy, entropy_coef=coef)
    expected, units = direct_loss(logps.tolist(), old.tolist(), ref.tolist(), adv.tolist(), mask.tolist(), 0.2, beta, averaging, direct_entropy(logits.tolist()), coef)
    assert terms.units == units
    assert float(terms.loss_sum.detach()) == pytest.approx(expected, rel=1e-12)  # the same float64 sums: rounding only
    assert 0 < float(terms.clipped_sum) < float(terms.tokens)  # both branches are exercised

    # gradient: the formula differentiated numerically (central differences in float64) at a few logits
    terms.loss_sum.backward()

    def loss_at(values):  # type: ignore[no-untyped-def]
        lp, m = token_logps(values, labels)
        return direct_loss(lp.double().tolist(), old.tolist(), ref.tolist(), adv.tolist(), m.tolist(), 0.2, beta, averaging, direct_entropy(values.tolist()), coef)[0]

    for index in [(0, 2, 3), (1, 3, 0), (3, 4, 7), (5, 1, 10)]:
        h = 1e-6
        plus, minus = logits.clone(), logits.clone()
        plus[index] += h
        minus[index] -= h
        numeric = (loss_at(plus) - loss_at(minus)) / (2 * h)
        assert float(policy.grad[index]) == pytest.approx(numeric, rel=1e-5, abs=1e-8)


def test_the_first_step_on_a_rollout_is_the_policy_gradient() -> None:
    """Without the sampling policy's log-probabilities (training.grpo.epochs 1) the ratio is 1:
    the loss is -sum(A * 1) and its gradient -A times the log-probability's."""
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    terms = grpo_terms(logps, mask, torch.tensor([2.0, -1.0]))
    assert float(terms.loss_sum) == pytest.approx(-(2.0 * 2 - 1.0))
    terms.loss_sum.backward()
    assert logps.grad.tolist() == [[-2.0, -2.0], [1.0, 0.0]]
    assert float(terms.kl_sum) == 0 and float(terms.clipped_sum) == 0


def test_group_advantages_are_each_groups_own() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    adv = group_advantages(rewards, 4)
    first = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert torch.allclose(adv[:4], (first - 0.25) / (first.std() + 1e-4))
    assert adv[4:].tolist() == [0.0] * 4  # a group whose answers are all alike teaches nothing
    assert group_advantages(rewards, 4, scale=False)[:4].tolist() == [0.75, -0.25, -0.25, -0.25]


def test_the_reference_is_the_last_assistant_turn() -> None:
    labels = torch.tensor([IGNORE, IGNORE, 5, 6, IGNORE, IGNORE, 7, 8, 9, IGNORE])
    assert answer_span(labels) == (6, 9)
    assert answer_span(torch.full((4,), IGNORE)) is None


def test_built_in_rewards() -> None:
    refs = ["Red", "blue", None]
    assert accuracy(["red.", "<think>hm</think><answer>the blue</answer>", "x"], refs, ["", "", ""]) == [1.0, 1.0, 0.0]
    assert exact(["Red ", "Blue", "x"], refs, ["", "", ""]) == [1.0, 0.0, 0.0]
    assert format_match(["<think>a</think> <answer>b</answer>", "b"], [None, None], ["", ""]) == [1.0, 0.0]
    assert length(["Red", "blue blue", "long answer"], refs, ["", "", ""]) == [0.0, -1.0, 0.0]
    # partial credit on the way to the answer: "yel" is half of "yellow"; normalised as accuracy is
    assert similarity(["yel", "Yellow.", "<answer>the yellowish</answer>", "red", "x"], ["yellow"] * 4 + [None], [""] * 5) == pytest.approx([0.5, 1.0, 1 - 3 / 9, 1 - 5 / 6, 0.0])
    assert edit_distance("kitten", "sitting") == 3 and edit_distance("", "abc") == 3


def registry_with(**impls: str) -> Registry:
    registry = Registry()
    for name, impl in {"accuracy": "mmcore.train.rewards:accuracy", **impls}.items():
        registry.add_reward(RewardSpec(name, impl), "test")
    return registry


def raises_value_error(**_):  # type: ignore[no-untyped-def]
    raise ValueError("the verifier is down")


def returns_one(completions, **_):  # type: ignore[no-untyped-def]
    return [1.0]


def returns_nan(completions, **_):  # type: ignore[no-untyped-def]
    return [float("nan")] * len(completions)


def test_reward_set_weights_and_one_line_errors() -> None:
    rewards = RewardSet(registry_with(), {"accuracy": 2.0})
    totals, each = rewards.score(["red", "blue"], ["red", "red"], ["q", "q"])
    assert totals == [2.0, 0.0] and each == {"accuracy": [1.0, 0.0]}
    with pytest.raises(UsageError, match="unknown reward function 'verifier'; known: accuracy"):
        RewardSet(registry_with(), {"verifier": 1.0})
    with pytest.raises(StageError, match="cannot be imported"):
        RewardSet(registry_with(gone="no_such_module:f"), {"gone": 1.0})
    for impl, message in (
        ("raises_value_error", "reward 'bad' raised ValueError: the verifier is down"),
        ("returns_one", "reward 'bad' returned 1 value\\(s\\) for 2 answer\\(s\\)"),
        ("returns_nan", "reward 'bad' returned nan \\(rewards must be finite\\)"),
    ):
        broken = RewardSet(registry_with(bad=f"{__name__}:{impl}"), {"bad": 1.0})
        with pytest.raises(StageError, match=message) as caught:
            broken.score(["a", "b"], ["a", "b"], ["q", "q"])
        assert "\n" not in str(caught.value)


def test_a_method_the_recipe_does_not_train_is_refused() -> None:
    from types import SimpleNamespace

    from mmcore.train.recipe import TrainRecipe
    from mmcore.train.rollouts import check_method

    def ctx(method: str) -> SimpleNamespace:
        return SimpleNamespace(pack="whisper", config=SimpleNamespace(training=SimpleNamespace(method=method)))

    parts = {"build_model": None, "dataset": None, "collate": None, "loss": None}
    declared, legacy = TrainRecipe(**parts, method="sft"), TrainRecipe(**parts)
    for method in ("dpo", "grpo"):
        with pytest.raises(StageError, match=f"training.method={method}: the whisper pack's recipe trains with training.method=sft; it has no {method} recipe"):
            check_method(ctx(method), declared)
    check_method(ctx("sft"), declared)
    check_method(ctx("dpo"), legacy)  # an SDK 1.x recipe built from parts keeps training what it trained
    with pytest.raises(StageError):
        check_method(ctx("grpo"), legacy)


def test_an_rl_prompt_file_with_answer_or_solution_fields_reads_as_a_conversation(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """verl / ms-swift GRPO files give the reference beside the prompt: the last user turn plus an
    ``answer`` or ``solution`` field reads as that conversation with the reference as the
    assistant's turn (what GRPO takes as its reference, and SFT as its target)."""
    from mmcore.data.mllm import Columns, _parse

    roles = {"user": "user", "assistant": "assistant", "system": "system"}
    sample = _parse(tmp_path / "f.json", 0, {"messages": [{"role": "user", "content": "2 + 2?"}], "solution": "4"}, Columns(), roles, tmp_path)
    assert [(t.role, t.content) for t in sample.turns] == [("user", "2 + 2?"), ("assistant", "4")]
    from mmcore.data.mllm import BadRecord

    with pytest.raises(BadRecord, match="or give the reference answer as 'answer' or 'solution'"):
        _parse(tmp_path / "f.json", 0, {"messages": [{"role": "user", "content": "2 + 2?"}]}, Columns(), roles, tmp_path)


def test_training_grpo_lr_holds_from_the_first_rollout_and_the_schedule_runs_before() -> None:
    """``training.grpo.lr``: the warm-up's steps follow ``training.lr_schedule``; from the first
    rollout on, the learning rate is ``grpo.lr``, constant; without it the schedule goes on."""
    from mmcore.testing import make_config, plugins_with
    from mmcore.train.optim import lr_lambda, run_schedule

    plugins = plugins_with(installed_packs=True)
    cfg = make_config(plugins, "flux", preset="grpo", overrides=["training.grpo.lr=5e-4"]).training
    planned, switch = cfg.steps, cfg.grpo.warmup_sft_steps
    scheduled, base = run_schedule(cfg, planned), lr_lambda(cfg.lr_schedule, cfg.warmup_steps, planned, cfg.min_lr_ratio)
    assert [scheduled(s) for s in range(switch)] == [base(s) for s in range(switch)]
    assert [scheduled(s) * cfg.lr for s in range(switch, planned)] == [pytest.approx(5e-4)] * (planned - switch)
    unset = make_config(plugins, "flux", preset="grpo", overrides=["training.grpo.lr=null"]).training
    assert [run_schedule(unset, planned)(s) for s in range(planned)] == [base(s) for s in range(planned)]
