//! Relative dates resolved against the moment they were said.
//!
//! "Remind me: dentist next Wednesday" (or "记住我下周三要去上海出差") means a date only next to
//! the day it was said; read months later, "next Wednesday" means nothing. The text is kept as
//! said; [`resolve`] finds the relative expressions in it and the days they meant, so that the
//! write path can store them as tags and retrieval can show them beside the text.
//!
//! Rules (the said day is the UTC date of the moment; Engram does not know the user's zone):
//! - today, tonight, tomorrow, yesterday, the day after tomorrow, the day before yesterday;
//!   今天, 明天, 后天, 大后天, 昨天, 前天, 大前天;
//! - next / last <weekday>: that weekday of the next / previous week (weeks start on Monday,
//!   as 下周三 / 上周五 count them); this / coming <weekday>: the first such day from today on;
//!   下周X, 上周X, 这周X / 本周X (周, 星期 or 礼拜);
//! - next / last / this week, month, year (下周, 上个月, 明年 ...): the whole week, month or year;
//! - next / last / this <month> ("next June", "last March"): that whole month, the next one
//!   after the current month, the last one before it, or this year's;
//! - in N days / weeks / months / years, N ... ago (N a number or one to twelve);
//!   N天后, N周前, N个月以后 ... (N in digits or Chinese numerals up to 99).
//!
//! Not resolved: a bare weekday ("on Friday": past or future?), dates that are already absolute
//! ("2026-12-02", "May 3rd"), times of day, and anything the rules above do not name.

use std::sync::LazyLock;

use chrono::{DateTime, Datelike, Days, Months, NaiveDate, Utc, Weekday};
use regex::{Regex, RegexSet};

/// A relative expression and the days it meant when said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedDate {
    /// The words as said ("next Wednesday", "下周三").
    pub phrase: String,
    /// First and last day meant (the same day for one day).
    pub from: NaiveDate,
    pub to: NaiveDate,
    pub span: Span,
}

/// How much time an expression names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    Day,
    Week,
    Month,
    Year,
}

impl ResolvedDate {
    /// A compact, stable tag for the days meant: `2026-12-02`, `2026-W49`, `2026-12`, `2027`.
    pub fn tag(&self) -> String {
        match self.span {
            Span::Day => self.from.format("%Y-%m-%d").to_string(),
            Span::Week => {
                let week = self.from.iso_week();
                format!("{}-W{:02}", week.year(), week.week())
            }
            Span::Month => self.from.format("%Y-%m").to_string(),
            Span::Year => self.from.format("%Y").to_string(),
        }
    }

    /// How the days read beside the text: `Wed 2026-12-02`, `2026-11-30 to 2026-12-06`.
    pub fn describe(&self) -> String {
        match self.span {
            Span::Day => self.from.format("%a %Y-%m-%d").to_string(),
            _ => format!(
                "{} to {}",
                self.from.format("%Y-%m-%d"),
                self.to.format("%Y-%m-%d")
            ),
        }
    }
}

const EN_MONTHS: &str = "january|february|march|april|may|june|july|august|september|october|november|december|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec";
const EN_WEEKDAYS: &str = "monday|tuesday|wednesday|thursday|friday|saturday|sunday";
const EN_NUMBER: &str =
    r"\d{1,3}|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve";
const ZH_NUMBER: &str = "[0-9]{1,3}|[一二两三四五六七八九十]{1,3}";

