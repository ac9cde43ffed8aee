"""A synthetic fine-tuning task and a tiny chat tokenizer, for tests and the CPU demo.

The task, "translate": every word of a small vocabulary has one fixed partner word (a random
permutation drawn from `seed`); the user sends `translate: w1 w2 ... wk` and the assistant
answers with the partners in the same order. Answers are a deterministic function of the
prompt, so a model that learns the rule predicts held-out answers it never saw, while one that
only learns the format stays near log(vocabulary) nats per answer word.

The tokenizer is a byte-level BPE trained here on the task's words with ChatML special tokens
and a ChatML `chat_template` in its `tokenizer_config.json`, the layout of a Hugging Face model
folder, so `transformers.AutoTokenizer` loads it offline.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

_WORDS = (
    "red green blue cyan black white amber ivory apple pear plum fig kiwi lime lemon grape "
    "one two three four five six seven eight north south east west cat dog owl fox"
)
WORDS = tuple(_WORDS.split())
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def partner_map(seed: int = 0) -> dict[str, str]:
    """The task's fixed word -> partner mapping."""
    shuffled = list(WORDS)
    random.Random(seed).shuffle(shuffled)
    return dict(zip(WORDS, shuffled, strict=True))


def translate_examples(
    num: int,
    *,
    seed: int = 0,
    example_seed: int = 1,
    chat_share: float = 0.5,
    max_words: int = 3,
) -> list[dict[str, object]]:
    """`num` task examples; about `chat_share` in chat form (with a system turn), the rest as
    prompt/completion pairs."""
    mapping = partner_map(seed)
    rng = random.Random(example_seed)
    out: list[dict[str, object]] = []
    for _ in range(num):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, max_words))]
        prompt = "translate: " + " ".join(words)
        answer = " ".join(mapping[w] for w in words)
        if rng.random() < chat_share:
            out.append(
                {
                    "messages": [
                        {"role": "system", "content": "answer with the partner words"},
                        {"role": "user", "content": prompt},
                        {"role": "assistant", "content": answer},
                    ]
                }
            )
        else:
            out.append({"prompt": prompt, "completion": answer})
    return out


def write_jsonl(path: str | Path, records: list[dict[str, object]]) -> Path:
    """Write records one JSON object per line."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    return p


def chat_tokenizer(out_dir: str | Path, vocab_size: int = 512, seed: int = 0) -> Path:
    """Train a tiny byte-level BPE with ChatML tokens and template into `out_dir`."""
    from llmctl.data.tokenizer import train_bpe

    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(16)) for _ in range(2000)]
    texts += ["translate: answer with the partner words system user assistant"] * 20
    out = Path(out_dir)
    train_bpe(texts, out, vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHATML_TEMPLATE
    config["pad_token"] = SPECIAL_TOKENS[0]
    config_path.write_text(json.dumps(config, indent=2))
    return out
