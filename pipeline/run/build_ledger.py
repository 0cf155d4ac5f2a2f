"""What this user's own builds produced: the trust behind reusing a stage from another folder.

A fresh build may copy a stage from a sibling folder of engines/ with the same cache key
(run/stage_cache.py, `_from_twin`): an export that a --set variant cannot change is not
redone. But engines/ also holds folders the user did not build (a CI artifact, a colleague's
copy, a download), and a sibling's manifest can be made consistent with any file in it: a
key and a digest in a folder prove nothing about who made them.

So every stage a run of this user commits is also recorded here, outside engines/, under the
user's cache folder (core.env.cache_root(): $PIPELINE_CACHE_DIR, else
~/.cache/engine-pipeline), as one empty file named by the digest of (stage id, cache key,
each output's sha256, the stage's meta). A sibling's stage is reused only when that very
digest is recorded: the same bytes and facts this user's own build produced for this key.
Anything else (a swapped engine, a rewritten meta, a folder from elsewhere) is rebuilt.
Whoever can write into the user's cache folder can already run code as the user.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.artifacts.manifest import StageRecord
from pipeline.core import env, safe_files
from pipeline.recipe import sha256_json

FOLDER = "built-stages"


def root() -> Path:
    """Where the records live (made on first record)."""
    return env.cache_root() / FOLDER


def _entry(stage_id: str, record: StageRecord, digests: dict[str, str]) -> Path:
    digest = sha256_json({"stage": stage_id, "key": record.key, "meta": record.meta,
                          "outputs": {name: digests[name] for name in record.outputs}})
    return root() / digest[:2] / digest


def record(stage_id: str, record: StageRecord, digests: dict[str, str]) -> None:
    """Note that this user's run committed `record` with outputs of these sha256s."""
    entry = _entry(stage_id, record, digests)
    if not entry.is_file():
        safe_files.write_atomic(entry, b"")


def built_here(stage_id: str, record: StageRecord, digests: dict[str, str]) -> bool:
    """Whether one of this user's runs committed exactly this stage: key, outputs, meta."""
    try:
        return _entry(stage_id, record, digests).is_file()
    except KeyError:  # an output without a digest: nothing vouches for it
        return False
