//! Facts that state a value of a subject, so that a newer value supersedes an older one.
//!
//! "My manager is Alice Chen", then "My manager is now Bob Smith": both are the subject
//! `manager`, with the values `alice chen` and `bob smith`. The write path stores the subject and
//! value of every fact the rules recognise; a new valid fact of the same subject with another
//! value sets the older fact's `invalid_at` (it is kept, as history) instead of leaving two
//! answers to "who is my manager?".
//!
//! The rules cover how people say who and where they are, in English and Chinese, in first and
//! third person and in the plural, without an LLM:
//! - "my <subject> is <value>" for a known set of subjects (name, manager, boss, email, phone
//!   number, address, birthday, job, role, team, company, city, hometown, timezone, partner, …),
//!   "<value> is my <subject> (now)", and "my favo(u)rite <thing> is <value>" for any thing;
//! - where one lives ("I live in", "we moved to", "we're in Porto now", "we bought a house in",
//!   "I rent a flat in", "my mum moved into a care home"), where one works ("I work at / for",
//!   "I joined", "I just started at", "I took a job at"), whom one reports to ("I report to Bob
//!   now"), one's role ("I'm a staff engineer", "they promoted me to lead"), one's partner ("I'm
//!   married to", "I'm seeing", "I'm single", "we broke up"), diet ("I'm vegan", "I don't eat
//!   meat any more", "I started eating fish again"), one's age, e-mail address and phone number
//!   (wherever the sentence gives one as the speaker's own);
//! - "I prefer X over / to / rather than Y" (the subject is the pair of options);
//! - the things one has one of at a time, named by the kind of thing the object is, and how one
//!   works, commutes and studies (`conflict::usage`: "I'm on an iPhone 11", "I bank with
//!   Barclays", "I moved all my accounts over to Monzo", "I work nights", 换了辆比亚迪);
//! - 我的<subject>是…, <value>是我的<subject>, 我最喜欢的<thing>是…, 我(们)住在 / 搬到…,
//!   我在…工作 / 上班 / 租房, 跳槽去了…, 向…汇报, 我吃素 / 开始吃…了, 单身 / 脱单, 我今年…岁.
//!
//! A sentence is looked at whole, then clause by clause ("Dana left last month, so I report to
//! Marcus now"): the first clause that states a value gives it. Someone else's value is theirs:
//! a named speaker's ("Nate: I live in Paris") and a relative's ("my mum lives with us") are
//! other subjects than the speaker's own.
//!
//! Limits, deliberately: a subject outside the known set ("my car is red") states nothing the
//! rules can compare, so it never supersedes anything; a negation or an adjective ("my manager is
//! not happy", "my manager is on holiday") is not a new value; a plan or a visit ("we might move
//! to Porto", "I'm in Porto for the weekend") is not where one lives; "I prefer tea" and later "I
//! prefer coffee" are both kept (nothing says they answer the same choice); things one may have
//! several of (pets, hobbies) are never superseded by a new one, since a second one is as likely
//! an addition as a replacement: only by one said to be over ([`ended_things`]). A car is the
//! user's one car only when they say they drive it or replaced it (`conflict::usage`). An LLM,
//! when configured, judges conflicts of consolidated facts itself.

use std::sync::LazyLock;

use regex::Regex;

mod ended;
mod usage;

pub use ended::{Ended, ended_things, names};

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
    "gp",
    "dentist",
    "vet",
    "therapist",
    "gym",
    "bank",
    "broadband",
    "insurer",
    "car insurance",
    "home insurance",
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
    "unknown", "unclear", "tbd", "this", "that", "it", "he", "she", "they", "who", "what", "which",
    "there", "here", "you", "one",
];

/// Time phrases after a value ("I joined Globex last month", "I live in Lisbon now"): when, not
/// what.
static TRAILING_TIME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\s+(?:(?:last|this|next)\s+(?:week|month|year|weekend|spring|summer|autumn|fall|winter|monday|tuesday|wednesday|thursday|friday|saturday|sunday)|yesterday|today|recently|now|these\s+days|at\s+the\s+moment|in\s+\d{4}|\d+\s+(?:days|weeks|months|years)\s+ago|in\s+(?:january|february|march|april|may|june|july|august|september|october|november|december|spring|summer|autumn|fall|winter|the\s+spring|the\s+summer|the\s+autumn|the\s+winter)|on\s+(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)|(?:for|after)\s+(?:a|the|two|three|\d+)\s+(?:\w+\s+)?(?:days?|weeks?|months?|years?))$",
    )
    .expect("valid time rule")
});

