"""The chat-template encoder: any family's template, labels from its {% generation %} blocks or
from prefix differences, media markers found and expanded, clear errors where it cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="chat templates are rendered by transformers")

from mmcore.data.chat_template import IGNORE, ChatTemplateEncoder, ChatTemplateError, Piece  # noqa: E402
from mmcore.data.mllm import Sample, Turn  # noqa: E402
from mmcore.engines.tiny import byte_level_tokenizer  # noqa: E402

# LLaVA-1.5's template as llava-hf ships it: images first in a turn, then text, assistant text
# in {% generation %} blocks, "ASSISTANT:" as the generation prompt.
LLAVA = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% if message['role'] != 'assistant' %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
LLAVA_NO_MARKS = LLAVA.replace("{% generation %}", "").replace("{% endgeneration %}", "")
# A template that drops earlier assistant turns (as reasoning templates drop old thoughts).
FORGETFUL = "{% for message in messages %}{% if message['role'] == 'assistant' and not loop.last %}[old]{% else %}{{ message['role'] }}: {{ message['content'] }}\n{% endif %}{% endfor %}"


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    corpus = ["USER: What colour is the square? ASSISTANT: red green blue yellow", "Sure? yes no maybe", "user assistant system"]
    return byte_level_tokenizer(corpus, ["<image>", "<im_patch>"], vocab_size=320, chat_template=LLAVA)


def conversation(*turns: tuple[str, str], images: int = 0) -> Sample:
    return Sample("x.json", 0, [Turn(role, text) for role, text in turns], {"images": [Path(f"{i}.png") for i in range(images)]} if images else {})


def expand_image(tokenizer, patches: int = 3):  # type: ignore[no-untyped-def]
    patch = tokenizer.convert_tokens_to_ids("<im_patch>")
    return lambda path: Piece([patch] * patches, {"image_sizes": [int(path.stem), 7]})


def supervised(tokenizer, encoded) -> str:  # type: ignore[no-untyped-def]
    return tokenizer.decode([t for t, label in zip(encoded.input_ids, encoded.labels) if label != IGNORE])


TALK = (("user", "What colour is the square?"), ("assistant", "red"), ("user", "Sure?"), ("assistant", "yes"))


def test_labels_of_a_generation_template_equal_transformers_assistant_mask(tokenizer) -> None:  # type: ignore[no-untyped-def]
    encoder = ChatTemplateEncoder(tokenizer, {})
    encoded = encoder.encode(conversation(*TALK))
    messages = [{"role": r, "content": [{"type": "text", "text": t}]} for r, t in TALK]
    want = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert encoded.input_ids == list(want["input_ids"])
    assert [label != IGNORE for label in encoded.labels] == [bool(m) for m in want["assistant_masks"]]
    assert supervised(tokenizer, encoded).split() == ["red", "yes"]


def test_a_template_without_generation_blocks_learns_the_answers_by_prefix_difference(tokenizer) -> None:  # type: ignore[no-untyped-def]
    encoded = ChatTemplateEncoder(tokenizer, {}, chat_template=LLAVA_NO_MARKS).encode(conversation(*TALK))
    assert encoded.input_ids == tokenizer.encode(
        tokenizer.apply_chat_template([{"role": r, "content": [{"type": "text", "text": t}]} for r, t in TALK], chat_template=LLAVA_NO_MARKS, tokenize=False), add_special_tokens=False
    )
    # what follows "ASSISTANT:" in each assistant turn, its separating whitespace not learnt
    assert supervised(tokenizer, encoded).split() == ["red", "yes"]
    with_prompt = ChatTemplateEncoder(tokenizer, {}, chat_template=LLAVA_NO_MARKS, train_on_prompt=True).encode(conversation(*TALK))
    assert "Sure?" in supervised(tokenizer, with_prompt) and encoded.labels[0] == with_prompt.labels[0] == IGNORE


def test_image_markers_the_template_writes_are_expanded_in_order(tokenizer) -> None:  # type: ignore[no-untyped-def]
    encoder = ChatTemplateEncoder(tokenizer, {"<image>": expand_image(tokenizer)})
    sample = conversation(("user", "<image>What colour?"), ("assistant", "red"), ("user", "<image><image>And these?"), ("assistant", "blue"), images=3)
    encoded = encoder.encode(sample)
    patch = tokenizer.convert_tokens_to_ids("<im_patch>")
    assert encoded.input_ids.count(patch) == 9 and tokenizer.convert_tokens_to_ids("<image>") not in encoded.input_ids
    assert encoded.fields["image_sizes"] == [[0, 7], [1, 7], [2, 7]]
    assert all(label == IGNORE for t, label in zip(encoded.input_ids, encoded.labels) if t == patch)
    assert supervised(tokenizer, encoded).split() == ["red", "blue"]


def test_a_template_that_rewrites_earlier_turns_is_refused_in_one_line(tokenizer) -> None:  # type: ignore[no-untyped-def]
    encoder = ChatTemplateEncoder(tokenizer, {}, chat_template=FORGETFUL, content="text")
    with pytest.raises(ChatTemplateError, match=r"does not render turn 2 \(assistant\) as a continuation.*\{% generation %\}"):
        encoder.encode(conversation(*TALK))


def test_media_the_template_does_not_write_is_an_error_naming_the_marker(tokenizer) -> None:  # type: ignore[no-untyped-def]
    encoder = ChatTemplateEncoder(tokenizer, {"<image>": expand_image(tokenizer)}, markers={"<image>": "<img></img>"})
    with pytest.raises(ChatTemplateError, match=r"wrote 0 '<img></img>' for the sample's 1 <image> item"):
        encoder.encode(conversation(("user", "<image>What?"), ("assistant", "red"), images=1))


def test_a_tokenizer_without_a_template_is_refused(tokenizer) -> None:  # type: ignore[no-untyped-def]
    bare = byte_level_tokenizer(["a b c"], [], vocab_size=270)
    with pytest.raises(ChatTemplateError, match="no chat_template"):
        ChatTemplateEncoder(bare, {})


def test_media_the_model_takes_no_expander_for_is_a_bad_sample_naming_the_file(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Real files mix kinds: a clip in an image model's data is refused (preprocess counts the
    sample as bad), not trained on as if it were not there."""
    from mmcore.data.media import MediaError

    encoder = ChatTemplateEncoder(tokenizer, {"<image>": expand_image(tokenizer)})
    sample = Sample("mixed.json", 3, [Turn("user", "<video>What moves?"), Turn("assistant", "red")], {"videos": [Path("clips/a.mp4")]})
    with pytest.raises(MediaError, match=r"^clips/a\.mp4: this model takes no videos \(it takes images\)$"):
        encoder.encode(sample)
    with pytest.raises(ChatTemplateError, match=r"this model takes no videos \(it takes images\)"):
        encoder.encode_prompt(sample)
