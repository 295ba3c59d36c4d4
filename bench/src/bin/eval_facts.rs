//! eval-facts: how well the local consolidation (no LLM) writes facts, measured on the two
//! hand-labelled sets of issue 39, without a database:
//!
//! - `tests/eval/facts/labelled.json`: sentences of chats and named dialogs, each labelled fact /
//!   preference / experience / goal / decision / todo / guideline / not a fact, with whom it is
//!   about. Each sentence is consolidated as a segment (after the line before it, where the set
//!   gives one) through `extractive_episode`, as ingest does; the facts it yields from the
//!   sentence give the predicted label (none: not a fact) and their subject (the speaker's name
//!   they are stored with, else the user).
//! - `tests/eval/conflicts/labelled.json`: pairs of statements by the same or different people,
//!   labelled whether the newer one supersedes the older. Each statement is consolidated as
//!   above; the newer supersedes the older when one of its facts states another value of the
//!   same subject as one of the older's (`conflict::subject_value`, the write path's rule) or
//!   says something the older names is over (`conflict::ended_things`, consolidation's rule).
//!
//! Writes docs/eval/facts.md (`make eval`, `make eval-facts`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use engram_core::Category;
use engram_core::SpeakerRole;
use engram_core::conflict;
use engram_core::episode::{SegmentTurn, extractive_episode};
use engram_core::normalize::normalize_for_fingerprint;
use engram_core::speaker::split_speaker;
use serde::Deserialize;

#[derive(Parser)]
#[command(about = "Measure the local fact extraction on the labelled fact and conflict sets")]
struct Args {
    #[arg(long, default_value = "tests/eval/facts/labelled.json")]
    facts: PathBuf,
    #[arg(long, default_value = "tests/eval/conflicts/labelled.json")]
    conflicts: PathBuf,
    /// Where the report goes (`-` prints it only).
    #[arg(long, default_value = "docs/eval/facts.md")]
    report: String,
    #[arg(long, default_value = "make eval-facts")]
    command_line: String,
    /// Print every item the extraction got wrong.
    #[arg(long)]
    misses: bool,
    /// The dev dialogs, whose sessions are consolidated for the judged sample below.
    #[arg(long, default_value = "tests/eval/dialogs")]
    dialogs: PathBuf,
    /// The facts once written from the dev dialogs, each judged a fact to keep or not.
    #[arg(long, default_value = "tests/eval/dialog_facts/labelled.json")]
    dialog_facts: PathBuf,
    /// Only show what consolidation makes of these sentences, each said by a chat's user (or
    /// "Name: text" by a named speaker): its facts, what each states and what it says is over.
    #[arg(long, num_args = 1..)]
    show: Vec<String>,
}

#[derive(Deserialize)]
struct JudgedFacts {
    facts: Vec<JudgedFact>,
}

#[derive(Deserialize)]
struct JudgedFact {
    text: String,
    fact: bool,
}

#[derive(Deserialize)]
struct DevDialog {
    speakers: Vec<String>,
    sessions: Vec<DevSession>,
}

#[derive(Deserialize)]
struct DevSession {
    turns: Vec<DevTurn>,
}

#[derive(Deserialize)]
struct DevTurn {
    speaker: String,
    text: String,
}

/// Each session of the dev dialogs as the turns of one segment, the first speaker as the user
/// (as the dev dialogs are appended).
fn dev_sessions(dialogs: &std::path::Path) -> anyhow::Result<Vec<Vec<SegmentTurn>>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dialogs)
        .with_context(|| format!("reading {}", dialogs.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| {
            path.extension().is_some_and(|ext| ext == "json")
                && path
                    .file_name()
                    .is_some_and(|name| name.to_string_lossy().starts_with('d'))
        })
        .collect();
    paths.sort();
    let mut sessions = Vec::new();
    for path in paths {
        let dialog: DevDialog = serde_json::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("reading {}", path.display()))?;
        let first = dialog.speakers.first().cloned().unwrap_or_default();
        for session in &dialog.sessions {
            sessions.push(
                session
                    .turns
                    .iter()
                    .map(|turn| SegmentTurn {
                        role: if turn.speaker == first {
                            SpeakerRole::User
                        } else {
                            SpeakerRole::Assistant
                        },
                        content: format!("{}: {}", turn.speaker, turn.text),
                    })
                    .collect(),
            );
        }
    }
    Ok(sessions)
}

