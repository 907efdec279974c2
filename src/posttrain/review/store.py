"""Review sessions in SQLite: items to judge, who was shown what, judgments, flags on run samples, scorer scores.

Why SQLite in WAL mode: a judgment is one transaction committed before the page answers, so killing the server at
any moment loses no submitted judgment, and several reviewers (server threads) write at once without a server of
its own. Every call opens its own connection: the web app calls from a thread pool.

Verdicts are stored in A/B terms ("a", "b", "tie", "both_bad"); the page shows the two outputs left/right in a
per-item random order (`Item.a_left`) and maps the reviewer's left/right answer back. A (session, item, reviewer)
judgment is unique, so a double submit stores nothing new. An item is claimed by a reviewer when shown; a claim
with no judgment older than `claim_seconds` is released, so an abandoned tab does not hold an item forever.
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from posttrain.errors import PosttrainError

SCHEMA_VERSION = 1
VERDICTS = ("a", "b", "tie", "both_bad")
FLAG_KINDS = ("reward_hacked", "wrong_but_rewarded", "good")
MAX_REVIEWER_CHARS = 100
CLAIM_SECONDS = 1800.0
Text = Union[str, list]  # a prompt: a string or a list of {"role", "content"} messages

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
  id TEXT PRIMARY KEY, created REAL NOT NULL, a_model TEXT NOT NULL, b_model TEXT NOT NULL, source TEXT NOT NULL,
  double_share REAL NOT NULL, meta TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
  session TEXT NOT NULL REFERENCES sessions(id), id TEXT NOT NULL, position INTEGER NOT NULL, prompt TEXT NOT NULL,
  output_a TEXT NOT NULL, output_b TEXT NOT NULL, source TEXT NOT NULL, a_left INTEGER NOT NULL,
  copies INTEGER NOT NULL, PRIMARY KEY (session, id));
CREATE TABLE IF NOT EXISTS claims (
  session TEXT NOT NULL, item TEXT NOT NULL, reviewer TEXT NOT NULL, claimed REAL NOT NULL,
  PRIMARY KEY (session, item, reviewer));
CREATE TABLE IF NOT EXISTS judgments (
  session TEXT NOT NULL, item TEXT NOT NULL, reviewer TEXT NOT NULL,
  verdict TEXT NOT NULL CHECK (verdict IN ('a', 'b', 'tie', 'both_bad')), note TEXT NOT NULL, created REAL NOT NULL,
  PRIMARY KEY (session, item, reviewer));
CREATE TABLE IF NOT EXISTS flags (
  run TEXT NOT NULL, step INTEGER NOT NULL, sample_id TEXT NOT NULL, reviewer TEXT NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('reward_hacked', 'wrong_but_rewarded', 'good')), note TEXT NOT NULL,
  prompt TEXT NOT NULL, output TEXT NOT NULL, reward REAL, created REAL NOT NULL,
  PRIMARY KEY (run, step, sample_id, reviewer));
CREATE TABLE IF NOT EXISTS scores (
  session TEXT NOT NULL, item TEXT NOT NULL, scorer TEXT NOT NULL, score_a REAL NOT NULL, score_b REAL NOT NULL,
  PRIMARY KEY (session, item, scorer));
"""


class ReviewInputError(PosttrainError):
    """Bad input from a reviewer or the CLI (unknown session or item, bad verdict or name): the page answers 4xx with
    this message, the CLI exits 2; nothing is stored."""

    def __init__(self, message: str, *, status: int = 400, hint: str | None = None):
        self.status = status
        super().__init__(message, hint=hint)


@dataclass(frozen=True)
class Session:
    id: str
    created: float  # unix seconds
    a_model: str
    b_model: str
    source: str  # where the prompts came from, e.g. "suite addition" or "prompts data/p.jsonl"
    double_share: float  # share of items that go to two reviewers
    meta: dict  # sampling, engine, seed, item count...


@dataclass(frozen=True)
class NewItem:
    """An item before it is stored: its id (unique in the session), prompt, the two models' outputs, and the
    prompt source's name (for the per-source breakdown)."""

    id: str
    prompt: Text
    output_a: str
    output_b: str
    source: str


