"""SENSE retrieval: datastore build/save/load, exact suffix lookup, the retrieval drafter in the loop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from semverify import generate, get_rule
from semverify.engine.loop import speculative_generate
from semverify.engine.tree import leaf_paths
from semverify.sense.build import build_datastore, collect_states, describe
from semverify.sense.datastore import SEPARATOR, Datastore, DatastoreError
from semverify.sense.drafter import RetrievalDrafter
from tests.helpers import byte_tokenizer, tiny_model

ANSWERS = [
    "Natalia sold 48 / 2 = 24 clips in May. 48 + 24 = 72.\nFinal Answer: 72",
    "Weng earns 12 / 60 = 0.2 per minute. 0.2 * 50 = 10.\nFinal Answer: 10",
    "Betty has 100 / 2 = 50. Her parents give 15, grandparents 30. 50 + 15 + 30 = 95.\nFinal Answer: 5",
    "James writes 3 * 2 = 6 pages a week... 6 * 52 = 312 pages a year.\nFinal Answer: 312",
]


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    tok = byte_tokenizer()
    model = tiny_model(0, arch="llama", vocab=len(tok))
    examples = [(tok.apply_chat_template([{"role": "user", "content": f"Question {i}"}], tokenize=False,
                                         add_generation_prompt=True), a) for i, a in enumerate(ANSWERS)]
    parts = tmp_path_factory.mktemp("states")
    collect_states(model, tok, examples, parts, shard_size=3, progress=False)
    return model, tok, build_datastore(parts, dim=16, model_name="tiny", corpus="test answers"), parts


def test_build_layout(tiny_store):
    _, tok, store, _ = tiny_store
    lengths = [len(tok(a, add_special_tokens=False).input_ids) for a in ANSWERS]
    assert store.size == sum(lengths) and store.keys.shape == (sum(lengths), 16)
    assert (store.tokens == SEPARATOR).sum() == len(ANSWERS)
    assert torch.allclose(store.keys.norm(dim=-1), torch.ones(store.size), atol=1e-2)
    first = tok(ANSWERS[0], add_special_tokens=False).input_ids
    assert store.continuation(0, 5) == first[:5]
    assert store.continuation(len(first) - 2, 10) == first[-2:]  # stops at the text boundary
    info = describe(store)
    assert info["entries"] == store.size and info["texts"] == len(ANSWERS) and info["disk_mb"] > 0


def test_suffix_matches_agree_with_brute_force(tiny_store):
    store = tiny_store[2]
    tokens = store.tokens.tolist()
    rng = np.random.default_rng(0)
    for _ in range(40):
        start = int(rng.integers(0, len(tokens) - 4))
        n = int(rng.integers(1, 5))
        suffix = tokens[start : start + n]
        if SEPARATOR in suffix:
            continue
        brute = [i + n for i in range(len(tokens) - n + 1) if tokens[i : i + n] == suffix]
        padded = tokens + [SEPARATOR] * 4
        following = [tuple(padded[p : p + 4]) for p in brute]  # continuations are told apart by 4 tokens
        found = store.suffix_matches(suffix, 10_000).tolist()
        assert set(found) <= set(brute)
        assert sorted(tuple(padded[p : p + 4]) for p in found) == sorted(set(following))  # one per continuation
        counts = [following.count(tuple(padded[p : p + 4])) for p in found]
        assert counts == sorted(counts, reverse=True)  # the most frequent first
        assert found[:2] == store.suffix_matches(suffix, 2).tolist()
    assert store.suffix_matches([10**6], 5).size == 0 and store.suffix_matches([], 5).size == 0


def test_saved_and_loaded_store_retrieves_identically(tiny_store, tmp_path):
    model, tok, store, _ = tiny_store
    loaded = Datastore.load(store.save(tmp_path / "store.pt"))
    assert loaded.meta == store.meta and np.array_equal(loaded.tokens, store.tokens)
    queries = store.reduce(torch.randn(5, model.config.hidden_size, generator=torch.Generator().manual_seed(0)))
    for q in queries:
        a, b = store.nearest(q, 7), loaded.nearest(q, 7)
        assert torch.equal(a[1], b[1]) and torch.allclose(a[0], b[0])
    assert loaded.suffix_matches([int(store.tokens[3])], 50).tolist() == store.suffix_matches(
        [int(store.tokens[3])], 50).tolist()


def test_bad_datastores_give_clear_errors(tiny_store, tmp_path):
    _, _, store, _ = tiny_store
    with pytest.raises(DatastoreError, match="hidden size 32"):
        store.reduce(torch.randn(1, 48))
    with pytest.raises(DatastoreError, match="hidden size"):
        store.check_model("tiny", 48)
    with pytest.raises(DatastoreError, match="built for tiny, not other-model"):
        store.check_model("other-model", store.hidden_size)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a datastore at all")
    with pytest.raises(DatastoreError, match="not a readable semverify datastore"):
        Datastore.load(corrupt)
    with pytest.raises(FileNotFoundError, match="semverify datastore"):
        Datastore.load(tmp_path / "missing.pt")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatastoreError, match="no collected states"):
        build_datastore(empty)
    torch.save({"states": [], "tokens": []}, empty / "shard00000.pt")
    with pytest.raises(DatastoreError, match="empty"):
        build_datastore(empty)


def test_collect_resumes_from_finished_shards(tiny_store, tmp_path):
    model, tok, store, parts = tiny_store
    examples = [("p", a) for a in ANSWERS]
    copy = tmp_path / "parts"
    copy.mkdir()
    (copy / "shard00000.pt").write_bytes((parts / "shard00000.pt").read_bytes())
    mtime = (copy / "shard00000.pt").stat().st_mtime_ns
    collect_states(model, tok, examples, copy, shard_size=3, progress=False)
    assert (copy / "shard00000.pt").stat().st_mtime_ns == mtime and (copy / "shard00001.pt").exists()


@pytest.mark.parametrize("lexical, semantic", [(True, False), (False, True), (True, True)])
def test_retrieval_drafting_with_exact_verification_equals_greedy(tiny_store, lexical, semantic):
    model, tok, store, _ = tiny_store
    prompt = tok.apply_chat_template([{"role": "user", "content": "Question 0"}], tokenize=False,
                                     add_generation_prompt=True) + ANSWERS[0][:20]
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    expected = model.generate(ids, do_sample=False, max_new_tokens=40)
    for rule in (get_rule("greedy"), get_rule("sense", theta_e=1.0)):
        drafter = RetrievalDrafter(store, num_candidates=6, lexical=lexical, semantic=semantic)
        out, stats = speculative_generate(model, ids, drafter=drafter, rule=rule, k=6,
                                          max_new_tokens=40)
        assert torch.equal(out, expected)
        assert stats.drafted > 0


@pytest.mark.parametrize("rule", ["greedy", "sense"])
def test_a_batch_retrieves_and_verifies_a_trie_per_row(tiny_store, rule):
    """Each row keeps its own query and dynamic store and writes what it writes alone (and, verified
    exactly, what greedy decoding writes), though the rows' tries share one forward."""
    model, tok, store, _ = tiny_store
    texts = [tok.apply_chat_template([{"role": "user", "content": f"Question {i}"}], tokenize=False,
                                     add_generation_prompt=True) + ANSWERS[i][: 12 + 5 * i] for i in range(3)]
    rows = [tok(t, return_tensors="pt", add_special_tokens=False).input_ids[0] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
    drafter = RetrievalDrafter(store, num_candidates=6)
    out, stats = speculative_generate(model, ids, attention_mask=mask, drafter=drafter, rule=get_rule(rule), k=6,
                                      max_new_tokens=30, pad_token_id=0)
    assert stats.accepted > 0
    if rule == "greedy":
        expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, pad_token_id=0)
        assert torch.equal(out, expected)
    for row, prompt in enumerate(rows):
        alone, _ = speculative_generate(model, prompt[None], drafter=RetrievalDrafter(store, num_candidates=6),
                                        rule=get_rule(rule), k=6, max_new_tokens=30)
        assert torch.equal(out[row, width:], alone[0, len(prompt):])


