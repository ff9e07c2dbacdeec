"""Build a tiny, randomly initialised Llama and its tokenizer on disk (no model hub needed).

Run with the vLLM venv's python: `python tests/plugin/tiny_model.py DIR`. Idempotent.
"""

from __future__ import annotations

import os
import sys

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "vllm schedules requests and preempts them when the kv cache is full",
    "opentelemetry traces show where a request spent its time",
    "a tiny model answers with random words from its small vocabulary",
    "one two three four five six seven eight nine ten eleven twelve",
]


def build(out: str) -> str:
    if os.path.exists(os.path.join(out, "config.json")) and os.path.exists(os.path.join(out, "tokenizer.json")):
        return out
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok.train_from_iterator(SENTENCES * 4, trainers.WordLevelTrainer(special_tokens=special))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64,  # CPU attention: head_dim 64+ max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True, torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    return out


if __name__ == "__main__":
    print(build(sys.argv[1]))
