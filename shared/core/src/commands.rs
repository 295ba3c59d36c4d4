//! Natural-language memory commands: a user message such as "forget that", "pin this",
//! "remember that my flight is on Friday", "turn memory off", "start incognito for this chat", or
//! their Chinese forms. A message is a command only when the whole of it says so; anything else is
//! no command, so ordinary conversation never changes memory by accident.

use std::sync::LazyLock;

use regex::Regex;

use crate::normalize::is_default_ignorable;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryCommand {
    /// Forget the memory most recently written in this conversation.
    ForgetLast,
    /// Pin the memory most recently written in this conversation.
    PinLast,
    /// Save this text as an explicit memory.
    Remember(String),
    MemoryOff,
    MemoryOn,
    IncognitoStart,
    IncognitoEnd,
    /// "What do you remember about X": answer with what retrieval finds for X.
    Recall(String),
}

struct Grammar {
    politeness_prefix: Regex,
    politeness_suffix: Regex,
    forget_last: Regex,
    retraction: Regex,
    pin_last: Regex,
    remember: Regex,
    courtesy_after_content: Regex,
    chinese_acknowledgement: Regex,
    reminiscence: Regex,
    memory_off: Regex,
    memory_on: Regex,
    incognito_start: Regex,
    incognito_end: Regex,
    recall: Regex,
}

/// What "forget ..." may name in Chinese: this, that, it, what was just said, the last one.
const CHINESE_LAST: &str = "(?:这个|那个|这条|那条|它|刚才(?:那句|说的)?|上一条)";

fn rule(pattern: &str) -> Regex {
    Regex::new(pattern).expect("valid command rule")
}

