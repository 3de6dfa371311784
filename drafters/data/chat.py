"""Render conversations with the target's chat template; loss masks over assistant tokens.

Training must see exactly the tokens the target sees when serving: the prompt rendered with
`add_generation_prompt=True`, then the answer, then the end-of-turn token that stops generation.
So an assistant span is found by rendering the conversation incrementally:

    prefix_i = render(messages[:i], add_generation_prompt=True)   # ... <|im_start|>assistant\\n
    upto_i   = render(messages[:i+1])                             # ... answer<|im_end|>\\n

and the span is upto_i's tokens past prefix_i's, up to and including the first end-of-turn token
(EOS), or, for a distilled conversation, the ids the target generated there, verbatim. Tokens
the template adds after EOS (ChatML's "\\n") are never generated, so they are not in the mask.
A tokenizer that does not tokenize prefix_i as a prefix of upto_i is an error: the training
render would then differ from serving.
"""

from __future__ import annotations

from dataclasses import dataclass

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# FastChat's vicuna_v1.1 conversation template (Vicuna's tokenizer ships none).
VICUNA_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + ' ' }}"
    "{% set loop_messages = messages[1:] %}{% else %}"
    "{{ 'A chat between a curious user and an artificial intelligence assistant. The assistant "
    "gives helpful, detailed, and polite answers to the user\\'s questions. ' }}"
    "{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}{% if message['role'] == 'user' %}"
    "{{ 'USER: ' + message['content'] + ' ' }}{% else %}"
    "{{ 'ASSISTANT: ' + message['content'] + eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

TEMPLATES = {"chatml": CHATML_TEMPLATE, "vicuna": VICUNA_TEMPLATE}


class ChatTemplateError(ValueError):
    pass


@dataclass
class RenderedConversation:
    input_ids: list[int]
    loss_mask: list[int]  # 1 on assistant content and its end-of-turn token, else 0

    def __len__(self) -> int:
        return len(self.input_ids)


def render_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of `messages` followed by the assistant generation prompt (serving render)."""
    return _ids(tokenizer, messages, add_generation_prompt=True)


def _ids(tokenizer, messages, add_generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def render_conversation(
    tokenizer,
    messages: list[dict],
    eos_token_ids: list[int] | None = None,
    response_ids: list[list[int]] | None = None,
) -> RenderedConversation:
    """The whole conversation as one training example, loss mask on assistant tokens only.

    response_ids: the ids the target generated for each assistant turn, as a distilled corpus
    keeps them (ending with the end-of-turn token, or not when the answer was cut by length).
    Given, each assistant span is those ids verbatim and everything between spans comes from
    the chat template: the first span follows exactly the prompt the target was given, later
    ones the template's text between turns. Re-tokenising the decoded text instead can change
    the ids ("\n\n" is one token when generated, two after re-tokenising). None: the spans are
    the re-tokenised message texts through their end-of-turn token.
    """
    eos = set(eos_token_ids or [tokenizer.eos_token_id])
    full = _ids(tokenizer, messages, add_generation_prompt=False)
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if response_ids is not None and len(response_ids) != len(assistant):
        raise ValueError(
            f"{len(response_ids)} response_ids for {len(assistant)} assistant turns: the "
            "distilled record is inconsistent"
        )
    out_ids: list[int] = []
    mask: list[int] = []
    done = 0  # tokens of `full` already covered by out_ids
    for a, i in enumerate(assistant):
        prefix = render_prompt(tokenizer, messages[:i])
        upto = _ids(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if upto[: len(prefix)] != prefix or full[: len(upto)] != upto:
            raise ChatTemplateError(
                f"chat template of {tokenizer.name_or_path!r}: rendering turn {i} for training "
                "does not start with its serving prompt (the generation prompt tokenizes "
                "differently in context); fix `target.chat_template`"
            )
        end = next((j + 1 for j in range(len(prefix), len(upto)) if upto[j] in eos), None)
        if end is None:
            raise ChatTemplateError(
                f"chat template of {tokenizer.name_or_path!r} renders assistant turn {i} without "
                f"an end-of-turn token (one of {sorted(eos)}); the drafter could never learn to "
                "stop: fix `target.chat_template`"
            )
        out_ids += prefix[done:]
        mask += [0] * (len(prefix) - done)
        span = upto[len(prefix) : end] if response_ids is None else list(response_ids[a])
        out_ids += span
        mask += [1] * len(span)
        done = end
    out_ids += full[done:]
    mask += [0] * (len(full) - done)
    return RenderedConversation(out_ids, mask)
