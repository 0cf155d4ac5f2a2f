"""What the commands other than `run` do: deploy, tune, bench, compare, generate's chat and the
CI helpers. Libraries called by the command modules in pipeline/cli/; each chains stages or
reads recorded artifacts, none is a cached stage, and none defines a click command."""