static GRAMMAR: LazyLock<Grammar> = LazyLock::new(|| Grammar {
    politeness_prefix: rule(
        r"(?i)^(?:(?:hey|ok|okay)\s+(?:assistant|engram)?[,\s]*|(?:please|pls|kindly)[,\s]+|(?:can|could|would|will)\s+you\s+(?:please\s+)?|(?:i\s+want\s+you\s+to|i'd\s+like\s+you\s+to)\s+|[请請]你?|麻[烦煩]你?|[帮幫]我|能不能|可以)+",
    ),
    politeness_suffix: rule(
        r"(?i)(?:[,\s]+(?:please|thanks|thank\s+you|for\s+me))+$|(?:吧|吗|呢|谢谢|，谢谢)+$",
    ),
    // "Forget it" and "忘了吧" mean "never mind", and a bare "忘了" is "I forgot": none of them
    // deletes anything. "Delete it" does.
    forget_last: rule(&format!(
        r"(?i)^(?:(?:forget|delete|remove|erase)\s+(?:that|this|what\s+i\s+(?:just\s+)?said|the\s+last\s+(?:one|thing|memory))|(?:delete|remove|erase)\s+it)(?:\s+(?:memory|from\s+(?:your\s+)?memory))?$|^(?:(?:忘掉|忘记|删除|删掉)(?:{CHINESE_LAST})?|忘了{CHINESE_LAST})(?:记忆)?$",
    )),
    // Taking back what was just said: "Actually, forget that.", "never mind, forget it",
    // "don't save that", "算了，别记了". A bare "forget it" stays "never mind" (above); with a cue
    // that the speaker takes something back, it deletes.
    retraction: rule(
        r"(?i)^(?:(?:actually|oh|wait|hmm+|no|nope|never\s*mind|nevermind|scratch\s+that|on\s+second\s+thought|sorry|on\s+reflection)[,.!…\s]+)+(?:(?:just\s+)?(?:forget|delete|remove|erase|drop)\s+(?:it|that|this)|(?:don'?t|do\s+not)\s+(?:remember|save|keep|store|note)\s+(?:it|that|this))(?:\s+(?:then|after\s+all))?$|^(?:don'?t|do\s+not)\s+(?:remember|save|keep|store)\s+(?:that|this)$|^(?:(?:算了|不对|等等|哎)[，,、\s]*)*(?:别记了|不用记了|不要记了|别记(?:这个|那个|这条|那条)了?|不要记(?:这个|那个|这条|那条)了?|忘了它|忘掉它)$",
    ),
    pin_last: rule(
        r"(?i)^pin\s+(?:this|that|it)(?:\s+memory)?$|^keep\s+(?:this|that)\s+(?:pinned|forever)$|^(?:置顶|固定|钉住)(?:这个|那个|这条|那条|它)?(?:记忆)?$|^把(?:这个|这条|它)(?:记忆)?(?:置顶|固定|钉住)$",
    ),
    // The verb must end at a separator: "Remembering names is hard" is no command.
    remember: rule(
        r"(?is)^(?:remember|memori[sz]e|note\s+down)(?:\s*[:：,，;；—–]+\s*|\s*(?:\.{2,}|…)\s*|\s+(?:that\s+)?)(?P<content>.*)$|^(?:记住|记一下|记得|记下|記住|記一下|記得|記下)(?:[:：,，\s]*)(?P<content_zh>.+)$",
    ),
    courtesy_after_content: rule(
        r"(?i)(?:\s*[,，;]\s*(?:please|pls|thanks|thank\s+you|thx|ty)|\s*[,，;]?\s*(?:谢谢|多谢|谢了|謝謝|多謝))+$",
    ),
    // What follows 记住/记下/记得 in a reply or a question rather than an instruction: "记住了"
    // (got it), "记得吗" (remember?), "记下了，谢谢" (noted, thanks).
    chinese_acknowledgement: rule(r"^(?:了|吗|呢|吧|啊|哦|没有?)+$"),
    // "Remember when we went to Paris", "remember me?": reminiscing, not an instruction.
    reminiscence: rule(r"(?i)^(?:when|how|if|whether|me|us)\b"),
    memory_off: rule(
        r"(?i)^(?:turn|switch)\s+(?:your\s+)?memory\s+off$|^(?:turn|switch)\s+off\s+(?:your\s+)?memory$|^(?:disable|pause)\s+(?:your\s+)?memory$|^stop\s+remembering(?:\s+things)?$|^(?:关闭|关掉|停用|暂停)(?:你的)?记忆(?:功能)?$|^不要再记(?:住)?(?:任何东西)?了?$",
    ),
    memory_on: rule(
        r"(?i)^(?:turn|switch)\s+(?:your\s+)?memory\s+(?:back\s+)?on$|^(?:turn|switch)\s+on\s+(?:your\s+)?memory$|^(?:enable|resume)\s+(?:your\s+)?memory$|^start\s+remembering(?:\s+again)?$|^(?:打开|开启|启用|恢复)(?:你的)?记忆(?:功能)?$",
    ),
    incognito_start: rule(
        r"(?i)^(?:start|enable|turn\s+on|begin|enter|use)\s+incognito(?:\s+mode)?(?:\s+(?:for|in)\s+this\s+(?:chat|conversation))?$|^go\s+incognito(?:\s+(?:for|in)\s+this\s+(?:chat|conversation))?$|^(?:这次对话|本次对话|这个对话)?(?:开启|开始|进入|打开|使用)(?:无痕|隐身)(?:模式)?$|^(?:无痕|隐身)模式$",
    ),
    incognito_end: rule(
        r"(?i)^(?:stop|end|exit|leave|disable|turn\s+off|quit)\s+incognito(?:\s+mode)?(?:\s+(?:for|in)\s+this\s+(?:chat|conversation))?$|^(?:关闭|结束|退出|停止)(?:无痕|隐身)(?:模式)?$",
    ),
    recall: rule(
        r"(?is)^(?:what|which\s+things)\s+do\s+you\s+(?:remember|know|recall)\s+about\s+(?P<topic>.+)$|^(?:tell\s+me\s+)?what\s+you\s+(?:remember|know|recall)\s+about\s+(?P<topic2>.+)$|^do\s+you\s+(?:still\s+)?remember\s+(?:anything\s+about\s+)?(?P<topic3>.+)$|^你(?:还)?(?:记得|记住了)(?:关于)?(?P<topic_zh>.+?)(?:的(?:什么|哪些(?:事|事情|东西)?)|什么)?$|^关于(?P<topic_zh2>.+?)你(?:还)?(?:记得|知道)(?:些)?什么$",
    ),
});

