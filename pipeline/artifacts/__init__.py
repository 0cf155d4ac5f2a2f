"""Typed artifacts: report.json, validate-<target>.json and manifest.json as pydantic models
(the contract), and the one way to read and write them (recorded.parse / recorded.dump)."""

from pipeline.artifacts.manifest import Manifest
from pipeline.artifacts.recorded import Unusable, dump, parse
from pipeline.artifacts.report import SCHEMA, EngineResult, Gate, Report, Versus

__all__ = ["Manifest", "Report", "EngineResult", "Gate", "Versus", "SCHEMA", "Unusable", "dump", "parse"]
