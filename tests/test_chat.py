import pytest

from drafters.data.chat import ChatTemplateError, render_conversation, render_prompt

CONV = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4, of course."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": " Six.\nDone"},
]


def assistant_spans(ids, mask):
    spans, cur = [], []
    for t, m in zip(ids, mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            spans.append(cur)
            cur = []
    return spans + ([cur] if cur else [])


@pytest.fixture(params=["tiny-chatml", "smollm2-chatml", "smollm2-vicuna", "tiny-vicuna"])
def tokenizer(request, tiny, smollm2):
    import copy

    which, template = request.param.split("-")
    tok = copy.deepcopy((tiny if which == "tiny" else smollm2).tokenizer)
    if template == "vicuna":
        from drafters.data.chat import VICUNA_TEMPLATE

        tok.chat_template = VICUNA_TEMPLATE
    return tok


def test_mask_covers_exactly_assistant_content_and_end_of_turn(tokenizer):
    r = render_conversation(tokenizer, CONV)
    spans = assistant_spans(r.input_ids, r.loss_mask)
    assert len(spans) == 2
    eos = tokenizer.eos_token_id
    for span, msg in zip(spans, [CONV[2], CONV[4]], strict=True):
        assert span[-1] == eos and eos not in span[:-1]
        assert tokenizer.decode(span[:-1]).strip() == msg["content"].strip()


def test_training_render_equals_serving_render(tokenizer):
    """prompt (add_generation_prompt) + answer tokens + EOS is a prefix of the training render,
    and the mask starts exactly where serving starts generating."""
    r = render_conversation(tokenizer, CONV)
    starts = [i for i in range(len(r.loss_mask)) if r.loss_mask[i] and not r.loss_mask[i - 1]]
    for start, turn in zip(starts, [2, 4], strict=True):
        prompt = render_prompt(tokenizer, CONV[:turn])
        assert r.input_ids[:start] == prompt
        end = r.input_ids.index(tokenizer.eos_token_id, start) + 1
        answer = r.input_ids[start:end]
        # what a generator emits after the prompt decodes back to the assistant's content
        assert (
            tokenizer.decode(answer, skip_special_tokens=True).strip()
            == CONV[turn]["content"].strip()
        )


def test_template_without_end_of_turn_is_refused(tiny):
    import copy

    tok = copy.deepcopy(tiny.tokenizer)
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="end-of-turn"):
        render_conversation(tok, CONV[1:3])


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_training_spans_are_the_ids_the_target_generated(which, chatty, smollm2):
    """Distil two 2-turn conversations for real, then build the training examples: every
    assistant span is the generated ids, the first span follows the exact distillation prompt."""
    from drafters.data.distillation import DistillConfig, generate_turns
    from drafters.data.engines import make_engine
    from drafters.data.sharegpt import Conversation

    # the tiny target: a random model rarely says end-of-turn, so its first answers are made to end
    target = chatty if which == "tiny" else smollm2
    convs = [
        Conversation(f"c{i}", (u1, {"role": "assistant", "content": "x"}, u2, CONV[2]), i)
        for i, (u1, u2) in enumerate([(CONV[1], CONV[3]), (CONV[3], CONV[1])])
    ]
    cfg = DistillConfig(max_new_tokens=24)
    engine = make_engine("hf", target, 4, 1024 + 24)
    records = generate_turns(engine, target.tokenizer, convs, cfg, target.eos_token_ids)
    assert any(len(r["response_ids"]) == 2 for r in records)
    for r in records:
        ex = render_conversation(
            target.tokenizer, r["messages"], target.eos_token_ids, r["response_ids"]
        )
        assert assistant_spans(ex.input_ids, ex.loss_mask) == r["response_ids"]
        prompt = render_prompt(target.tokenizer, r["messages"][:1])
        assert ex.input_ids[: len(prompt)] == prompt


def test_verbatim_ids_survive_where_retokenising_merges(smollm2):
    """SmolLM2 may generate "\\n\\n" as one token; its decoded text re-tokenises to two."""
    tok = smollm2.tokenizer
    said = tok("Hi", add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("ĊĊ")]
    said += tok("there", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    msgs = [CONV[1], {"role": "assistant", "content": tok.decode(said[:-1])}]
    retok = render_conversation(tok, msgs, [tok.eos_token_id])
    verbatim = render_conversation(tok, msgs, [tok.eos_token_id], [said])
    assert assistant_spans(verbatim.input_ids, verbatim.loss_mask) == [said]
    assert assistant_spans(retok.input_ids, retok.loss_mask) != [said]