/// Recognises a memory command in a user message, or `None` for ordinary conversation.
pub fn parse_command(message: &str) -> Option<MemoryCommand> {
    let grammar = &*GRAMMAR;
    // Emoji, quotes and the like around a message decorate it: "🙏 forget that" is a command.
    let trimmed = message
        .trim_start_matches(is_decoration)
        .trim_end_matches(['.', '!', '?', '。', '！', '？', '~', ' ']);
    let without_prefix = grammar.politeness_prefix.replace(trimmed, "");
    let without_prefix = without_prefix.trim();
    // Politeness suffixes ("... please", "...吧") are dropped here for control commands only: in a
    // "remember ..." message they may be part of what the user wants remembered, so that rule
    // drops only courtesy set off by a comma.
    let core = grammar.politeness_suffix.replace(without_prefix, "");
    // A control command names no content, so whatever decorates its end can go too ("pin this
    // 📌"); a "remember ..." keeps its end, which may be part of what to remember.
    let core = core.trim().trim_end_matches(is_decoration);
    if core.is_empty() {
        return None;
    }

    if grammar.forget_last.is_match(core) || grammar.retraction.is_match(core) {
        return Some(MemoryCommand::ForgetLast);
    }
    if grammar.pin_last.is_match(core) {
        return Some(MemoryCommand::PinLast);
    }
    if grammar.memory_off.is_match(core) {
        return Some(MemoryCommand::MemoryOff);
    }
    if grammar.memory_on.is_match(core) {
        return Some(MemoryCommand::MemoryOn);
    }
    if grammar.incognito_start.is_match(core) {
        return Some(MemoryCommand::IncognitoStart);
    }
    if grammar.incognito_end.is_match(core) {
        return Some(MemoryCommand::IncognitoEnd);
    }
    if let Some(captures) = grammar.recall.captures(core) {
        let topic = ["topic", "topic2", "topic3", "topic_zh", "topic_zh2"]
            .iter()
            .find_map(|name| captures.name(name))
            .map(|m| m.as_str().trim())
            .unwrap_or_default();
        if !topic.is_empty() {
            return Some(MemoryCommand::Recall(topic.to_owned()));
        }
    }
    // "Remember when we went to Paris?" and "记得吗？" ask; "Could you remember that ...?" asks
    // politely for the same thing as "Remember that ...".
    let asked_politely = without_prefix.len() < trimmed.len();
    if is_question(message) && !asked_politely {
        return None;
    }
    let captures = grammar.remember.captures(without_prefix)?;
    let content = captures
        .name("content")
        .or_else(|| captures.name("content_zh"))
        .map(|m| m.as_str())
        .unwrap_or_default();
    // "..., please" after the content is courtesy; "... say thank you" is content.
    let content = content
        .trim()
        .trim_start_matches([',', '，', ':', '：', ';', '；'])
        .trim();
    let content = grammar.courtesy_after_content.replace(content, "");
    let mut content = content
        .trim()
        .trim_end_matches(['.', '!', '。', '！', ',', '，'])
        .trim();
    // A trailing 吗/呢 makes a Chinese sentence a question, with or without "？".
    if content.ends_with(CHINESE_QUESTION_PARTICLES) {
        if !asked_politely {
            return None;
        }
        // "可以记下我的地址吗": a polite request; the particle is no part of the content.
        content = content
            .trim_end_matches(CHINESE_QUESTION_PARTICLES)
            .trim_end();
    }
    if names_no_content(grammar, content) || grammar.reminiscence.is_match(content) {
        return None;
    }
    Some(MemoryCommand::Remember(content.to_owned()))
}

const CHINESE_QUESTION_PARTICLES: [char; 2] = ['吗', '呢'];

/// Neither a letter nor a digit (CJK characters are letters): punctuation, symbols, emoji,
/// spacing.
fn is_decoration(c: char) -> bool {
    !c.is_alphanumeric()
}

fn is_question(message: &str) -> bool {
    message
        .trim_end()
        .trim_end_matches(['!', '！'])
        .trim_end()
        .ends_with(['?', '？'])
}

/// "remember this", "remember that, please", "remember this one, ok", "记住这个吧", "记住了":
/// nothing to remember beyond a reference to what was said before, or no instruction at all.
/// Text made only of invisible characters names nothing either.
fn names_no_content(grammar: &Grammar, content: &str) -> bool {
    let visible: String = content
        .chars()
        .filter(|&c| !is_default_ignorable(c))
        .collect::<String>()
        .to_lowercase();
    let mut reference = visible.trim();
    // Peel what may close a bare reference, in any order: "this, ok", "这个吧", "that one please".
    loop {
        let peeled = REFERENCE_CLOSINGS
            .iter()
            .find_map(|closing| reference.strip_suffix(closing))
            .unwrap_or(reference)
            .trim_end_matches(|c: char| c.is_whitespace() || is_decoration(c));
        if peeled.len() == reference.len() {
            break;
        }
        reference = peeled;
    }
    NO_CONTENT.contains(&reference) || grammar.chinese_acknowledgement.is_match(reference)
}