/// Words that only say the value is current ("my manager is now Bob").
const CURRENTNESS: &[&str] = &["now", "currently", "actually", "officially", "finally"];

struct Rule {
    pattern: Regex,
    /// The subject: fixed, or taken from a capture group.
    subject: Subject,
    /// The value: a capture group, or fixed by the rule ("I'm single": none).
    value: Value,
}

enum Subject {
    Fixed(&'static str),
    /// A known subject in this group (checked against [`KNOWN_SUBJECTS`]).
    Known(usize),
    /// Any thing in this group, prefixed ("favorite color").
    Prefixed(&'static str, usize),
    /// A relative's attribute: the relative named in this group ("my mum lives with us":
    /// `mother: residence`), never the speaker's own.
    Relative(usize, &'static str),
    /// The kind of thing the value names ("an iPhone 12": `phone`; [`usage::kind_of`]); the rule
    /// states nothing when the value names no known kind.
    KindOf,
}

enum Value {
    /// The capture group holding the value.
    Group(usize),
    /// A value the rule itself says.
    Fixed(&'static str),
    /// A capture group after a fixed word ("I don't eat meat": `no meat`).
    Prefixed(&'static str, usize),
}

fn rule(pattern: &str, subject: Subject, value_group: usize) -> Rule {
    valued(pattern, subject, Value::Group(value_group))
}

fn valued(pattern: &str, subject: Subject, value: Value) -> Rule {
    Rule {
        pattern: Regex::new(pattern).expect("valid conflict rule"),
        subject,
        value,
    }
}

/// Relatives whose attributes people state ("my mum", "my son"), each with the one name both
/// spellings share.
const RELATIVES: &[(&str, &str)] = &[
    ("mum", "mother"),
    ("mom", "mother"),
    ("mother", "mother"),
    ("dad", "father"),
    ("father", "father"),
    ("son", "son"),
    ("daughter", "daughter"),
    ("brother", "brother"),
    ("sister", "sister"),
    ("grandma", "grandmother"),
    ("gran", "grandmother"),
    ("grandmother", "grandmother"),
    ("grandad", "grandfather"),
    ("grandpa", "grandfather"),
    ("grandfather", "grandfather"),
    ("妈", "mother"),
    ("妈妈", "mother"),
    ("我妈", "mother"),
    ("爸", "father"),
    ("爸爸", "father"),
    ("我爸", "father"),
    ("儿子", "son"),
    ("女儿", "daughter"),
];

/// What people call their relatives in the rules below.
const RELATIVE_WORDS: &str = r"mum|mom|mother|dad|father|son|daughter|brother|sister|grandma|gran|grandmother|grandad|grandpa|grandfather";

/// Words that end a job title ("a senior engineer on the platform team", "the treasurer of our
/// running club"): a sentence naming one says what the speaker's role is.
const ROLE_WORDS: &str = r"engineer|developer|programmer|designer|architect|manager|lead|director|head|officer|analyst|consultant|accountant|lawyer|solicitor|barrister|teacher|lecturer|professor|tutor|nurse|doctor|surgeon|midwife|paramedic|pharmacist|therapist|illustrator|writer|editor|journalist|photographer|chef|cook|baker|waiter|waitress|barista|cashier|driver|electrician|plumber|carpenter|joiner|mechanic|technician|scientist|researcher|intern|apprentice|assistant|secretary|administrator|receptionist|treasurer|chair|chairperson|president|founder|owner|student|trainee|coordinator|specialist|clerk|salesperson|recruiter|librarian|vet|dentist|cleaner|carer";

/// A place: words starting with a capital, or Chinese, up to where the sentence goes on.
const PLACE: &str =
    r"(\p{Lu}[\p{L}'’\-]*(?:\s+(?:\p{Lu}[\p{L}'’\-]*|on|upon|de|del|la|le|am|im))*)";

static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    let relative = format!(r"(?i)^(?:my|our)\s+({RELATIVE_WORDS})");
    let role = format!(
        r"(?i)^(?:i'?m|i\s+am)\s+(?:now\s+|currently\s+|still\s+|officially\s+)?(?:a|an|the)\s+((?:[\p{{L}}\-]+\s+){{0,3}}(?:{ROLE_WORDS}))(?:\s+(?:on|in|of|at|for)\b.*)?$"
    );
    let mut rules = vec![
        rule(
            r"(?i)^my\s+fav(?:ou?)?rite\s+([\p{L}\- ]{2,30}?)\s+(?:is|are)\s+(.+)$",
            Subject::Prefixed("favorite ", 1),
            2,
        ),
        rule(
            r"(?i)^(?:my|our)\s+([\p{L}\- ]{2,30}?)(?:\s+(?:is|are)|'s|’s)\s+(.+)$",
            Subject::Known(1),
            2,
        ),
        // "Bob is my manager now", "Bob Smith is now my boss".
        rule(
            r"^(\p{Lu}[\p{L}.'\-]*(?:\s+\p{Lu}[\p{L}.'\-]*){0,2})\s+is\s+(?:now\s+|officially\s+)?my\s+(?:new\s+)?([\p{L}\- ]{2,20}?)(?:\s+now)?$",
            Subject::Known(2),
            1,
        ),
        rule(
            r"(?i)^(?:i|we)\s+(?:now\s+|currently\s+|still\s+)?(?:live|am living|'m living|are living|'re living|am based|'m based|reside)\s+in\s+(.+)$",
            Subject::Fixed("residence"),
            1,
        ),
        rule(
            r"(?i)^(?:i|we)(?:'ve| have)?\s+(?:just\s+|finally\s+|now\s+|recently\s+|officially\s+)*(?:moved|relocated)\s+(?:to|into)\s+(.+)$",
            Subject::Fixed("residence"),
            1,
        ),
        rule(
            r"(?i)^(?:i|we)(?:'re|\s+are|'m|\s+am)\s+(?:now\s+)?(?:renting|living|based)\s+in\s+(.+)$",
            Subject::Fixed("residence"),
            1,
        ),
        rule(
            r"(?i)^(?:i|we)\s+(?:rent|own|share|have)\s+(?:a|an|the|our)\s+(?:[\p{L}\-]+\s+){0,3}(?:flat|house|home|place|studio|apartment|room|bungalow|cottage|bedsit|one-bed|two-bed)\s+in\s+(.+)$",
            Subject::Fixed("residence"),
            1,
        ),
        rule(
            r"(?i)\b(?:i|we)(?:'ve| have)?\s+(?:just\s+|finally\s+)?(?:bought|completed\s+on|got\s+the\s+keys\s+to|moved\s+into|exchanged\s+on)\s+(?:a|an|the|our)\s+(?:new\s+)?(?:[\p{L}\-]+\s+){0,2}(?:flat|house|home|place|apartment|bungalow|cottage)\s+in\s+(.+)$",
            Subject::Fixed("residence"),
            1,
        ),
        // "We're in Porto now": a place with "now" is where one is living, not a visit.
        rule(
            &format!(
                r"^(?i:we'?re|we\s+are|i'?m|i\s+am)\s+(?i:now\s+)?(?i:in)\s+{PLACE}\s+(?i:now)\b"
            ),
            Subject::Fixed("residence"),
            1,
        ),
        rule(
            &format!(r"{relative}\s+(?:now\s+)?lives\s+(?:in|with)\s+(.+)$"),
            Subject::Relative(1, "residence"),
            2,
        ),
        rule(
            &format!(
                r"(?i)^(?:my\s+|our\s+)?({RELATIVE_WORDS})\s+(?:has\s+)?(?:just\s+|finally\s+)?(?:moved|went)\s+(?:in\s*to|to|into)\s+(.+)$"
            ),
            Subject::Relative(1, "residence"),
            2,
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
            r"(?i)^i(?:'ve| have)?\s+(?:just\s+|finally\s+|now\s+)?(?:started|begun|start)\s+(?:a\s+new\s+job\s+|work\s+|working\s+)?at\s+(.+)$",
            Subject::Fixed("employer"),
            1,
        ),
        rule(
            r"(?i)^i(?:'ve| have)?\s+(?:just\s+)?(?:took|taken|accepted|got)\s+a\s+(?:[\p{L}\-]+\s+){0,3}(?:job|role|position)\s+(?:as\s+(?:a|an)\s+[\p{L}\- ]+?\s+)?(?:at|with)\s+(.+)$",
            Subject::Fixed("employer"),
            1,
        ),
        // Whom one reports to is one's manager.
        rule(
            r"(?i)^i\s+(?:now\s+)?(?:report|answer)\s+(?:directly\s+)?to\s+(.+)$",
            Subject::Fixed("manager"),
            1,
        ),
        valued(&role, Subject::Fixed("role"), Value::Group(1)),
        rule(
            r"(?i)^(?:they|we|the\s+company|my\s+(?:boss|manager))\s+(?:just\s+|finally\s+)?promoted\s+me\s+to\s+(.+)$",
            Subject::Fixed("role"),
            1,
        ),
        rule(
            r"(?i)^i\s+(?:just\s+|finally\s+)?(?:got|was|have\s+been|'ve\s+been)\s+promoted\s+to\s+(.+)$",
            Subject::Fixed("role"),
            1,
        ),
        // One's partner: married to, seeing, single, separated.
        rule(
            r"(?i)^i(?:'m|\s+am)\s+(?:now\s+)?(?:married|engaged)\s+to\s+(.+)$",
            Subject::Fixed("partner"),
            1,
        ),
        // Seeing or dating someone named (a name, not "a physio").
        rule(
            r"^(?i:i'm|i\s+am|i've\s+been|i\s+have\s+been)\s+(?i:now\s+)?(?i:seeing|dating)\s+(?i:a\s+(?:guy|girl|woman|man|bloke|lad|lady)\s+(?:called|named)\s+)?(\p{Lu}[\p{L}\-]*|(?i:someone|somebody))(?:\s|$)",
            Subject::Fixed("partner"),
            1,
        ),
        valued(
            r"(?i)^i(?:'m|\s+am)\s+(?:now\s+|still\s+|happily\s+)?(?:single|divorced|widowed)\b",
            Subject::Fixed("partner"),
            Value::Fixed("none"),
        ),
        valued(
            r"(?i)^(?:[\p{Lu}][\p{L}\-]*\s+and\s+i|i\s+and\s+[\p{Lu}][\p{L}\-]*|we|i)\s+(?:have\s+|'ve\s+)?(?:just\s+|finally\s+)?(?:broke\s+up|broken\s+up|split\s+up|split|separated|divorced|got\s+divorced)\b",
            Subject::Fixed("partner"),
            Value::Fixed("none"),
        ),
        // Diet.
        rule(
            r"(?i)^i(?:'m|\s+am)\s+(?:now\s+|still\s+|strictly\s+|fully\s+)?(?:a\s+)?(vegan|vegetarian|veggie|pescatarian|pescetarian|flexitarian|carnivore|teetotal)\b",
            Subject::Fixed("diet"),
            1,
        ),
        valued(
            r"(?i)^i\s+eat\s+(?:pretty\s+much\s+|just\s+about\s+|basically\s+)?(?:everything|anything)\b",
            Subject::Fixed("diet"),
            Value::Fixed("everything"),
        ),
        valued(
            r"(?i)^i\s+(?:don'?t|do\s+not|no\s+longer|can'?t)\s+eat\s+(meat|fish|dairy|eggs|pork|beef|gluten|sugar|animal\s+products)\b",
            Subject::Fixed("diet"),
            Value::Prefixed("no ", 1),
        ),
        valued(
            r"(?i)^i(?:'ve|\s+have)?\s+(?:just\s+)?(?:started|begun|gone\s+back\s+to)\s+eating\s+(meat|fish|dairy|eggs|chicken|pork|beef|seafood)\b",
            Subject::Fixed("diet"),
            Value::Prefixed("eats ", 1),
        ),
        valued(
            r"(?i)^i(?:'m|\s+am)\s+eating\s+(meat|fish|dairy|eggs|chicken|pork|beef|seafood)\s+again\b",
            Subject::Fixed("diet"),
            Value::Prefixed("eats ", 1),
        ),
        rule(
            r"(?i)^i(?:'m|\s+am)\s+(?:doing|on|trying|following)\s+(?:the\s+|a\s+)?(keto|paleo|atkins|low-carb|whole30|carnivore|intermittent\s+fasting|5:2)(?:\s+diet)?\b",
            Subject::Fixed("diet"),
            1,
        ),
        valued(
            r"(?i)^i(?:'ve|\s+have)?\s+(?:just\s+)?(?:dropped|stopped|quit|given\s+up|gave\s+up|come\s+off|came\s+off|ditched)\s+(?:the\s+)?(keto|paleo|atkins|low-carb|whole30|carnivore|intermittent\s+fasting|5:2|being\s+vegan|being\s+vegetarian)\b",
            Subject::Fixed("diet"),
            Value::Prefixed("no ", 1),
        ),
        rule(
            r"(?i)^i(?:'m| am)\s+(\d{1,3})(?:\s+years?\s+old)?$",
            Subject::Fixed("age"),
            1,
        ),
        rule(r"^我的?(.{1,8}?)(?:现在)?是(.+)$", Subject::Known(1), 2),
        rule(
            r"^我最喜欢的(.{1,8}?)是(.+)$",
            Subject::Prefixed("favorite ", 1),
            2,
        ),
        rule(
            r"^(.{1,12}?)(?:现在)?是我的?(.{1,6})$",
            Subject::Known(2),
            1,
        ),
        rule(
            r"^我们?(?:现在|目前)?住在(.+)$",
            Subject::Fixed("residence"),
            1,
        ),
        rule(
            r"^我们?(?:已经|刚|终于)?搬(?:到|去|进)了?(.+?)了?$",
            Subject::Fixed("residence"),
            1,
        ),
        rule(
            r"^我们?(?:现在|目前)?在(.+?)租(?:房|了)",
            Subject::Fixed("residence"),
            1,
        ),
        rule(
            r"^(我?(?:妈|妈妈|爸|爸爸|儿子|女儿))(?:现在)?(?:住在|搬到了?|搬进了?|搬去了?)(.+?)了?$",
            Subject::Relative(1, "residence"),
            2,
        ),
        rule(
            r"^我(?:现在|目前)?在(.+?)(?:工作|上班)$",
            Subject::Fixed("employer"),
            1,
        ),
        rule(
            r"^我(?:上个月|上周|最近|刚|已经)?(?:跳槽|换工作)(?:去|到)了?(.+)$",
            Subject::Fixed("employer"),
            1,
        ),
        rule(
            r"^我?(?:现在)?(?:直接)?(?:向|给)(.{1,8}?)汇报",
            Subject::Fixed("manager"),
            1,
        ),
        valued(
            r"^我(?:现在|目前|还是)?(?:单身|离婚了)",
            Subject::Fixed("partner"),
            Value::Fixed("none"),
        ),
        valued(
            r"^我(?:终于)?脱单了",
            Subject::Fixed("partner"),
            Value::Fixed("someone"),
        ),
        valued(
            r"^我(?:一直)?(?:吃素|是素食者)",
            Subject::Fixed("diet"),
            Value::Fixed("vegetarian"),
        ),
        valued(
            r"^我?(?:最近|现在)?(?:又)?开始吃(?:点|一点|些)?(肉|鱼|鱼虾|海鲜|鸡蛋|荤)",
            Subject::Fixed("diet"),
            Value::Prefixed("eats ", 1),
        ),
        valued(
            r"^我(?:现在)?(?:不|不再)吃(肉|鱼|海鲜|鸡蛋|荤)了",
            Subject::Fixed("diet"),
            Value::Prefixed("no ", 1),
        ),
        rule(r"^我(?:今年)?(\d{1,3})岁$", Subject::Fixed("age"), 1),
    ];
    rules.extend(usage::rules());
    rules
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
    ("微信", "wechat"),
    ("微信号", "wechat"),
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
    Regex::new(r"(?i)[,;:，；、：]|\s+(?:but|because|since|so|and|who|which|where|when|with|near|by|for|from|until|till|after|before)\s|因为|但是|所以|，")
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
    // "My car insurance is with Admiral": the provider.
    if let Some(provider) = value.strip_prefix("with ") {
        value = provider.to_owned();
    }
    value = value
        .trim_start_matches("现在")
        .trim_start_matches("已经")
        .trim_end_matches('了')
        .to_owned();
    // "in Lisbon last month now": each time phrase from the end.
    while let Some(time) = TRAILING_TIME.find(&value) {
        value.truncate(time.start());
    }
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
        return Some(canonical_subject(english).to_owned());
    }
    let subject = subject
        .strip_prefix("current ")
        .or_else(|| subject.strip_prefix("new "))
        .unwrap_or(&subject)
        .to_owned();
    KNOWN_SUBJECTS
        .contains(&subject.as_str())
        .then(|| canonical_subject(&subject).to_owned())
}

/// The one name of subjects said in several ways: "my boss is Bob" and "Bob is my manager now"
/// answer the same question, as do "my wife" and "my partner", "my number" and "my mobile".
fn canonical_subject(subject: &str) -> &str {
    match subject {
        "boss" | "team lead" | "supervisor" | "line manager" => "manager",
        "wife" | "husband" | "girlfriend" | "boyfriend" | "fiance" | "fiancee" => "partner",
        "email address" | "e-mail" => "email",
        "phone" | "mobile" | "mobile number" | "number" => "phone number",
        "home address" => "address",
        "job" | "job title" | "title" | "position" | "occupation" | "profession" => "role",
        "company" => "employer",
        "home town" => "hometown",
        "time zone" => "timezone",
        "date of birth" => "birthday",
        other => other,
    }
}

fn relative(raw: &str) -> Option<&'static str> {
    let raw = fold(raw);
    RELATIVES
        .iter()
        .find(|(said, _)| *said == raw)
        .map(|(_, relative)| *relative)
}

/// Words that open a sentence without adding to what it states: "And my manager is Alice",
/// "Actually, I live in Lisbon now", "对了，我住在上海". The rules are anchored at the start of
/// what is stated, so these go first.
static LEADING_CONNECTIVES: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?ix)^(?:
            (?:and|also|plus|but|so|actually|anyway|oh|well|btw|by\s+the\s+way|honestly|finally|now|these\s+days|since\s+then)\b[\s,]*
          | (?:而且|另外|还有|其实|对了|顺便说一下|顺便说|不过|现在|目前|所以)[\s,，、]*
        )+",
    )
    .expect("valid connective rule")
});

