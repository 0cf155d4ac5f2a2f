"""Model loading: the recipe's model sources (zoo, factory, transformers), user code, the
recipe's dynamic shapes and facts read from ONNX graphs."""
