"""Calibration chats in the model's own words: each chat's user turns (written for this
project) answered by a built engine, greedy, the conversation kept, and the whole chat written
through the model's chat template as one text -- the prefills GPTQ's Hessians are taken from
(`data.calibration.text`).

Why: a chat model is judged on its replies, and GPTQ keeps what its calibration text
exercises (benchmarks/results/float-int4-2026-12-07.md: prose calibration lost answers).
The model's own replies to everyday requests are the text it writes in use; the prompts share
no topic with data/chat/questions.jsonl, the questions it is judged on.

    .venv/bin/python benchmarks/chat_calibration.py smollm2-int4 \
        data/chat/calibration-prompts.jsonl data/chat/calibration-replies.jsonl --max-tokens 96

smollm2-int4 multiplies with the GGUF's own blocks: the function of the float checkpoint that
smollm2-float-int4 quantizes (its channel rescaling leaves the function as it is).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.commands.generate import Chat  # noqa: E402
from pipeline.recipe import load as load_recipe  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="a built generation recipe (engines/RECIPE/)")
    parser.add_argument("prompts", type=Path, help='jsonl: {"id", "turns": [user messages]}')
    parser.add_argument("out", type=Path, help='jsonl written: {"text": one rendered chat}')
    parser.add_argument("--max-tokens", type=int, default=96, help="most tokens a reply may take")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    chat = Chat(Path("engines") / recipe.name, raw=False, recipe=recipe)
    texts = []
    for line in args.prompts.read_text().splitlines():
        messages: list[dict] = []
        for turn in json.loads(line)["turns"]:
            messages.append({"role": "user", "content": turn})
            print(f"> {turn}", flush=True)
            messages.append({"role": "assistant", "content": chat.reply(messages, args.max_tokens)})
        texts.append(chat.tokenizer.hf.apply_chat_template(messages, tokenize=False))
    args.out.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tokens = sum(len(chat.tokenizer.encode(t, special_tokens=False)) for t in texts)
    print(f"{args.out}: {len(texts)} chats, {tokens} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