/// The facts the rules write from the dev dialogs now, each session consolidated as one segment,
/// against the judged sample: (facts written, judged ones among them, judged a fact to keep),
/// and the written facts judged not to be kept (and those not judged yet, marked so).
fn dialog_fact_precision(
    sessions: &[Vec<SegmentTurn>],
    judged: &JudgedFacts,
) -> (usize, usize, usize, Vec<String>) {
    let verdicts: BTreeMap<&str, bool> = judged
        .facts
        .iter()
        .map(|f| (f.text.as_str(), f.fact))
        .collect();
    let (mut written, mut judged_count, mut kept) = (0, 0, 0);
    let mut not_facts = Vec::new();
    for turns in sessions {
        for fact in extractive_episode(turns).facts {
            written += 1;
            match verdicts.get(fact.text.as_str()) {
                Some(true) => {
                    judged_count += 1;
                    kept += 1;
                }
                Some(false) => {
                    judged_count += 1;
                    not_facts.push(fact.text);
                }
                // Written since the sample was judged: listed for judging.
                None => not_facts.push(format!("(not judged yet) {}", fact.text)),
            }
        }
    }
    (written, judged_count, kept, not_facts)
}

/// The episodes of the dev dialogs' sessions, each consolidated as one segment: their titles,
/// how many are a list of keyphrases rather than a phrase and how many name a speaker; and how
/// many of the segments' facts their summaries hold (a fact's words, without its speaker, in
/// the summary).
struct DialogEpisodes {
    titles: Vec<String>,
    lists: usize,
    naming_a_speaker: usize,
    facts: usize,
    facts_in_summary: usize,
}

fn dialog_episodes(sessions: &[Vec<SegmentTurn>]) -> DialogEpisodes {
    let mut episodes = DialogEpisodes {
        titles: Vec::new(),
        lists: 0,
        naming_a_speaker: 0,
        facts: 0,
        facts_in_summary: 0,
    };
    for turns in sessions {
        let episode = extractive_episode(turns);
        let summary = normalize_for_fingerprint(&episode.summary);
        for fact in &episode.facts {
            let said = split_speaker(&fact.text).map_or(fact.text.as_str(), |(_, said)| said);
            episodes.facts += 1;
            episodes.facts_in_summary +=
                usize::from(summary.contains(&normalize_for_fingerprint(said)));
        }
        let title = episode.title;
        let speakers: Vec<&str> = turns
            .iter()
            .filter_map(|turn| split_speaker(&turn.content).map(|(name, _)| name))
            .collect();
        episodes.lists += usize::from(title.contains(", "));
        episodes.naming_a_speaker += usize::from(
            title
                .split(|c: char| !c.is_alphanumeric())
                .any(|word| speakers.contains(&word)),
        );
        episodes.titles.push(title);
    }
    episodes
}

#[derive(Deserialize)]
struct FactSet {
    items: Vec<FactItem>,
}

#[derive(Deserialize)]
struct FactItem {
    id: String,
    language: String,
    setting: String,
    speaker: String,
    previous: Option<String>,
    text: String,
    label: String,
    about: Option<String>,
    /// Why the label: the phatic kinds ([`PHATIC_WHY`]) are what a summary must leave out.
    #[serde(default)]
    why: String,
}

/// The labels' reasons that mark a sentence said for the conversation's sake (greetings,
/// thanks, reactions, compliments, farewells, agreement, filler): no summary sentence.
const PHATIC_WHY: &[&str] = &[
    "Filler",
    "Reaction",
    "Farewell",
    "Greeting",
    "Thanks",
    "Compliment",
    "Agreement",
    "The assistant's reaction",
];

