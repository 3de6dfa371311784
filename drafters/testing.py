"""A tiny random target for tests and smoke runs (`target=tiny`, `--target tiny`): a real
byte-level tokenizer with the ChatML specials and a random 2-layer Llama, built locally in
well under a second, that goes through the same code paths as a real target."""

from __future__ import annotations

import torch

from drafters.target import Target, torch_dtype


def tiny_tokenizer():
    """A real byte-level tokenizer (256 bytes + ChatML specials), built locally, for tests."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from drafters.data.chat import CHATML_TEMPLATE

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    fast.add_special_tokens({"additional_special_tokens": specials})
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_target(
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    seed: int = 0,
    dtype: str = "float32",
    name: str = "tiny-random-llama",
) -> Target:
    """A random Llama over `tiny_tokenizer()`, for tests: same code paths as a real target."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch_dtype(dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return Target(model, tokenizer, f"{name}-seed{seed}")
