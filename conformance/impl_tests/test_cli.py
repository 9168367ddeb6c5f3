"""The ``loadspec`` command line: build, preview, check."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.assertions import assert_equal, check
from fixtures import generators
from impl import cli
from impl.store import TokenStore


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    texts = generators.load_corpus(limit=12)
    generators.write_jsonl_shards(texts, root / "data", num_shards=2)
    code = cli.main(["build", str(root / "data"), str(root / "store"), "--tokenizer", str(generators.tokenizer_path()),
                     "--num-proc", "1"])
    assert code == 0
    return root / "store"


@pytest.fixture(scope="module")
def second_store(store_dir):
    """A second store of other documents (corpus texts 12..29), for mixtures."""
    root = store_dir.parent
    generators.write_jsonl_shards(generators.load_corpus(limit=30)[12:], root / "data2", num_shards=1)
    assert cli.main(["build", str(root / "data2"), str(root / "store2"), "--tokenizer",
                     str(generators.tokenizer_path()), "--num-proc", "1"]) == 0
    return root / "store2"


REPO = Path(__file__).resolve().parents[2]
TORCH_PROBE = """
import sys
from impl import cli
try:
    cli.main(sys.argv[1:])
except SystemExit:
    pass
print("TORCH_IMPORTED", "torch" in sys.modules)
"""


@pytest.mark.parametrize("argv", [["--help"], ["preview", "--help"], ["check", "store", "--seq-len", "0"],
                                  ["preview", "store", "--seq-len", "8", "--bucket", "2,4"], ["frobnicate"]],
                         ids=["help", "command-help", "bad-value", "bad-bucket", "bad-command"])
def test_help_and_usage_errors_answer_without_importing_torch(argv):
    done = subprocess.run([sys.executable, "-c", TORCH_PROBE, *argv], check=False, cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    check("usage: loadspec" in done.stdout + done.stderr, clause="RES-3", what=f"no usage text: {done.stderr[-500:]!r}")
    assert_equal(done.stdout.strip().splitlines()[-1], "TORCH_IMPORTED False", clause="RES-3",
                 what=f"torch imported by `loadspec {' '.join(argv)}`")


@pytest.mark.clause("SPLIT-8")
def test_preview_with_a_split_shows_only_the_documents_of_that_split(store_dir, capsys):
    assert cli.main(["preview", str(store_dir), "--seq-len", "4096", "--packing", "none", "-n", "100",
                     "--split", "train[50%:]"]) == 0
    out = capsys.readouterr().out
    starts = {int(d): [int(t) for t in head.split()] for d, head in re.findall(r"⟦doc (\d+) @0⟧((?: \d+){8})", out)}
    store = TokenStore.open(store_dir)
    assert_equal(sorted(starts), list(range(6, 12)), clause="SPLIT-9", what="documents (store ids) shown")
    assert_equal([starts[d] for d in range(6, 12)], [store[d][:8].tolist() for d in range(6, 12)], clause="SPLIT-8",
                 what="first tokens of the documents shown for train[50%:] of 12 (documents 6..11)")
    check("split 'train[50%:]'" in out.splitlines()[0], clause="SPLIT-8", what=f"header {out.splitlines()[0]!r}")


@pytest.mark.clause("MIX-13")
def test_check_of_two_stores_with_weights_audits_and_reports_the_mixture(store_dir, second_store, capsys):
    code = cli.main(["check", str(store_dir), str(second_store), "--seq-len", "32", "--weights", "0.7", "0.3",
                     "--stopping", "all_exhausted", "--mix-seed", "3", "--world-sizes", "2,3", "--resumes", "2"])
    out = capsys.readouterr().out
    assert_equal(code, 0, clause="MIX-13", what=f"exit code (output: {out})")
    check("MixedDataset(2 sources, weights=(0.7, 0.3), stopping='all_exhausted'" in out, clause="MIX-13",
          what=f"mixture not described: {out}")
    counts = [(int(a), int(b)) for a, b in re.findall(r"mixture store \d .*?(\d+) of its (\d+) samples", out)]
    assert_equal(len(counts), 2, clause="MIX-13", what=f"per-store lines in {out}")
    check(all(taken == size > 0 for taken, size in counts), clause="MIX-13",
          what=f"all_exhausted takes every sample of both stores once: {counts}")
    check("duplicates 0, missing 0" in out and out.rstrip().endswith("OK"), clause="RES-4", what=f"report: {out}")


@pytest.mark.clause("BUCK-2")
def test_preview_with_bucket_shows_packs_of_similar_lengths(store_dir, capsys):
    assert cli.main(["preview", str(store_dir), "--seq-len", "4096", "--packing", "none", "-n", "12",
                     "--bucket", "12,4"]) == 0
    out = capsys.readouterr().out
    packs = [json.loads(m) for m in re.findall(r"══ pack \d+ \(samples \d+\.\.\d+\): lengths (\[.*\])", out)]
    assert_equal(len(packs), 3, clause="BUCK-2", what=f"packs shown in {out[:400]!r}")
    ranked = sorted(n for pack in packs for n in pack)
    runs = [sorted(ranked[k:k + 4]) for k in range(0, 12, 4)]
    check(sorted(sorted(pack) for pack in packs) == runs, clause="BUCK-2",
          what=f"each pack is a run of the length-sorted buffer: packs {packs}, sorted {ranked}")


@pytest.mark.parametrize("argv, message", [
    (["--split", "train[:abc]"], "split spec 'train[:abc]' is malformed"),
    (["--weights", "0.7"], "--weights, --stopping and --mix-seed apply to a mixture"),
    (["--weights", "-1"], "a weight must be a finite number >= 0"),
    (["--bucket", "8"], "is not BUFFER,PACK"),
    (["--bucket", "4,8"], "pass PACK <= BUFFER"),
], ids=["split", "weights-one-store", "negative-weight", "bucket-form", "bucket-pack"])
def test_bad_split_mixture_and_bucket_values_are_usage_errors_naming_the_fix(store_dir, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["preview", str(store_dir), "--seq-len", "8", *argv])
    err = capsys.readouterr().err
    assert_equal(exit_info.value.code, 2, clause="RES-3", what="usage error exit code")
    check(message in err, clause="RES-3", what=f"stderr {err!r} does not say {message!r}")


def test_weights_for_another_number_of_stores_is_a_usage_error(store_dir, second_store, capsys):
    with pytest.raises(SystemExit):
        cli.main(["check", str(store_dir), str(second_store), "--seq-len", "8", "--weights", "1", "2", "3"])
    check("--weights has 3 value(s) but 2 store(s)" in capsys.readouterr().err, clause="RES-3", what="message")


@pytest.mark.clause("PACK-6")
def test_build_tokenizes_every_document_with_an_eos(store_dir):
    store = TokenStore.open(store_dir)
    tok = generators.load_tokenizer()
    texts = generators.load_corpus(limit=12)
    assert_equal(len(store), 12, clause="PACK-1", what="documents in the built store")
    assert_equal(store[3].tolist(), tok(texts[3], add_special_tokens=False).input_ids + [tok.eos_token_id],
                 clause="PACK-1", what="document 3 tokens")


@pytest.mark.clause("PACK-5")
def test_preview_marks_document_boundaries_and_masked_labels(store_dir, capsys):
    assert cli.main(["preview", str(store_dir), "--seq-len", "64", "--packing", "best_fit", "-n", "3",
                     "--tokenizer", str(generators.tokenizer_path())]) == 0
    out = capsys.readouterr().out
    check("⟦doc 0 @0⟧In the beginning" in out, clause="PACK-5", what=f"first document's start not shown in {out[:300]!r}")
    check("‹" in out and "labels masked" in out, clause="PACK-4", what="masked labels not marked")


def test_preview_echoes_the_shuffle_as_the_user_spelled_it(store_dir, capsys):
    for shuffle in ("none", "global"):
        assert cli.main(["preview", str(store_dir), "--seq-len", "64", "--shuffle", shuffle, "-n", "1"]) == 0
        out = capsys.readouterr().out
        check(f"shuffle={shuffle!r}" in out.splitlines()[0], clause="ORD-2", what=f"preview header {out.splitlines()[0]!r}")


@pytest.mark.clause("RES-4", "PART-1")
def test_check_audits_resumes_across_world_sizes_and_reports_ok(store_dir, capsys):
    code = cli.main(["check", str(store_dir), "--seq-len", "32", "--shuffle", "global", "--world-sizes", "2,3",
                     "--batch-size", "2", "--resumes", "3", "--verify"])
    out = capsys.readouterr().out
    assert_equal(code, 0, clause="RES-4", what=f"exit code (output: {out})")
    check("duplicates 0, missing 0" in out and out.rstrip().endswith("OK"), clause="RES-4", what=f"report: {out}")


def test_commands_report_typed_errors_with_exit_code_2(tmp_path, capsys):
    code = cli.main(["check", str(tmp_path / "nowhere"), "--seq-len", "8"])
    err = capsys.readouterr().err
    assert_equal(code, 2, clause="RES-3", what="exit code for a missing store")
    check("StoreNotFoundError" in err, clause="RES-3", what=f"stderr {err!r} does not name the error")