/// Of the labelled phatic sentences, how many a summary kept: each said in a segment with a
/// plain statement beside it (so that the summary has something else to say), as the
/// extractive summary of that segment.
fn phatic_in_summaries(items: &[FactItem]) -> (usize, usize, Vec<String>) {
    let phatic: Vec<&FactItem> = items
        .iter()
        .filter(|item| PHATIC_WHY.iter().any(|why| item.why.starts_with(why)))
        .collect();
    let mut kept = Vec::new();
    for item in &phatic {
        let other = if item.setting == "chat" {
            "user"
        } else {
            "Sam"
        };
        let mut turns = vec![turn(
            &item.setting,
            other,
            "We moved the team meeting to Thursday at ten, in the big room upstairs.",
            false,
        )];
        turns.push(turn(&item.setting, &item.speaker, &item.text, true));
        let summary = extractive_episode(&turns).summary;
        let said = item
            .text
            .trim()
            .trim_end_matches(['.', '!', '?', '。', '！', '？']);
        if summary.contains(said) {
            kept.push(format!("{} {}", item.id, item.text));
        }
    }
    (phatic.len(), kept.len(), kept)
}

#[derive(Deserialize)]
struct ConflictSet {
    pairs: Vec<ConflictPair>,
}

#[derive(Deserialize)]
struct ConflictPair {
    id: String,
    language: String,
    setting: String,
    older: Said,
    newer: Said,
    supersedes: bool,
}

#[derive(Deserialize)]
struct Said {
    speaker: String,
    text: String,
}

/// The labels, in the report's order; `not_a_fact` last.
const LABELS: [&str; 8] = [
    "fact",
    "preference",
    "experience",
    "goal",
    "decision",
    "todo",
    "guideline",
    "not_a_fact",
];
const NOT_A_FACT: &str = "not_a_fact";

/// A line as ingest receives it: a chat's turns by role; a dialog's as "Name: text", the
/// speaker of the labelled sentence as the user or, for every other item, as the assistant (the
/// dev dialogs send their second speaker as the assistant), so both roles are measured.
fn turn(setting: &str, speaker: &str, text: &str, speaker_is_user: bool) -> SegmentTurn {
    if setting == "chat" {
        let role = if speaker == "assistant" {
            SpeakerRole::Assistant
        } else {
            SpeakerRole::User
        };
        return SegmentTurn {
            role,
            content: text.to_owned(),
        };
    }
    SegmentTurn {
        role: if speaker_is_user {
            SpeakerRole::User
        } else {
            SpeakerRole::Assistant
        },
        content: format!("{speaker}: {text}"),
    }
}

/// A fact as consolidation writes it: its text and category.
type Fact = (String, Category);

/// What consolidation writes from a segment: its episode's established facts, each with its
/// category (`StructuredSummary::established`, as ingest reads the stored summary).
fn consolidated(turns: &[SegmentTurn]) -> Vec<Fact> {
    extractive_episode(turns).structured.established()
}

/// Whether `fact` was written from `sentence`: its words, without the speaker it is stored
/// with, are the sentence's or part of them.
fn from_sentence(fact: &Fact, sentence: &str) -> bool {
    let said = split_speaker(&fact.0).map_or(fact.0.as_str(), |(_, said)| said);
    let fact_key = normalize_for_fingerprint(said);
    let sentence_key = normalize_for_fingerprint(sentence);
    !fact_key.is_empty() && (sentence_key.contains(&fact_key) || fact_key.contains(&sentence_key))
}

/// Whom a fact is about: the speaker it is stored with, else the user.
fn subject_of(fact: &Fact) -> String {
    split_speaker(&fact.0).map_or_else(|| "user".to_owned(), |(name, _)| name.to_owned())
}

/// The facts consolidation writes from the labelled sentence (after the line before it).
fn facts_of_item(item: &FactItem, speaker_is_user: bool) -> Vec<Fact> {
    let mut turns = Vec::new();
    if let Some(previous) = &item.previous {
        let (speaker, text) = previous
            .split_once(':')
            .map_or(("user", previous.as_str()), |(s, t)| (s.trim(), t.trim()));
        turns.push(turn(&item.setting, speaker, text, !speaker_is_user));
    }
    turns.push(turn(
        &item.setting,
        &item.speaker,
        &item.text,
        speaker_is_user,
    ));
    consolidated(&turns)
        .into_iter()
        .filter(|fact| from_sentence(fact, &item.text))
        .collect()
}

