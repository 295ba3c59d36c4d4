//! What one uses, drives, banks with, goes to, and how one works: the things people have one of
//! at a time and replace ("I'm on an iPhone 12" → "I'm on a Pixel 8 now"; "I bank with Barclays"
//! → "I moved all my accounts over to Monzo"; "I work nights" → "I'm finally on days now").
//!
//! Where a verb alone does not say what kind of thing its object is ("I'm on …", "I use …",
//! "I switched to …", "换了个…"), the object's words do: [`kind_of`] knows the words that name a
//! phone, a computer's system, a car, a bank, a gym or a plan. An object of no known kind
//! states nothing ("I'm on the train", "I switched to decaf"), so it supersedes nothing.

use super::{Rule, Subject, Value, rule, valued};

/// Kinds of thing one has one of at a time, each with words that name one: a kind word itself
/// ("gym", "plan"), or a maker or model. (Shifts have rules of their own: "days" is a kind word
/// only right after "on".) A word matches whole, a kind word ([`KIND_WORDS`]) also as the end
/// of a word ("PureGym" is a gym); a Chinese name anywhere in the text.
const KINDS: &[(&str, &[&str])] = &[
    (
        "phone",
        &[
            "iphone",
            "pixel",
            "galaxy",
            "samsung",
            "huawei",
            "xiaomi",
            "oneplus",
            "motorola",
            "nokia",
            "华为",
            "小米",
            "苹果手机",
            "荣耀",
            "oppo",
            "vivo",
        ],
    ),
    (
        "computer system",
        &[
            "windows",
            "macos",
            "mac",
            "macbook",
            "macbooks",
            "linux",
            "ubuntu",
            "fedora",
            "chromebook",
            "chromeos",
        ],
    ),
    (
        "car",
        &[
            "ford",
            "toyota",
            "honda",
            "volkswagen",
            "vw",
            "bmw",
            "audi",
            "mercedes",
            "tesla",
            "nissan",
            "kia",
            "hyundai",
            "renault",
            "peugeot",
            "citroen",
            "fiat",
            "vauxhall",
            "skoda",
            "volvo",
            "mazda",
            "mini",
            "corsa",
            "fiesta",
            "focus",
            "yaris",
            "prius",
            "golf",
            "polo",
            "qashqai",
            "卡罗拉",
            "比亚迪",
            "特斯拉",
            "大众",
            "丰田",
            "本田",
            "宝马",
            "奔驰",
            "奥迪",
            "理想",
            "蔚来",
        ],
    ),
    (
        "bank",
        &[
            "bank",
            "barclays",
            "hsbc",
            "lloyds",
            "natwest",
            "santander",
            "monzo",
            "starling",
            "revolut",
            "nationwide",
            "halifax",
            "chase",
            "银行",
        ],
    ),
    ("gym", &["gym", "健身房"]),
    ("plan", &["plan", "tier", "tariff", "subscription", "套餐"]),
];

/// The kind of thing `value` names ([`KINDS`]), if any.
pub(super) fn kind_of(value: &str) -> Option<&'static str> {
    let lower = value.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|word| !word.is_empty())
        .collect();
    KINDS.iter().find_map(|(kind, names)| {
        let named = names.iter().any(|name| {
            if name.chars().any(crate::normalize::is_cjk) {
                return lower.contains(name);
            }
            // A word ending in a kind word ("puregym") is one; a longer maker's name is not
            // ("minimalist" is no Mini).
            words
                .iter()
                .any(|word| *word == *name || (KIND_WORDS.contains(name) && word.ends_with(name)))
        });
        named.then_some(*kind)
    })
}

/// Kind words that also end the names of things of that kind ("PureGym", "FlexiPlan").
const KIND_WORDS: &[&str] = &["gym", "plan", "bank"];

