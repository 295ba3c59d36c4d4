//! Things a statement says are over for its speaker: "I gave up the cello", "We had to put Rex
//! down", "Sold the Transit", "Pickle went missing", "卡罗拉卖了", "我戒烟了". An older fact of the
//! same speaker that names the thing ("I'm learning the cello", "Our dog Rex is fourteen") is no
//! longer true, whatever its subject: these are the things one may have several of (pets, cars,
//! hobbies, gyms, subscriptions), where a new one is no sign the old one is gone but an ending
//! is.
//!
//! Only the speaker's own endings count: a verb in the past said by "I" or "we", or with no
//! subject at all ("Sold the Transit"); the thing as the subject of an ending verb ("The guppies
//! all died", "Ruth left"). Plans, wishes and negations end nothing ("I might sell the car", "I
//! didn't quit"). A person leaving counts only by name ("Ruth left", not "my dad left for work").

use std::sync::LazyLock;

use regex::Regex;

use super::fold;

/// A thing a fact says is over, and whose it was (a named speaker's, or the user's in a chat).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The named speaker, lowercased; none for the user of a chat.
    pub speaker: Option<String>,
    /// The thing, lowercased ("cello", "rex", "卡罗拉").
    pub thing: String,
}

/// Whether a clause may say anything is over: one test before the rules below, which most
/// clauses fail.
static ANY_ENDING: LazyLock<regex::RegexSet> = LazyLock::new(|| {
    regex::RegexSet::new([
        ENDING_VERB.as_str(),
        PUT_DOWN.as_str(),
        NO_MORE.as_str(),
        THING_ENDED.as_str(),
        NAMED_LEFT.as_str(),
        FREE_OF.as_str(),
        OVERTAKEN.as_str(),
        CHINESE_THING_ENDED.as_str(),
        CHINESE_ENDING_VERB.as_str(),
    ])
    .expect("valid ending rules")
});

/// Verbs that end a thing, said by the speaker: "I gave up the cello", "cancelled PureGym".
static ENDING_VERB: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?ix)
        (?:^|\b(?:i|we)(?:'ve|\s+have|'d|\s+had|\s+had\s+to|\s+have\s+had\s+to)?\s+(?:just\s+|finally\s+|already\s+|also\s+|recently\s+|completely\s+|eventually\s+)?)
        (?:gave\s+up|given\s+up|quit|stopped\s+(?:seeing|using|going\s+to|doing|playing|taking)|stopped|cancell?ed|canceled|sold|ditched|dropped|got\s+rid\s+of|handed(?:\s+over)?|pulled\s+out\s+of|moved\s+(?:away\s+)?from|switched\s+(?:away\s+)?from|broke\s+up\s+with|split\s+(?:up\s+)?with|finished\s+with|(?:am|'m)\s+done\s+with|no\s+longer\s+(?:have|use|see|go\s+to|do|play)|put\s+down)
        \s+(.+)$",
    )
    .expect("valid ending rule")
});

/// "We had to put Rex down".
static PUT_DOWN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(?:i|we)(?:\s+had\s+to|\s+have\s+had\s+to|'ve\s+had\s+to)?\s+put\s+(.+?)\s+down\b",
    )
    .expect("valid ending rule")
});

/// "Three months smoke-free", "I'm alcohol-free now", "sugar-free since June": what one has
/// stopped, said as being free of it (a time or the speaker says so; "a sugar-free drink" ends
/// nothing).
static FREE_OF: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)(?:\b(?:\d+|a|one|two|three|four|five|six|seven|eight|nine|ten|twelve)\s+(?:days?|weeks?|months?|years?)\s+|^(?:i'?m|i\s+am|we'?re|we\s+are)\s+(?:now\s+|officially\s+|still\s+)?)(\p{L}+)-free\b",
    )
    .expect("valid ending rule")
});

/// A favourite overtaken: "Ravel has overtaken Chopin for me now", "Bowie's replaced Prince".
/// The one overtaken is no longer what the older fact said it was.
static OVERTAKEN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(?:has|have|'s)\s+(?:now\s+|finally\s+|officially\s+)?(?:overtaken|replaced|dethroned|taken\s+over\s+from)\s+(.+)$",
    )
    .expect("valid ending rule")
});