/// The patterns, most specific first: a span a pattern took is not looked at again.
static PATTERNS: LazyLock<Vec<(Regex, Rule)>> = LazyLock::new(|| {
    let rule =
        |pattern: String, rule: Rule| (Regex::new(&pattern).expect("valid date pattern"), rule);
    vec![
        rule(
            r"(?i)\b(?:the\s+)?day\s+after\s+tomorrow\b".into(),
            Rule::Days(2),
        ),
        rule(
            r"(?i)\b(?:the\s+)?day\s+before\s+yesterday\b".into(),
            Rule::Days(-2),
        ),
        rule(r"(?i)\btomorrow\b".into(), Rule::Days(1)),
        rule(r"(?i)\byesterday\b".into(), Rule::Days(-1)),
        rule(r"(?i)\b(?:today|tonight)\b".into(), Rule::Days(0)),
        rule(
            format!(r"(?i)\b(next|last|this|coming)\s+({EN_WEEKDAYS})\b"),
            Rule::EnWeekday,
        ),
        rule(
            r"(?i)\b(next|last|this)\s+(week|month|year)\b".into(),
            Rule::EnPeriod,
        ),
        rule(
            format!(r"(?i)\b(next|last|this|coming)\s+({EN_MONTHS})\b"),
            Rule::EnMonth,
        ),
        rule(
            format!(r"(?i)\bin\s+({EN_NUMBER})\s+(day|week|month|year)s?\b"),
            Rule::EnAmount { sign: 1 },
        ),
        rule(
            format!(r"(?i)\b({EN_NUMBER})\s+(day|week|month|year)s?\s+ago\b"),
            Rule::EnAmount { sign: -1 },
        ),
        rule(
            format!("({ZH_NUMBER})(天|周|个?星期|个?礼拜|个月|年)(后|以后|之后|前|以前|之前)"),
            Rule::ZhAmount,
        ),
        rule("大后天".into(), Rule::Days(3)),
        rule("大前天".into(), Rule::Days(-3)),
        rule("后天".into(), Rule::Days(2)),
        rule("前天".into(), Rule::Days(-2)),
        rule("明天|明日|明早|明晚".into(), Rule::Days(1)),
        rule("昨天|昨日|昨晚".into(), Rule::Days(-1)),
        rule("今天|今日|今晚|今早".into(), Rule::Days(0)),
        rule(
            "(下|上|这|本)个?(?:周|星期|礼拜)([一二三四五六日天])".into(),
            Rule::ZhWeekday,
        ),
        rule("(下|上|这|本)个?(?:周|星期|礼拜)".into(), Rule::ZhWeek),
        rule("(下|上|这)个月|(本)月".into(), Rule::ZhMonth),
        rule("(明|去|今)年".into(), Rule::ZhYear),
    ]
});

#[derive(Debug, Clone, Copy)]
enum Rule {
    Days(i64),
    EnWeekday,
    EnPeriod,
    EnMonth,
    EnAmount { sign: i64 },
    ZhWeekday,
    ZhWeek,
    ZhMonth,
    ZhYear,
    ZhAmount,
}

