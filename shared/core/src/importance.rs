//! The importance heuristics of the write path, and the category a text most likely belongs to.
//!
//! Importance starts from a neutral base and moves by the signals the rules find:
//! +0.5 an explicit request to save or pin, +0.3 a persistent preference, commitment or goal,
//! +0.2 confident metadata (confidence ≥ 0.6), −0.1 chit-chat; the result is clamped to [0, 1].
//! Rules cover English and Chinese.

use std::sync::LazyLock;

use regex::{Regex, RegexSet};

use crate::category::Category;

/// Importance of a memory with no signal at all.
pub const BASE_IMPORTANCE: f64 = 0.3;
pub const EXPLICIT_SAVE_BOOST: f64 = 0.5;
pub const PERSISTENT_BOOST: f64 = 0.3;
pub const CONFIDENT_METADATA_BOOST: f64 = 0.2;
pub const CHIT_CHAT_PENALTY: f64 = 0.1;
/// Metadata counts as confident from this mean detector confidence on.
pub const CONFIDENT_METADATA_THRESHOLD: f64 = 0.6;

/// What the rules found in one text.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ImportanceSignals {
    /// The user asked to save or pin (by flag, or by saying so in the text).
    pub explicit_save: bool,
    /// A lasting preference, commitment or goal.
    pub persistent: bool,
    /// Metadata extraction was confident (mean confidence ≥ 0.6).
    pub confident_metadata: bool,
    /// Greetings, thanks, acknowledgements: nothing worth keeping for long.
    pub chit_chat: bool,
}

impl ImportanceSignals {
    pub fn score(&self) -> f64 {
        let mut importance = BASE_IMPORTANCE;
        if self.explicit_save {
            importance += EXPLICIT_SAVE_BOOST;
        }
        if self.persistent {
            importance += PERSISTENT_BOOST;
        }
        if self.confident_metadata {
            importance += CONFIDENT_METADATA_BOOST;
        }
        if self.chit_chat {
            importance -= CHIT_CHAT_PENALTY;
        }
        importance.clamp(0.0, 1.0)
    }
}

/// The importance gained by the n-th repetition of a memory: diminishing, so that repetition
/// raises importance without letting spam saturate it at once.
pub fn repeat_boost(repeat_count: u32) -> f64 {
    if repeat_count == 0 {
        0.0
    } else {
        0.1 / f64::from(repeat_count).sqrt()
    }
}

/// The importance of an entry after a near-duplicate merged into it.
pub fn merged_importance(existing: f64, incoming: f64, new_repeat_count: u32) -> f64 {
    (existing.max(incoming) + repeat_boost(new_repeat_count)).clamp(0.0, 1.0)
}

struct Rules {
    explicit_save: RegexSet,
    preference: RegexSet,
    commitment: RegexSet,
    goal: RegexSet,
    guideline: RegexSet,
    decision: RegexSet,
    experience: RegexSet,
    chit_chat: Regex,
}

fn set(patterns: &[&str]) -> RegexSet {
    RegexSet::new(patterns).expect("valid importance rule")
}

