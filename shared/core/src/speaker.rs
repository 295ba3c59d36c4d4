//! Who said a line of a transcript. A chat history kept one memory per turn reads
//! "Maria: Did you ever make it to Lisbon?": the label before the colon names the speaker.
//! Two things use it:
//! - an import whose entries read as a dialog is indexed with each turn's neighbours by default
//!   (`reads_as_dialog`), since a short turn ("Yes, last week!") means what its neighbours say;
//! - a question that names one of the speakers ("What breed is Jonas's dog?") is mostly answered
//!   by that speaker's own lines, while the other speaker echoes the name ("Wow, Jonas! ...");
//!   ranking discounts the lines of speakers the question does not name (`NamedSpeakers`), when
//!   the entries it ranks read as a dialog themselves.
//!
//! Notes and exports label lines too ("Goal: run a marathon", "Email: a@example.com"): the
//! common headings are not speakers (`NOT_SPEAKERS`), and both uses ask for most lines to carry
//! a label, so a list of facts with a few headings is neither a dialog nor ranked as one.

use std::collections::HashSet;

/// The longest label taken for a speaker's name, in characters.
const MAX_LABEL_CHARS: usize = 40;
/// The most words a speaker's name has ("Dr Ana Sousa").
const MAX_LABEL_WORDS: usize = 3;
/// The share of entries that must carry a speaker label for them to read as a dialog.
const DIALOG_LABELLED_SHARE: f64 = 0.8;
/// Headings of notes, lists and exports that look like a speaker's label and are not one, and
/// the words an assistant opens an acknowledgement with ("Noted: March 14 to 21"), compared
/// without case.
const NOT_SPEAKERS: &[&str] = &[
    "acknowledged",
    "action",
    "address",
    "agenda",
    "answer",
    "birthday",
    "confirmed",
    "date",
    "decision",
    "done",
    "email",
    "fact",
    "fyi",
    "goal",
    "idea",
    "important",
    "info",
    "location",
    "meeting",
    "name",
    "note",
    "noted",
    "notes",
    "ok",
    "okay",
    "phone",
    "preference",
    "ps",
    "q",
    "question",
    "re",
    "reminder",
    "step",
    "subject",
    "summary",
    "sure",
    "task",
    "time",
    "tip",
    "title",
    "todo",
    "understood",
    "update",
    "warning",
    "background",
    "context",
    "edit",
    "error",
    "example",
    "input",
    "output",
    "result",
    "source",
    "status",
    "备注",
    "待办",
    "提醒",
    "目标",
    "总结",
    "问题",
    "回答",
    "答案",
    "决定",
    "注意",
    "时间",
    "地址",
];

/// The speaker label a line begins with: one to three words before a colon (ASCII or
/// full-width) and something said after it, each word starting with a capital letter or a letter
/// without case (CJK names). "Maria: Yes!" is Maria's; "meeting at 10:30" and "note: buy milk"
/// name nobody.
pub fn speaker_label(text: &str) -> Option<&str> {
    split_speaker(text).map(|(label, _)| label)
}

/// A line's speaker label (as [`speaker_label`] reads it) and what was said after it:
/// "Maria: Yes!" is `("Maria", "Yes!")`.
pub fn split_speaker(text: &str) -> Option<(&str, &str)> {
    let text = text.trim_start();
    // Only the head of the line can hold a label: a long text without one is not scanned whole.
    let colon = text
        .char_indices()
        .take(MAX_LABEL_CHARS + 1)
        .find(|(_, c)| matches!(c, ':' | '：'))?
        .0;
    let label = text[..colon].trim_end();
    let said = text[colon..].trim_start_matches([':', '：']).trim();
    if label.is_empty() || said.is_empty() || label.chars().count() > MAX_LABEL_CHARS {
        return None;
    }
    let words: Vec<&str> = label.split_whitespace().collect();
    let is_name_word = |word: &str| {
        let mut chars = word.chars();
        chars
            .next()
            .is_some_and(|first| first.is_alphabetic() && !first.is_lowercase())
            && word
                .chars()
                .all(|c| c.is_alphabetic() || matches!(c, '.' | '-' | '\'' | '’'))
    };
    let is_heading = NOT_SPEAKERS
        .iter()
        .any(|heading| label.eq_ignore_ascii_case(heading));
    (words.len() <= MAX_LABEL_WORDS
        && words.iter().all(|word| is_name_word(word))
        && !is_heading
        && could_be_a_cjk_name(label))
    .then_some((label, said))
}