/// "no more Little Acorns", "no more freelancing".
static NO_MORE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\bno\s+more\s+(.+)$").expect("valid ending rule"));

/// The thing as the subject of an ending: "The guppies all died", "Sublime's gone".
static THING_ENDED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?ix)^(?:the\s+|my\s+|our\s+)?
        ((?:[\p{L}\d][\p{L}\d'’&\-]*)(?:\s+[\p{L}\d][\p{L}\d'’&\-]*){0,2}?)
        (?:'s|’s|\s+is|\s+has|\s+have|\s+are|\s+was|\s+were)?\s+(?:all\s+|finally\s+|sadly\s+)?
        (?:died|passed\s+away|went\s+missing|gone|history|was\s+stolen|got\s+stolen|were\s+stolen|broke\s+down|closed(?:\s+down)?|shut\s+down|got\s+sold|been\s+sold)\b",
    )
    .expect("valid ending rule")
});

/// A named person leaving, as the whole clause: "Ruth left", "Dana left last month" ("Mum left
/// for work" is no ending).
static NAMED_LEFT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(\p{Lu}[\p{L}'’\-]+)\s+(?:has\s+)?(?:left|retired|moved\s+on)(?:\s+(?:last\s+\w+|this\s+\w+|in\s+\w+|on\s+\w+|yesterday|recently|the\s+(?:company|team|firm|school|practice)))?$",
    )
    .expect("valid ending rule")
});

/// Chinese: "卡罗拉卖了", "那家健身房倒闭了", "可乐上个月走了", "电动车被偷了".
static CHINESE_THING_ENDED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(.{1,10}?)(?:上个月|上周|去年|前几天|昨天|最近|已经|终于)*(?:卖了|卖掉了|走了|没了|倒闭了|关门了|被偷了|丢了|去世了|死了|不见了|停了|退居第二|退居二线|不是最喜欢的了)")
        .expect("valid ending rule")
});

/// Chinese: "我戒烟了", "辞掉了那份工作", "取消了会员".
static CHINESE_ENDING_VERB: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:我们?)?(?:已经|终于|上个月|最近)?(?:戒了|戒掉了|辞掉了|退了|取消了|注销了|不再用|不用|戒)(.{1,8}?)(?:了|啦)?$")
        .expect("valid ending rule")
});

/// Negations and plans before an ending verb: nothing has ended.
static NOT_ENDED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:not|never|n't|didn'?t|won'?t|might|may|could|should|would|want\s+to|going\s+to|gonna|planning|thinking\s+(?:of|about)|if|whether)\b|没有|没|不会|打算|想|要是|如果")
        .expect("valid negation rule")
});

/// Words that end the thing's name ("the cello and found …" is the cello).
const THING_ENDS_AT: &[&str] = &[
    "and",
    "but",
    "so",
    "because",
    "to",
    "for",
    "with",
    "in",
    "at",
    "on",
    "after",
    "since",
    "last",
    "this",
    "that",
    "it",
    "which",
    "who",
    "when",
    "as",
    "from",
    "over",
    "by",
    "completely",
    "altogether",
    "now",
    "again",
    "today",
    "yesterday",
    "the",
    "a",
    "an",
    "of",
];

/// Words that name no thing of one's own.
const NOT_A_THING: &[&str] = &[
    "it",
    "that",
    "this",
    "them",
    "those",
    "these",
    "him",
    "her",
    "everything",
    "anything",
    "something",
    "all",
    "there",
    "here",
    "one",
    "some",
    "way",
    "time",
    "trying",
    "worrying",
];

/// Words after a thing that name one's part in it, not another thing.
const THING_ROLE_WORDS: &[&str] = &[
    "job",
    "role",
    "position",
    "post",
    "membership",
    "subscription",
    "account",
    "contract",
];

