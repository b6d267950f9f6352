"""ChatML (``<|im_start|>role\\n ... <|im_end|>\\n``), one case of the chat-template encoder.

Kept for packs that encode with ChatML whatever their tokenizer's template says: the Qwen
families' turn format with media placeholders written where the sample has them. New packs use
:class:`~mmcore.data.chat_template.ChatTemplateEncoder` with the tokenizer's own template.
"""

from __future__ import annotations

from typing import Any, Iterable

from mmcore.data.chat_template import IGNORE, ChatTemplateEncoder, Encoded, Expander, Piece

#: Turns as ``<|im_start|>role\n{content}<|im_end|>\n``; string content, placeholders kept in place.
CHATML_TEMPLATE = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


class ChatMLEncoder(ChatTemplateEncoder):
    """Encodes :class:`~mmcore.data.mllm.Sample` turns as ChatML; labels cover assistant turns
    (and their ``<|im_end|>``), or user turns too with ``train_on_prompt``.

    Args:
        tokenizer: the model's tokenizer (with ``<|im_start|>``/``<|im_end|>``).
        expanders: placeholder (``"<image>"``) -> function from a media file to a :class:`Piece`.
        default_system: the system prompt of samples that bring none (None: no system turn).
        train_on_prompt: also supervise user turns.
        media_token_ids: tokens that belong to media; truncation may not cut through them.
    """

    def __init__(self, tokenizer: Any, expanders: dict[str, Expander], *, default_system: str | None, train_on_prompt: bool = False, media_token_ids: Iterable[int] = ()) -> None:
        super().__init__(tokenizer, expanders, chat_template=CHATML_TEMPLATE, content="text", default_system=default_system, train_on_prompt=train_on_prompt, media_token_ids=media_token_ids)


__all__ = ["CHATML_TEMPLATE", "IGNORE", "ChatMLEncoder", "Encoded", "Expander", "Piece"]
