"""Backends that the test suite brings as third-party plugins (registered at runtime)."""