static RULES: LazyLock<Rules> = LazyLock::new(|| {
    Rules {
    explicit_save: set(&[
        r"(?i)\b(please\s+)?(remember|memori[sz]e|save|keep in mind)\b.{0,12}\b(that|this)\b",
        r"(?i)^\s*(please\s+)?(remember|save|pin)\b",
        r"(?i)\bdon'?t forget\b",
        r"记住|记一下|别忘了|不要忘记|保存(这|一下)|置顶",
    ]),
    preference: set(&[
        r"(?i)\bi\s+(really\s+|much\s+|strongly\s+)?(like|love|prefer|enjoy|hate|dislike|adore|loathe)\b",
        r"(?i)\bi\s+(can'?t|cannot)\s+stand\b",
        r"(?i)\bmy\s+(favou?rite|preferred)\b",
        r"(?i)\bi'?m\s+(a\s+)?(vegetarian|vegan|allergic|lactose)",
        r"(?i)\bi\s+am\s+(a\s+)?(vegetarian|vegan|allergic|lactose)",
        r"(?i)\bi\s+(always|never|usually)\b",
        r"(?i)\bi'?d\s+rather\b",
        r"我(很|非常|最|更|比较|真的)?(喜欢|爱|偏好|讨厌|不喜欢|习惯|受不了)",
        r"我(总是|从不|一向|通常)",
        r"我(对.{1,8})?过敏|我是素食",
        r"我最(爱|喜欢)的",
    ]),
    commitment: set(&[
        r"(?i)\bi\s+(will|promise|have to|need to|must|am going to)\b",
        r"(?i)\bi'?ll\b",
        r"(?i)\bi'?m\s+going\s+to\b",
        r"(?i)\bremind me\b",
        r"(?i)\b(deadline|due (on|by)|by (monday|tuesday|wednesday|thursday|friday|saturday|sunday|tomorrow|next week))\b",
        r"(?i)\b(every|each)\s+(day|week|month|monday|tuesday|wednesday|thursday|friday|saturday|sunday|morning|evening)\b",
        r"我(会|要|必须|需要|答应|承诺)",
        r"提醒我|截止|每(天|周|个?月|个?星期)",
    ]),
    goal: set(&[
        r"(?i)\bmy\s+(goal|plan|aim|objective|dream)\b",
        r"(?i)\bi\s+(want|plan|hope|intend|aim)\s+to\b",
        r"(?i)\bi'?m\s+(trying|planning|aiming|learning)\b",
        r"我的(目标|计划|梦想)|我(打算|计划|希望|想要|想学|正在学)",
    ]),
    guideline: set(&[
        r"(?i)\b(always|never|please)\s+(respond|answer|reply|use|write|call me|address me)\b",
        r"(?i)\b(you|the assistant)\s+should\b",
        r"(?i)\bfrom now on\b",
        r"以后(请|回答|都)|请(用|始终|总是|不要)|你应该",
    ]),
    decision: set(&[
        r"(?i)\b(we|i)\s+(decided|agreed|chose|settled on)\b",
        r"(?i)\b(decision|the plan is)\b",
        r"(我们|我)(决定|选择了|定了)",
    ]),
    experience: set(&[
        r"(?i)\bi\s+(went|visited|worked|lived|studied|grew up|moved|met|have been|used to)\b",
        r"(?i)\bi'?ve\s+(been|worked|lived|visited)\b",
        r"我(去过|曾经|以前|住过|在.{1,10}工作过)",
    ]),
    chit_chat: Regex::new(
        r"(?ix)^[\s\p{P}]*(
            hi|hello|hey|yo|thanks|thank\s+you|thx|ok|okay|k|cool|nice|great|lol|haha|sure|yes|no|yep|nope|
            good\s+(morning|afternoon|evening|night)|how\s+are\s+you|bye|see\s+you|
            你好|您好|谢谢|多谢|好的|好|嗯|哈哈+|早上好|晚安|再见|拜拜|没事|可以
        )([\s\p{P}]+(
            hi|hello|hey|there|thanks|thank\s+you|a\s+lot|so\s+much|ok|okay|cool|lol|haha|
            bye|goodbye|see\s+you|later|cheers|
            谢谢|好的|哈哈+|嗯|啊|呀|呢|了
        ))*[\s\p{P}\p{So}]*$",
    )
    .expect("valid chit-chat rule"),
}
});

/// Applies the rules to a text. `explicit_flag` is the request's save/pin flag; the text can
/// also ask to be saved ("remember that ...", "记住...").
pub fn classify(text: &str, explicit_flag: bool, metadata_confidence: f64) -> ImportanceSignals {
    let rules = &*RULES;
    ImportanceSignals {
        explicit_save: explicit_flag || rules.explicit_save.is_match(text),
        persistent: rules.preference.is_match(text)
            || rules.commitment.is_match(text)
            || rules.goal.is_match(text),
        confident_metadata: metadata_confidence >= CONFIDENT_METADATA_THRESHOLD,
        chit_chat: rules.chit_chat.is_match(text),
    }
}

/// Whether a text is nothing but greetings, thanks or acknowledgements ("thanks a lot!", "好的"):
/// the chit-chat signal of [`classify`] alone, for callers that sift many sentences.
pub fn is_chit_chat(text: &str) -> bool {
    RULES.chit_chat.is_match(text)
}

