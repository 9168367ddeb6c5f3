"""Meta tests: reference.evaluation obeys EVAL-1..EVAL-5.

The oracle for EVAL-1 cuts the concatenated documents into windows by hand;
EVAL-2 and EVAL-3 count the calls of the build and compare every rank's outcome;
EVAL-4 and EVAL-5 draw per-rank records (some missing, some disagreeing) and
check the decision against the plain reading of the rule.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_raises_typed, check
from reference.errors import EmptyDataError, TopologyError
from reference.evaluation import EvalBroadcastError, EvalBuildError, agreed_source, broadcast_eval, eval_set

docs = st.lists(st.lists(st.integers(1, 9), max_size=8).map(lambda d: [*d, 0]), min_size=1, max_size=8)


def _windows(documents, seq_len):
    stream = [(t, d) for d, doc in enumerate(documents) for t in doc]
    out = []
    for start in range(0, len(stream) - seq_len, seq_len + 1):
        w = stream[start:start + seq_len + 1]
        out.append(([t for t, _ in w[:-1]], [w[j + 1][0] if w[j + 1][1] == w[j][1] else -100 for j in range(seq_len)]))
    return out


@pytest.mark.clause("EVAL-1")
@given(documents=docs, seq_len=st.integers(1, 12))
def test_eval_set_is_the_disjoint_windows_of_the_split_or_an_empty_data_error(documents, seq_len):
    total = sum(len(d) for d in documents)
    if total < seq_len + 1:
        assert_raises_typed(EmptyDataError, eval_set, documents, seq_len=seq_len, clause="EVAL-1",
                            what="split shorter than one window", mentions=[f"seq_len={seq_len}", f"{total} tokens"])
        return
    got = [(list(s.input_ids), list(s.labels)) for s in eval_set(documents, seq_len=seq_len)]
    assert_equal(got, _windows(documents, seq_len), clause="EVAL-1", what="eval samples",
                 repro={"documents": documents, "seq_len": seq_len})


@pytest.mark.clause("EVAL-2", "EVAL-3")
@given(documents=docs, seq_len=st.integers(1, 12), world=st.integers(1, 4), data=st.data())
def test_every_rank_ends_with_the_one_build_result_or_the_same_error(documents, seq_len, world, data):
    src = data.draw(st.integers(0, world - 1))
    calls = []

    def build():
        calls.append(1)
        return eval_set(documents, seq_len=seq_len)

    outcomes = broadcast_eval(build, world_size=world, src=src)
    repro = {"documents": documents, "seq_len": seq_len, "world_size": world, "src": src}
    assert_equal(len(calls), 1, clause="EVAL-2", what="builds", repro=repro)
    assert_equal(len(outcomes), world, clause="EVAL-2", what="outcomes", repro=repro)
    first = outcomes[0]
    if isinstance(first, Exception):
        check(all(type(o) is EmptyDataError and o.args == first.args for o in outcomes), clause="EVAL-3",
              what=f"ranks end with different errors: {outcomes}", repro=repro)
    else:
        check(all(o == first for o in outcomes), clause="EVAL-2", what="ranks hold different sets", repro=repro)


@pytest.mark.clause("EVAL-3")
def test_an_untyped_failure_becomes_an_eval_build_error_naming_it_on_every_rank():
    def build():
        raise FileNotFoundError("eval.jsonl")

    outcomes = broadcast_eval(build, world_size=3, src=0)
    check(all(type(o) is EvalBuildError for o in outcomes), clause="EVAL-3", what=f"outcomes {outcomes}")
    check(all("FileNotFoundError: eval.jsonl" in str(o) for o in outcomes), clause="EVAL-3", what="messages")
    assert_raises_typed(TopologyError, broadcast_eval, build, world_size=2, src=2, clause="EVAL-3",
                        what="src outside the world", mentions=["src=2"])


records = st.lists(st.one_of(st.none(), st.tuples(st.integers(0, 2), st.sampled_from(["f1", "f2"]))),
                   min_size=1, max_size=4)


@pytest.mark.clause("EVAL-4", "EVAL-5")
@given(records=records)
def test_ranks_agree_on_the_source_only_when_every_rank_arrived_with_the_same_src_and_fingerprint(records):
    missing = [r for r, rec in enumerate(records) if rec is None]
    srcs = {rec[0] for rec in records if rec is not None}
    prints = {rec[1] for rec in records if rec is not None}
    if missing:
        assert_raises_typed(EvalBroadcastError, agreed_source, records, clause="EVAL-5", what="a rank is missing",
                            mentions=[f"{missing}", "did not reach", "crashed"])
    elif len(srcs) > 1 or len(prints) > 1:
        ranks_of = {}
        for r, (src, fp) in enumerate(records):
            ranks_of.setdefault(("src", src), []).append(r)
            ranks_of.setdefault(("fingerprint", fp), []).append(r)
        named = [f"{name}={value!r} on rank{'s' if len(rs) > 1 else ''} {rs}" for (name, value), rs in ranks_of.items()
                 if len(srcs if name == "src" else prints) > 1]
        assert_raises_typed(EvalBroadcastError, agreed_source, records, clause="EVAL-4", what="ranks disagree",
                            mentions=[*named, "pass the same src"])
    elif next(iter(srcs)) >= len(records):
        assert_raises_typed(TopologyError, agreed_source, records, clause="EVAL-4", what="src outside the group",
                            mentions=[f"src={next(iter(srcs))}"])
    else:
        assert_equal(agreed_source(records), next(iter(srcs)), clause="EVAL-4", what="agreed src",
                     repro={"records": records})


@pytest.mark.clause("EVAL-4")
def test_a_disagreement_names_every_value_seen_and_the_ranks_holding_it():
    got = [(0, "f1"), (1, "f1"), (0, "f2")]
    assert_raises_typed(EvalBroadcastError, agreed_source, got, clause="EVAL-4", what="src and fingerprint differ",
                        mentions=["src=0 on ranks [0, 2]", "src=1 on rank [1]", "fingerprint='f1' on ranks [0, 1]",
                                  "fingerprint='f2' on rank [2]"])
