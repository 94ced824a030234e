"""How a Session turns the next message into the turn's prompt (text and tokens).

* With the chat template (the default): the template over the whole conversation
  plus the new message; a model without a template gets a plain "User:/Assistant:"
  transcript.  As tokens, the prompt is the conversation's exact token history
  when the rendered text extends the text those tokens spell, plus the rest
  tokenized; otherwise the whole text tokenized afresh.
* `chat_template=False` (`mlxspec chat --ignore-chat-template`): no template; the
  message's raw text, exactly as given, continues the conversation so far (the
  first message is encoded as `generate --ignore-chat-template` encodes its prompt,
  BOS included where the tokenizer adds one; later ones add no special tokens).
  The model reads the concatenated raw texts, replies included as generated.
"""

from __future__ import annotations

from ..api import apply_chat_template, encode_prompt


def render(tokenizer, messages: list[dict]) -> str:
    """The prompt text for `messages` (chat template, generation prompt added)."""
    if getattr(tokenizer, "chat_template", None):
        return apply_chat_template(tokenizer, messages, tokenize=False)
    # No chat template: a plain transcript the model can continue.
    bos = getattr(tokenizer, "bos_token", None) or ""
    body = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages)
    return f"{bos}{body}Assistant:"


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def templated(tokenizer, messages: list[dict], tokens: list[int], token_text: str) -> tuple[str, list[int]]:
    text = render(tokenizer, messages)
    if tokens and text.startswith(token_text):
        return text, tokens + encode(tokenizer, text[len(token_text):])
    return text, encode(tokenizer, text)


def raw(tokenizer, user_text: str, tokens: list[int], token_text: str) -> tuple[str, list[int]]:
    if tokens:
        return token_text + user_text, tokens + encode(tokenizer, user_text)
    ids = encode_prompt(tokenizer, user_text, chat_template=False)  # "the prompt is empty ..." for ""
    bos = getattr(tokenizer, "bos_token", None)
    added = bos and ids[0] == getattr(tokenizer, "bos_token_id", None) and not user_text.startswith(bos)
    return (bos if added else "") + user_text, ids