/// The longest Chinese name taken for a speaker's label, in characters ("欧阳娜娜").
const MAX_CJK_NAME_CHARS: usize = 4;

/// Whether a label without case (Chinese) could be a name: a short run of characters without
/// the particles and words of a heading ("我的情况：", "以下是一些建议："). Labels with case pass.
fn could_be_a_cjk_name(label: &str) -> bool {
    let cjk = label
        .chars()
        .filter(|c| crate::normalize::is_cjk(*c))
        .count();
    if cjk == 0 {
        return true;
    }
    const NOT_IN_NAMES: &[char] = &[
        '的', '是', '了', '在', '和', '与', '或', '如', '下', '些', '以', '情', '况', '我', '你',
        '他', '她', '们', '这', '那', '有', '个', '说', '问', '答', '请', '注', '意', '建', '议',
    ];
    label.chars().count() <= MAX_CJK_NAME_CHARS && !label.chars().any(|c| NOT_IN_NAMES.contains(&c))
}

/// Whether a batch of entries reads as a dialog: most of them (80 %) begin with a speaker label,
/// and at least two speakers take part. A list of facts, or one person's notes, does not.
pub fn reads_as_dialog<'a>(texts: impl IntoIterator<Item = &'a str>) -> bool {
    Transcript::of(texts).is_dialog()
}

/// The speakers of a batch of entries, each line's label parsed once.
struct Transcript {
    entries: usize,
    labelled: usize,
    /// Lowercased labels.
    speakers: HashSet<String>,
}

impl Transcript {
    fn of<'a>(texts: impl IntoIterator<Item = &'a str>) -> Self {
        let mut transcript = Self {
            entries: 0,
            labelled: 0,
            speakers: HashSet::new(),
        };
        for text in texts {
            transcript.entries += 1;
            if let Some(label) = speaker_label(text) {
                transcript.labelled += 1;
                transcript.speakers.insert(label.to_lowercase());
            }
        }
        transcript
    }

    fn is_dialog(&self) -> bool {
        self.entries >= 2
            && self.speakers.len() >= 2
            && self.labelled as f64 >= DIALOG_LABELLED_SHARE * self.entries as f64
    }
}

/// The speakers a query names, among the labels of the entries ranked for it: "What breed is
/// Jonas's dog?" names Jonas when some candidate is a line of Jonas's. Compared without case, by
/// whole words (a name without case, such as a CJK one, by its characters). Nobody is named
/// unless the entries read as a dialog (`reads_as_dialog`): in a space of facts a few labelled
/// lines are headings more likely than speakers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamedSpeakers {
    /// Lowercased labels.
    named: HashSet<String>,
}

impl NamedSpeakers {
    pub fn in_query<'a>(query: &str, texts: impl IntoIterator<Item = &'a str>) -> Self {
        let transcript = Transcript::of(texts);
        if !transcript.is_dialog() {
            return Self::default();
        }
        let query_lower = query.to_lowercase();
        let query_words = words(&query_lower);
        let named = transcript
            .speakers
            .into_iter()
            .filter(|label| {
                let label_words = words(label);
                if label
                    .chars()
                    .any(|c| c.is_alphabetic() && !c.is_lowercase())
                {
                    // Caseless script: no spaces between words to match on.
                    query_lower.contains(label.as_str())
                } else {
                    !label_words.is_empty()
                        && query_words
                            .windows(label_words.len())
                            .any(|window| window == label_words.as_slice())
                }
            })
            .collect();
        Self { named }
    }

    /// Whether the query names a speaker at all.
    pub fn any(&self) -> bool {
        !self.named.is_empty()
    }

    /// Whether `text` is a line of a speaker other than those the query names: false when the
    /// query names nobody or the text has no speaker label.
    pub fn spoken_by_another(&self, text: &str) -> bool {
        self.any()
            && speaker_label(text).is_some_and(|label| !self.named.contains(&label.to_lowercase()))
    }
}