@dataclass(frozen=True)
class Item:
    session: str
    id: str
    position: int
    prompt: Text
    output_a: str
    output_b: str
    source: str
    a_left: bool  # True: A's output is shown on the left
    copies: int  # reviewers this item goes to (2 for the doubly reviewed share)

    @property
    def left(self) -> str:
        return self.output_a if self.a_left else self.output_b

    @property
    def right(self) -> str:
        return self.output_b if self.a_left else self.output_a

    def verdict_of(self, answer: str) -> str:
        """The A/B verdict of a left/right answer ("left", "right", "tie", "both_bad")."""
        if answer == "left":
            return "a" if self.a_left else "b"
        if answer == "right":
            return "b" if self.a_left else "a"
        return check_verdict(answer)


@dataclass(frozen=True)
class Judgment:
    session: str
    item: str
    reviewer: str
    verdict: str  # one of VERDICTS
    note: str
    created: float


@dataclass(frozen=True)
class Flag:
    run: str
    step: int
    sample_id: str
    reviewer: str
    kind: str  # one of FLAG_KINDS
    note: str
    prompt: Text
    output: str
    reward: float | None
    created: float


def check_reviewer(name) -> str:
    """A reviewer's name, stripped: 1..MAX_REVIEWER_CHARS characters."""
    text = name.strip() if isinstance(name, str) else ""
    if not text:
        raise ReviewInputError("reviewer name is empty", hint="enter your name once; it tells your judgments apart")
    if len(text) > MAX_REVIEWER_CHARS:
        raise ReviewInputError(f"reviewer name is {len(text)} characters; at most {MAX_REVIEWER_CHARS}")
    return text


def check_verdict(value) -> str:
    if value not in VERDICTS:
        raise ReviewInputError(f"judgment {value!r} is not one of {', '.join(VERDICTS)} (or left / right)")
    return value


def check_flag_kind(value) -> str:
    if value not in FLAG_KINDS:
        raise ReviewInputError(f"flag {value!r} is not one of {', '.join(FLAG_KINDS)}")
    return value


def _text_in(value: Text) -> str:
    return json.dumps(value)


def _text_out(value: str) -> Text:
    return json.loads(value)


