"""The per-model seq_id queue (service/queue.py): order, duplicates, gaps, models independent."""

from posttrain.service.queue import SeqQueue


def test_out_of_order_submits_run_in_seq_order():
    q = SeqQueue(gap_wait_s=10)
    q.submit("m", 2, "b", now=0)
    q.submit("m", 3, "c", now=0)
    assert q.ready(now=0) == []  # 1 has not come
    q.submit("m", 1, "a", now=0)
    assert [job for _, job in q.ready(now=0)] == ["a", "b", "c"]


def test_a_retried_submit_is_the_same_request_and_runs_once():
    q = SeqQueue()
    rid, new = q.submit("m", 1, "first", now=0)
    assert new
    assert q.ready(now=0) == [(rid, "first")]
    rid2, new2 = q.submit("m", 1, "retry", now=1)  # after it ran
    rid3, new3 = q.submit("m", 1, "retry", now=1)
    assert (rid2, new2) == (rid, False) and (rid3, new3) == (rid, False)
    assert q.ready(now=1) == []
    q.submit("m", 2, "x", now=1)
    q.submit("m", 2, "x-again", now=1)  # a retry before it ran
    assert [job for _, job in q.ready(now=1)] == ["x"]


def test_a_gap_is_skipped_after_gap_wait():
    q = SeqQueue(gap_wait_s=2.0)
    q.submit("m", 3, "c", now=0)
    q.submit("m", 5, "e", now=0)
    assert q.ready(now=1.9) == []
    assert [job for _, job in q.ready(now=2.0)] == ["c", "e"]  # 4 never came: e waited since 0 too


def test_models_have_their_own_order():
    q = SeqQueue(gap_wait_s=10)
    q.submit("a", 1, "a1", now=0)
    q.submit("b", 2, "b2", now=0)
    q.submit("b", 1, "b1", now=0)
    assert sorted(job for _, job in q.ready(now=0)) == ["a1", "b1", "b2"]
