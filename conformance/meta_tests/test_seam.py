"""The seam between impl and reference: impl imports configuration, constants, errors and formats, never arithmetic.

Why a test: conformance compares impl with the reference on generated inputs.
If impl calls ``reference.partition.advance`` or ``reference.rng.derive_key``
in production, the comparison of those clauses compares a function with
itself, and the spec's own checks run on the hot path. Every
``from reference... import name`` in ``impl/*.py`` (at module level or inside
a function) is checked against ``ALLOWED``, an explicit list of names by
module; ``import reference...`` (a whole module) is refused, since it would
give access to everything. The commands that audit impl (``loadspec
check``, the demos) use impl's own audit (``impl.resume``), compared with
the reference's in ``conformance/impl_tests/test_resume_audit.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

IMPL = Path(__file__).resolve().parents[2] / "impl"

ALLOWED: dict[str, frozenset[str]] = {
    "reference.errors": frozenset({"LoadspecError", "ConfigError", "SplitError", "TopologyError", "StateError",
                                   "EmptyDataError", "MapError", "is_int", "require"}),
    "reference.rng": frozenset({"MASK64", "GOLDEN_GAMMA", "FEISTEL_ROUNDS", "Stream"}),
    "reference.ordering": frozenset({"OrderingConfig", "KINDS", "RANDOM_ACCESS_KINDS", "Kind"}),
    "reference.packing": frozenset({"PackingConfig", "IGNORE", "NO_DOC", "NO_OFFSET", "MODES", "STREAM_MODES",
                                    "BIN_MODES", "OVERFLOWS", "Piece", "Mode", "Overflow"}),
    "reference.partition": frozenset({"PartitionConfig", "PADDING", "END_POLICIES", "End"}),
    "reference.collation": frozenset({"SIDES", "POOLINGS", "IGNORE_INDEX"}),
    # repeat_message / zero_weight_message word MIX-17/18's refusals (error text); deciding them is impl's own.
    "reference.mixing": frozenset({"MixConfig", "MixState", "STOPPING_STRATEGIES", "WeightFn", "repeat_message",
                                   "zero_weight_message"}),
    # check_batching validates the batching options (MIX-16's refusals: configuration); the methods are impl's own.
    "reference.streams": frozenset({"StreamConfig", "BATCHING_METHODS", "check_batching"}),
    "reference.bucketing": frozenset({"BucketConfig"}),
    "reference.sharding": frozenset({"ShardConfig", "MODES", "UNEVEN_POLICIES", "FILE_MODES"}),
    # parse_bounds reads split notation into its written bounds (configuration syntax); resolving them is impl's own.
    "reference.splits": frozenset({"SplitSpec", "ACCEPTED_FORMS", "STORE_SPLIT", "Bound", "parse_bounds"}),
    "reference.resume": frozenset({"PipelineConfig", "Topology", "STATE_FORMAT", "STATE_VERSION",
                                   "SUPPORTED_STATE_VERSIONS", "STATE_KEYS", "MAX_STATE_INT", "PAD_SAMPLE_INDEX",
                                   "canonical_json", "corpus_fingerprint", "pipeline_fingerprint", "make_state",
                                   "validate_state", "MixtureConfig", "mixture_fingerprint", "pipeline_parts",
                                   "mixture_parts", "mixture_level_parts", "part_hash"}),
    "reference.streaming": frozenset({"StreamingConfig", "STATE_FORMAT", "STATE_VERSION", "STATE_KEYS", "V1_KEYS"}),
    # The keys and version of STREAM-22's steps record (the state format); resuming to S is impl's own.
    "reference.stream_steps": frozenset({"RANK_KEYS", "STEPS_VERSION", "TOPOLOGY_KEYS"}),
    # BatchedMap is the map's configuration (its identity enters the state); mapping a batch is impl's own.
    "reference.stream_maps": frozenset({"BatchedMap", "MAP_LANE_KEYS", "TOKENS"}),
    # planned_options_refused validates the options a lane mixture refuses (MIX-25: configuration), mismatches
    # names the parts of a foreign state (the state format, MIX-24); the draws, lanes and state are impl's own.
    "reference.stream_mixing": frozenset({"StreamMixConfig", "STATE_FORMAT", "STATE_VERSION", "STATE_KEYS",
                                          "V1_KEYS", "mismatches", "planned_options_refused"}),
}
"""Configuration types, constants, errors and the state/fingerprint format: what impl may share with the spec."""

def reference_imports(source: str) -> list[tuple[int, str, str]]:
    r"""``(line, module, name)`` for every import of the reference in ``source``; ``name`` is ``*`` for a whole module.

    >>> reference_imports("from reference.partition import advance, PADDING as P\nimport reference.rng\n")
    [(1, 'reference.partition', 'PADDING'), (1, 'reference.partition', 'advance'), (2, 'reference.rng', '*')]
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None and (
                node.module == "reference" or node.module.startswith("reference.")):
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, "*") for alias in node.names
                      if alias.name == "reference" or alias.name.startswith("reference.")]
    return sorted(found)


def seam_violations(filename: str, source: str) -> list[str]:
    """Each reference import of an impl module that ``ALLOWED`` does not list."""
    return [f"impl/{filename}:{line}: from {module} import {name}"
            for line, module, name in reference_imports(source)
            if name not in ALLOWED.get(module, frozenset())]


def impl_sources() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(IMPL.glob("*.py"))}


def test_impl_imports_from_the_reference_only_configuration_constants_errors_and_formats():
    violations = [v for name, source in impl_sources().items() for v in seam_violations(name, source)]
    assert not violations, (
        "impl calls reference arithmetic (conformance would compare the reference with itself); implement it in "
        "impl, or, if the name is configuration/constant/error/format, add it to ALLOWED:\n" + "\n".join(violations))


def test_the_seam_check_refuses_reference_arithmetic_added_to_any_impl_module():
    for source in ("from reference.partition import advance\n",
                   "def f():\n    from reference.rng import derive_key\n",
                   "import reference.partition\n",
                   "from reference import rng\n",
                   "from reference.resume import padding_sample\n",
                   "from reference.rng import FeistelPermutation as ScalarFeistel\n"):
        assert seam_violations("loader.py", source), f"the seam check accepted {source!r}"
    assert not seam_violations("loader.py", "from reference.partition import PADDING, PartitionConfig\n")


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_every_allowed_name_exists_in_its_reference_module(module):
    import importlib

    missing = sorted(name for name in ALLOWED[module] if not hasattr(importlib.import_module(module), name))
    assert not missing, f"{module} has no {missing}: the allow-list names something that is not there"