/// What may close a bare reference without naming anything: courtesy, assent, particles.
const REFERENCE_CLOSINGS: &[&str] = &[
    " please",
    " for me",
    " ok",
    " okay",
    " thanks",
    " thank you",
    "吧",
    "啊",
    "呀",
    "哦",
    "哈",
    "啦",
    "好吗",
    "好吧",
    "谢谢",
];

/// What may follow "remember" without naming anything to remember: a pointer back to what was
/// said ("this one", "这一点"), or to the speaker ("me": "remember me" asks to be recognised).
const NO_CONTENT: &[&str] = &[
    "",
    "this",
    "that",
    "it",
    "this one",
    "that one",
    "these",
    "those",
    "me",
    "us",
    "please",
    "thanks",
    "thank you",
    "thx",
    "ok",
    "okay",
    "这个",
    "那个",
    "这",
    "那",
    "这些",
    "那些",
    "这一点",
    "这点",
    "那一点",
    "这条",
    "那条",
    "这一条",
    "这句",
    "这句话",
    "那句话",
    "它",
    "我",
    "我们",
    "谢谢",
];

#[cfg(test)]
mod tests {
    use super::*;
    use MemoryCommand::*;

    #[test]
    fn recognises_english_commands() {
        let cases = [
            ("forget that", ForgetLast),
            ("Please forget that.", ForgetLast),
            ("can you forget what I just said?", ForgetLast),
            ("delete that memory", ForgetLast),
            ("delete it", ForgetLast),
            ("pin this", PinLast),
            ("Pin that, please", PinLast),
            ("turn memory off", MemoryOff),
            ("Turn off memory!", MemoryOff),
            ("disable memory", MemoryOff),
            ("turn memory back on", MemoryOn),
            ("enable memory", MemoryOn),
            ("start incognito for this chat", IncognitoStart),
            ("go incognito", IncognitoStart),
            ("stop incognito", IncognitoEnd),
            ("exit incognito mode", IncognitoEnd),
            ("forget that!!! 😡", ForgetLast),
            ("Actually, forget that.", ForgetLast),
            ("never mind, forget it", ForgetLast),
            ("Oh wait, don't save that.", ForgetLast),
            ("don't remember this", ForgetLast),
            ("算了，别记了", ForgetLast),
            ("别记这个了", ForgetLast),
            ("🙏 forget that", ForgetLast),
            ("pin this 📌", PinLast),
            ("\"turn memory off\"", MemoryOff),
        ];
        for (message, expected) in cases {
            assert_eq!(parse_command(message), Some(expected), "{message}");
        }
    }

    #[test]
    fn remember_carries_its_content() {
        assert_eq!(
            parse_command("Remember that my flight to Lisbon is on Friday."),
            Some(Remember("my flight to Lisbon is on Friday".into()))
        );
        assert_eq!(
            parse_command("please remember: I take my coffee black"),
            Some(Remember("I take my coffee black".into()))
        );
        assert_eq!(
            parse_command("记住：我对花生过敏"),
            Some(Remember("我对花生过敏".into()))
        );
        assert_eq!(
            parse_command("请帮我记住我的生日是五月三号"),
            Some(Remember("我的生日是五月三号".into()))
        );
        assert_eq!(
            parse_command("记住我常去的那家酒吧"),
            Some(Remember("我常去的那家酒吧".into()))
        );
        assert_eq!(parse_command("remember that"), None);
        assert_eq!(parse_command("remember this!"), None);
        assert_eq!(
            parse_command("Could you remember that my flight is on Friday?"),
            Some(Remember("my flight is on Friday".into()))
        );
        assert_eq!(
            parse_command("remember that I always say thank you"),
            Some(Remember("I always say thank you".into()))
        );
        assert_eq!(
            parse_command("Remember: the spare key is under the blue pot, thanks!"),
            Some(Remember("the spare key is under the blue pot".into()))
        );
        assert_eq!(
            parse_command("remember thatcher's book is on the shelf"),
            Some(Remember("thatcher's book is on the shelf".into()))
        );
        assert_eq!(
            parse_command("Remember: that's the gate code 4411"),
            Some(Remember("that's the gate code 4411".into()))
        );
        assert_eq!(
            parse_command("remember：the gate code is 4411"),
            Some(Remember("the gate code is 4411".into()))
        );
        assert_eq!(
            parse_command("Remember... the gate code is 4411"),
            Some(Remember("the gate code is 4411".into()))
        );
        assert_eq!(
            parse_command("可以记下我的地址吗？"),
            Some(Remember("我的地址".into()))
        );
        assert_eq!(
            parse_command("😊 Remember that I like oolong 🍵"),
            Some(Remember("I like oolong 🍵".into()))
        );
        assert_eq!(
            parse_command("請記住我的生日是五月"),
            Some(Remember("我的生日是五月".into()))
        );
        assert_eq!(
            parse_command("请记住我的生日是5月3日谢谢"),
            Some(Remember("我的生日是5月3日".into()))
        );
    }