/// The tags of the days `text`'s relative words meant when said at `said_at`, without repeats.
pub fn date_tags(text: &str, said_at: DateTime<Utc>) -> Vec<String> {
    let mut tags: Vec<String> = Vec::new();
    for tag in resolve(text, said_at).iter().map(ResolvedDate::tag) {
        if !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    tags
}

/// All the patterns at once, to tell in one pass over a text which match: most texts (every fact
/// line a retrieval shows is resolved) name no relative day, and trying the patterns one by one
/// read each such text once a pattern (issue 41).
static ANY_PATTERN: LazyLock<RegexSet> = LazyLock::new(|| {
    RegexSet::new(PATTERNS.iter().map(|(pattern, _)| pattern.as_str()))
        .expect("valid date patterns")
});

/// The relative dates of `text`, in the order they appear, resolved against `said_at`.
pub fn resolve(text: &str, said_at: DateTime<Utc>) -> Vec<ResolvedDate> {
    // Only the patterns that match somewhere are run for their captures, in the patterns' order:
    // a text naming one day was read again by each of the others.
    let matching = ANY_PATTERN.matches(text);
    if !matching.matched_any() {
        return Vec::new();
    }
    let today = said_at.date_naive();
    let mut taken: Vec<(usize, usize)> = Vec::new();
    let mut found: Vec<(usize, ResolvedDate)> = Vec::new();
    for (pattern, rule) in matching.iter().map(|index| &PATTERNS[index]) {
        for captures in pattern.captures_iter(text) {
            let whole = captures.get(0).expect("a match has its whole");
            let (start, end) = (whole.start(), whole.end());
            if taken.iter().any(|&(s, e)| start < e && s < end) {
                continue;
            }
            if inside_chinese_word(text, start, end) {
                continue;
            }
            let group = |index: usize| captures.get(index).map(|m| m.as_str());
            let Some((from, to, span)) = apply(*rule, &group, today) else {
                continue;
            };
            taken.push((start, end));
            found.push((
                start,
                ResolvedDate {
                    phrase: whole.as_str().to_owned(),
                    from,
                    to,
                    span,
                },
            ));
        }
    }
    found.sort_by_key(|(start, _)| *start);
    found.into_iter().map(|(_, resolved)| resolved).collect()
}

/// Whether a Chinese day word at `start..end` is the tail of another word running into 天:
/// 以前/之前/以后 (以前天天加班: "used to work overtime every day"), 说明/聪明/透明 (说明天数:
/// "state the number of days"). The regular expressions have no look-behind, so the character
/// before is checked here. (What follows proves nothing: 明天天气 is tomorrow's weather.)
fn inside_chinese_word(text: &str, start: usize, end: usize) -> bool {
    let word = &text[start..end];
    let before = text[..start].chars().next_back();
    match word {
        "前天" | "后天" => matches!(before, Some('以' | '之' | '先' | '日' | '午' | '然')),
        "明天" => matches!(before, Some('说' | '聪' | '透' | '分' | '光' | '文' | '证')),
        _ => false,
    }
}

fn apply<'t>(
    rule: Rule,
    group: &dyn Fn(usize) -> Option<&'t str>,
    today: NaiveDate,
) -> Option<(NaiveDate, NaiveDate, Span)> {
    let day = |date: NaiveDate| Some((date, date, Span::Day));
    match rule {
        Rule::Days(offset) => day(shift_days(today, offset)?),
        Rule::EnWeekday => {
            let weekday = en_weekday(group(2)?)?;
            let relation = match group(1)?.to_ascii_lowercase().as_str() {
                "next" => WeekRelation::Next,
                "last" => WeekRelation::Last,
                _ => WeekRelation::Coming,
            };
            day(weekday_of(today, weekday, relation)?)
        }
        Rule::EnPeriod => {
            let offset = match group(1)?.to_ascii_lowercase().as_str() {
                "next" => 1,
                "last" => -1,
                _ => 0,
            };
            match group(2)?.to_ascii_lowercase().as_str() {
                "week" => week(today, offset),
                "month" => month(today, offset),
                _ => year(today, offset),
            }
        }
        Rule::EnMonth => {
            // "this may be hard": lower-case "may" is the verb.
            if group(2)? == "may" {
                return None;
            }
            let named = en_month(group(2)?)?;
            let relation = group(1)?.to_ascii_lowercase();
            let year = match relation.as_str() {
                // The next such month after this one: said in November, "next June" is June of
                // next year; said in March, this year's June.
                "next" | "coming" if named > today.month() => today.year(),
                "next" | "coming" => today.year().checked_add(1)?,
                // The last such month before this one.
                "last" if named < today.month() => today.year(),
                "last" => today.year().checked_sub(1)?,
                _ => today.year(),
            };
            month(NaiveDate::from_ymd_opt(year, named, 1)?, 0)
        }
        Rule::EnAmount { sign } => {
            let amount = en_number(group(1)?)? * sign;
            amount_from(today, amount, &group(2)?.to_ascii_lowercase())
        }
        Rule::ZhWeekday => {
            let relation = match group(1)? {
                "下" => WeekRelation::Next,
                "上" => WeekRelation::Last,
                _ => WeekRelation::This,
            };
            day(weekday_of(today, zh_weekday(group(2)?)?, relation)?)
        }
        Rule::ZhWeek => week(today, zh_offset(group(1)?)),
        Rule::ZhMonth => month(today, zh_offset(group(1).or(group(2))?)),
        Rule::ZhYear => year(
            today,
            match group(1)? {
                "明" => 1,
                "去" => -1,
                _ => 0,
            },
        ),
        Rule::ZhAmount => {
            let sign = if group(3)?.ends_with('后') { 1 } else { -1 };
            let amount = zh_number(group(1)?)? * sign;
            let unit = match group(2)? {
                "天" => "day",
                "个月" => "month",
                "年" => "year",
                _ => "week",
            };
            amount_from(today, amount, unit)
        }
    }
}