/// What the extraction made of one labelled sentence.
struct Judged<'a> {
    item: &'a FactItem,
    predicted: String,
    subject: Option<String>,
    facts: Vec<String>,
}

fn judge(item: &FactItem, index: usize) -> Judged<'_> {
    let facts = facts_of_item(item, index.is_multiple_of(2));
    // Where one sentence gave several facts, the first one written counts (the labelled
    // sentence has one label).
    let chosen = facts.first();
    Judged {
        item,
        predicted: chosen.map_or(NOT_A_FACT.to_owned(), |fact| fact.1.as_str().to_owned()),
        subject: chosen.map(subject_of),
        facts: facts.iter().map(|fact| fact.0.clone()).collect(),
    }
}

#[derive(Default, Clone, Copy)]
struct Counts {
    true_positive: usize,
    predicted: usize,
    gold: usize,
}

impl Counts {
    fn precision(&self) -> Option<f64> {
        (self.predicted > 0).then(|| self.true_positive as f64 / self.predicted as f64)
    }
    fn recall(&self) -> Option<f64> {
        (self.gold > 0).then(|| self.true_positive as f64 / self.gold as f64)
    }
    fn f1(&self) -> f64 {
        match (self.precision(), self.recall()) {
            (Some(p), Some(r)) if p + r > 0.0 => 2.0 * p * r / (p + r),
            _ => 0.0,
        }
    }
}

fn percent(value: Option<f64>) -> String {
    value.map_or("—".to_owned(), |v| format!("{:.1} %", 100.0 * v))
}

/// Per label, and whether a sentence is kept as a fact at all.
struct FactScores {
    items: usize,
    per_label: BTreeMap<&'static str, Counts>,
    kept: Counts,
    /// Facts kept for a sentence that is one, and of them those about the right person.
    attributed: (usize, usize),
}

fn score_facts(judged: &[Judged<'_>]) -> FactScores {
    let mut per_label: BTreeMap<&'static str, Counts> = BTreeMap::new();
    let mut kept = Counts::default();
    let mut attributed = (0, 0);
    for judged in judged {
        for label in LABELS {
            let counts = per_label.entry(label).or_default();
            let gold = judged.item.label == label;
            let predicted = judged.predicted == label;
            counts.gold += usize::from(gold);
            counts.predicted += usize::from(predicted);
            counts.true_positive += usize::from(gold && predicted);
        }
        let gold_fact = judged.item.label != NOT_A_FACT;
        let predicted_fact = judged.predicted != NOT_A_FACT;
        kept.gold += usize::from(gold_fact);
        kept.predicted += usize::from(predicted_fact);
        kept.true_positive += usize::from(gold_fact && predicted_fact);
        if gold_fact && predicted_fact {
            attributed.1 += 1;
            attributed.0 += usize::from(judged.subject.as_deref() == judged.item.about.as_deref());
        }
    }
    FactScores {
        items: judged.len(),
        per_label,
        kept,
        attributed,
    }
}

impl FactScores {
    /// Macro-F1 over the seven kinds of fact and "not a fact".
    fn macro_f1(&self) -> f64 {
        self.per_label.values().map(Counts::f1).sum::<f64>() / self.per_label.len() as f64
    }
}

/// The facts consolidation writes from one statement said alone.
fn facts_of_statement(setting: &str, said: &Said) -> Vec<Fact> {
    consolidated(&[turn(setting, &said.speaker, &said.text, true)])
}

/// What the facts of one statement state (subject = value), as the write path reads them; a
/// statement kept as no fact states nothing.
fn stated(setting: &str, said: &Said) -> Vec<String> {
    let facts = facts_of_statement(setting, said);
    if facts.is_empty() {
        return vec!["(no fact)".to_owned()];
    }
    facts
        .iter()
        .filter_map(|fact| conflict::subject_value(&fact.0))
        .map(|stated| format!("{} = {}", stated.subject, stated.value))
        .chain(
            facts
                .iter()
                .flat_map(|fact| conflict::ended_things(&fact.0))
                .map(|ended| format!("ended: {}", ended.thing)),
        )
        .collect()
}

/// Whether the write path's rule supersedes the older statement's facts with the newer's.
fn supersedes(pair: &ConflictPair) -> bool {
    let older: Vec<_> = facts_of_statement(&pair.setting, &pair.older)
        .iter()
        .filter_map(|fact| conflict::subject_value(&fact.0))
        .collect();
    let older_facts = facts_of_statement(&pair.setting, &pair.older);
    let newer_facts = facts_of_statement(&pair.setting, &pair.newer);
    let new_value = newer_facts
        .iter()
        .filter_map(|fact| conflict::subject_value(&fact.0))
        .any(|newer| {
            older
                .iter()
                .any(|older| older.subject == newer.subject && older.value != newer.value)
        });
    // Consolidation's second rule: a newer fact that says something of the speaker's is over
    // supersedes the older facts naming it.
    let ended = newer_facts
        .iter()
        .flat_map(|fact| conflict::ended_things(&fact.0))
        .any(|ended| {
            older_facts
                .iter()
                .any(|older| conflict::names(&older.0, &ended))
        });
    new_value || ended
}

struct ConflictScores {
    updates: usize,
    superseded_correctly: usize,
    unrelated: usize,
    superseded_wrongly: usize,
}

fn score_conflicts<'a>(pairs: impl Iterator<Item = (&'a ConflictPair, bool)>) -> ConflictScores {
    let mut scores = ConflictScores {
        updates: 0,
        superseded_correctly: 0,
        unrelated: 0,
        superseded_wrongly: 0,
    };
    for (pair, superseded) in pairs {
        if pair.supersedes {
            scores.updates += 1;
            scores.superseded_correctly += usize::from(superseded);
        } else {
            scores.unrelated += 1;
            scores.superseded_wrongly += usize::from(superseded);
        }
    }
    scores
}