/// Where a sentence's clauses part ("Ruth left, I report to Daniel now"; "Dana left last month,
/// so I report to Marcus").
static CLAUSE_BREAK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\s*(?:[,;:，；：]|\s+-\s+|\s+–\s+|\s+—\s+)\s*|\s+(?:so|and\s+now|because)\s+")
        .expect("valid clause rule")
});

static EMAIL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+")
        .expect("valid e-mail rule")
});

/// A phone number: seven digits or more, possibly grouped by spaces, dashes or dots.
static PHONE_NUMBER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\+?\d[\d \-.]{5,}\d").expect("valid phone number rule"));

static PHONE_WORDS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:number|phone|mobile|cell|landline|call\s+me|text\s+me|whatsapp)\b|号码|手机|电话|号")
        .expect("valid phone word rule")
});

/// The speaker speaks of their own contact details ("my", "me", "new number", "use …").
static OWN_CONTACT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:my|me|i|i'm|i've|use|new|got)\b|我|新|用").expect("valid contact rule")
});

/// Someone else's contact details ("her email is …", "Tom's number").
static OTHERS_CONTACT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:his|her|their|your|\p{Lu}\p{L}+'s)\s+(?:new\s+)?(?:e-?mail|number|phone|mobile|address)|他的|她的|你的")
        .expect("valid contact rule")
});