/// Lowercase words: runs of letters and digits ("jonas's" is "jonas", "s").
fn words(text: &str) -> Vec<&str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_is_a_capitalised_name_before_a_colon() {
        for (text, label) in [
            ("Maria: Did you ever make it to Lisbon?", Some("Maria")),
            ("  Ana Sousa : Yes, last week!", Some("Ana Sousa")),
            ("Dr. O'Neil: Take two.", Some("Dr. O'Neil")),
            ("小明：我下周三去上海", Some("小明")),
            ("User: I prefer dark mode", Some("User")),
            ("note: buy milk", None),
            ("Note: buy milk", None),
            ("Goal: run a marathon in May", None),
            ("目标：跑完马拉松", None),
            ("https://example.com/a:b", None),
            ("Meeting at 10:30 with Ana", None),
            ("Maria:", None),
            ("The plan for the launch party is: cake", None),
            ("I prefer dark mode", None),
            ("Context: I'm vegan and cooking for six.", None),
            ("Noted: March 14 to 21, vegetarian-friendly places.", None),
            ("Okay: Porto from March 14 to 21.", None),
            ("林悦：我今年一定要学会游泳。", Some("林悦")),
            ("我的情况：我有两个孩子，住在上海。", None),
            ("以下是一些建议：先休息。", None),
        ] {
            assert_eq!(speaker_label(text), label, "{text}");
        }
    }

    #[test]
    fn a_dialog_has_two_speakers_and_labels_on_most_lines() {
        let dialog = [
            "Clara: Happy new year!",
            "Jonas: Barely survived the train.",
            "Clara: Go on.",
            "Jonas: I got a dog.",
        ];
        assert!(reads_as_dialog(dialog));
        // One speaker's notes, or a list of facts, are not a dialog.
        assert!(!reads_as_dialog([
            "Clara: one",
            "Clara: two",
            "Clara: three"
        ]));
        assert!(!reads_as_dialog([
            "I prefer dark mode",
            "My manager is Alice"
        ]));
        // A few unlabelled lines among many labelled ones still read as a dialog; many do not.
        let mut mixed: Vec<&str> = dialog.repeat(2);
        mixed.push("(photo of a whippet)");
        assert!(reads_as_dialog(mixed.iter().copied()));
        mixed.extend(["(photo)", "(photo)"]);
        assert!(!reads_as_dialog(mixed.iter().copied()));
        assert!(!reads_as_dialog(["Clara: alone"]));
        // Headings of notes and exports are not speakers.
        assert!(!reads_as_dialog([
            "Goal: run a marathon",
            "Todo: buy shoes",
            "Decision: train on Sundays",
        ]));
        assert!(!reads_as_dialog([
            "Name: Alice",
            "Email: alice@example.com"
        ]));
    }

    #[test]
    fn a_query_names_a_speaker_by_whole_words_without_case() {
        let labels = ["Jonas: hi", "Clara: hi", "Ana Sousa: hi", "小明：你好"];
        let named = NamedSpeakers::in_query("What breed is Jonas's pup?", labels);
        assert!(named.spoken_by_another("Clara: Wow, Jonas! What breed?"));
        assert!(!named.spoken_by_another("Jonas: A whippet cross."));
        assert!(!named.spoken_by_another("A line without a label"));
        // "Jonasson" is not Jonas; nobody named, nobody discounted.
        let nobody = NamedSpeakers::in_query("Who is Jonasson?", labels);
        assert!(!nobody.any());
        assert!(!nobody.spoken_by_another("Clara: hi"));
        assert!(NamedSpeakers::in_query("what did ana sousa say?", labels).any());
        assert!(!NamedSpeakers::in_query("what did Ana say?", labels).any());
        let chinese = NamedSpeakers::in_query("小明下周去哪里？", labels);
        assert!(chinese.spoken_by_another("小红：我不知道"));
        assert!(!chinese.spoken_by_another("小明：去上海"));
    }

    #[test]
    fn nobody_is_named_among_entries_that_are_not_a_dialog() {
        // A space of facts with a couple of labelled lines: the query names "Maria", but these
        // are not a transcript, so nothing is discounted.
        let facts = [
            "Maria: likes jazz",
            "Tom: allergic to peanuts",
            "I prefer dark mode",
            "My manager is Alice Chen",
            "The launch is in May",
        ];
        let named = NamedSpeakers::in_query("What does Maria like?", facts);
        assert!(!named.any());
        assert!(!named.spoken_by_another("Tom: allergic to peanuts"));
    }
}
