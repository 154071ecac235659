"""What the consumer tests (TRL, LLaMA-Factory) need instead of a downloaded model: a tokenizer
built here, with one token per byte, so it encodes any text and decodes it back unchanged.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

# Special tokens of the chat formats the tests render (Qwen/ChatML, Llama 3, DeepSeek-R1).
SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|eom_id|>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]

# A ChatML template that renders tools, tool calls (arguments as JSON objects) and tool results,
# the shape of Qwen 2.5's.
TOOL_CHAT_TEMPLATE = (  # every literal inside {{ }}, so transformers' trim_blocks/lstrip_blocks leave it alone
    "{% if messages[0].role == 'system' or tools %}{{ '<|im_start|>system\\n' }}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content + '\\n' }}{% endif %}"
    "{% if tools %}{{ '# Tools\\n<tools>\\n' }}{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '</tools>' }}{% endif %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' %}{{ '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{% elif message.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{% for call in message.tool_calls or [] %}{{ '\\n<tool_call>\\n{\"name\": \"' + call.function.name }}"
    "{{ '\", \"arguments\": ' + call.function.arguments | tojson + '}\\n</tool_call>' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% elif message.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def byte_tokenizer(path: Path, chat_template: str | None = None) -> Any:
    """A byte-level BPE tokenizer without merges (every byte one token) plus SPECIAL_TOKENS,
    saved to path and loaded back from it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>", additional_special_tokens=SPECIAL_TOKENS)
    if chat_template:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(path)
    return PreTrainedTokenizerFast.from_pretrained(path)
