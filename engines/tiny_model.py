"""A tiny Qwen2 model built locally: a byte-level BPE tokenizer trained on a generated
corpus and random weights, saved as a folder vLLM and transformers load by path.

No weights can be downloaded where the tests and the CPU demo run, and trace replay needs
only the model's shape (its output is gibberish: a replayed step generates exactly the
trace's token count with `min_tokens = max_tokens` and `ignore_eos`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen2.5's template, reduced: the offered tools as function schemas in the system turn,
# tool results as a user turn in <tool_response> tags. The taught model (`heddle/teach.py`)
# learns it; the agent loop renders every context with it (`engines/chat.py`).
AGENT_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{% else %}You are a helpful assistant.{% endif %}\n\n# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n"
    "{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ message['content'] }}\n</tool_response><|im_end|>\n"
    "{% elif message['role'] != 'system' %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TEXT = (
    "def return import class self for while if else try except tool call search python "
    "result answer question step plan think file line value list dict error ok timeout "
    "the a of to and in is that it with as on be at by this from or"
)


@dataclass(frozen=True)
class TinyModelShape:
    vocab_size: int = 1024  # the BPE trainer's target; the corpus may give fewer
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2  # head size 64: vLLM's CPU attention has no kernel for 16
    num_kv_heads: int = 1
    intermediate_size: int = 256
    max_position_embeddings: int = 8192


def _corpus(lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = _TEXT.split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 24))) for _ in range(lines)]


def build_tiny_model(
    out: Path,
    shape: TinyModelShape | None = None,
    seed: int = 0,
    *,
    corpus: list[str] | None = None,
    chat_template: str = CHAT_TEMPLATE,
) -> Path:
    """Write tokenizer and random bfloat16 weights to `out`; returns `out`. The tokenizer
    is trained on `corpus` (by default, a generated word salad)."""
    # Heavy imports here: the rest of Heddle runs without the real-engine extra.
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    shape = shape or TinyModelShape()
    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus or _corpus(2000, seed), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(out)

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),  # every id the model can make decodes
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=SPECIAL_TOKENS.index("<|im_end|>"),  # special tokens come first
        pad_token_id=SPECIAL_TOKENS.index("<|endoftext|>"),
        bos_token_id=None,
    )
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # weights made in bfloat16, as vLLM runs them
    try:
        model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default_dtype)
    model.save_pretrained(out)
    return out
