//! Facts that state a value of a subject, so that a newer value supersedes an older one.
//!
//! "My manager is Alice Chen", then "My manager is now Bob Smith": both are the subject
//! `manager`, with the values `alice chen` and `bob smith`. The write path stores the subject and
//! value of every fact the rules recognise; a new valid fact of the same subject with another
//! value sets the older fact's `invalid_at` (it is kept, as history) instead of leaving two
//! answers to "who is my manager?".
//!
//! The rules cover the common first-person patterns, in English and Chinese:
//! - "my <subject> is <value>" for a known set of subjects (name, manager, boss, email, phone
//!   number, address, birthday, job, role, team, company, city, hometown, timezone, partner, …),
//!   and "my favo(u)rite <thing> is <value>" for any thing;
//! - where one lives ("I live in", "I moved to", "I'm based in"), where one works ("I work at /
//!   for", "I joined", "I now work at"), one's age ("I'm 34", "I am 34 years old");
//! - "I prefer X over / to / rather than Y" (the subject is the pair of options);
//! - 我的<subject>是…, 我最喜欢的<thing>是…, 我住在 / 我搬到…, 我在…工作 / 上班, 我今年…岁.
//!
//! Limits, deliberately: a subject outside the known set ("my car is red") states nothing the
//! rules can compare, so it never supersedes anything; a negation or an adjective ("my manager is
//! not happy", "my manager is on holiday") is not a new value; "I prefer tea" and later "I prefer
//! coffee" are both kept (nothing says they answer the same choice); third-person statements
//! ("Alice is my manager") are not recognised. An LLM, when configured, judges conflicts of
//! consolidated facts itself.

use std::sync::LazyLock;

use regex::Regex;

/// What a fact states: a subject and its value, both normalised (lowercase, words folded).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SubjectValue {
    pub subject: String,
    pub value: String,
}

/// Subjects "my <subject> is <value>" may state (compared after lowercasing).
const KNOWN_SUBJECTS: &[&str] = &[
    "name",
    "full name",
    "first name",
    "last name",
    "surname",
    "nickname",
    "manager",
    "boss",
    "team lead",
    "supervisor",
    "mentor",
    "email",
    "email address",
    "e-mail",
    "phone",
    "phone number",
    "mobile",
    "mobile number",
    "number",
    "address",
    "home address",
    "birthday",
    "date of birth",
    "job",
    "job title",
    "title",
    "role",
    "position",
    "occupation",
    "profession",
    "team",
    "department",
    "company",
    "employer",
    "office",
    "city",
    "hometown",
    "home town",
    "country",
    "timezone",
    "time zone",
    "partner",
    "wife",
    "husband",
    "girlfriend",
    "boyfriend",
    "fiance",
    "fiancee",
    "doctor",
    "dentist",
    "landlord",
    "username",
    "handle",
    "pronouns",
    "native language",
    "first language",
    "major",
    "school",
    "university",
    "salary",
    "budget",
    "age",
    "blood type",
];

/// Values that describe rather than name: "my manager is not happy" states no new manager.
const NOT_A_VALUE: &[&str] = &[
    "not", "no", "very", "so", "really", "too", "quite", "always", "never", "still", "also",
    "happy", "sad", "busy", "great", "good", "bad", "sick", "ill", "away", "out", "on", "in", "at",
    "back", "late", "tired", "angry", "upset", "nice", "kind", "mean", "new", "old", "broken",
    "down", "off", "gone", "leaving", "moving", "changing", "going", "coming", "being", "getting",
    "pretty", "kinda", "kind of", "sort of", "a bit", "the same", "same", "fine", "ok", "okay",
    "unknown", "unclear", "tbd",
];

/// Time phrases after a value ("I joined Globex last month", "I live in Lisbon now"): when, not
/// what.
static TRAILING_TIME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\s+(?:(?:last|this|next)\s+(?:week|month|year)|yesterday|today|recently|now|these\s+days|at\s+the\s+moment|in\s+\d{4}|\d+\s+(?:days|weeks|months|years)\s+ago)$",
    )
    .expect("valid time rule")
});

/// Words that only say the value is current ("my manager is now Bob").
const CURRENTNESS: &[&str] = &["now", "currently", "actually", "officially", "finally"];

