"""The lowest layer: errors, the environment and cache roots, the device, statistics, text and
the terminal, safe file access, recipe paths and the user-code resolver. It imports no other
package of the pipeline."""
