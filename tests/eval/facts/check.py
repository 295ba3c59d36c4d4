#!/usr/bin/env python3
"""Validate the labelled fact-extraction set in this directory (Python 3.11, stdlib only).

Usage:
  python3 tests/eval/facts/check.py             # validate labelled.json, print the counts table
  python3 tests/eval/facts/check.py --markdown  # same, table as Markdown (for README.md)
  python3 tests/eval/facts/check.py other.json  # validate another file with the same rules

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

KEPT = ["fact", "preference", "experience", "goal", "decision", "todo", "guideline"]
NOT_A_FACT = "not_a_fact"
LABELS = KEPT + [NOT_A_FACT]
LANGUAGES = ["en", "zh"]
SETTINGS = ["chat", "dialog"]
CHAT_SPEAKERS = {"user", "assistant"}

MIN_ITEMS = 330
MIN_PER_KEPT_LABEL = 20
MIN_ZH_PER_LABEL = 4
MIN_NOT_A_FACT_SHARE = 0.35
ZH_SHARE = (0.20, 0.30)
MIN_PER_SETTING = 60
MIN_WITH_PREVIOUS = 30
MIN_ASSISTANT_LINES = 10

TOP_KEYS = ["description", "items"]
ITEM_KEYS = ["id", "language", "setting", "speaker", "previous", "text", "label", "about", "statement", "why"]

ID_RE = re.compile(r"^f\d{3}$")
NAME_RE = re.compile(r"^[^\s:：][^:：\n]{0,29}$")
PREVIOUS_RE = re.compile(r"^([^:：\n]+): (\S.*)$")
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


def valid_speaker(setting: str, name) -> bool:
    if not isinstance(name, str):
        return False
    if setting == "chat":
        return name in CHAT_SPEAKERS
    return name not in CHAT_SPEAKERS and bool(NAME_RE.match(name)) and name == name.strip()


def check_item(item, idx: int, rep: Report, seen_ids: set[str], seen_texts: dict[str, str]) -> None:
    where = f"items[{idx}]"
    if not isinstance(item, dict) or list(item.keys()) != ITEM_KEYS:
        rep.err(where, f"keys must be exactly {ITEM_KEYS} in that order")
        return
    iid = item["id"]
    if not (isinstance(iid, str) and ID_RE.match(iid)):
        rep.err(where, f"id {iid!r} must look like f001")
        return
    where = iid
    if iid in seen_ids:
        rep.err(where, "duplicate id")
    seen_ids.add(iid)
    if iid != f"f{idx + 1:03d}":
        rep.err(where, f"ids must run f001, f002, … in file order; expected f{idx + 1:03d}")

    lang, setting, speaker, label = item["language"], item["setting"], item["speaker"], item["label"]
    if lang not in LANGUAGES:
        rep.err(where, f"language {lang!r} not in {LANGUAGES}")
    if setting not in SETTINGS:
        rep.err(where, f"setting {setting!r} not in {SETTINGS}")
        return
    if not valid_speaker(setting, speaker):
        want = "user or assistant" if setting == "chat" else "a name (not user/assistant, no colon)"
        rep.err(where, f"speaker {speaker!r} must be {want} in a {setting} item")
    if label not in LABELS:
        rep.err(where, f"label {label!r} not in {LABELS}")

    t = item["text"]
    if not text(t):
        rep.err(where, "text must be non-empty one-line text without surrounding whitespace")
        t = ""
    if lang == "zh" and not CJK_RE.search(t):
        rep.err(where, "zh item whose text has no Chinese characters")
    if lang == "en" and CJK_RE.search(t):
        rep.err(where, "en item whose text has Chinese characters")
    key = normalise(t)
    if key:
        if key in seen_texts:
            rep.err(where, f"same text as {seen_texts[key]}")
        seen_texts[key] = iid

    prev = item["previous"]
    if prev is not None:
        m = PREVIOUS_RE.match(prev) if text(prev) else None
        if not m:
            rep.err(where, "previous must be null or 'Speaker: text'")
        elif not valid_speaker(setting, m.group(1)):
            rep.err(where, f"previous speaker {m.group(1)!r} is not a valid {setting} speaker")

    about, statement = item["about"], item["statement"]
    if label == NOT_A_FACT:
        if about is not None:
            rep.err(where, "about must be null for not_a_fact")
        if statement is not None:
            rep.err(where, "statement must be null for not_a_fact")
    elif label in KEPT:
        if setting == "chat" and speaker != "user":
            rep.err(where, "in a chat only the user's lines yield memories; assistant lines are not_a_fact")
        want_about = "user" if setting == "chat" else speaker
        if about != want_about:
            rep.err(where, f"about must be {want_about!r} (the speaker) for a kept label, not {about!r}")
        if label == "guideline" and setting != "chat":
            rep.err(where, "guidelines (how the assistant should behave) only occur in chat items")
        if not text(statement):
            rep.err(where, "statement must be non-empty one-line text for a kept label")
        else:
            if not statement.endswith((".", "。")):
                rep.err(where, "statement must end with '.' or '。'")
            if lang == "zh" and not CJK_RE.search(statement):
                rep.err(where, "zh item needs a Chinese statement")
            if setting == "chat":
                if lang == "en" and not statement.startswith("The user"):
                    rep.err(where, "an en chat statement must start with 'The user'")
                if lang == "zh" and "用户" not in statement:
                    rep.err(where, "a zh chat statement must name 用户")
            elif isinstance(speaker, str) and speaker not in statement:
                rep.err(where, f"a dialog statement must name its subject {speaker!r}")
    if not text(item["why"]):
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
    items = doc["items"]
    if not isinstance(items, list):
        rep.err(where, "items must be a list")
        return None
    seen_ids: set[str] = set()
    seen_texts: dict[str, str] = {}
    for i, item in enumerate(items):
        check_item(item, i, rep, seen_ids, seen_texts)
    return doc


def good_items(doc: dict) -> list[dict]:
    return [it for it in doc["items"] if isinstance(it, dict) and set(ITEM_KEYS) <= set(it)]


def counts(doc: dict) -> tuple[Counter, Counter]:
    labels: Counter = Counter()    # (language, label) -> items
    settings: Counter = Counter()  # (language, setting) -> items
    for it in good_items(doc):
        labels[(it["language"], it["label"])] += 1
        settings[(it["language"], it["setting"])] += 1
    return labels, settings


def set_rules(doc: dict, rep: Report) -> None:
    labels, settings = counts(doc)
    items = good_items(doc)
    total = len(items)
    if total < MIN_ITEMS:
        rep.err("set", f"{total} items, need at least {MIN_ITEMS}")
    for label in LABELS:
        n = sum(v for (_, lb), v in labels.items() if lb == label)
        if label in KEPT and n < MIN_PER_KEPT_LABEL:
            rep.err("set", f"{n} items labelled {label!r}, need at least {MIN_PER_KEPT_LABEL}")
        if labels[("zh", label)] < MIN_ZH_PER_LABEL:
            rep.err("set", f"{labels[('zh', label)]} zh items labelled {label!r}, need at least {MIN_ZH_PER_LABEL}")
    if total:
        naf = sum(v for (_, lb), v in labels.items() if lb == NOT_A_FACT)
        if naf / total < MIN_NOT_A_FACT_SHARE:
            rep.err("set", f"not_a_fact is {naf / total:.1%} of the items, need at least {MIN_NOT_A_FACT_SHARE:.0%}")
        zh = sum(v for (lg, _), v in labels.items() if lg == "zh")
        if not (ZH_SHARE[0] <= zh / total <= ZH_SHARE[1]):
            rep.err("set", f"zh is {zh / total:.1%} of the items, need {ZH_SHARE[0]:.0%}-{ZH_SHARE[1]:.0%}")
    for setting in SETTINGS:
        n = sum(v for (_, st), v in settings.items() if st == setting)
        if n < MIN_PER_SETTING:
            rep.err("set", f"{n} {setting} items, need at least {MIN_PER_SETTING}")
    with_prev = sum(1 for it in items if it["previous"] is not None)
    if with_prev < MIN_WITH_PREVIOUS:
        rep.err("set", f"{with_prev} items with a previous line, need at least {MIN_WITH_PREVIOUS}")
    assistant = sum(1 for it in items if it["speaker"] == "assistant")
    if assistant < MIN_ASSISTANT_LINES:
        rep.err("set", f"{assistant} assistant lines, need at least {MIN_ASSISTANT_LINES}")


def render(head: list[str], rows: list[list], markdown: bool) -> str:
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
        out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(head)] + [fmt(r) for r in rows])


def table(doc: dict, markdown: bool) -> str:
    labels, settings = counts(doc)
    head = ["language", "chat", "dialog"] + LABELS + ["items", "not_a_fact share"]
    rows = []
    for lang in LANGUAGES + ["all"]:
        langs = LANGUAGES if lang == "all" else [lang]
        per = [sum(labels[(lg, lb)] for lg in langs) for lb in LABELS]
        st = [sum(settings[(lg, s)] for lg in langs) for s in SETTINGS]
        n = sum(per)
        share = f"{per[-1] / n:.0%}" if n else "-"
        rows.append([lang] + st + per + [n, share])
    return render(head, rows, markdown)


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