def test_semantic_slots_put_hidden_state_candidates_in_the_tree(tiny_store):
    model, tok, store, _ = tiny_store
    prompt = tok.apply_chat_template([{"role": "user", "content": "Question 0"}], tokenize=False,
                                     add_generation_prompt=True) + ANSWERS[0][:20]
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    expected = model.generate(ids, do_sample=False, max_new_tokens=30)
    seen = {}
    for slots in (0, 3):
        drafter = RetrievalDrafter(store, num_candidates=4, semantic_slots=slots)
        semantic_first = []
        original = drafter._ranked

        def ranked(scored, semantic, original=original, log=semantic_first):
            order = original(scored, semantic)
            log.append(sum(c in semantic for c in order[:3]))
            return order

        drafter._ranked = ranked
        out, _ = speculative_generate(model, ids, drafter=drafter, rule=get_rule("greedy"), k=6,
                                      max_new_tokens=30)
        assert torch.equal(out, expected)  # exact verification: lossless whatever the drafts
        seen[slots] = sum(semantic_first)
    assert seen[3] > seen[0]  # the reserved slots go to hidden-state candidates
    with pytest.raises(ValueError, match="semantic_slots"):
        RetrievalDrafter(store, num_candidates=2, semantic_slots=3)


def test_drafter_proposes_a_trie_of_corpus_continuations(tiny_store):
    _, tok, store, _ = tiny_store
    drafter = RetrievalDrafter(store, num_candidates=4, semantic=False)
    context = tok("clips in May. 48 + 24", add_special_tokens=False).input_ids
    draft = drafter.propose(torch.tensor([context]), 5, None, None)
    expected = tok(" = 72.\nFinal", add_special_tokens=False).input_ids[:5]
    paths = leaf_paths(draft.parents) if draft.is_tree else [list(range(draft.length))]
    assert expected in [[int(draft.tokens[0, i]) for i in path] for path in paths]