/// The thing's name from what follows an ending verb: at most three words, up to the first word
/// that starts something else, without a leading article or possessive.
fn thing_named(raw: &str) -> Option<String> {
    let mut words: Vec<&str> = Vec::new();
    for (position, word) in raw.split_whitespace().enumerate() {
        let bare = word.trim_matches(|c: char| !c.is_alphanumeric());
        let lower = bare.to_lowercase();
        let leading = matches!(lower.as_str(), "the" | "my" | "our" | "a" | "an" | "all");
        if position == words.len() && words.is_empty() && leading {
            continue;
        }
        if bare.is_empty() || THING_ENDS_AT.contains(&lower.as_str()) {
            break;
        }
        words.push(bare);
        if word.ends_with([',', '.', ';', '!', '?']) || words.len() == 3 {
            break;
        }
    }
    // "the treasurer job", "my gym membership": the thing is the treasurer's, the gym.
    if words.len() > 1
        && words
            .last()
            .is_some_and(|last| THING_ROLE_WORDS.contains(&last.to_lowercase().as_str()))
    {
        words.pop();
    }
    let thing = fold(&words.join(" "));
    let thing = thing
        .strip_suffix("'s")
        .or_else(|| thing.strip_suffix("’s"))
        .unwrap_or(&thing)
        .to_owned();
    let long_enough = thing.chars().count() >= 3;
    (long_enough && !NOT_A_THING.contains(&thing.as_str())).then_some(thing)
}

/// A duration at the end of a Chinese ending ("两个月", "三年", "半年多").
static CHINESE_DURATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[\d一二两三四五六七八九十几半]+个?多?(?:月|年|周|星期|天)多?$")
        .expect("valid duration rule")
});

/// A Chinese thing's name without a leading demonstrative or possessive ("那家健身房": 健身房).
fn chinese_thing(raw: &str) -> Option<String> {
    let mut thing = raw.trim();
    for prefix in [
        "我们家",
        "我家",
        "我的",
        "那家",
        "这家",
        "那个",
        "这个",
        "那辆",
        "那只",
        "我",
    ] {
        thing = thing.strip_prefix(prefix).unwrap_or(thing);
    }
    let thing = thing.trim_end_matches(['，', ',', '了']).trim();
    // "我戒烟两个月了": how long ago is not the thing.
    let thing = CHINESE_DURATION
        .find(thing)
        .map_or(thing, |duration| &thing[..duration.start()]);
    (thing.chars().count() >= 1 && !thing.is_empty() && thing.chars().count() <= 8)
        .then(|| thing.to_owned())
}

/// A fact's named speaker (lowercased; none for a chat's user) and what they said.
fn speaker_and_said(fact: &str) -> (Option<String>, &str) {
    match crate::speaker::split_speaker(fact) {
        Some((speaker, said)) => (Some(speaker.to_lowercase()), said),
        None => (None, fact.trim()),
    }
}

/// What a fact says is over for its speaker (see the module documentation). Each clause is
/// looked at alone.
pub fn ended_things(fact: &str) -> Vec<Ended> {
    let (speaker, said) = speaker_and_said(fact);
    let mut ended: Vec<Ended> = Vec::new();
    for clause in super::CLAUSE_BREAK.split(said) {
        let clause = clause
            .trim()
            .trim_end_matches(['.', '!', '。', '！'])
            .trim();
        let clause = match super::LEADING_CONNECTIVES.find(clause) {
            Some(connectives) => &clause[connectives.end()..],
            None => clause,
        };
        if clause.is_empty() || clause.ends_with('?') || clause.ends_with('？') {
            continue;
        }
        for thing in things_ended_in(clause) {
            if !ended.iter().any(|known| known.thing == thing) {
                ended.push(Ended {
                    speaker: speaker.clone(),
                    thing,
                });
            }
        }
    }
    ended
}

