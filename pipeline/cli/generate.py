"""`pipeline generate RECIPE [--prompt TEXT | --chat]`: talk to a built generation engine
(commands/generate.py's `Chat` runs the deployed folder under onnxruntime-genai)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.cli.options import debug_option, engines_dir_option


@click.command("generate")
@click.argument("recipe")
@click.option("--prompt", default=None, help="One message; the reply is printed as it is generated.")
@click.option("--chat", "interactive", is_flag=True, help="A conversation: one message a line on stdin.")
@click.option("--max-tokens", type=click.IntRange(1), default=256, show_default=True,
              help="Most tokens a reply may take.")
@click.option("--raw", is_flag=True, help="Feed the text as is, without the chat template.")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="The --set values the engine was built with.")
@engines_dir_option()
@debug_option
def generate_command(recipe, prompt, interactive, max_tokens, raw, overrides, engines_dir):
    """Generate with RECIPE's built engine through onnxruntime-genai (chat template, greedy)."""
    from pipeline.commands.generate import Chat
    from pipeline.core.errors import InputError
    from pipeline.store import folder_names as folders

    if (prompt is None) == (not interactive):
        raise click.UsageError("give --prompt TEXT or --chat")
    r = folders.load(recipe, tuple(overrides), Path(engines_dir))
    if r.workload.served_as != "generate":
        raise InputError(f"{r.where}: `generate` needs a generation recipe (workload.kind: "
                         f"generation), not {r.workload.kind}")
    folder = Path(engines_dir) / folders.folder_name(r)
    chat = Chat(folder, raw, r)
    if prompt is not None:
        chat.reply([{"role": "user", "content": prompt}], max_tokens)
        return
    messages: list[dict] = []
    for number, raw_line in enumerate(sys.stdin.buffer, 1):
        try:  # bytes first: a terminal's encoding must not decide what text is
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"--chat: line {number} of the input is not UTF-8 text",
                             "type or pipe UTF-8 text, one message a line") from None
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.strip()})
        messages.append({"role": "assistant", "content": chat.reply(messages, max_tokens)})