def test_generate_with_a_retrieval_drafter_and_the_sense_rule(tiny_store):
    model, tok, store, _ = tiny_store
    ids = tok("Natalia sold 48 / 2", return_tensors="pt", add_special_tokens=False).input_ids
    out = generate(model, ids, drafter=RetrievalDrafter(store), rule="sense", max_new_tokens=20,
                   num_assistant_tokens=6, return_dict_in_generate=True)
    assert out.sequences.shape[1] == ids.shape[1] + 20 and out.spec_stats.steps <= 20


def test_drafter_parameter_errors(tiny_store):
    with pytest.raises(ValueError, match="lexical or semantic"):
        RetrievalDrafter(tiny_store[2], lexical=False, semantic=False)
    with pytest.raises(ValueError, match="datastore or the dynamic store"):
        RetrievalDrafter(None, semantic=True, dynamic=False)


def test_datastore_cli_then_compare_with_sense_methods(tmp_path, tiny_checkpoint):
    import json

    from evals.report import report
    from semverify.cli import main

    problems = [{"question": f"What is {a} + {a}?", "answer": f"{a} + {a} = {2 * a}.\n#### {2 * a}"} for a in range(6)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in problems))
    store = tmp_path / "store.pt"
    assert main(["datastore", "--model", str(tiny_checkpoint), "--data", str(data), "--limit", "5", "--dim", "8",
                 "--dtype", "float32", "--out", str(store)]) == 0
    info = json.loads(store.with_suffix(".json").read_text())
    assert info["texts"] == 5 and info["entries"] > 0 and info["dim"] == 8
    both = tmp_path / "both.pt"
    assert main(["datastore", "--model", str(tiny_checkpoint), "--data", str(data), "--limit", "3", "--dim", "8",
                 "--dtype", "float32", "--corpus", "both", "--max-new-tokens", "5", "--out", str(both)]) == 0
    info = json.loads(both.with_suffix(".json").read_text())
    assert info["texts"] == 6 and "(ID" in info["corpus"] and "(OOD)" in info["corpus"]
    assert len(Path(f"{both}.answers.jsonl").read_text().splitlines()) == 3

    out = tmp_path / "run"
    main(["compare", "--target", str(tiny_checkpoint), "--data", "sample", "--limit", "2", "--max-new-tokens", "10",
          "--dtype", "float32", "--methods", "vanilla,rest,sense,sense_no_se,rest:drafter.max_nodes=2",
          "--datastore", str(store), "--out", str(out), "--no-report"])
    rows = [json.loads(line) for line in (out / "rows.rank0.jsonl").open()]
    assert len(rows) == 10
    by = {(r["id"], r["method"]): r for r in rows}
    for i in range(2):  # exact verification of retrieval drafts keeps the target's greedy output
        assert by[(i, "rest")]["output"] == by[(i, "vanilla")]["output"] == by[(i, "sense_no_se")]["output"]
        small = by[(i, "rest:drafter.max_nodes=2")]  # the drafter setting reached the drafter
        assert small["output"] == by[(i, "rest")]["output"] and small["drafted"] <= 2 * small["steps"]
    assert any(by[(i, "rest")]["drafted"] > 2 * by[(i, "rest")]["steps"] for i in range(2))

    # a method's own datastore: the same rows as a run that gives that store to every method
    common = ["compare", "--target", str(tiny_checkpoint), "--data", "sample", "--limit", "2", "--max-new-tokens",
              "10", "--dtype", "float32", "--no-report"]
    main([*common, "--methods", f"vanilla,rest:drafter.datastore={both}", "--datastore", str(store),
          "--out", str(tmp_path / "own")])
    main([*common, "--methods", "rest", "--datastore", str(both), "--out", str(tmp_path / "global")])
    own = {r["id"]: r for r in map(json.loads, (tmp_path / "own" / "rows.rank0.jsonl").open())
           if r["method"] != "vanilla"}
    whole = {r["id"]: r for r in map(json.loads, (tmp_path / "global" / "rows.rank0.jsonl").open())}
    for i in range(2):
        assert own[i]["output"] == by[(i, "vanilla")]["output"]
        assert (own[i]["drafted"], own[i]["accepted_per_position"]) == (whole[i]["drafted"],
                                                                        whole[i]["accepted_per_position"])
    header = report(tmp_path / "own").splitlines()[2]  # a run without a draft model does not name one
    assert f"target `{tiny_checkpoint}`, no draft model, datastore `{store}`," in header