/// Adverbs that may stand between the subject and the verb ("I'm now on …", "I still use …").
const NOW: &str = r"(?:now\s+|still\s+|currently\s+|finally\s+|just\s+|mostly\s+|only\s+)*";
/// Words before a thing that describe it ("an old Ford Focus"): not part of its value.
const WORN: &str = r"(?:(?:old|new|little|battered|trusty|ancient|used|second-hand|secondhand|beat-up|brand\s+new)\s+)*";

/// The rules, tried after the ones of the parent module.
pub(super) fn rules() -> Vec<Rule> {
    [things_one_has(), circumstances(), chinese()]
        .into_iter()
        .flatten()
        .collect()
}

/// What one has one of at a time: what one is on or uses, where one goes regularly, what
/// replaced it, a new one of a kind.
fn things_one_has() -> Vec<Rule> {
    vec![
        // What one is on or uses: a phone, a system, a plan (a shift: below).
        rule(
            &format!(
                r"(?i)^(?:i'?m|i\s+am|we'?re|we\s+are)\s+{NOW}on\s+(?:an?\s+|the\s+|my\s+)?{WORN}(.+)$"
            ),
            Subject::KindOf,
            1,
        ),
        rule(
            &format!(
                r"(?i)^(?:i|we)\s+{NOW}use\s+(?:an?\s+|the\s+)?(.+?)(?:\s+(?:on|for|at|as)\s+.*)?$"
            ),
            Subject::KindOf,
            1,
        ),
        // Where one goes regularly: a gym (a shop or a party is no kind of thing one has one of).
        rule(
            &format!(r"(?i)^(?:i|we)\s+{NOW}go\s+to\s+(?:the\s+|a\s+)?(.+)$"),
            Subject::KindOf,
            1,
        ),
        rule(
            &format!(r"(?i)^(?:i|we)\s+{NOW}drive\s+(?:an?\s+|the\s+|my\s+)?{WORN}(.+)$"),
            Subject::Fixed("car"),
            1,
        ),
        rule(
            &format!(r"(?i)^(?:i|we)\s+{NOW}bank\s+with\s+(.+)$"),
            Subject::Fixed("bank"),
            1,
        ),
        // A replacement: "I switched to …", "I moved all my accounts over to Monzo", "upgraded
        // to Pro", "bought a used Toyota Yaris".
        rule(
            &format!(
                r"(?i)^(?:i|we)(?:'ve|\s+have)?\s+{NOW}(?:switched|changed|moved|swapped|upgraded|transferred|gone|went|converted)(?:\s+(?:all\s+)?(?:my|our)\s+[\p{{L}}\-]+(?:\s+[\p{{L}}\-]+)?)?(?:\s+over|\s+across)?\s+to\s+(?:an?\s+|the\s+)?(.+)$"
            ),
            Subject::KindOf,
            1,
        ),
        // An upgrade to what names no kind is one of a plan ("I upgraded to Pro").
        rule(
            &format!(
                r"(?i)^(?:i|we)(?:'ve|\s+have)?\s+{NOW}(?:upgraded|downgraded)\s+to\s+(?:the\s+)?(.+)$"
            ),
            Subject::Fixed("plan"),
            1,
        ),
        rule(
            &format!(
                r"(?i)^(?:i|we)(?:'ve|\s+have)?\s+{NOW}(?:bought|got)\s+(?:an?|the)\s+{WORN}(.+)$"
            ),
            Subject::KindOf,
            1,
        ),
        // A new one of a kind the parent module knows: "I registered with a new GP", "I changed
        // to the dentist by work".
        valued(
            r"(?i)^(?:i|we)(?:'ve|\s+have)?\s+(?:just\s+|finally\s+)?(?:registered|signed\s+up|changed|switched|moved)\s+(?:with|to)\s+(?:a\s+new|another|the)\s+([\p{L}]+)\b",
            Subject::Known(1),
            Value::Fixed("a new one"),
        ),
        // A service said as where it is: "my dentist is at the Headingley practice".
        rule(
            r"(?i)^(?:my|our)\s+(gp|doctor|dentist|vet|therapist|gym|surgery)\s+is\s+(?:at|in|on)\s+(.+)$",
            Subject::Known(1),
            2,
        ),
    ]
}