struct Rule {
    pattern: Regex,
    /// The subject: fixed, or taken from a capture group.
    subject: Subject,
    /// The capture group holding the value.
    value_group: usize,
}

enum Subject {
    Fixed(&'static str),
    /// A known subject in this group (checked against [`KNOWN_SUBJECTS`]).
    Known(usize),
    /// Any thing in this group, prefixed ("favorite color").
    Prefixed(&'static str, usize),
}

fn rule(pattern: &str, subject: Subject, value_group: usize) -> Rule {
    Rule {
        pattern: Regex::new(pattern).expect("valid conflict rule"),
        subject,
        value_group,
    }
}

static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    vec![
        rule(
            r"(?i)^my\s+fav(?:ou?)?rite\s+([\p{L}\- ]{2,30}?)\s+(?:is|are)\s+(.+)$",
            Subject::Prefixed("favorite ", 1),
            2,
        ),
        rule(
            r"(?i)^my\s+([\p{L}\- ]{2,30}?)\s+(?:is|are|'s)\s+(.+)$",
            Subject::Known(1),
            2,
        ),
        rule(
            r"(?i)^i\s+(?:now\s+|currently\s+|still\s+)?(?:live|am living|'m living|am based|'m based|reside)\s+in\s+(.+)$",
            Subject::Fixed("residence"),
            1,
        ),
        rule(
            r"(?i)^i(?:'ve| have)?\s+(?:just\s+)?(?:moved|relocated)\s+to\s+(.+)$",
            Subject::Fixed("residence"),
            1,
        ),
        rule(
            r"(?i)^i\s+(?:now\s+|currently\s+|still\s+)?(?:work|am working|'m working)\s+(?:at|for)\s+(.+)$",
            Subject::Fixed("employer"),
            1,
        ),
        rule(
            r"(?i)^i(?:'ve| have)?\s+(?:just\s+)?joined\s+(.+)$",
            Subject::Fixed("employer"),
            1,
        ),
        rule(
            r"(?i)^i(?:'m| am)\s+(\d{1,3})(?:\s+years?\s+old)?$",
            Subject::Fixed("age"),
            1,
        ),
        rule(r"^我的(.{1,8}?)是(.+)$", Subject::Known(1), 2),
        rule(
            r"^我最喜欢的(.{1,8}?)是(.+)$",
            Subject::Prefixed("favorite ", 1),
            2,
        ),
        rule(
            r"^我(?:现在|目前)?住在(.+)$",
            Subject::Fixed("residence"),
            1,
        ),
        rule(
            r"^我(?:已经)?搬(?:到|去)了?(.+)$",
            Subject::Fixed("residence"),
            1,
        ),
        rule(
            r"^我(?:现在|目前)?在(.+?)(?:工作|上班)$",
            Subject::Fixed("employer"),
            1,
        ),
        rule(r"^我(?:今年)?(\d{1,3})岁$", Subject::Fixed("age"), 1),
    ]
});

/// "I prefer X over Y": the subject is the pair, the value the one preferred.
static PREFERENCE_BETWEEN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^i\s+(?:now\s+|still\s+)?prefer\s+(.+?)\s+(?:over|to|rather than)\s+(.+)$")
        .expect("valid preference rule")
});

/// Chinese subjects and their English form (so both languages share one subject).
const CHINESE_SUBJECTS: &[(&str, &str)] = &[
    ("名字", "name"),
    ("经理", "manager"),
    ("老板", "boss"),
    ("领导", "manager"),
    ("上司", "manager"),
    ("邮箱", "email"),
    ("电话", "phone number"),
    ("手机号", "phone number"),
    ("手机号码", "phone number"),
    ("电话号码", "phone number"),
    ("地址", "address"),
    ("生日", "birthday"),
    ("工作", "job"),
    ("职位", "job title"),
    ("公司", "company"),
    ("城市", "city"),
    ("家乡", "hometown"),
    ("老家", "hometown"),
    ("年龄", "age"),
    ("专业", "major"),
    ("学校", "school"),
    ("医生", "doctor"),
    ("妻子", "wife"),
    ("老婆", "wife"),
    ("丈夫", "husband"),
    ("老公", "husband"),
    ("女朋友", "girlfriend"),
    ("男朋友", "boyfriend"),
];