    #[test]
    fn talk_about_remembering_is_no_command() {
        for message in [
            "Remembering names is hard for me",
            "Remembered to buy milk today",
            "memorized the whole poem yesterday",
            "Remember that, please",
            "remember that, thanks",
            "remember this please",
            "Remember when we went to Paris?",
            "Remember me?",
            "记得吗？",
            "记住了",
            "记下了，谢谢",
            "记住了吗",
            "Can you remember when we met?",
            "Hey remember when we went to Paris?",
            "Remember when we went to Paris?!",
            "记得我们第一次见面吗",
            // Pointing back, not saying what to remember.
            "记住这个吧",
            "请记住这个吧",
            "remember this one",
            "记住这一点",
            "remember this, ok",
            "记住我",
            "Remember that one, okay?",
            // Nothing visible after the verb.
            "Remember: \u{200b}",
            "记住 \u{2060}",
            "remember that \u{feff}",
        ] {
            assert_eq!(parse_command(message), None, "{message:?}");
        }
    }

    #[test]
    fn recognises_chinese_commands() {
        let cases = [
            ("忘掉这个", ForgetLast),
            ("请忘记刚才说的", ForgetLast),
            ("删除这条记忆", ForgetLast),
            ("忘了这条", ForgetLast),
            ("置顶这条", PinLast),
            ("把这条置顶", PinLast),
            ("关闭记忆", MemoryOff),
            ("请关掉记忆功能", MemoryOff),
            ("打开记忆", MemoryOn),
            ("开启无痕模式", IncognitoStart),
            ("这次对话开启无痕", IncognitoStart),
            ("退出无痕模式", IncognitoEnd),
        ];
        for (message, expected) in cases {
            assert_eq!(parse_command(message), Some(expected), "{message}");
        }
    }

    #[test]
    fn recognises_questions_about_what_is_remembered() {
        let cases = [
            ("What do you remember about my sister?", "my sister"),
            ("what do you know about Project Atlas", "Project Atlas"),
            (
                "Tell me what you remember about the trip to Kyoto.",
                "the trip to Kyoto",
            ),
            (
                "Do you remember anything about my allergies?",
                "my allergies",
            ),
            ("do you still remember my dog's name", "my dog's name"),
            ("你记得关于我妹妹的什么", "我妹妹"),
            ("你还记得我的狗吗？", "我的狗"),
            ("关于京都旅行你记得什么", "京都旅行"),
        ];
        for (message, topic) in cases {
            assert_eq!(
                parse_command(message),
                Some(Recall(topic.to_owned())),
                "{message}"
            );
        }
        // Telling Engram to remember is not asking what it remembers.
        assert_eq!(
            parse_command("记得明天开会"),
            Some(Remember("明天开会".to_owned()))
        );
    }

    #[test]
    fn ordinary_conversation_is_no_command() {
        for message in [
            "I always forget that my keys are in the car",
            "I remember the meeting",
            "what do you think about Rust?",
            "what's the weather",
            "pin the tail on the donkey",
            "I turned off the memory foam mattress heater",
            "我忘了带钥匙",
            // "Never mind" and "I forgot" delete nothing.
            "forget it",
            "Forget it!",
            "I don't remember that",
            "Actually, I forgot that",
            "忘了",
            "忘了吧",
            "",
            "   ",
            "please",
        ] {
            assert_eq!(parse_command(message), None, "{message:?}");
        }
    }
}