fn share(part: usize, whole: usize) -> String {
    percent((whole > 0).then(|| part as f64 / whole as f64))
}

fn report(
    command_line: &str,
    facts: &[(&str, FactScores)],
    conflicts: &[(&str, ConflictScores)],
) -> String {
    let mut text = String::new();
    text.push_str("# Facts written from conversations (local consolidation)\n\n");
    text.push_str(&format!(
        "Produced by `{command_line}` on {}. No LLM: the extractive consolidation that runs by \
         default. Sets: `tests/eval/facts` and `tests/eval/conflicts` (their READMEs say how \
         they were made and what each label means).\n\n\
         The statement rules (`engram_core::statement`) were written against the misses on \
         the fact set, each as a phrasing rather than a sentence of it: these are figures on \
         the rules' development set, an upper bound of what they do on chats they never saw. \
         The conflict set measured the first conflict rules only; the rules of what one uses \
         and replaces (`conflict::usage`) were written after reading its misses, again as \
         phrasings with unit tests of their own sentences, so it is their development set \
         too.\n\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    ));
    text.push_str(
        "## Which sentences become facts, of what kind, about whom\n\n\
         Each labelled sentence is consolidated as a segment of its own, after the line before \
         it where the set gives one, through the same `extractive_episode` ingest runs, and its \
         facts read back from the episode's structured summary as consolidation reads them; a \
         named dialog's speaker is sent as the user for half the items and as the assistant for \
         the other half, as the dev dialogs send their two speakers. **kept** is whether a \
         sentence gives any fact (precision: of the sentences kept, how many are facts; recall: \
         of the facts, how many are kept); **attributed** is, of the facts kept for sentences \
         that are facts, the share stored with the right person (the speaker's name in a \
         dialog, the user in a chat).\n\n",
    );
    text.push_str("| sentences | set | kept: precision | kept: recall | attributed | macro-F1 (8 labels) |\n|---|---|---|---|---|---|\n");
    for (name, scores) in facts {
        text.push_str(&format!(
            "| {} | {name} | {} | {} | {} | {:.3} |\n",
            scores.items,
            percent(scores.kept.precision()),
            percent(scores.kept.recall()),
            share(scores.attributed.0, scores.attributed.1),
            scores.macro_f1()
        ));
    }
    if let Some((_, all)) = facts.first() {
        text.push_str("\nPer label, all sentences:\n\n| label | sentences | predicted | precision | recall | F1 |\n|---|---|---|---|---|---|\n");
        for label in LABELS {
            let counts = all.per_label[label];
            text.push_str(&format!(
                "| {label} | {} | {} | {} | {} | {:.3} |\n",
                counts.gold,
                counts.predicted,
                percent(counts.precision()),
                percent(counts.recall()),
                counts.f1()
            ));
        }
    }
    text.push_str(
        "\n## Conflicts: does the newer statement supersede the older?\n\n\
         Each statement is consolidated alone; the newer supersedes the older when one of its \
         facts states another value of the same subject as one of the older's facts (the write \
         path's rule, `conflict::subject_value`), or says something of the speaker's is over \
         that one of the older's facts names (consolidation's rule, `conflict::ended_things`). \
         The first rules were written from phrasings of the attributes the issue names (home, \
         work, manager, role, partner, diet, contact details) and of endings, and checked on \
         unit tests of their own sentences; the later ones of things one has one of at a time \
         (a phone, a car, a bank, a gym, a plan, a shift, a commute; named by the kind the \
         object's words name) after reading this set's misses.\n\n\
         | set | update pairs | superseded correctly | unrelated pairs | superseded wrongly |\n|---|---|---|---|---|\n",
    );
    for (name, scores) in conflicts {
        text.push_str(&format!(
            "| {name} | {} | {} | {} | {} |\n",
            scores.updates,
            share(scores.superseded_correctly, scores.updates),
            scores.unrelated,
            share(scores.superseded_wrongly, scores.unrelated),
        ));
    }
    text
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !args.show.is_empty() {
        for sentence in &args.show {
            let said = match split_speaker(sentence) {
                Some((speaker, text)) => Said {
                    speaker: speaker.to_owned(),
                    text: text.to_owned(),
                },
                None => Said {
                    speaker: "user".to_owned(),
                    text: sentence.clone(),
                },
            };
            let setting = if said.speaker == "user" {
                "chat"
            } else {
                "dialog"
            };
            let facts = facts_of_statement(setting, &said);
            println!(
                "{sentence}\n    facts: {facts:?}\n    states: {:?}",
                stated(setting, &said)
            );
        }
        return Ok(());
    }
    let fact_set: FactSet = serde_json::from_str(
        &std::fs::read_to_string(&args.facts)
            .with_context(|| format!("reading {}", args.facts.display()))?,
    )?;
    let conflict_set: ConflictSet = serde_json::from_str(
        &std::fs::read_to_string(&args.conflicts)
            .with_context(|| format!("reading {}", args.conflicts.display()))?,
    )?;

    let judged: Vec<Judged<'_>> = fact_set
        .items
        .iter()
        .enumerate()
        .map(|(index, item)| judge(item, index))
        .collect();
    if args.misses {
        for judged in &judged {
            let wrong_label = judged.predicted != judged.item.label;
            let wrong_subject = judged.item.label != NOT_A_FACT
                && judged.predicted != NOT_A_FACT
                && judged.subject.as_deref() != judged.item.about.as_deref();
            if wrong_label || wrong_subject {
                println!(
                    "{} [{} → {}] {}: {} {:?}",
                    judged.item.id,
                    judged.item.label,
                    judged.predicted,
                    judged.item.speaker,
                    judged.item.text,
                    judged.facts
                );
            }
        }
    }
    let subset = |keep: &dyn Fn(&FactItem) -> bool| {
        let chosen: Vec<Judged<'_>> = judged
            .iter()
            .filter(|j| keep(j.item))
            .map(|j| Judged {
                item: j.item,
                predicted: j.predicted.clone(),
                subject: j.subject.clone(),
                facts: Vec::new(),
            })
            .collect();
        score_facts(&chosen)
    };
    let fact_scores = vec![
        ("all", score_facts(&judged)),
        ("English", subset(&|i| i.language == "en")),
        ("Chinese", subset(&|i| i.language == "zh")),
        ("chats", subset(&|i| i.setting == "chat")),
        ("named dialogs", subset(&|i| i.setting == "dialog")),
    ];

    let decided: Vec<(&ConflictPair, bool)> = conflict_set
        .pairs
        .iter()
        .map(|pair| (pair, supersedes(pair)))
        .collect();
    if args.misses {
        for (pair, superseded) in &decided {
            if *superseded != pair.supersedes {
                println!(
                    "{} [{} → {}] {} / {}\n    states: {:?} / {:?}",
                    pair.id,
                    pair.supersedes,
                    superseded,
                    pair.older.text,
                    pair.newer.text,
                    stated(&pair.setting, &pair.older),
                    stated(&pair.setting, &pair.newer),
                );
            }
        }
    }
    let conflict_scores = vec![
        ("all", score_conflicts(decided.iter().copied())),
        (
            "English",
            score_conflicts(decided.iter().copied().filter(|(p, _)| p.language == "en")),
        ),
        (
            "Chinese",
            score_conflicts(decided.iter().copied().filter(|(p, _)| p.language == "zh")),
        ),
    ];

    let judged: JudgedFacts = serde_json::from_str(
        &std::fs::read_to_string(&args.dialog_facts)
            .with_context(|| format!("reading {}", args.dialog_facts.display()))?,
    )?;
    let sessions = dev_sessions(&args.dialogs)?;
    let (written, judged_count, judged_kept, not_facts) = dialog_fact_precision(&sessions, &judged);
    let episodes = dialog_episodes(&sessions);
    if args.misses {
        for title in &episodes.titles {
            println!("title: {title}");
        }
    }
    if args.misses {
        for text in &not_facts {
            println!("not a fact to keep: {text}");
        }
    }
    let (phatic, phatic_kept, kept) = phatic_in_summaries(&fact_set.items);
    if args.misses {
        for sentence in &kept {
            println!("phatic in a summary: {sentence}");
        }
    }
    let mut text = report(&args.command_line, &fact_scores, &conflict_scores);
    text.push_str(&format!(
        "\n## Summaries: phatic sentences\n\nThe {phatic} sentences of the fact set labelled as \
         said for the conversation's sake (greetings, thanks, reactions, compliments, \
         farewells, agreement, filler), each said in a segment beside a plain statement: the \
         extractive summary of that segment kept **{phatic_kept}** of them ({:.1} %).\n",
        100.0 * phatic_kept as f64 / phatic.max(1) as f64
    ));
    text.push_str(&format!(
        "\n## The facts written from the dev dialogs, judged\n\nEach session of the dev dialogs \
         (`tests/eval/dialogs`) consolidated as one segment gives {written} facts; \
         {judged_count} of them are in the judged sample (`tests/eval/dialog_facts`: the facts \
         written at 9e73049 and those written since, each judged by hand when first written: a \
         fact an assistant should keep, attributed, self-contained and truly a statement, or \
         not). **Precision on the judged ones: \
         {:.1} %** ({judged_kept} of {judged_count}); issue 39 asks for 90 %. `--misses` lists \
         the others. Some of the rules that leave sentences out (figures of speech, \
         instructions to the other speaker, the day so far) were written against this sample's \
         misses: it is their development set too.\n",
        100.0 * judged_kept as f64 / judged_count.max(1) as f64
    ));
    let examples: Vec<String> = episodes
        .titles
        .iter()
        .step_by((episodes.titles.len() / 8).max(1))
        .take(8)
        .map(|title| format!("\"{title}\""))
        .collect();
    text.push_str(&format!(
        "\n## Titles and summaries of the dev dialogs' sessions\n\nEach session consolidated as one segment \
         ({} sessions): **{}** titles are a list of keyphrases rather than a phrase naming the \
         topic, **{}** name one of the people talking. Every eighth: {}. `--misses` lists them \
         all.\n\nThe same sessions' summaries hold **{:.1} %** of their segments' facts ({} of {}: \
         the fact's words, without its speaker, in the summary).\n",
        episodes.titles.len(),
        episodes.lists,
        episodes.naming_a_speaker,
        examples.join(", "),
        100.0 * episodes.facts_in_summary as f64 / episodes.facts.max(1) as f64,
        episodes.facts_in_summary,
        episodes.facts
    ));
    println!("{text}");
    if args.report != "-" {
        std::fs::write(&args.report, &text).with_context(|| format!("writing {}", args.report))?;
        eprintln!("report written to {}", args.report);
    }
    Ok(())
}