/// The days a question asks about, from its dates: the relative ones [`resolve`] knows (against
/// `asked_at`: "last week", "三天前") and named months ("in March", "early June 2026", "三月"),
/// which a question asks about in the past: the most recent such month up to the asking one,
/// unless a year is given. Several dates give the span from the first to the last day. `None`
/// when the question names no date. A weekday alone or a day of the month alone names none.
pub fn query_window(query: &str, asked_at: DateTime<Utc>) -> Option<(NaiveDate, NaiveDate)> {
    let today = asked_at.date_naive();
    let relative = resolve(query, asked_at)
        .into_iter()
        .map(|resolved| (resolved.from, resolved.to));
    let named = NAMED_MONTHS
        .captures_iter(query)
        .filter(|captures| {
            // "May I ..." opens a question with the verb.
            let word = captures.get(1).expect("the month group");
            !(word.as_str() == "May" && query[..word.start()].trim().is_empty())
        })
        .filter_map(|captures| {
            let month = en_month(captures.get(1)?.as_str())?;
            let year = captures.get(2).and_then(|year| year.as_str().parse().ok());
            past_month(today, month, year)
        });
    let chinese = ZH_NAMED_MONTHS.captures_iter(query).filter_map(|captures| {
        let month = u32::try_from(zh_number(captures.get(2)?.as_str())?).ok()?;
        let year = captures.get(1).and_then(|year| year.as_str().parse().ok());
        past_month(today, month, year)
    });
    relative
        .chain(named)
        .chain(chinese)
        .reduce(|(from, to), (next_from, next_to)| (from.min(next_from), to.max(next_to)))
}

/// A month named by its English name, capitalised as a name is (so that "may" and "march" as
/// verbs are not months), with an optional year after it ("June 2026", "June 3, 2026").
static NAMED_MONTHS: LazyLock<Regex> = LazyLock::new(|| {
    // EN_MONTHS's names, capitalised: this pattern is case-sensitive.
    let names: Vec<String> = EN_MONTHS
        .split('|')
        .map(|name| name[..1].to_ascii_uppercase() + &name[1..])
        .collect();
    Regex::new(&format!(
        r"\b({})\b\.?(?:\s+\d{{1,2}}(?:st|nd|rd|th)?\b,?)?(?:\s+(\d{{4}})\b)?",
        names.join("|")
    ))
    .expect("valid month pattern")
});

/// 三月, 3月, 十二月, 2026年5月 (not 三个月, a length, nor 5月3日's day, which the month covers).
static ZH_NAMED_MONTHS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new("(?:([0-9]{4})年)?(1[0-2]|[1-9]|十[一二]?|[一二三四五六七八九])月")
        .expect("valid month pattern")
});

/// The whole month `month` of `year`, or without a year the most recent one up to `today`'s.
fn past_month(today: NaiveDate, month: u32, year: Option<i32>) -> Option<(NaiveDate, NaiveDate)> {
    let year = match year {
        Some(year) => year,
        None if month <= today.month() => today.year(),
        None => today.year().checked_sub(1)?,
    };
    let (from, to, _) = self::month(NaiveDate::from_ymd_opt(year, month, 1)?, 0)?;
    Some((from, to))
}

fn shift_days(date: NaiveDate, offset: i64) -> Option<NaiveDate> {
    let days = Days::new(offset.unsigned_abs());
    if offset >= 0 {
        date.checked_add_days(days)
    } else {
        date.checked_sub_days(days)
    }
}

