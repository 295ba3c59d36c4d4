#!/usr/bin/env python3
"""Validate the labelled memory-review set in this directory (Python 3.11, stdlib only).

Usage:
  python3 tests/eval/review/check.py             # validate labelled.json, print the counts table
  python3 tests/eval/review/check.py --markdown  # same, table as Markdown (for README.md)
  python3 tests/eval/review/check.py other.json  # validate another file with the same rules

Exit status 0 when every rule holds, 1 otherwise. The rules are listed in README.md.
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_FILE = HERE / "labelled.json"

LABELS = ["again", "hard", "good", "easy"]
LANGUAGES = ["en", "zh"]
ROLES = {"user", "assistant"}

MIN_PAIRS = 100
MIN_PER_LABEL = 25
MIN_SEGMENTS = 30
TURNS = (4, 14)
MEMORIES_PER_SEGMENT = (2, 6)
QUERIES_PER_MEMORY = (1, 2)
MIN_ZH_SEGMENT_SHARE = 0.10

TOP_KEYS = ["description", "segments"]
SEGMENT_KEYS = ["id", "language", "context", "memories"]
TURN_KEYS = ["role", "content"]
MEMORY_KEYS = ["id", "title", "summary", "queries", "label", "why"]

SEGMENT_ID_RE = re.compile(r"^r\d{2,3}$")
CJK_RE = re.compile(r"[\u4e00-\u9fff]")


class Report:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def err(self, where: str, msg: str) -> None:
        self.errors.append(f"{where}: {msg}")


def text(x) -> bool:
    """A non-empty string without leading or trailing whitespace."""
    return isinstance(x, str) and x.strip() != "" and x == x.strip()


def check_segment(seg, idx: int, rep: Report, seen: set[str]) -> None:
    where = f"segments[{idx}]"
    if not isinstance(seg, dict) or list(seg.keys()) != SEGMENT_KEYS:
        rep.err(where, f"keys must be exactly {SEGMENT_KEYS} in that order")
        return
    sid = seg["id"]
    if not (isinstance(sid, str) and SEGMENT_ID_RE.match(sid)):
        rep.err(where, f"id {sid!r} must look like r01")
        return
    where = sid
    if sid in seen:
        rep.err(where, "duplicate id")
    seen.add(sid)
    lang = seg["language"]
    if lang not in LANGUAGES:
        rep.err(where, f"language {lang!r} not in {LANGUAGES}")

    ctx = seg["context"]
    if not isinstance(ctx, list) or not (TURNS[0] <= len(ctx) <= TURNS[1]):
        rep.err(where, f"context must be a list of {TURNS[0]}-{TURNS[1]} turns")
        ctx = ctx if isinstance(ctx, list) else []
    roles = []
    for t, turn in enumerate(ctx):
        tw = f"{where}.context[{t}]"
        if not isinstance(turn, dict) or list(turn.keys()) != TURN_KEYS:
            rep.err(tw, f"keys must be exactly {TURN_KEYS}")
            continue
        if turn["role"] not in ROLES:
            rep.err(tw, f"role {turn['role']!r} must be user or assistant")
        if not text(turn["content"]):
            rep.err(tw, "content must be non-empty text without surrounding whitespace")
        roles.append(turn["role"])
    if set(roles) != ROLES:
        rep.err(where, "context must contain both user and assistant turns")
    if roles and roles[0] != "user":
        rep.err(where, "context must start with a user turn")
    for a, b in zip(roles, roles[1:]):
        if a == b:
            rep.err(where, "user and assistant turns must alternate")
            break
    if lang == "zh" and not any(CJK_RE.search(t.get("content", "")) for t in ctx if isinstance(t, dict)):
        rep.err(where, "zh segment without Chinese text")

    mems = seg["memories"]
    if not isinstance(mems, list) or not (MEMORIES_PER_SEGMENT[0] <= len(mems) <= MEMORIES_PER_SEGMENT[1]):
        rep.err(where, f"memories must be a list of {MEMORIES_PER_SEGMENT[0]}-{MEMORIES_PER_SEGMENT[1]} items")
        mems = mems if isinstance(mems, list) else []
    labels = []
    for m, mem in enumerate(mems):
        mw = f"{where}.memories[{m}]"
        if not isinstance(mem, dict) or list(mem.keys()) != MEMORY_KEYS:
            rep.err(mw, f"keys must be exactly {MEMORY_KEYS} in that order")
            continue
        mid = mem["id"]
        if mid != f"{sid}-m{m + 1}":
            rep.err(mw, f"id {mid!r} must be {sid}-m{m + 1}")
        if mid in seen:
            rep.err(mw, f"duplicate id {mid!r}")
        seen.add(mid)
        for k in ("title", "summary", "why"):
            if not text(mem[k]):
                rep.err(mw, f"{k} must be non-empty text without surrounding whitespace")
        q = mem["queries"]
        if not (isinstance(q, list) and QUERIES_PER_MEMORY[0] <= len(q) <= QUERIES_PER_MEMORY[1]
                and all(text(x) for x in q) and len(set(q)) == len(q)):
            rep.err(mw, f"queries must be {QUERIES_PER_MEMORY[0]}-{QUERIES_PER_MEMORY[1]} distinct non-empty strings")
        if mem["label"] not in LABELS:
            rep.err(mw, f"label {mem['label']!r} not in {LABELS}")
        labels.append(mem["label"])
        if lang == "zh" and not CJK_RE.search(mem["summary"]):
            rep.err(mw, "memory of a zh segment should have a Chinese summary")
    if len(set(labels)) < 2:
        rep.err(where, "a segment must mix at least two different labels")


def check(path: Path, rep: Report) -> dict | None:
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
    if not text(doc["description"]):
        rep.err(where, "description must be non-empty text")
    segs = doc["segments"]
    if not isinstance(segs, list):
        rep.err(where, "segments must be a list")
        return None
    seen: set[str] = set()
    for i, seg in enumerate(segs):
        check_segment(seg, i, rep, seen)
    return doc


def counts(doc: dict) -> tuple[Counter, Counter, Counter]:
    pairs: Counter = Counter()  # (language, label) -> memories
    segs: Counter = Counter()   # language -> segments
    turns: Counter = Counter()  # language -> turns
    for seg in doc["segments"]:
        if not isinstance(seg, dict):
            continue
        lang = seg.get("language")
        segs[lang] += 1
        turns[lang] += len(seg.get("context") or [])
        for mem in seg.get("memories") or []:
            if isinstance(mem, dict):
                pairs[(lang, mem.get("label"))] += 1
    return pairs, segs, turns


def set_rules(doc: dict, rep: Report) -> None:
    pairs, segs, _ = counts(doc)
    total = sum(pairs.values())
    if total < MIN_PAIRS:
        rep.err("set", f"{total} labelled pairs, need at least {MIN_PAIRS}")
    for label in LABELS:
        n = sum(v for (_, lb), v in pairs.items() if lb == label)
        if n < MIN_PER_LABEL:
            rep.err("set", f"{n} pairs labelled {label!r}, need at least {MIN_PER_LABEL}")
    nseg = sum(segs.values())
    if nseg < MIN_SEGMENTS:
        rep.err("set", f"{nseg} segments, need at least {MIN_SEGMENTS}")
    if nseg and segs["zh"] / nseg < MIN_ZH_SEGMENT_SHARE:
        rep.err("set", f"only {segs['zh']} of {nseg} segments are zh, need at least {MIN_ZH_SEGMENT_SHARE:.0%}")


def table(doc: dict, markdown: bool) -> str:
    pairs, segs, turns = counts(doc)
    head = ["language", "segments", "turns"] + LABELS + ["pairs"]
    rows = []
    for lang in LANGUAGES + ["all"]:
        langs = LANGUAGES if lang == "all" else [lang]
        per = [sum(pairs[(lg, lb)] for lg in langs) for lb in LABELS]
        rows.append([lang, sum(segs[lg] for lg in langs), sum(turns[lg] for lg in langs)] + per + [sum(per)])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
        out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(head)] + [fmt(r) for r in rows])


def main(argv: list[str]) -> int:
    markdown = "--markdown" in argv
    files = [a for a in argv if not a.startswith("--")]
    path = Path(files[0]) if files else DEFAULT_FILE
    rep = Report()
    doc = check(path, rep)
    if doc is not None:
        set_rules(doc, rep)
        print(table(doc, markdown))
    for e in rep.errors:
        print(f"ERROR {e}", file=sys.stderr)
    if rep.errors:
        print(f"{len(rep.errors)} error(s)", file=sys.stderr)
        return 1
    print("OK", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