/// The category a text most likely belongs to, for writes that do not say.
pub fn infer_category(text: &str) -> Category {
    let rules = &*RULES;
    if rules.guideline.is_match(text) {
        Category::Guideline
    } else if rules.decision.is_match(text) {
        Category::Decision
    } else if rules.preference.is_match(text) {
        Category::Preference
    } else if rules.goal.is_match(text) {
        Category::Goal
    } else if rules.commitment.is_match(text) {
        Category::Todo
    } else if rules.experience.is_match(text) {
        Category::Experience
    } else {
        Category::Fact
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn importance(text: &str) -> f64 {
        classify(text, false, 0.0).score()
    }

    #[test]
    fn preferences_commitments_and_goals_are_persistent() {
        for text in [
            "I prefer dark mode in every editor",
            "I really like green tea",
            "I can't stand loud open offices",
            "My favorite language is Rust",
            "I'm allergic to peanuts",
            "I will send the report by Friday",
            "Remind me to call mom every Sunday",
            "My goal is to run a marathon this year",
            "I want to learn Japanese",
            "我喜欢喝绿茶",
            "我对花生过敏",
            "我打算明年去日本",
            "我的目标是跑完马拉松",
            "每周二上午十点开组会",
        ] {
            assert!(classify(text, false, 0.0).persistent, "{text}");
            assert!(
                (importance(text) - 0.6).abs() < 1e-9,
                "{text}: {}",
                importance(text)
            );
        }
    }

    #[test]
    fn neutral_statements_keep_the_base() {
        for text in ["The build server is in Frankfurt", "服务器在法兰克福"] {
            let signals = classify(text, false, 0.0);
            assert_eq!(signals, ImportanceSignals::default(), "{text}");
            assert!((signals.score() - BASE_IMPORTANCE).abs() < 1e-9);
        }
    }

    #[test]
    fn chit_chat_is_penalised() {
        for text in [
            "hi",
            "Thanks a lot!",
            "ok cool",
            "good morning",
            "哈哈哈",
            "谢谢！",
            "好的",
        ] {
            assert!(classify(text, false, 0.0).chit_chat, "{text}");
            assert!((importance(text) - 0.2).abs() < 1e-9, "{text}");
        }
        // A greeting followed by content is not chit-chat.
        assert!(!classify("hi, I moved to Lisbon last month", false, 0.0).chit_chat);
    }

    #[test]
    fn explicit_saves_by_flag_or_words() {
        assert!(classify("The wifi password is hunter2", true, 0.0).explicit_save);
        assert!(classify("Please remember that my wife is called Ana", false, 0.0).explicit_save);
        assert!(classify("记住我的护照号在抽屉里", false, 0.0).explicit_save);
        // Explicit and persistent together: 0.3 + 0.5 + 0.3 = 1.1, clamped to 1.
        assert_eq!(
            classify("Remember that I love sushi", false, 0.0).score(),
            1.0
        );
    }

    #[test]
    fn confident_metadata_adds_a_fifth() {
        let signals = classify("The build server is in Frankfurt", false, 0.6);
        assert!(signals.confident_metadata);
        assert!((signals.score() - 0.5).abs() < 1e-9);
        assert!(!classify("x", false, 0.59).confident_metadata);
    }

    #[test]
    fn repetition_raises_importance_with_diminishing_steps() {
        let once = merged_importance(0.3, 0.3, 1);
        let twice = merged_importance(once, 0.3, 2);
        assert!(once > 0.3 && twice > once);
        assert!(twice - once < once - 0.3);
        assert_eq!(merged_importance(0.95, 0.3, 1), 1.0);
        // An explicit save arriving as a repeat lifts the entry to the explicit importance.
        assert!((merged_importance(0.3, 0.8, 1) - 0.9).abs() < 1e-9);
    }

    #[test]
    fn infers_categories() {
        assert_eq!(
            infer_category("I prefer tabs over spaces"),
            Category::Preference
        );
        assert_eq!(
            infer_category("Always respond in British English"),
            Category::Guideline
        );
        assert_eq!(
            infer_category("We decided to ship on Monday"),
            Category::Decision
        );
        assert_eq!(infer_category("My goal is to learn Rust"), Category::Goal);
        assert_eq!(
            infer_category("Remind me to renew my passport"),
            Category::Todo
        );
        assert_eq!(
            infer_category("I lived in Tokyo for three years"),
            Category::Experience
        );
        assert_eq!(infer_category("The office wifi is slow"), Category::Fact);
        assert_eq!(infer_category("以后请用中文回答"), Category::Guideline);
        assert_eq!(infer_category("我们决定周五发布"), Category::Decision);
        assert_eq!(infer_category("我喜欢猫"), Category::Preference);
    }
}