fn things_ended_in(clause: &str) -> Vec<String> {
    let mut things = Vec::new();
    if !ANY_ENDING.is_match(clause) {
        return things;
    }
    if let Some(found) = ENDING_VERB.captures(clause) {
        let before = &clause[..found.get(0).map_or(0, |m| m.start())];
        if !NOT_ENDED.is_match(before) {
            things.extend(thing_named(&found[1]));
        }
    }
    if let Some(found) = PUT_DOWN.captures(clause) {
        things.extend(thing_named(&found[1]));
    }
    if let Some(found) = NO_MORE.captures(clause) {
        things.extend(thing_named(&found[1]));
    }
    if let Some(found) = FREE_OF.captures(clause) {
        things.extend(thing_named(&found[1]));
    }
    if let Some(found) = OVERTAKEN.captures(clause) {
        things.extend(thing_named(&found[1]));
    }
    if let Some(found) = THING_ENDED.captures(clause) {
        things.extend(thing_named(&found[1]));
    }
    if let Some(found) = NAMED_LEFT.captures(clause) {
        // A relative leaving ("Mum left") is a visit's end, not a person gone from one's life.
        let relative = super::RELATIVES
            .iter()
            .any(|(said, _)| said.eq_ignore_ascii_case(&found[1]));
        if !relative {
            things.extend(thing_named(&found[1]));
        }
    }
    if NOT_ENDED.is_match(clause) && ENDING_VERB.is_match(clause) {
        // "I didn't quit the gym", "I might sell the car": the verb's own clause says not.
        things.clear();
    }
    if let Some(found) = CHINESE_THING_ENDED.captures(clause) {
        things.extend(chinese_thing(&found[1]));
    }
    if let Some(found) = CHINESE_ENDING_VERB.captures(clause) {
        things.extend(chinese_thing(&found[1]));
    }
    things
}

/// Whether `fact` (an older fact, as stored) is about `ended`: said by the same speaker, naming
/// the thing (whole words; a Chinese name anywhere in the text).
pub fn names(fact: &str, ended: &Ended) -> bool {
    let (speaker, said) = speaker_and_said(fact);
    if speaker != ended.speaker {
        return false;
    }
    let said = said.to_lowercase();
    if ended.thing.chars().any(crate::normalize::is_cjk) {
        return said.contains(&ended.thing);
    }
    let named = |thing: &str| {
        said.match_indices(thing).any(|(at, _)| {
            let before = said[..at].chars().next_back();
            let after = said[at + thing.len()..].chars().next();
            let boundary = |c: Option<char>| c.is_none_or(|c| !c.is_alphanumeric());
            // "guppies" names "guppy"'s plural too, and "cello" in "cellos".
            boundary(before) && (boundary(after) || after == Some('s'))
        })
    };
    if named(&ended.thing) || names_a_part(&said, &ended.thing) {
        return true;
    }
    let words: Vec<&str> = ended.thing.split_whitespace().collect();
    match words.as_slice() {
        // "the Friday music school" is the music school.
        [_, rest @ ..] if rest.len() >= 2 => named(&rest.join(" ")),
        // "freelancing" ends "freelance", "smoke" "smoker": one stem of four letters or more.
        [word] => {
            let thing_stem = stem(word);
            thing_stem.chars().count() >= 4
                && said
                    .split(|c: char| !c.is_alphanumeric())
                    .any(|older| stem(older) == thing_stem)
        }
        _ => false,
    }
}

/// Things that are given up as a whole and the words an older fact names them by: "I've quit
/// caffeine" ends "I drink too much coffee".
const GIVEN_UP_AS_A_WHOLE: &[(&str, &[&str])] = &[
    (
        "caffeine",
        &[
            "coffee",
            "coffees",
            "espresso",
            "espressos",
            "latte",
            "lattes",
            "cappuccino",
        ],
    ),
    (
        "alcohol",
        &[
            "beer",
            "beers",
            "wine",
            "pint",
            "pints",
            "gin",
            "whisky",
            "whiskey",
            "cocktails",
            "drinking",
        ],
    ),
    (
        "booze",
        &["beer", "beers", "wine", "pint", "pints", "drinking"],
    ),
    (
        "drinking",
        &["beer", "beers", "wine", "pint", "pints", "alcohol"],
    ),
    ("cigarettes", &["smoke", "smoker", "smoking", "fags"]),
    ("smoking", &["smoke", "smoker", "cigarettes", "fags"]),
    ("咖啡因", &["咖啡"]),
    ("酒", &["啤酒", "白酒", "红酒", "喝酒"]),
];

/// Whether `said` (lowercased) names something `thing` covers as a whole.
fn names_a_part(said: &str, thing: &str) -> bool {
    GIVEN_UP_AS_A_WHOLE
        .iter()
        .filter(|(whole, _)| *whole == thing)
        .flat_map(|(_, parts)| parts.iter())
        .any(|part| {
            if part.chars().any(crate::normalize::is_cjk) {
                return said.contains(part);
            }
            said.split(|c: char| !c.is_alphanumeric())
                .any(|word| word == *part)
        })
}

