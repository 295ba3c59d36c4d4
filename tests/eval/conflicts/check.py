#!/usr/bin/env python3
"""Validate the labelled conflict (supersede) set in this directory (Python 3.11, stdlib only).

Usage:
  python3 tests/eval/conflicts/check.py             # validate labelled.json, print the counts tables
  python3 tests/eval/conflicts/check.py --markdown  # same, tables as Markdown (for README.md)
  python3 tests/eval/conflicts/check.py other.json  # validate another file with the same rules

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

LANGUAGES = ["en", "zh"]
SETTINGS = ["chat", "dialog"]
CHAT_SPEAKERS = {"user", "assistant"}

# The attribute a pair is about. Add to this list when a new kind of attribute is labelled.
ATTRIBUTES = [
    "residence", "work_location", "work_arrangement", "schedule", "commute",
    "employer", "manager", "role", "department",
    "partner", "relationship", "children",
    "pet", "diet", "allergy", "smoking", "alcohol", "caffeine", "weight", "medication",
    "doctor", "dentist", "therapist", "gym", "exercise", "hobby", "language",
    "phone", "email", "contact",
    "school", "course",
    "car", "device", "editor", "subscription", "internet_provider", "bank", "insurer", "landlord",
    "favourite", "plan",
]

MIN_TRUE = 70
MIN_FALSE = 70
MIN_ZH_PER_CLASS = 15
ZH_SHARE = (0.20, 0.30)
MIN_DIALOG_PER_CLASS = 15
MIN_DIFFERENT_SPEAKER_FALSE = 5

TOP_KEYS = ["description", "pairs"]
PAIR_KEYS = ["id", "language", "setting", "older", "newer", "supersedes", "attribute", "why"]
SIDE_KEYS = ["speaker", "text"]

ID_RE = re.compile(r"^c\d{3}$")
NAME_RE = re.compile(r"^[^\s:：][^:：\n]{0,29}$")
CJK_RE = re.compile(r"[\u4e00-\u9fff]")
NORMALISE_RE = re.compile(r"[^\w]+")


class Report:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def err(self, where: str, msg: str) -> None:
        self.errors.append(f"{where}: {msg}")


def text(x) -> bool:
    """A non-empty one-line string without leading or trailing whitespace."""
    return isinstance(x, str) and x.strip() != "" and x == x.strip() and "\n" not in x


def normalise(s: str) -> str:
    return NORMALISE_RE.sub(" ", s.lower()).strip()


def check_pair(pair, idx: int, rep: Report, seen_ids: set[str], seen_texts: dict[str, str]) -> None:
    where = f"pairs[{idx}]"
    if not isinstance(pair, dict) or list(pair.keys()) != PAIR_KEYS:
        rep.err(where, f"keys must be exactly {PAIR_KEYS} in that order")
        return
    pid = pair["id"]
    if not (isinstance(pid, str) and ID_RE.match(pid)):
        rep.err(where, f"id {pid!r} must look like c001")
        return
    where = pid
    if pid in seen_ids:
        rep.err(where, "duplicate id")
    seen_ids.add(pid)
    if pid != f"c{idx + 1:03d}":
        rep.err(where, f"ids must run c001, c002, … in file order; expected c{idx + 1:03d}")

    lang, setting = pair["language"], pair["setting"]
    if lang not in LANGUAGES:
        rep.err(where, f"language {lang!r} not in {LANGUAGES}")
    if setting not in SETTINGS:
        rep.err(where, f"setting {setting!r} not in {SETTINGS}")

    speakers = []
    for side in ("older", "newer"):
        sw = f"{where}.{side}"
        s = pair[side]
        if not isinstance(s, dict) or list(s.keys()) != SIDE_KEYS:
            rep.err(sw, f"keys must be exactly {SIDE_KEYS} in that order")
            speakers.append(None)
            continue
        sp, t = s["speaker"], s["text"]
        if setting == "chat" and sp != "user":
            rep.err(sw, "in a chat pair both statements are the user's")
        if setting == "dialog" and not (isinstance(sp, str) and sp not in CHAT_SPEAKERS and NAME_RE.match(sp)):
            rep.err(sw, f"speaker {sp!r} must be a name in a dialog pair")
        speakers.append(sp)
        if not text(t):
            rep.err(sw, "text must be non-empty one-line text without surrounding whitespace")
            continue
        if lang == "zh" and not CJK_RE.search(t):
            rep.err(sw, "zh pair whose text has no Chinese characters")
        if lang == "en" and CJK_RE.search(t):
            rep.err(sw, "en pair whose text has Chinese characters")
        key = normalise(t)
        if key in seen_texts:
            rep.err(sw, f"same text as {seen_texts[key]}")
        seen_texts[key] = sw

    sup = pair["supersedes"]
    if not isinstance(sup, bool):
        rep.err(where, "supersedes must be true or false")
    elif sup and speakers[0] != speakers[1]:
        rep.err(where, "a superseding pair needs the same speaker on both sides (the same person)")
    if pair["attribute"] not in ATTRIBUTES:
        rep.err(where, f"attribute {pair['attribute']!r} is not in the list in check.py")
    if not text(pair["why"]):
        rep.err(where, "why must be non-empty one-line text")


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
    pairs = doc["pairs"]
    if not isinstance(pairs, list):
        rep.err(where, "pairs must be a list")
        return None
    seen_ids: set[str] = set()
    seen_texts: dict[str, str] = {}
    for i, pair in enumerate(pairs):
        check_pair(pair, i, rep, seen_ids, seen_texts)
    return doc


def good_pairs(doc: dict) -> list[dict]:
    return [p for p in doc["pairs"] if isinstance(p, dict) and list(p.keys()) == PAIR_KEYS
            and isinstance(p["older"], dict) and isinstance(p["newer"], dict)]


def set_rules(doc: dict, rep: Report) -> None:
    pairs = good_pairs(doc)
    cls = Counter((p["language"], p["setting"], p["supersedes"]) for p in pairs)
    n_true = sum(v for (_, _, s), v in cls.items() if s is True)
    n_false = sum(v for (_, _, s), v in cls.items() if s is False)
    if n_true < MIN_TRUE:
        rep.err("set", f"{n_true} superseding pairs, need at least {MIN_TRUE}")
    if n_false < MIN_FALSE:
        rep.err("set", f"{n_false} non-conflicting pairs, need at least {MIN_FALSE}")
    for sup in (True, False):
        zh = sum(v for (lg, _, s), v in cls.items() if lg == "zh" and s is sup)
        if zh < MIN_ZH_PER_CLASS:
            rep.err("set", f"{zh} zh pairs with supersedes={str(sup).lower()}, need at least {MIN_ZH_PER_CLASS}")
        dia = sum(v for (_, st, s), v in cls.items() if st == "dialog" and s is sup)
        if dia < MIN_DIALOG_PER_CLASS:
            rep.err("set", f"{dia} dialog pairs with supersedes={str(sup).lower()}, need at least {MIN_DIALOG_PER_CLASS}")
    if pairs:
        zh = sum(v for (lg, _, _), v in cls.items() if lg == "zh")
        if not (ZH_SHARE[0] <= zh / len(pairs) <= ZH_SHARE[1]):
            rep.err("set", f"zh is {zh / len(pairs):.1%} of the pairs, need {ZH_SHARE[0]:.0%}-{ZH_SHARE[1]:.0%}")
    diff = sum(1 for p in pairs if p["supersedes"] is False and p["older"].get("speaker") != p["newer"].get("speaker"))
    if diff < MIN_DIFFERENT_SPEAKER_FALSE:
        rep.err("set", f"{diff} non-conflicting pairs between two speakers, need at least {MIN_DIFFERENT_SPEAKER_FALSE}")


def render(head: list[str], rows: list[list], markdown: bool) -> str:
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
        out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(head)] + [fmt(r) for r in rows])


def tables(doc: dict, markdown: bool) -> str:
    pairs = good_pairs(doc)
    cls = Counter((p["language"], p["setting"], p["supersedes"]) for p in pairs)
    head = ["language", "chat", "dialog", "supersedes", "no conflict", "pairs"]
    rows = []
    for lang in LANGUAGES + ["all"]:
        langs = LANGUAGES if lang == "all" else [lang]
        get = lambda st=None, s=None: sum(v for (lg, t, x), v in cls.items()
                                          if lg in langs and (st is None or t == st) and (s is None or x is s))
        rows.append([lang, get(st="chat"), get(st="dialog"), get(s=True), get(s=False), get()])
    attrs = Counter((p["attribute"], p["supersedes"]) for p in pairs)
    names = sorted({a for a, _ in attrs}, key=lambda a: (-(attrs[(a, True)] + attrs[(a, False)]), a))
    arows = [[a, attrs[(a, True)], attrs[(a, False)], attrs[(a, True)] + attrs[(a, False)]] for a in names]
    return render(head, rows, markdown) + "\n\n" + render(["attribute", "supersedes", "no conflict", "pairs"], arows, markdown)


def main(argv: list[str]) -> int:
    markdown = "--markdown" in argv
    files = [a for a in argv if not a.startswith("--")]
    path = Path(files[0]) if files else DEFAULT_FILE
    rep = Report()
    doc = check(path, rep)
    if doc is not None:
        set_rules(doc, rep)
        print(tables(doc, markdown))
    for e in rep.errors:
        print(f"ERROR {e}", file=sys.stderr)
    if rep.errors:
        print(f"{len(rep.errors)} error(s)", file=sys.stderr)
        return 1
    print("OK", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