fn shift_months(date: NaiveDate, offset: i64) -> Option<NaiveDate> {
    let months = Months::new(u32::try_from(offset.unsigned_abs()).ok()?);
    if offset >= 0 {
        date.checked_add_months(months)
    } else {
        date.checked_sub_months(months)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WeekRelation {
    Next,
    Last,
    /// This calendar week's.
    This,
    /// The first from today on.
    Coming,
}

fn weekday_of(today: NaiveDate, weekday: Weekday, relation: WeekRelation) -> Option<NaiveDate> {
    let monday = shift_days(today, -i64::from(today.weekday().num_days_from_monday()))?;
    let in_week = i64::from(weekday.num_days_from_monday());
    match relation {
        WeekRelation::Next => shift_days(monday, 7 + in_week),
        WeekRelation::Last => shift_days(monday, in_week - 7),
        WeekRelation::This => shift_days(monday, in_week),
        WeekRelation::Coming => {
            let ahead = (in_week - i64::from(today.weekday().num_days_from_monday())).rem_euclid(7);
            shift_days(today, ahead)
        }
    }
}

fn week(today: NaiveDate, offset: i64) -> Option<(NaiveDate, NaiveDate, Span)> {
    let monday = shift_days(today, -i64::from(today.weekday().num_days_from_monday()))?;
    let start = shift_days(monday, 7 * offset)?;
    Some((start, shift_days(start, 6)?, Span::Week))
}

fn month(today: NaiveDate, offset: i64) -> Option<(NaiveDate, NaiveDate, Span)> {
    let first = shift_months(today.with_day(1)?, offset)?;
    let last = shift_days(shift_months(first, 1)?, -1)?;
    Some((first, last, Span::Month))
}

fn year(today: NaiveDate, offset: i64) -> Option<(NaiveDate, NaiveDate, Span)> {
    let year = today.year().checked_add(i32::try_from(offset).ok()?)?;
    Some((
        NaiveDate::from_ymd_opt(year, 1, 1)?,
        NaiveDate::from_ymd_opt(year, 12, 31)?,
        Span::Year,
    ))
}

/// The day `amount` units from today (a week is seven days).
fn amount_from(today: NaiveDate, amount: i64, unit: &str) -> Option<(NaiveDate, NaiveDate, Span)> {
    let date = match unit {
        "day" => shift_days(today, amount)?,
        "week" => shift_days(today, amount.checked_mul(7)?)?,
        "month" => shift_months(today, amount)?,
        _ => shift_months(today, amount.checked_mul(12)?)?,
    };
    Some((date, date, Span::Day))
}

fn zh_offset(word: &str) -> i64 {
    match word {
        "下" => 1,
        "上" => -1,
        _ => 0,
    }
}

/// The month a name or its common abbreviation means (1 to 12).
fn en_month(word: &str) -> Option<u32> {
    let word = word.to_ascii_lowercase();
    let prefix = word.get(..3)?;
    [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ]
    .iter()
    .position(|month| *month == prefix)
    .map(|index| index as u32 + 1)
}

fn en_weekday(word: &str) -> Option<Weekday> {
    word.to_ascii_lowercase().parse().ok()
}

fn zh_weekday(word: &str) -> Option<Weekday> {
    Some(match word {
        "一" => Weekday::Mon,
        "二" => Weekday::Tue,
        "三" => Weekday::Wed,
        "四" => Weekday::Thu,
        "五" => Weekday::Fri,
        "六" => Weekday::Sat,
        "日" | "天" => Weekday::Sun,
        _ => return None,
    })
}

fn en_number(word: &str) -> Option<i64> {
    const WORDS: [&str; 12] = [
        "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
        "twelve",
    ];
    let word = word.to_ascii_lowercase();
    if word == "a" || word == "an" {
        return Some(1);
    }
    if let Some(position) = WORDS.iter().position(|w| *w == word) {
        return i64::try_from(position + 1).ok();
    }
    word.parse().ok()
}

/// Digits, or Chinese numerals up to 99 (十, 十二, 二十, 二十五, 两).
fn zh_number(word: &str) -> Option<i64> {
    if let Ok(number) = word.parse() {
        return Some(number);
    }
    let digit = |c: char| -> Option<i64> {
        Some(match c {
            '一' => 1,
            '二' | '两' => 2,
            '三' => 3,
            '四' => 4,
            '五' => 5,
            '六' => 6,
            '七' => 7,
            '八' => 8,
            '九' => 9,
            _ => return None,
        })
    };
    let chars: Vec<char> = word.chars().collect();
    match chars.as_slice() {
        [c] if *c == '十' => Some(10),
        [c] => digit(*c),
        ['十', ones] => Some(10 + digit(*ones)?),
        [tens, '十'] => Some(digit(*tens)? * 10),
        [tens, '十', ones] => Some(digit(*tens)? * 10 + digit(*ones)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_asks_about_the_days_its_dates_name() {
        let asked = wednesday();
        let day = |y, m, d| NaiveDate::from_ymd_opt(y, m, d).unwrap();
        let window = |query: &str| query_window(query, asked);
        // A named month is the last one up to the asking month, or the year's if given.
        assert_eq!(
            window("What did the vet find wrong with Mochi in February?"),
            Some((day(2026, 2, 1), day(2026, 2, 28)))
        );
        assert_eq!(
            window("Where are they going on holiday in December?"),
            Some((day(2025, 12, 1), day(2025, 12, 31)))
        );
        assert_eq!(
            window("What did the vet do in March 2025?"),
            Some((day(2025, 3, 1), day(2025, 3, 31)))
        );
        assert_eq!(
            window("What happened on June 3rd, 2025?"),
            Some((day(2025, 6, 1), day(2025, 6, 30)))
        );
        // Several dates: from the first day to the last.
        assert_eq!(
            window("How did her swimming change between January and March?"),
            Some((day(2026, 1, 1), day(2026, 3, 31)))
        );
        // Relative dates, against the asking day.
        assert_eq!(
            window("what did I say yesterday"),
            Some((day(2026, 11, 24), day(2026, 11, 24)))
        );
        assert_eq!(
            window("我三月份说过什么"),
            Some((day(2026, 3, 1), day(2026, 3, 31)))
        );
        assert_eq!(
            window("2025年5月的旅行"),
            Some((day(2025, 5, 1), day(2025, 5, 31)))
        );
        // Verbs and lengths are not months; no date, no window.
        assert_eq!(window("May I ask what we decided about the launch?"), None);
        assert_eq!(window("they may march on"), None);
        assert_eq!(window("我们三个月没见了"), None);
        assert_eq!(window("What are the names of Andrew's dogs?"), None);
        assert_eq!(window("What happened on Friday?"), None);
    }

    /// Wednesday 2026-11-25, 15:00 UTC.
    fn wednesday() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-25T15:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn tags(text: &str) -> Vec<String> {
        resolve(text, wednesday())
            .iter()
            .map(ResolvedDate::tag)
            .collect()
    }

    #[test]
    fn days_around_today() {
        assert_eq!(tags("Call mum tomorrow"), ["2026-11-26"]);
        assert_eq!(
            tags("I saw it yesterday, and today too"),
            ["2026-11-24", "2026-11-25"]
        );
        assert_eq!(tags("the day after tomorrow"), ["2026-11-27"]);
        assert_eq!(tags("The day before yesterday I ran 10k"), ["2026-11-23"]);
        assert_eq!(
            tags("明天开会，后天出差，大后天回来"),
            ["2026-11-26", "2026-11-27", "2026-11-28"]
        );
        assert_eq!(
            tags("昨天和前天都下雨，大前天没有"),
            ["2026-11-24", "2026-11-23", "2026-11-22"]
        );
    }

    #[test]
    fn weekdays_of_this_next_and_last_week() {
        // Said on a Wednesday: next Wednesday is a week on, this Friday two days on.
        assert_eq!(tags("Dentist next Wednesday"), ["2026-12-02"]);
        assert_eq!(tags("dentist next monday"), ["2026-11-30"]);
        assert_eq!(tags("The party is this Friday"), ["2026-11-27"]);
        assert_eq!(tags("coming Monday"), ["2026-11-30"]);
        assert_eq!(tags("this Wednesday"), ["2026-11-25"]);
        assert_eq!(tags("We met last Friday"), ["2026-11-20"]);
        assert_eq!(tags("记住我下周三要去上海出差"), ["2026-12-02"]);
        assert_eq!(tags("上周五我们吃了火锅"), ["2026-11-20"]);
        assert_eq!(
            tags("这周日休息，下星期天加班，下礼拜一开会"),
            ["2026-11-29", "2026-12-06", "2026-11-30"]
        );
    }

    #[test]
    fn weeks_months_and_years() {
        let next_week = &resolve("Let's meet next week", wednesday())[0];
        assert_eq!(next_week.describe(), "2026-11-30 to 2026-12-06");
        assert_eq!(next_week.tag(), "2026-W49");
        assert_eq!(tags("last month"), ["2026-10"]);
        assert_eq!(tags("This year has been long"), ["2026"]);
        assert_eq!(tags("next year"), ["2027"]);
        assert_eq!(
            tags("下个月去日本，上个月在北京，本月在家"),
            ["2026-12", "2026-10", "2026-11"]
        );
        assert_eq!(tags("明年结婚，去年搬家"), ["2027", "2025"]);
        // Said in November 2026.
        assert_eq!(tags("The wedding is next June"), ["2027-06"]);
        assert_eq!(tags("We moved last March"), ["2026-03"]);
        assert_eq!(
            tags("last November and next November"),
            ["2025-11", "2027-11"]
        );
        assert_eq!(tags("this December, coming Jan"), ["2026-12", "2027-01"]);
        assert_eq!(
            resolve("next June", wednesday())[0].describe(),
            "2027-06-01 to 2027-06-30"
        );
        // A month alone is not relative (in May: which May?), nor is "may" the verb.
        assert!(tags("I may go in May").is_empty());
        assert!(tags("this may be hard, next may be easier").is_empty());
        assert_eq!(tags("next May"), ["2027-05"]);
        assert_eq!(tags("下周很忙"), ["2026-W49"]);
    }

    #[test]
    fn amounts_from_now() {
        assert_eq!(tags("The results come in two weeks"), ["2026-12-09"]);
        assert_eq!(tags("in 3 days"), ["2026-11-28"]);
        assert_eq!(tags("I moved here a year ago"), ["2025-11-25"]);
        assert_eq!(tags("six months ago"), ["2026-05-25"]);
        assert_eq!(tags("三天后出发"), ["2026-11-28"]);
        assert_eq!(tags("两周前"), ["2026-11-11"]);
        assert_eq!(tags("十二个月以后"), ["2027-11-25"]);
        assert_eq!(tags("20天之前"), ["2026-11-05"]);
    }

    #[test]
    fn what_is_not_relative_is_left_alone() {
        assert_eq!(
            tags("三天前天气很好"),
            ["2026-11-22"],
            "three days ago, not 前天"
        );
        assert!(tags("以前天天加班").is_empty());
        assert!(tags("请说明天数").is_empty());
        assert_eq!(tags("今天气温很低"), ["2026-11-25"]);
        assert_eq!(tags("明天天气很好"), ["2026-11-26"]);
        assert!(tags("I was born on 1990-05-03").is_empty());
        assert!(tags("On Friday we go").is_empty());
        assert!(tags("The Next Generation; yesterdays; todays").is_empty());
        assert!(tags("").is_empty());
    }

    #[test]
    fn phrases_are_kept_as_said_in_order() {
        let found = resolve("Tomorrow, then next Friday", wednesday());
        let phrases: Vec<&str> = found.iter().map(|r| r.phrase.as_str()).collect();
        assert_eq!(phrases, ["Tomorrow", "next Friday"]);
        assert_eq!(found[1].describe(), "Fri 2026-12-04");
    }

    #[test]
    fn extreme_moments_resolve_or_are_left_out_without_panicking() {
        for moment in [DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC] {
            let found = resolve(
                "tomorrow, yesterday, next year, in 999 years, 99年前",
                moment,
            );
            assert!(found.len() <= 5);
        }
    }
}
