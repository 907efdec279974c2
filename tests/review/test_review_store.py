"""ReviewStore (review/store.py): the guarantees the review page and the statistics rely on."""

from __future__ import annotations

import threading

import pytest

from posttrain.errors import PosttrainError
from posttrain.review.store import NewItem, ReviewInputError, ReviewStore


def _items(n: int) -> list[NewItem]:
    return [NewItem(f"i{k}", f"{k}+1=", str(k + 1), str(k + 2), "addition") for k in range(n)]


@pytest.fixture()
def store(tmp_path) -> ReviewStore:
    s = ReviewStore(tmp_path / "r.db", create=True)
    s.create_session("s", "A", "B", "test", _items(10), double_share=0.2, seed=0)
    return s


def test_missing_db_and_existing_session_are_errors(tmp_path, store):
    with pytest.raises(PosttrainError, match="no review database"):
        ReviewStore(tmp_path / "nope.db")
    with pytest.raises(ReviewInputError, match="session 's' exists"):
        store.create_session("s", "A", "B", "test", _items(2))
    assert [s.id for s in store.sessions()] == ["s"]


def test_double_submit_is_idempotent(store):
    assert store.judge("s", "i0", "ann", "b", "clearer") is True
    assert store.judge("s", "i0", "ann", "a") is False  # the first answer stands
    (j,) = store.judgments("s")
    assert (j.item, j.reviewer, j.verdict, j.note) == ("i0", "ann", "b", "clearer")


def test_unknown_session_item_and_bad_verdict_store_nothing(tmp_path, store):
    other = ReviewStore(tmp_path / "r.db")
    other.create_session("t", "A", "B", "test", [NewItem("only-in-t", "p", "x", "y", "src")])
    with pytest.raises(ReviewInputError, match="unknown review session 'nope'") as e:
        store.judge("nope", "i0", "ann", "a")
    assert e.value.status == 404
    with pytest.raises(ReviewInputError, match="item 'only-in-t' is not in session 's'"):
        store.judge("s", "only-in-t", "ann", "a")  # an item id from another session
    with pytest.raises(ReviewInputError, match="judgment 'great' is not one of a, b, tie, both_bad"):
        store.judge("s", "i0", "ann", "great")
    assert store.judgments("s") == [] and store.judgments("t") == []


def test_reviewer_name_limits(store):
    for bad, why in (("", "empty"), ("   ", "empty"), ("x" * 200, "200 characters; at most 100")):
        with pytest.raises(ReviewInputError, match=why):
            store.judge("s", "i0", bad, "a")
        with pytest.raises(ReviewInputError, match=why):
            store.next_item("s", bad)
    assert store.judge("s", "i0", "  " + "x" * 100 + " ", "a")  # stripped: exactly 100 is fine
    assert store.judgments("s")[0].reviewer == "x" * 100


def test_double_share_count(tmp_path):
    s = ReviewStore(tmp_path / "r.db", create=True)
    for sid, n, share, doubled in (("a", 10, 0.2, 2), ("b", 100, 0.2, 20), ("c", 3, 0.2, 1), ("d", 10, 0.0, 0),
                                   ("e", 4, 1.0, 4)):
        s.create_session(sid, "A", "B", "t", _items(n), double_share=share)
        copies = [it.copies for it in s.items(sid)]
        assert sum(c == 2 for c in copies) == doubled and set(copies) <= {1, 2}
        assert s.progress(sid)["needed"] == n + doubled


def test_a_reviewer_never_gets_an_item_they_judged_and_doubles_go_to_two(store):
    doubled = {it.id for it in store.items("s") if it.copies == 2}
    seen = {"ann": [], "bob": []}
    done = set()
    while done != set(seen):  # interleaved: three items each in turn, until nothing is left for either
        for reviewer in seen:
            for _ in range(3):
                it = store.next_item("s", reviewer)
                if it is None:
                    done.add(reviewer)
                    break
                assert it.id not in seen[reviewer]
                seen[reviewer].append(it.id)
                store.judge("s", it.id, reviewer, "tie")
    both = set(seen["ann"]) & set(seen["bob"])
    assert both == doubled  # exactly the doubly reviewed items went to both
    assert len(seen["ann"]) + len(seen["bob"]) == 12
    assert store.progress("s") == {"judged": 12, "needed": 12, "items": 10, "mine": 0}


def test_concurrent_claims_never_share_a_single_copy_item(tmp_path):
    s = ReviewStore(tmp_path / "r.db", create=True)
    s.create_session("s", "A", "B", "t", _items(40), double_share=0.0)
    got: dict[str, list[str]] = {"ann": [], "bob": []}
    barrier = threading.Barrier(2)

    def work(reviewer: str) -> None:
        barrier.wait()  # both start claiming at once
        while (it := s.next_item("s", reviewer)) is not None:
            got[reviewer].append(it.id)
            s.judge("s", it.id, reviewer, "a")

    threads = [threading.Thread(target=work, args=(r,)) for r in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not set(got["ann"]) & set(got["bob"])  # no single-copy item went to both
    assert sorted(got["ann"] + got["bob"]) == sorted(f"i{k}" for k in range(40))
    assert len(s.judgments("s")) == 40