class ReviewStore:
    """One SQLite file holding every review session and flag. `ReviewStore(path, create=True)` makes the file;
    without it a missing file is an error naming the path."""

    def __init__(self, path: str | Path, *, create: bool = False):
        self.path = Path(path)
        if not self.path.is_file():
            if not create:
                raise PosttrainError(f"--db {self.path}: no review database here",
                                     hint="create a session first with `posttrain review new`, or pass the right --db")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as con:
            con.executescript(_SCHEMA)
            row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                con.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise PosttrainError(f"--db {self.path}: schema version {row[0]}, this posttrain reads {SCHEMA_VERSION}",
                                     hint="use the posttrain version that wrote it, or start a new --db")

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)  # autocommit; transactions explicit
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=FULL")  # a committed judgment survives a power cut too, not only a kill
        con.execute("PRAGMA foreign_keys=ON")
        return con

    def _transaction(self):
        return _Transaction(self._connect())

    # ------------------------------------------------------------ sessions and items

    def create_session(self, session_id: str, a_model: str, b_model: str, source: str, items: list[NewItem], *,
                       double_share: float = 0.2, seed: int = 0, meta: dict | None = None) -> Session:
        """Stores a session: each item's left/right order and whether it goes to two reviewers are drawn from
        `seed` (round(double_share * n) items, at least one when double_share > 0 and n >= 1)."""
        if not items:
            raise ReviewInputError("a review session needs at least one item")
        if not 0.0 <= double_share <= 1.0:
            raise ReviewInputError(f"--double {double_share}: a share between 0 and 1")
        ids = [it.id for it in items]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ReviewInputError(f"item id {dup!r} appears twice; item ids must be unique in a session")
        rng = random.Random(seed)
        a_left = [rng.random() < 0.5 for _ in items]
        n_double = min(len(items), max(1, round(double_share * len(items)))) if double_share > 0 else 0
        doubled = set(rng.sample(range(len(items)), n_double))
        created = time.time()
        with self._transaction() as con:
            if con.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone():
                raise ReviewInputError(f"session {session_id!r} exists in {self.path}", hint="pick another --name")
            con.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (session_id, created, a_model, b_model, source, double_share, json.dumps(meta or {})))
            con.executemany("INSERT INTO items VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", [
                (session_id, it.id, i, _text_in(it.prompt), it.output_a, it.output_b, it.source, int(a_left[i]),
                 2 if i in doubled else 1) for i, it in enumerate(items)])
        return self.session(session_id)

    def sessions(self) -> list[Session]:
        with closing(self._connect()) as con:
            rows = con.execute("SELECT * FROM sessions ORDER BY created").fetchall()
        return [Session(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6])) for r in rows]

    def session(self, session_id: str) -> Session:
        with closing(self._connect()) as con:
            r = con.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if r is None:
            known = ", ".join(s.id for s in self.sessions()) or "none yet"
            raise ReviewInputError(f"unknown review session {session_id!r} in {self.path} (sessions: {known})",
                                   status=404)
        return Session(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]))

    @staticmethod
    def _item(r) -> Item:
        return Item(r[0], r[1], r[2], _text_out(r[3]), r[4], r[5], r[6], bool(r[7]), r[8])

    def items(self, session_id: str) -> list[Item]:
        self.session(session_id)
        with closing(self._connect()) as con:
            rows = con.execute("SELECT * FROM items WHERE session = ? ORDER BY position", (session_id,)).fetchall()
        return [self._item(r) for r in rows]

    def item(self, session_id: str, item_id: str) -> Item:
        self.session(session_id)
        with closing(self._connect()) as con:
            r = con.execute("SELECT * FROM items WHERE session = ? AND id = ?", (session_id, item_id)).fetchone()
        if r is None:
            raise ReviewInputError(f"item {item_id!r} is not in session {session_id!r}", status=404)
        return self._item(r)

    # ------------------------------------------------------------ reviewing

    def next_item(self, session_id: str, reviewer: str, *, claim_seconds: float = CLAIM_SECONDS) -> Item | None:
        """The item to show `reviewer` now, claimed for them; None when nothing is left for them. Their own open
        claim comes first (a reload shows the same item); then the first item, in session order, they have not
        seen whose judgments plus live claims of others are fewer than its copies."""
        reviewer = check_reviewer(reviewer)
        self.session(session_id)
        now = time.time()
        with self._transaction() as con:
            own = con.execute(
                "SELECT c.item FROM claims c WHERE c.session = ? AND c.reviewer = ? AND NOT EXISTS (SELECT 1 FROM "
                "judgments j WHERE j.session = c.session AND j.item = c.item AND j.reviewer = c.reviewer) "
                "ORDER BY c.claimed LIMIT 1", (session_id, reviewer)).fetchone()
            if own is not None:
                item_id = own[0]
            else:
                free = con.execute(
                    "SELECT i.id FROM items i WHERE i.session = ?1 "
                    "AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.session = i.session AND c.item = i.id AND c.reviewer = ?2) "
                    "AND NOT EXISTS (SELECT 1 FROM judgments j WHERE j.session = i.session AND j.item = i.id AND j.reviewer = ?2) "
                    "AND (SELECT COUNT(*) FROM judgments j WHERE j.session = i.session AND j.item = i.id) + "
                    "    (SELECT COUNT(*) FROM claims c WHERE c.session = i.session AND c.item = i.id AND c.claimed > ?3 "
                    "     AND NOT EXISTS (SELECT 1 FROM judgments j WHERE j.session = c.session AND j.item = c.item "
                    "     AND j.reviewer = c.reviewer)) < i.copies "
                    "ORDER BY i.position LIMIT 1", (session_id, reviewer, now - claim_seconds)).fetchone()
                if free is None:
                    return None
                item_id = free[0]
                con.execute("INSERT INTO claims VALUES (?, ?, ?, ?)", (session_id, item_id, reviewer, now))
            r = con.execute("SELECT * FROM items WHERE session = ? AND id = ?", (session_id, item_id)).fetchone()
        return self._item(r)

    def judge(self, session_id: str, item_id: str, reviewer: str, verdict: str, note: str = "", *,
              require_claim: bool = False) -> bool:
        """Stores one judgment in its own transaction; True when stored, False when this reviewer had already judged
        this item (a double submit: the first answer stands). With `require_claim` (the web app) the item must have
        been shown to this reviewer by `next_item`: a hand-made request cannot judge an item nobody showed them,
        nor add a judgment beyond an item's copies."""
        reviewer = check_reviewer(reviewer)
        verdict = check_verdict(verdict)
        self.item(session_id, item_id)
        note = (note or "").strip()
        with self._transaction() as con:
            if require_claim and not con.execute(
                    "SELECT 1 FROM claims WHERE session = ? AND item = ? AND reviewer = ?",
                    (session_id, item_id, reviewer)).fetchone():
                raise ReviewInputError(f"item {item_id!r} of session {session_id!r} was not shown to {reviewer!r}",
                                       status=409, hint="judge the item the review page shows you")
            cur = con.execute("INSERT OR IGNORE INTO judgments VALUES (?, ?, ?, ?, ?, ?)",
                              (session_id, item_id, reviewer, verdict, note, time.time()))
            return cur.rowcount == 1

    def judgments(self, session_id: str) -> list[Judgment]:
        self.session(session_id)
        with closing(self._connect()) as con:
            rows = con.execute("SELECT j.* FROM judgments j JOIN items i ON i.session = j.session AND i.id = j.item "
                               "WHERE j.session = ? ORDER BY i.position, j.created", (session_id,)).fetchall()
        return [Judgment(*r) for r in rows]

    def progress(self, session_id: str, reviewer: str | None = None) -> dict:
        """{"judged": judgments stored, "needed": sum of copies, "items": item count, "mine": this reviewer's
        judgments (0 without a reviewer)}."""
        self.session(session_id)
        with closing(self._connect()) as con:
            items, needed = con.execute("SELECT COUNT(*), COALESCE(SUM(copies), 0) FROM items WHERE session = ?",
                                        (session_id,)).fetchone()
            judged = con.execute("SELECT COUNT(*) FROM judgments WHERE session = ?", (session_id,)).fetchone()[0]
            mine = con.execute("SELECT COUNT(*) FROM judgments WHERE session = ? AND reviewer = ?",
                               (session_id, reviewer or "")).fetchone()[0]
        return {"judged": judged, "needed": needed, "items": items, "mine": mine}

    # ------------------------------------------------------------ flags on run samples

    def flag(self, run: str, step: int, sample_id: str, reviewer: str, kind: str, *, note: str = "",
             prompt: Text = "", output: str = "", reward: float | None = None) -> None:
        """Flags one sample of a run; flagging it again (same reviewer) replaces the kind and note."""
        reviewer = check_reviewer(reviewer)
        kind = check_flag_kind(kind)
        with self._transaction() as con:
            con.execute("INSERT OR REPLACE INTO flags VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (run, int(step), sample_id, reviewer, kind, (note or "").strip(), _text_in(prompt), output,
                         reward, time.time()))

    def flags(self, run: str | None = None) -> list[Flag]:
        with closing(self._connect()) as con:
            rows = (con.execute("SELECT * FROM flags WHERE run = ? ORDER BY step, sample_id", (run,)) if run
                    else con.execute("SELECT * FROM flags ORDER BY run, step, sample_id")).fetchall()
        return [Flag(r[0], r[1], r[2], r[3], r[4], r[5], _text_out(r[6]), r[7], r[8], r[9]) for r in rows]

    # ------------------------------------------------------------ scorer scores (reward model / judge)

    def save_scores(self, session_id: str, scorer: str, scores: dict[str, tuple[float, float]]) -> None:
        """{item id: (score of A's output, score of B's output)} under a scorer's name, e.g. "rm:runs/rm/model"."""
        self.session(session_id)
        with self._transaction() as con:
            con.executemany("INSERT OR REPLACE INTO scores VALUES (?, ?, ?, ?, ?)",
                            [(session_id, i, scorer, float(a), float(b)) for i, (a, b) in scores.items()])

    def scores(self, session_id: str) -> dict[str, dict[str, tuple[float, float]]]:
        """{scorer: {item id: (score_a, score_b)}}."""
        with closing(self._connect()) as con:
            rows = con.execute("SELECT item, scorer, score_a, score_b FROM scores WHERE session = ?",
                               (session_id,)).fetchall()
        out: dict[str, dict[str, tuple[float, float]]] = {}
        for item, scorer, a, b in rows:
            out.setdefault(scorer, {})[item] = (a, b)
        return out


class _Transaction:
    """`with store._transaction() as con`: BEGIN IMMEDIATE (the write lock up front, so two reviewers' claims
    serialise), COMMIT on success, ROLLBACK on error, and the connection closed either way."""

    def __init__(self, con: sqlite3.Connection):
        self.con = con

    def __enter__(self) -> sqlite3.Connection:
        self.con.execute("BEGIN IMMEDIATE")
        return self.con

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.con.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self.con.close()