/// How one lives and works: shifts, where one works and how one gets there, weight, role,
/// where one lives and studies.
fn circumstances() -> Vec<Rule> {
    vec![
        // Shifts: "I work nights", "I'm on days now", 我现在上夜班.
        rule(
            &format!(r"(?i)^i\s+{NOW}work\s+(days|nights|earlies|lates|weekends|shifts)\b"),
            Subject::Fixed("shift"),
            1,
        ),
        rule(
            &format!(
                r"(?i)^(?:i'?m|i\s+am|we'?re|we\s+are)\s+{NOW}on\s+(?:the\s+)?(days|nights|earlies|lates|night\s+shift|day\s+shift|the\s+night\s+shift)\b"
            ),
            Subject::Fixed("shift"),
            1,
        ),
        rule(
            r"^我?(?:现在|目前)?(?:上|改上|换成|倒)(白班|夜班)",
            Subject::Fixed("shift"),
            1,
        ),
        // Where one works: at home or in the office.
        valued(
            &format!(
                r"(?i)^(?:i|we)\s+{NOW}work\s+(?:from|at)\s+home(?:\s+(?:full[\s-]time|now|permanently|these\s+days))?$"
            ),
            Subject::Fixed("work location"),
            Value::Fixed("home"),
        ),
        valued(
            r"(?i)^(?:i'?m|i\s+am|we'?re|we\s+are)\s+(?:now\s+)?back\s+(?:in|at)\s+the\s+office\b",
            Subject::Fixed("work location"),
            Value::Fixed("office"),
        ),
        // How one gets to work.
        rule(
            &format!(
                r"(?i)^i\s+{NOW}(?:usually\s+|always\s+)?(cycle|bike|walk|drive|run|scoot)\s+(?:in\s+)?to\s+(?:work|the\s+office)\b"
            ),
            Subject::Fixed("commute"),
            1,
        ),
        rule(
            r"(?i)\bi(?:'ve\s+been|\s+have\s+been|'m|\s+am)?\s+(?:now\s+)?(?:taking|take|getting|get|catching|catch)\s+the\s+(bus|train|tube|metro|tram|ferry)\s+(?:in|to\s+work|to\s+the\s+office)\b",
            Subject::Fixed("commute"),
            1,
        ),
        // Weight: "I'm 80 kilos", "Down to 72 kilos".
        rule(
            r"(?i)^(?:(?:i'?m|i\s+am)\s+(?:now\s+)?(?:down\s+to\s+|up\s+to\s+)?|(?:down|up)\s+to\s+)(\d{2,3}(?:\.\d)?\s*(?:kilos|kg|kgs|pounds|lbs|stone))\b",
            Subject::Fixed("weight"),
            1,
        ),
        // One's role said another way: leading a team, stepping up or down, a job as.
        valued(
            r"(?i)^(?:i'?m|i\s+am)\s+(?:now\s+)?(?:leading|managing|running)\s+(?:a|the|my)\s+team\b",
            Subject::Fixed("role"),
            Value::Fixed("team lead"),
        ),
        rule(
            r"(?i)^i(?:'ve|\s+have)?\s+(?:just\s+)?stepped\s+(?:back\s+)?(?:down|up)\s+to\s+(?:an?\s+)?(.+)$",
            Subject::Fixed("role"),
            1,
        ),
        // Where one lives, said with whom or how: "I live with two flatmates in Brixton", "I'm
        // living alone now, in a one-bed in Peckham".
        rule(
            r"(?i)^(?:i|we)(?:'m|\s+am|'re|\s+are)?\s+(?:now\s+|still\s+)?(?:live|living)\s+(?:alone|on\s+my\s+own|by\s+myself|with\s+[^,]+?)(?:\s+now)?,?\s+in\s+(.+)$",
            Subject::Fixed("residence"),
            1,
        ),
        // Where one studies: "I'm doing my master's at Leeds", "I transferred to Manchester for
        // the second year of the course".
        rule(
            r"(?i)^(?:i'?m|i\s+am)\s+(?:now\s+|still\s+)?(?:doing|studying\s+for|studying)\s+(?:my\s+|a\s+|an\s+)?(?:master'?s|masters|degree|phd|doctorate|bachelor'?s|mba|undergrad|apprenticeship|a-levels|pgce)\b.*?\bat\s+(.+)$",
            Subject::Fixed("school"),
            1,
        ),
        rule(
            r"(?i)^i(?:'ve|\s+have)?\s+(?:just\s+)?transferred\s+to\s+(.+?)\s+for\s+.*\b(?:year|degree|master'?s|masters|phd|course|studies|term|semester)\b",
            Subject::Fixed("school"),
            1,
        ),
        // The relocation one's employer made: "They relocated me to Amsterdam".
        rule(
            r"(?i)^(?:they|the\s+company|work|my\s+(?:company|employer|firm))\s+(?:have\s+|has\s+)?(?:just\s+)?(?:relocated|transferred|moved)\s+me\s+to\s+(.+)$",
            Subject::Fixed("residence"),
            1,
        ),
    ]
}