fn fold(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Where a value ends and the sentence goes on ("Bob Smith, Alice moved to Berlin").
static VALUE_END: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)[,;，；、]|\s+(?:but|because|since|so|and then|who|which)\s|因为|但是|所以")
        .expect("valid value end rule")
});

/// The value as said, without leading "now"/"currently", what follows it in the sentence, and
/// sentence punctuation.
fn clean_value(raw: &str) -> Option<String> {
    let raw = VALUE_END.find(raw).map_or(raw, |end| &raw[..end.start()]);
    let mut value = fold(raw.trim_end_matches(|c: char| {
        c.is_whitespace() || matches!(c, '.' | '!' | '。' | '！' | ',' | '，' | ';' | '；')
    }));
    loop {
        let stripped = CURRENTNESS.iter().find_map(|word| {
            value
                .strip_prefix(word)
                .filter(|rest| rest.starts_with(' '))
                .map(|rest| rest.trim_start().to_owned())
        });
        match stripped {
            Some(rest) => value = rest,
            None => break,
        }
    }
    value = value
        .trim_start_matches("现在")
        .trim_start_matches("已经")
        .to_owned();
    value = TRAILING_TIME.replace(&value, "").into_owned();
    if value.is_empty()
        || value.chars().count() > 80
        || value.ends_with('?')
        || value.ends_with('？')
    {
        return None;
    }
    let describes = NOT_A_VALUE.iter().any(|word| {
        value == *word
            || value
                .strip_prefix(word)
                .is_some_and(|rest| rest.starts_with(' '))
    });
    let negated = value.starts_with('不') || value.starts_with("没");
    (!describes && !negated).then_some(value)
}

fn known_subject(raw: &str) -> Option<String> {
    let subject = fold(raw);
    if let Some((_, english)) = CHINESE_SUBJECTS.iter().find(|(zh, _)| *zh == subject) {
        return Some((*english).to_owned());
    }
    let subject = subject
        .strip_prefix("current ")
        .or_else(|| subject.strip_prefix("new "))
        .unwrap_or(&subject)
        .to_owned();
    KNOWN_SUBJECTS
        .contains(&subject.as_str())
        .then_some(subject)
}

/// Words that open a sentence without adding to what it states: "And my manager is Alice",
/// "Actually, I live in Lisbon now", "对了，我住在上海". The rules are anchored at the start of
/// what is stated, so these go first.
static LEADING_CONNECTIVES: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?ix)^(?:
            (?:and|also|plus|but|so|actually|anyway|oh|well|btw|by\s+the\s+way)\b[\s,]*
          | (?:而且|另外|还有|其实|对了|顺便说一下|顺便说|不过)[\s,，、]*
        )+",
    )
    .expect("valid connective rule")
});