/// Which of one's addresses or numbers: "my work email", "the office landline", 单位电话. One
/// may have one of each; an unqualified one is the personal one.
static CONTACT_QUALIFIER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(work|office|business|school|uni|university|company|home)\s+(?:e-?mail|number|phone|mobile|landline|line|address)|(单位|公司|办公室|工作|家里)的?(?:邮箱|电话|座机|手机)")
        .expect("valid contact qualifier rule")
});

/// The speaker's e-mail address or phone number, where a sentence gives one as theirs: the value
/// is the address in lowercase, or the number's digits (however they were grouped).
fn contact_value(sentence: &str) -> Option<SubjectValue> {
    // Most sentences hold neither an address nor seven digits: no rule needs to look.
    let digits = sentence.bytes().filter(u8::is_ascii_digit).count();
    if !sentence.contains('@') && digits < 7 {
        return None;
    }
    if OTHERS_CONTACT.is_match(sentence) || !OWN_CONTACT.is_match(sentence) {
        return None;
    }
    let qualified = |subject: &str| match CONTACT_QUALIFIER.captures(sentence) {
        Some(found) => {
            let which = found
                .get(1)
                .or_else(|| found.get(2))
                .map_or("", |m| m.as_str());
            let which = match which.to_lowercase().as_str() {
                "单位" | "公司" | "办公室" | "工作" | "office" | "business" | "company" => {
                    "work".to_owned()
                }
                "家里" => "home".to_owned(),
                "uni" | "university" => "school".to_owned(),
                other => other.to_owned(),
            };
            format!("{which} {subject}")
        }
        None => subject.to_owned(),
    };
    if let Some(address) = EMAIL.find(sentence) {
        return Some(SubjectValue {
            subject: qualified("email"),
            value: address.as_str().trim_end_matches('.').to_lowercase(),
        });
    }
    if !PHONE_WORDS.is_match(sentence) {
        return None;
    }
    let digits: String = PHONE_NUMBER
        .find(sentence)?
        .as_str()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    (digits.len() >= 7).then(|| SubjectValue {
        subject: qualified("phone number"),
        value: digits,
    })
}

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
    if sentence.is_empty() || sentence.ends_with('?') || sentence.ends_with('？') {
        return None;
    }
    if let Some(contact) = contact_value(sentence) {
        return Some(contact);
    }
    // The whole sentence, then each of its clauses (when it has more than one).
    if let Some(stated) = clause_value(sentence) {
        return Some(stated);
    }
    if !CLAUSE_BREAK.is_match(sentence) {
        return None;
    }
    CLAUSE_BREAK.split(sentence).find_map(clause_value)
}

