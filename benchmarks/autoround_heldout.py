"""Does AutoRound's fit carry over to text it was not fitted on? The first decoder layers of a
recipe's PyTorch model are fitted (pipeline/precision/autoround.py) on one calibration text;
then, on another text, each layer's output is compared with the float model's: round-to-nearest
(min/max, asymmetric, blocks of 32) against the fitted rounding, each fed what its own rounded
layers below give. Printed: mean squared error per layer, RTN and AutoRound.

Used for benchmarks/results/float-int4-2026-12-07.md (the AutoRound section, 2026-12-08):

    .venv/bin/python benchmarks/autoround_heldout.py smollm2-float-int4-autoround --layers 3 \
        --fit data/sentences/calibration-chatml.jsonl --measure data/chat/calibration-replies.jsonl
    .venv/bin/python benchmarks/autoround_heldout.py smollm2-float-int4-autoround --layers 3 \
        --fit data/chat/calibration-replies.jsonl --measure data/sentences/calibration-chatml.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import numpy as np
    import torch

    from pipeline.model import sources
    from pipeline.precision import autoround, calibrate, gptq
    from pipeline.recipe import load

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="an int4_method autoround recipe (its model, tokenizer, template, settings)")
    parser.add_argument("--fit", required=True, help="the text the layers are fitted on")
    parser.add_argument("--measure", required=True, help="the text the error is measured on")
    parser.add_argument("--layers", type=int, default=3, help="the first n decoder layers")
    args = parser.parse_args()

    def sequences(text):
        recipe = load(args.recipe, [f"data.calibration.text={text}"])
        return [torch.from_numpy(np.asarray(f["input_ids"], np.int64)) for f in calibrate.feeds(recipe)]

    recipe = load(args.recipe, [])
    spec = recipe.precision.autoround
    fit_on = autoround.pieces(sequences(args.fit), spec.max_tokens)
    measured = sequences(args.measure)
    model = sources.load(recipe)
    hf, layers = autoround.decoder_layers(model)
    hf.get_decoder().layers = torch.nn.ModuleList(layers[:args.layers])
    fitted, fits = autoround.fit(model, fit_on, recipe.precision.block_size, spec,
                                 note=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"fitted on {args.fit}: {sum(s.shape[-1] for s in fit_on)} tokens in {len(fit_on)} sequences; "
          f"measured on {args.measure}: {sum(s.shape[-1] for s in measured)} tokens")

    def dequantized(f):  # the weight [out, K] a layer's fitted blocks stand for
        return torch.from_numpy(gptq.weight_of(f.codes, f.scales, f.zeros, f.weight.T.shape).T.astype(np.float32))

    inputs = autoround.layer_inputs(hf, layers[0], measured)
    kwargs = [kw for _, kw in inputs]
    clean = rtn_in = fit_in = [x for x, _ in inputs]
    print("| layer | on calibration: RTN -> AutoRound | on the other text: RTN | AutoRound | ratio |")
    print("|---|---|---|---|---|")
    for index, layer in enumerate(layers[:args.layers]):
        linears = [name for name, m in layer.named_modules() if isinstance(m, torch.nn.Linear)]
        rtn = {f"{n}.weight": autoround.Rounding(layer.get_submodule(n).weight, recipe.precision.block_size).weight()
               for n in linears}
        ours = {f"{n}.weight": dequantized(fitted[f"{index}.{n}"]) for n in linears}
        with torch.no_grad():
            target = [autoround.run_layer(layer, x, kw) for x, kw in zip(clean, kwargs)]
            rtn_in = [autoround.run_layer(layer, x, kw, rtn) for x, kw in zip(rtn_in, kwargs)]
            fit_in = [autoround.run_layer(layer, x, kw, ours) for x, kw in zip(fit_in, kwargs)]
        clean = target

        e_rtn, e_fit = (sum(((o - t) ** 2).sum().item() for o, t in zip(outs, target)) / sum(t.numel() for t in target)
                        for outs in (rtn_in, fit_in))
        print(f"| {index + 1} | {fits[index].rtn:.4g} -> {fits[index].fitted:.4g} | {e_rtn:.4g} | {e_fit:.4g} | "
              f"x{e_fit / e_rtn:.2f} |", flush=True)


if __name__ == "__main__":
    main()
