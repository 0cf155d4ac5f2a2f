"""Calibration text for the model transforms (prune.py, awq.py), and what a module sees of it.

The text is everyday English written for this project (16 of data/sentences' calibration
sentences, ~250 tokens), neither the held-out text perplexity is scored on nor the chat
questions, so a transform does not see what it is judged by.
"""

from __future__ import annotations

CALIBRATION = " ".join([  # the first 16 of data/sentences/calibration.txt (CC0, written here)
    'The train to the coast leaves every hour from the main station.',
    'She planted tomatoes and basil along the south wall of the garden.',
    'Our team shipped the new release two days ahead of schedule.',
    'A thin layer of frost covered the windshield this morning.',
    'The museum opens late on Thursdays and admission is free after six.',
    'He spent the afternoon repairing the chain on his old bicycle.',
    'The recipe calls for two cups of flour and a pinch of salt.',
    'Heavy rain is expected to move across the region by the weekend.',
    'The library extended its hours during the exam period.',
    'A small fishing boat drifted slowly past the harbor lights.',
    'Please remember to back up your files before installing the update.',
    'The children built a sandcastle with towers and a moat.',
    'Interest rates remained unchanged after the central bank meeting.',
    'The orchestra rehearsed the final movement three times before the concert.',
    'A stray cat has been sleeping on our porch every night this week.',
    'The hikers reached the summit just as the clouds began to clear.',
])


def calibration_ids(tokenizer):
    """The calibration sentences' token ids [1, T]."""
    return tokenizer(CALIBRATION, return_tensors="pt").input_ids


def inputs_of(model, ids, modules: dict) -> dict:
    """{key: the input [T, in] module `modules[key]` saw} over one forward pass of ids [1, T]."""
    import torch

    seen: dict = {}
    hooks = [module.register_forward_hook(
        lambda module, args, output, key=key: seen.__setitem__(key, args[0].reshape(-1, args[0].shape[-1])))
        for key, module in modules.items()]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return seen
