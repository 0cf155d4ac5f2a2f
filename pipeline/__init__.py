"""Turn PyTorch model variants into deployable engines and prove what each engine is worth.

Importing this package is cheap on purpose: torch, onnxruntime and TensorRT are imported
only by the stages and backends that need them, so `pipeline --help` stays instant.
"""

__version__ = "0.1.0"