/// The subject and value a fact states, when one of the rules recognises it. A sentence of a
/// longer text is looked at alone: pass facts, not paragraphs.
pub fn subject_value(fact: &str) -> Option<SubjectValue> {
    // A named speaker's fact ("Nate: I live in Paris") states a subject of that speaker's:
    // Joanna's city is not Nate's.
    if let Some((speaker, said)) = crate::speaker::split_speaker(fact) {
        return subject_value(said).map(|stated| SubjectValue {
            subject: format!("{}: {}", speaker.to_lowercase(), stated.subject),
            value: stated.value,
        });
    }
    let sentence = fact.trim();
    let sentence = match LEADING_CONNECTIVES.find(sentence) {
        Some(connectives) => &sentence[connectives.end()..],
        None => sentence,
    };
    let sentence = sentence.trim_end_matches(['.', '!', '。', '！']).trim();
    if sentence.is_empty() || sentence.ends_with('?') || sentence.ends_with('？') {
        return None;
    }
    if let Some(captures) = PREFERENCE_BETWEEN.captures(sentence) {
        let chosen = clean_value(&captures[1])?;
        let other = clean_value(&captures[2])?;
        let mut pair = [chosen.clone(), other];
        pair.sort();
        return Some(SubjectValue {
            subject: format!("prefer {} or {}", pair[0], pair[1]),
            value: chosen,
        });
    }
    RULES.iter().find_map(|rule| {
        let captures = rule.pattern.captures(sentence)?;
        let subject = match rule.subject {
            Subject::Fixed(subject) => subject.to_owned(),
            Subject::Known(group) => known_subject(&captures[group])?,
            Subject::Prefixed(prefix, group) => {
                let thing = fold(&captures[group]);
                let thing = CHINESE_SUBJECTS
                    .iter()
                    .find(|(zh, _)| *zh == thing)
                    .map_or(thing.clone(), |(_, english)| (*english).to_owned());
                format!("{prefix}{thing}")
            }
        };
        let value = clean_value(&captures[rule.value_group])?;
        Some(SubjectValue { subject, value })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(fact: &str) -> Option<(String, String)> {
        subject_value(fact).map(|sv| (sv.subject, sv.value))
    }

    fn pair(subject: &str, value: &str) -> Option<(String, String)> {
        Some((subject.to_owned(), value.to_owned()))
    }

    #[test]
    fn a_new_manager_is_the_same_subject_with_another_value() {
        assert_eq!(
            states("My manager is Alice Chen"),
            pair("manager", "alice chen")
        );
        assert_eq!(
            states("My manager is now Bob Smith."),
            pair("manager", "bob smith")
        );
        assert_eq!(
            states("my new manager is Bob Smith"),
            pair("manager", "bob smith")
        );
        assert_eq!(
            states("My manager is now Bob Smith, Alice moved to Berlin"),
            pair("manager", "bob smith")
        );
        assert_eq!(states("我的经理是王芳"), pair("manager", "王芳"));
        assert_eq!(
            states("我的领导现在是李雷"),
            None,
            "word order the rules do not cover"
        );
    }

    #[test]
    fn a_connective_before_the_statement_does_not_hide_it() {
        assert_eq!(
            states("and my manager is Alice Chen, she approves travel."),
            pair("manager", "alice chen")
        );
        assert_eq!(
            states("Actually, I live in Lisbon now"),
            pair("residence", "lisbon")
        );
        assert_eq!(
            states("Oh and by the way my manager is Bob"),
            pair("manager", "bob")
        );
        assert_eq!(states("对了，我住在上海"), pair("residence", "上海"));
        // Only whole words: "Sonia" is no "so".
        assert_eq!(states("Sonia is my manager"), None);
    }

    #[test]
    fn places_employers_ages_and_favourites() {
        assert_eq!(states("I live in Paris"), pair("residence", "paris"));
        assert_eq!(states("I moved to Lisbon!"), pair("residence", "lisbon"));
        assert_eq!(
            states("I've just moved to Lisbon"),
            pair("residence", "lisbon")
        );
        assert_eq!(
            states("I now work at Acme Corp"),
            pair("employer", "acme corp")
        );
        assert_eq!(
            states("I joined Globex last month"),
            pair("employer", "globex")
        );
        assert_eq!(states("I'm 34 years old"), pair("age", "34"));
        assert_eq!(
            states("My favourite colour is blue"),
            pair("favorite colour", "blue")
        );
        assert_eq!(states("我住在上海"), pair("residence", "上海"));
        assert_eq!(states("我搬到了深圳"), pair("residence", "深圳"));
        assert_eq!(states("我在腾讯工作"), pair("employer", "腾讯"));
        assert_eq!(states("我今年28岁"), pair("age", "28"));
        assert_eq!(
            states("我最喜欢的水果是芒果"),
            pair("favorite 水果", "芒果")
        );
    }

    #[test]
    fn a_preference_between_two_options_is_one_subject() {
        let tea = subject_value("I prefer tea over coffee").unwrap();
        let coffee = subject_value("I now prefer coffee to tea").unwrap();
        assert_eq!(tea.subject, coffee.subject);
        assert_ne!(tea.value, coffee.value);
        assert_eq!(
            states("I prefer tea"),
            None,
            "a choice without its alternative"
        );
    }

    #[test]
    fn descriptions_questions_and_unknown_subjects_state_nothing() {
        for text in [
            "My manager is not happy",
            "My manager is on holiday",
            "My manager is very strict",
            "My car is red",
            "Is my manager Alice?",
            "My manager is?",
            "Alice is my manager",
            "我的经理不在",
            "The weather is nice",
            "",
        ] {
            assert_eq!(states(text), None, "{text}");
        }
    }
}