/// The same in Chinese.
fn chinese() -> Vec<Rule> {
    vec![
        // Chinese: what one uses or drives, what one changed to, one's role and workplace.
        rule(
            r"^我们?(?:现在|目前)?(?:用的是|开的是|用|开)(?:一辆|一部|一台|辆|部|台)?(.+)$",
            Subject::KindOf,
            1,
        ),
        rule(
            r"^我?们?(?:又|刚|最近|已经)?(?:换了|换成了?|改用了?|改去了?)(?:个|一个|部|一部|台|一台|辆|一辆|家|一家)?(.+?)了?$",
            Subject::KindOf,
            1,
        ),
        rule(
            r"^我?(?:现在|目前)?在(?:一[所家个]|某)?.{1,16}?当(.{2,10}?)了?$",
            Subject::Fixed("role"),
            1,
        ),
        valued(
            r"^我(?:现在|目前|还)?在读(研|博|研究生|博士|大学|本科|高中)",
            Subject::Fixed("role"),
            Value::Fixed("student"),
        ),
        rule(
            r"^我(?:终于|已经|刚)?升(?:职|为|成|到)?了?(.{1,6}?)了",
            Subject::Fixed("role"),
            1,
        ),
        rule(
            r"^我是(?:.{1,10}的)?(.{0,6}(?:员工|工程师|老师|经理|主管|医生|护士|学生|设计师|程序员|会计|律师|销售))$",
            Subject::Fixed("role"),
            1,
        ),
        rule(
            r"^我(?:现在|目前)?在(.{1,16}?(?:公司|大厂|工厂|厂|医院|学校|银行|机构|单位))(?:做|当|上班)",
            Subject::Fixed("employer"),
            1,
        ),
        valued(
            r"^我的?(?:微信|手机号|号码|邮箱)(?:号)?换(?:号|了)",
            Subject::Fixed("wechat"),
            Value::Fixed("a new one"),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::subject_value;

    fn states(fact: &str) -> Option<(String, String)> {
        subject_value(fact).map(|stated| (stated.subject, stated.value))
    }

    fn subject(fact: &str) -> Option<String> {
        states(fact).map(|(subject, _)| subject)
    }

    #[test]
    fn what_one_is_on_uses_or_drives_is_named_by_its_kind() {
        assert_eq!(
            subject("I'm on a Galaxy S21 at the moment."),
            Some("phone".into())
        );
        assert_eq!(
            subject("Got a new phone, I'm on an iPhone 15 now."),
            Some("phone".into())
        );
        assert_eq!(
            subject("I use Linux for everything."),
            Some("computer system".into())
        );
        assert_eq!(subject("We're on the family plan."), Some("plan".into()));
        assert_eq!(
            states("I drive a battered Vauxhall Astra."),
            Some(("car".into(), "vauxhall astra".into()))
        );
        assert_eq!(
            states("We downgraded to the Lite tier."),
            Some(("plan".into(), "lite tier".into()))
        );
        assert_eq!(subject("I bank with HSBC."), Some("bank".into()));
        assert_eq!(
            subject("I go to the FitSpace gym near work."),
            Some("gym".into())
        );
        assert_eq!(subject("我用的是小米手机。"), Some("phone".into()));
        assert_eq!(subject("我开的是一辆大众。"), Some("car".into()));
    }

    #[test]
    fn a_replacement_states_a_new_value_of_the_same_kind() {
        let older = states("I bank with Lloyds.").unwrap();
        let newer = states("We moved our savings over to Starling.").unwrap();
        assert_eq!(older.0, newer.0);
        assert_ne!(older.1, newer.1);
        assert_eq!(subject("I switched to a Fairphone."), None, "no kind known");
        assert_eq!(
            subject("Just upgraded to the premium tier."),
            None,
            "no subject"
        );
        assert_eq!(
            subject("I just upgraded to the premium tier."),
            Some("plan".into())
        );
        assert_eq!(subject("换了辆比亚迪，油费省多了。"), Some("car".into()));
        assert_eq!(
            states("I registered with a new vet after we moved."),
            Some(("vet".into(), "a new one".into()))
        );
    }

    #[test]
    fn shifts_commutes_weights_and_roles_said_other_ways() {
        assert_eq!(
            states("I work weekends at the garden centre."),
            Some(("shift".into(), "weekends".into()))
        );
        assert_eq!(
            states("I'm on nights this month."),
            Some(("shift".into(), "nights".into()))
        );
        assert_eq!(
            states("I walk to work most days."),
            Some(("commute".into(), "walk".into()))
        );
        assert_eq!(
            states("Since the move I've been getting the train in."),
            Some(("commute".into(), "train".into()))
        );
        assert_eq!(
            states("I'm 64 kg these days."),
            Some(("weight".into(), "64 kg".into()))
        );
        assert_eq!(
            states("Down to 90 kilos!"),
            Some(("weight".into(), "90 kilos".into()))
        );
        assert_eq!(
            subject("I'm managing a team of six now."),
            Some("role".into())
        );
        assert_eq!(subject("我在一家医院当护士。"), Some("role".into()));
        assert_eq!(
            states("We live with my in-laws in Croydon."),
            Some(("residence".into(), "croydon".into()))
        );
        assert_eq!(
            states("I'm living on my own now, in a studio in Leith."),
            Some(("residence".into(), "a studio in leith".into()))
        );
        assert_eq!(
            states("I'm doing my PhD at Durham, second year."),
            Some(("school".into(), "durham".into()))
        );
        assert_eq!(
            states("I transferred to Bristol for the final year of my degree."),
            Some(("school".into(), "bristol".into()))
        );
        assert_eq!(subject("我升组长了。"), Some("role".into()));
        assert_eq!(subject("我在一家银行做柜员。"), Some("employer".into()));
    }

    #[test]
    fn visits_trips_and_things_of_no_kind_state_nothing() {
        for text in [
            "I'm on the train home.",
            "I'm on holiday next week.",
            "I use a lot of garlic.",
            "I go to the shops on Saturdays.",
            "We went to the beach.",
            "I bought a new jumper.",
            "I'm driving my dad's car this week.",
            "我在家做饭。",
            "I'm living with my sister for the summer.",
            "I transferred to the night team.",
            "我用了一下午。",
        ] {
            assert_eq!(states(text), None, "{text}");
        }
    }
}