/// A word without an -ing, -er, -ed, -e or -s ending, to match a thing's forms.
fn stem(word: &str) -> &str {
    ["ing", "er", "ed", "e", "s"]
        .iter()
        .find_map(|ending| word.strip_suffix(ending).filter(|stem| stem.len() >= 4))
        .unwrap_or(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn things(fact: &str) -> Vec<String> {
        ended_things(fact).into_iter().map(|e| e.thing).collect()
    }

    #[test]
    fn what_the_speaker_ended_is_named() {
        assert_eq!(things("I gave up the violin, it was too much."), ["violin"]);
        assert_eq!(things("We had to put Biscuit down last week."), ["biscuit"]);
        assert_eq!(things("Sold the Corsa, finally."), ["corsa"]);
        assert_eq!(things("I cancelled Netflix and kept Disney."), ["netflix"]);
        assert_eq!(
            things("The goldfish all died over the summer."),
            ["goldfish"]
        );
        assert_eq!(things("Figaro went missing in June."), ["figaro"]);
        assert_eq!(things("Marta left, so now it's just me."), ["marta"]);
        assert_eq!(things("我的自行车被偷了。"), ["自行车"]);
        assert_eq!(things("我戒酒了。"), ["酒"]);
        assert_eq!(
            ended_things("Ines: I quit the choir in March."),
            [Ended {
                speaker: Some("ines".to_owned()),
                thing: "choir".to_owned()
            }]
        );
    }

    #[test]
    fn plans_negations_and_others_end_nothing() {
        for text in [
            "I might sell the car next year.",
            "I didn't quit the choir after all.",
            "I want to give up sugar.",
            "My dad left for work early.",
            "Mum left for work early.",
            "Mum left last week.",
            "We stopped for lunch in Lyon.",
            "I gave up.",
            "It died down after a while.",
        ] {
            assert!(things(text).is_empty(), "{text}: {:?}", things(text));
        }
    }

    #[test]
    fn an_older_fact_of_the_same_speaker_naming_the_thing_is_ended() {
        let violin = &ended_things("I gave up the violin.")[0];
        assert!(names("I'm learning the violin.", violin));
        assert!(
            !names("Ines: I'm learning the violin.", violin),
            "another speaker"
        );
        assert!(!names("I'm learning the viola.", violin));
        let goldfish = &ended_things("The guppies died.")[0];
        assert!(names("I've got a tank with six guppies.", goldfish));
        let bike = &ended_things("我的自行车被偷了。")[0];
        assert!(names("我每天骑自行车上班。", bike));
    }

    #[test]
    fn a_thing_is_named_by_its_core_its_last_words_or_its_stem() {
        let post = &ended_things("I handed the secretary job over to Priti.")[0];
        assert_eq!(post.thing, "secretary");
        assert!(names("I'm the secretary of the allotment society.", post));
        let class = &ended_things("I quit the Tuesday pottery class.")[0];
        assert!(names("I go to a pottery class near work.", class));
        let freelancing = &ended_things("No more freelancing for me.")[0];
        assert!(names("I'm a freelance translator.", freelancing));
        assert!(!names("I'm a translator.", freelancing));
        assert_eq!(things("我戒酒半年了。"), ["酒"]);
        let smoke = &ended_things("Two weeks smoke-free, finally!")[0];
        assert!(names("I'm a smoker, twenty a day.", smoke));
        assert_eq!(things("I'm alcohol-free now."), ["alcohol"]);
        assert!(things("I ordered a sugar-free cola.").is_empty());
        let favourite = &ended_things("Honestly, Bach has overtaken Mozart for me.")[0];
        assert_eq!(favourite.thing, "mozart");
        assert!(names("My favourite composer is Mozart.", favourite));
        assert_eq!(things("我最喜欢的是周杰伦了，林俊杰退居第二。"), ["林俊杰"]);
        let caffeine = &ended_things("I've given up caffeine, two weeks now.")[0];
        assert!(names("I need three coffees to get going.", caffeine));
        assert!(!names(
            "I need three teas to get going.",
            &ended_things("I quit alcohol.")[0]
        ));
    }
}