def test_resuming_states_over_another_corpus_is_refused(tiny_store, tmp_path):
    model, tok, _, _ = tiny_store
    collect_states(model, tok, [("p", a) for a in ANSWERS[:2]], tmp_path, progress=False)
    with pytest.raises(DatastoreError, match="another corpus"):
        collect_states(model, tok, [("p", a) for a in ANSWERS[1:3]], tmp_path, progress=False)


def test_retrieval_methods_need_a_datastore_before_models_load(tmp_path):
    from semverify.cli import main

    with pytest.raises(SystemExit) as info:
        main(["compare", "--target", "/no/such/model", "--methods", "vanilla,sense", "--out", str(tmp_path / "r")])
    assert "need --datastore" in str(info.value)
    with pytest.raises(SystemExit) as info:
        main(["compare", "--target", "/no/such/model", "--methods", "rest", "--datastore", str(tmp_path / "x.pt"),
              "--out", str(tmp_path / "r")])
    assert "datastore not found" in str(info.value)
    with pytest.raises(SystemExit) as info:  # a method's own store stands in for --datastore, and is checked
        main(["compare", "--target", "/no/such/model", "--methods", f"sense:drafter.datastore={tmp_path / 'y.pt'}",
              "--out", str(tmp_path / "r")])
    assert "datastore not found" in str(info.value) and "y.pt" in str(info.value)


def test_tree_size_is_bounded(tiny_store):
    _, tok, store, _ = tiny_store
    context = torch.tensor([tok(" = ", add_special_tokens=False).input_ids])
    big = RetrievalDrafter(store, num_candidates=10, semantic=False).propose(context, 8, None, None)
    small = RetrievalDrafter(store, num_candidates=10, semantic=False, max_nodes=6).propose(context, 8, None, None)
    assert big.length > 6 == small.length


def test_optional_faiss_index_finds_the_same_neighbours(tiny_store):
    pytest.importorskip("faiss")
    store = tiny_store[2]
    copy = Datastore(store.keys, store.positions, store.tokens, store.mean, store.scale, store.components, store.meta)
    copy.build_faiss_index(nlist=4, nprobe=4)  # every list probed: the search is exact
    for i in (0, 7, store.size - 1):
        exact, approx = store.nearest(store.keys[i], 5), copy.nearest(store.keys[i], 5)
        assert int(approx[1][0]) == int(exact[1][0]) or torch.isclose(approx[0][0], exact[0][0], atol=1e-4)
        assert torch.allclose(approx[0], exact[0], atol=1e-4)


@pytest.mark.parametrize("context", [None, 2])  # noise keyed by position, or by the last two tokens
def test_retrieval_drafting_under_coupled_sampling_equals_the_target_alone(tiny_store, tmp_path, context):
    from semverify import NoDrafter, Sampler
    from semverify.engine.coupling import CoupledNoise

    model, tok, _, _ = tiny_store
    prompt = tok.apply_chat_template([{"role": "user", "content": "Question 0"}], tokenize=False,
                                     add_generation_prompt=True) + ANSWERS[0][:20]
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    sampler = Sampler(True, 0.8)
    vanilla = {seed: speculative_generate(model, ids, drafter=NoDrafter(), rule=get_rule("speculative"),
                                          k=6, max_new_tokens=40, sampler=sampler,
                                          generator=CoupledNoise(seed, context=context))[0] for seed in range(3)}
    # a store of what the target writes under seeds 0 and 1 (seed 2's output is new to it)
    examples = [(prompt, tok.decode(vanilla[seed][0, ids.shape[1] :])) for seed in (0, 1)]
    collect_states(model, tok, examples, tmp_path / "own", shard_size=3, progress=False)
    store = build_datastore(tmp_path / "own", dim=16, model_name="tiny", corpus="own outputs")
    accepted = 0
    for seed, expected in vanilla.items():
        for rule in (get_rule("speculative"), get_rule("sense", theta_e=1.0)):
            drafter = RetrievalDrafter(store, num_candidates=6)
            out, stats = speculative_generate(model, ids, drafter=drafter, rule=rule, k=6,
                                              max_new_tokens=40, sampler=sampler,
                                              generator=CoupledNoise(seed, context=context))
            assert torch.equal(out, expected), f"{rule.name}, seed {seed}"
            accepted += stats.accepted
    assert accepted > 0  # retrieved drafts were kept, so the identity is not vacuous