/// What one clause states, by the first rule that recognises it.
fn clause_value(clause: &str) -> Option<SubjectValue> {
    let clause = clause.trim();
    let clause = match LEADING_CONNECTIVES.find(clause) {
        Some(connectives) => &clause[connectives.end()..],
        None => clause,
    };
    let clause = clause.trim_end_matches(['.', '!', '。', '！']).trim();
    if clause.is_empty() || clause.ends_with('?') || clause.ends_with('？') {
        return None;
    }
    if let Some(captures) = PREFERENCE_BETWEEN.captures(clause) {
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
        // A match test first: most rules fail, and a failed search for captures still allocates
        // their slots.
        if !rule.pattern.is_match(clause) {
            return None;
        }
        let captures = rule.pattern.captures(clause)?;
        let value = match rule.value {
            Value::Group(group) => clean_value(&captures[group])?,
            Value::Fixed(value) => value.to_owned(),
            Value::Prefixed(prefix, group) => format!("{prefix}{}", fold(&captures[group])),
        };
        let subject = match rule.subject {
            Subject::Fixed(subject) => subject.to_owned(),
            Subject::KindOf => usage::kind_of(&value)?.to_owned(),
            Subject::Known(group) => known_subject(&captures[group])?,
            Subject::Prefixed(prefix, group) => {
                let thing = fold(&captures[group]);
                let thing = CHINESE_SUBJECTS
                    .iter()
                    .find(|(zh, _)| *zh == thing)
                    .map_or(thing.clone(), |(_, english)| (*english).to_owned());
                format!("{prefix}{thing}")
            }
            Subject::Relative(group, attribute) => {
                format!("{}: {attribute}", relative(&captures[group])?)
            }
        };
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
        assert_eq!(states("我的领导现在是李雷"), pair("manager", "李雷"));
        assert_eq!(states("My boss is Carla"), pair("manager", "carla"));
    }

    #[test]
    fn third_person_plural_and_clauses_state_the_same_subjects() {
        assert_eq!(states("Bob is my manager now."), pair("manager", "bob"));
        assert_eq!(
            states("Grace Hopper is now my boss"),
            pair("manager", "grace hopper")
        );
        assert_eq!(
            states("Carla retired, so I report to Ivan now."),
            pair("manager", "ivan")
        );
        assert_eq!(states("We moved to Lisbon."), pair("residence", "lisbon"));
        assert_eq!(
            states("We finally made it, we're in Valencia now!"),
            pair("residence", "valencia")
        );
        assert_eq!(
            states("We bought a little house in Girona last spring."),
            pair("residence", "girona")
        );
        assert_eq!(
            states("I rent a tiny flat in Bristol with two cats."),
            pair("residence", "bristol")
        );
        assert_eq!(
            states("My dad lives in Cork."),
            pair("father: residence", "cork")
        );
        assert_eq!(
            states("I started at Octopus Energy on Monday."),
            pair("employer", "octopus energy")
        );
        assert_eq!(
            states("I'm a data engineer on the billing team."),
            pair("role", "data engineer")
        );
        assert_eq!(
            states("They promoted me to principal engineer."),
            pair("role", "principal engineer")
        );
        assert_eq!(
            states("Sam and I split up in May."),
            pair("partner", "none")
        );
        assert_eq!(states("I'm married to Alex."), pair("partner", "alex"));
        assert_eq!(states("我们搬到杭州了。"), pair("residence", "杭州"));
        assert_eq!(
            states("老周退休了，现在我向陈姐汇报。"),
            pair("manager", "陈姐")
        );
        assert_eq!(states("张伟是我的领导"), pair("manager", "张伟"));
        assert_eq!(states("我跳槽去了字节"), pair("employer", "字节"));
    }

    #[test]
    fn diets_change_by_what_one_eats_or_stops_eating() {
        assert_eq!(states("I'm vegetarian."), pair("diet", "vegetarian"));
        assert_eq!(
            states("I don't eat meat any more."),
            pair("diet", "no meat")
        );
        assert_eq!(
            states("I've started eating fish again."),
            pair("diet", "eats fish")
        );
        assert_eq!(
            states("I eat pretty much anything."),
            pair("diet", "everything")
        );
        assert_eq!(states("我吃素。"), pair("diet", "vegetarian"));
        assert_eq!(states("最近又开始吃肉了。"), pair("diet", "eats 肉"));
    }

    #[test]
    fn contact_details_are_compared_by_address_and_digits() {
        assert_eq!(
            states("You can email me at Jo.Rivers@Example.org."),
            pair("email", "jo.rivers@example.org")
        );
        assert_eq!(
            states("My mobile is 07700 900111."),
            pair("phone number", "07700900111")
        );
        assert_eq!(
            states("New number: 07700-900-222, the old one is dead."),
            pair("phone number", "07700900222")
        );
        assert_eq!(
            states("我的手机号是 138 0000 1111"),
            pair("phone number", "13800001111")
        );
        // A work address or an office line is another subject than one's own.
        assert_eq!(
            states("My work email is kb@firm.example, use it only for work things."),
            pair("work email", "kb@firm.example")
        );
        assert_eq!(
            states("The office landline is 0117 496 0000 if my mobile's off."),
            pair("work phone number", "01174960000")
        );
        // Someone else's, or no sign it is the speaker's.
        assert_eq!(states("Her email is mia@example.org."), None);
        assert_eq!(states("Tom's number is 07700 900333."), None);
        assert_eq!(states("The office line is 0161 496 0000."), None);
    }

    #[test]
    fn visits_plans_and_others_are_not_where_one_lives() {
        for text in [
            "I'm in Porto for the weekend.",
            "We might move to Porto next year.",
            "I don't live in Paris any more.",
            "I'm moving to Madrid in the spring.",
        ] {
            assert_eq!(states(text), None, "{text}");
        }
        // A relative's home is theirs.
        assert_ne!(
            subject_value("My sister moved to Leeds.").map(|s| s.subject),
            Some("residence".to_owned())
        );
        // The same place said again is the same value.
        assert_eq!(
            states("I live in Lyon with my partner, near the old town."),
            pair("residence", "lyon")
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
        assert_eq!(states("Sonia is my manager"), pair("manager", "sonia"));
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
            "我的经理不在",
            "The weather is nice",
            "",
        ] {
            assert_eq!(states(text), None, "{text}");
        }
    }
}
