#!/usr/bin/env python3
"""Validate the multi-session dialog evaluation set in this directory (Python 3.11, stdlib only).

Usage:
  python3 tests/eval/dialogs/check.py            # validate every dNN.json, print the tables
  python3 tests/eval/dialogs/check.py --markdown # same, tables as Markdown (for README.md)
  python3 tests/eval/dialogs/check.py d03.json   # validate some files only (set-wide rules skipped)

Exit status 0 when every rule holds, 1 otherwise. See README.md for the rules.
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent

CATEGORIES = ["single_hop", "multi_hop", "temporal", "preference_change", "adversarial"]
# Target share of each category over the whole set, and the allowed deviation (percentage points).
TARGET_SHARE = {"single_hop": 35, "multi_hop": 25, "temporal": 20, "preference_change": 10, "adversarial": 10}
SET_TOLERANCE = 5.0
FILE_TOLERANCE = 10.0

MIN_FILES = 8
MIN_QUESTIONS_TOTAL = 400
SESSIONS = (12, 20)
TURNS_PER_SESSION = (6, 20)
TURNS_PER_DIALOG = (150, 220)
QUESTIONS_PER_DIALOG = (50, 70)
SPAN_DAYS = (56, 186)  # first to last session: 2 to 6 months
MIN_GAP = timedelta(hours=12)
MAX_GAP = timedelta(days=45)
EVIDENCE_MAX = 4
NOT_MENTIONED = "not mentioned"

FILE_RE = re.compile(r"^d\d{2}\.json$")
DIALOG_ID_RE = re.compile(r"^d\d{2}$")
DATE_RE = re.compile(r"^2026-(0[1-9]|1[01])-\d{2}T\d{2}:\d{2}:\d{2}Z$")
TOP_KEYS = ["id", "speakers", "relationship", "description", "sessions", "questions"]


class Report:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def err(self, where: str, msg: str) -> None:
        self.errors.append(f"{where}: {msg}")


def nonempty_str(x) -> bool:
    return isinstance(x, str) and x.strip() != "" and x == x.strip()


def check_file(path: Path, rep: Report) -> dict | None:
    where = path.name
    raw = path.read_text(encoding="utf-8")
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        rep.err(where, f"invalid JSON: {e}")
        return None
    if raw != json.dumps(doc, ensure_ascii=False, indent=2) + "\n":
        rep.err(where, "not in canonical form (UTF-8, 2-space indent, non-ASCII unescaped, final newline)")
    if not isinstance(doc, dict) or list(doc.keys()) != TOP_KEYS:
        rep.err(where, f"top-level keys must be exactly {TOP_KEYS} in that order")
        return None

    did = doc["id"]
    if not (isinstance(did, str) and DIALOG_ID_RE.match(did)) or f"{did}.json" != path.name:
        rep.err(where, f"id {did!r} must be dNN and match the file name")
        return None
    sp = doc["speakers"]
    if not (isinstance(sp, list) and len(sp) == 2 and all(nonempty_str(s) for s in sp) and sp[0] != sp[1]):
        rep.err(where, "speakers must be two distinct non-empty names")
        return None
    for k in ("relationship", "description"):
        if not nonempty_str(doc[k]):
            rep.err(where, f"{k} must be a non-empty string")

    # ---- sessions and turns
    sessions = doc["sessions"]
    if not isinstance(sessions, list):
        rep.err(where, "sessions must be a list")
        return None
    if not SESSIONS[0] <= len(sessions) <= SESSIONS[1]:
        rep.err(where, f"{len(sessions)} sessions, want {SESSIONS[0]}..{SESSIONS[1]}")
    turn_session: dict[str, int] = {}
    prev_date = None
    prev_end = None
    first_date = None
    total_turns = 0
    for si, s in enumerate(sessions, 1):
        sw = f"{where} session {si}"
        if not isinstance(s, dict) or list(s.keys()) != ["session", "date", "turns"]:
            rep.err(sw, "keys must be exactly session, date, turns")
            continue
        if s["session"] != si:
            rep.err(sw, f"session number {s['session']!r}, want {si}")
        date = s["date"]
        if not (isinstance(date, str) and DATE_RE.match(date)):
            rep.err(sw, f"date {date!r} must be YYYY-MM-DDTHH:MM:SSZ in January..November 2026")
            continue
        try:
            d = datetime.strptime(date, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        except ValueError:
            rep.err(sw, f"date {date!r} is not a real date")
            continue
        first_date = first_date or d
        if prev_date is not None:
            if d <= prev_date:
                rep.err(sw, "dates must increase")
            elif d - prev_date < MIN_GAP or d - prev_date > MAX_GAP:
                rep.err(sw, f"gap {d - prev_date} outside {MIN_GAP}..{MAX_GAP}")
            if prev_end is not None and d <= prev_end:
                rep.err(sw, "starts before the previous session ends (turns are about a minute apart)")
        turns = s["turns"]
        if not isinstance(turns, list):
            rep.err(sw, "turns must be a list")
            continue
        if not TURNS_PER_SESSION[0] <= len(turns) <= TURNS_PER_SESSION[1]:
            rep.err(sw, f"{len(turns)} turns, want {TURNS_PER_SESSION[0]}..{TURNS_PER_SESSION[1]}")
        speakers_seen = set()
        for ti, t in enumerate(turns, 1):
            tw = f"{sw} turn {ti}"
            if not isinstance(t, dict) or list(t.keys()) != ["id", "speaker", "text"]:
                rep.err(tw, "keys must be exactly id, speaker, text")
                continue
            want = f"{did}-s{si:02d}-t{ti:02d}"
            if t["id"] != want:
                rep.err(tw, f"id {t['id']!r}, want {want!r}")
            if t["id"] in turn_session:
                rep.err(tw, f"duplicate turn id {t['id']}")
            turn_session[t["id"]] = si
            if t["speaker"] not in sp:
                rep.err(tw, f"speaker {t['speaker']!r} is not one of {sp}")
            speakers_seen.add(t["speaker"])
            text = t["text"]
            if not nonempty_str(text):
                rep.err(tw, "text must be a non-empty trimmed string")
            elif any(text.startswith(f"{name}:") for name in sp):
                rep.err(tw, "text must not start with a 'Name:' prefix")
        if len(speakers_seen) != 2:
            rep.err(sw, "both speakers must talk in every session")
        total_turns += len(turns)
        prev_date = d
        prev_end = d + timedelta(minutes=len(turns))
    if not TURNS_PER_DIALOG[0] <= total_turns <= TURNS_PER_DIALOG[1]:
        rep.err(where, f"{total_turns} turns, want {TURNS_PER_DIALOG[0]}..{TURNS_PER_DIALOG[1]}")
    span = (prev_date - first_date).days if first_date and prev_date else 0
    if not SPAN_DAYS[0] <= span <= SPAN_DAYS[1]:
        rep.err(where, f"sessions span {span} days, want {SPAN_DAYS[0]}..{SPAN_DAYS[1]}")

    # ---- questions
    questions = doc["questions"]
    if not isinstance(questions, list):
        rep.err(where, "questions must be a list")
        return None
    if not QUESTIONS_PER_DIALOG[0] <= len(questions) <= QUESTIONS_PER_DIALOG[1]:
        rep.err(where, f"{len(questions)} questions, want {QUESTIONS_PER_DIALOG[0]}..{QUESTIONS_PER_DIALOG[1]}")
    cats: Counter[str] = Counter()
    seen_q = set()
    order = {tid: i for i, tid in enumerate(turn_session)}
    for qi, q in enumerate(questions, 1):
        qw = f"{where} question {qi}"
        if not isinstance(q, dict) or list(q.keys()) != ["id", "category", "question", "answer", "evidence"]:
            rep.err(qw, "keys must be exactly id, category, question, answer, evidence")
            continue
        want = f"{did}-q{qi:03d}"
        if q["id"] != want:
            rep.err(qw, f"id {q['id']!r}, want {want!r}")
        cat = q["category"]
        if cat not in CATEGORIES:
            rep.err(qw, f"unknown category {cat!r}")
            continue
        cats[cat] += 1
        if not nonempty_str(q["question"]) or not nonempty_str(q["answer"]):
            rep.err(qw, "question and answer must be non-empty trimmed strings")
            continue
        if q["question"] in seen_q:
            rep.err(qw, "duplicate question text")
        seen_q.add(q["question"])
        ev = q["evidence"]
        if not (isinstance(ev, list) and all(isinstance(e, str) for e in ev)):
            rep.err(qw, "evidence must be a list of turn ids")
            continue
        if len(set(ev)) != len(ev):
            rep.err(qw, "duplicate evidence id")
        missing = [e for e in ev if e not in turn_session]
        if missing:
            rep.err(qw, f"evidence ids not in the dialog: {missing}")
            continue
        if ev != sorted(ev, key=order.__getitem__):
            rep.err(qw, "evidence must be listed in reading order")
        if len(ev) > EVIDENCE_MAX:
            rep.err(qw, f"{len(ev)} evidence turns, at most {EVIDENCE_MAX}")
        ev_sessions = {turn_session[e] for e in ev}
        if cat == "adversarial":
            if ev:
                rep.err(qw, "adversarial evidence must be empty")
            if q["answer"] != NOT_MENTIONED:
                rep.err(qw, f"adversarial answer must be {NOT_MENTIONED!r}")
        else:
            if not ev:
                rep.err(qw, f"{cat} needs evidence")
            if q["answer"] == NOT_MENTIONED:
                rep.err(qw, f"only adversarial questions answer {NOT_MENTIONED!r}")
        if cat == "single_hop" and len(ev) != 1:
            rep.err(qw, "single_hop evidence must be exactly one turn")
        if cat == "multi_hop" and len(ev_sessions) < 2:
            rep.err(qw, "multi_hop evidence must span at least two sessions")
    n = sum(cats.values())
    for c in CATEGORIES:
        share = 100.0 * cats[c] / n if n else 0.0
        if abs(share - TARGET_SHARE[c]) > FILE_TOLERANCE:
            rep.err(where, f"{c} is {share:.1f}% of questions, want {TARGET_SHARE[c]}% +/- {FILE_TOLERANCE}")
    return {
        "id": did,
        "relationship": doc["relationship"],
        "language": "zh" if any("\u4e00" <= ch <= "\u9fff" for ch in doc["description"]) else "en",
        "sessions": len(sessions),
        "turns": total_turns,
        "span": span,
        "questions": n,
        "cats": cats,
    }


def print_tables(rows: list[dict], markdown: bool) -> None:
    short = {"single_hop": "single", "multi_hop": "multi", "temporal": "temporal",
             "preference_change": "pref", "adversarial": "adv"}
    head = ["id", "relationship", "lang", "sessions", "days", "turns", "questions"] + [short[c] for c in CATEGORIES]
    body = [[r["id"], r["relationship"], r["language"], r["sessions"], r["span"], r["turns"], r["questions"]]
            + [r["cats"][c] for c in CATEGORIES] for r in rows]
    tot = Counter()
    for r in rows:
        tot.update(r["cats"])
    body.append(["total", "", "", sum(r["sessions"] for r in rows), "", sum(r["turns"] for r in rows),
                 sum(r["questions"] for r in rows)] + [tot[c] for c in CATEGORIES])
    nq = sum(r["questions"] for r in rows) or 1
    cat_rows = [[c, tot[c], f"{100.0 * tot[c] / nq:.1f}%", f"{TARGET_SHARE[c]}%"] for c in CATEGORIES]
    for h, b in ((head, body), (["category", "questions", "share", "target"], cat_rows)):
        if markdown:
            print("| " + " | ".join(map(str, h)) + " |")
            print("|" + "|".join("---" for _ in h) + "|")
            for row in b:
                print("| " + " | ".join(map(str, row)) + " |")
        else:
            w = [max(len(str(x)) for x in col) for col in zip(h, *b)]
            for row in [h] + b:
                print("  ".join(str(x).ljust(wi) for x, wi in zip(row, w)))
        print()


def main(argv: list[str]) -> int:
    markdown = "--markdown" in argv
    names = [a for a in argv if not a.startswith("--")]
    files = [HERE / n for n in names] if names else sorted(p for p in HERE.iterdir() if FILE_RE.match(p.name))
    rep = Report()
    rows = [r for p in files if (r := check_file(p, rep)) is not None]
    if not names:
        if len(files) < MIN_FILES:
            rep.err("set", f"{len(files)} dialog files, want at least {MIN_FILES}")
        total = Counter()
        for r in rows:
            total.update(r["cats"])
        nq = sum(total.values())
        if nq < MIN_QUESTIONS_TOTAL:
            rep.err("set", f"{nq} questions, want at least {MIN_QUESTIONS_TOTAL}")
        for c in CATEGORIES:
            share = 100.0 * total[c] / nq if nq else 0.0
            if abs(share - TARGET_SHARE[c]) > SET_TOLERANCE:
                rep.err("set", f"{c} is {share:.1f}% of questions, want {TARGET_SHARE[c]}% +/- {SET_TOLERANCE}")
    if rows:
        print_tables(rows, markdown)
    for e in rep.errors:
        print("ERROR", e)
    print("OK" if not rep.errors else f"{len(rep.errors)} error(s)")
    return 0 if not rep.errors else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
