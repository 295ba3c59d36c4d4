//! What a sentence of a conversation states about the person who said it, for the local
//! consolidation (no LLM): whether it is worth keeping as a fact at all, and of what kind.
//!
//! A sentence is a fact when it says something lasting about its speaker: who they are, what
//! they have, like, did, aim for, decided or must do, or (said by a user to the assistant) how
//! the assistant should behave. Most of what people say is none of these, even when it sounds
//! like one: reactions and compliments to the other speaker ("I love your commitment", "I love
//! that line"), vague maybes ("I'll have to check it out sometime", "I'd love to visit Japan
//! someday"), hypotheticals ("If I won the lottery I'd buy a farm"), what is happening in the
//! conversation itself ("Let me paste the rest", "I've pasted the error below", "sorry, typo")
//! and passing states ("I'm so tired today"). Those are left out first ([`is_passing`]); what is
//! left is a fact only when a rule recognises the kind of statement ([`lasting_statement`]).
//!
//! The rules were chosen on the labelled sentences of `tests/eval/facts` and on the judged facts
//! of the dev dialogs (`tests/eval/dialog_facts`; `make eval-facts` reports both); each is a
//! phrasing, never a sentence of the sets.
//! They cover English and Chinese. A statement phrased in a way no rule knows is missed; an LLM,
//! when configured, writes the facts instead.

use std::sync::LazyLock;

use regex::{Regex, RegexSet};

use crate::category::Category;
use crate::importance::infer_category;

fn regex(pattern: &str) -> Regex {
    Regex::new(pattern).expect("valid statement rule")
}

fn set(patterns: &[&str]) -> RegexSet {
    RegexSet::new(patterns).expect("valid statement rule")
}

/// Sentences that say nothing lasting about their speaker, whatever else they match.
static PASSING: LazyLock<RegexSet> = LazyLock::new(|| {
    set(&[
        // A reaction to what the other said, or a compliment: the object is them or what they
        // just said ("I love your attention to detail", "I love that line", "I love it").
        r"(?i)\bi\s+(?:really\s+|just\s+|absolutely\s+|totally\s+)?(?:love|like|adore|appreciate|admire|enjoyed)\s+(?:your|you|how\s+you|what\s+you|that|it|this|these|those|the\s+(?:thought|idea|sound\s+of\s+that))\b",
        r"(?i)^(?:your|you're|you\s+are|you've|that's|that\s+is|that\s+was|what\s+a|how)\b",
        r"(?i)\b(?:congrats|congratulations|well\s+done|good\s+for\s+you|proud\s+of\s+you|happy\s+for\s+you|means\s+a\s+lot)\b",
        // Vague maybes and wishes without intent.
        r"(?i)\b(?:sometime|someday|some\s+day|one\s+day|at\s+some\s+point|no\s+promises|who\s+knows|no\s+idea|we'?ll\s+see|i\s+guess|i\s+suppose)\b",
        r"(?i)^(?:maybe|perhaps|possibly)\b",
        r"(?i)\bi\s+(?:might|may)\s+(?:try|take|do|go|get|look|check|give|start)\b",
        r"(?i)\bi'?ll\s+(?:think\s+about|try\s+to\s+remember|have\s+to\s+(?:check|try|see)|check\s+it\s+out|reply|get\s+back|let\s+you\s+know|see\s+how)\b",
        // Hypotheticals, counterfactuals and wonderings.
        r"(?i)^(?:if|imagine|what\s+if|i\s+wonder|wouldn'?t\s+it|had\s+i)\b",
        r"(?i)\bi'?d\s+have\b|\bi\s+would\s+have\b",
        // The conversation itself: pasting, typing, pausing, correcting, testing.
        r"(?i)^(?:let\s+me|let'?s|hold\s+on|hang\s+on|wait|sorry|my\s+bad|never\s+mind|nevermind|just\s+testing|ok(?:ay)?\s*,?\s*i'?m\s+back|one\s+sec|brb|anyway)\b",
        r"(?i)\bi(?:'ve|\s+have)\s+(?:just\s+)?(?:pasted|attached|copied|uploaded|shared|sent\s+you|moved\s+the|put\s+the)\b",
        r"(?i)\b(?:right\s+now|at\s+the\s+moment|as\s+we\s+speak)\b",
        r"(?i)\bi'?m\s+(?:so\s+|really\s+|a\s+bit\s+|pretty\s+)?(?:tired|knackered|exhausted|bored|hungry|sleepy|back|typing|confused|not\s+sure|lost)\b",
        r"(?i)\bi\s+(?:think|guess|feel\s+like)\s+you\b|\bi\s+meant\b|\bi\s+typed\b|\bi'?m\s+not\s+sure\b",
        // Hearsay and small talk about the world.
        r"(?i)^(?:apparently|everyone|everybody|people\s+say|they\s+say|i\s+read|i\s+heard|rumou?r\s+has\s+it|my\s+friend\s+reckons)\b",
        r"(?i)^(?:it'?s|it\s+is)\s+(?:raining|snowing|sunny|so\s+hot|so\s+cold|freezing|boiling)\b",
        r"(?i)\bi\s+think\s+it'?s\s+going\s+to\b",
        // Figures of speech and announcements that say nothing yet: "My lips are sealed", "My
        // mum's going to kill me", "I'm going to cry", "I am a husk of a human", "I've made a
        // decision", "My money's on paintball".
        r"(?i)\b(?:my\s+lips\s+are\s+sealed|(?:is|are|'s|'re)\s+going\s+to\s+(?:kill|murder)\s+me|i'?m\s+going\s+to\s+(?:cry|die|scream|explode|sleep\s+for)|like\s+i'?ve\s+been\s+hit\s+by|a\s+husk\s+of\s+a|my\s+brain\s+is\s+(?:mush|fried)|living\s+(?:my|the)\s+(?:best\s+life|dream))\b",
        r"(?i)^(?:i(?:'ve|\s+have)?\s+(?:just\s+)?made\s+(?:a|my|the)\s+decision(?:\s+of\s+my\s+own)?|big\s+decision\s+day)\W*$",
        r"(?i)^my\s+money'?s\s+on\b",
        // What the speaker has been doing today, or to what the conversation just named: "I've
        // been refreshing my phone all morning", "I've been avoiding that spreadsheet".
        r"(?i)^i(?:'ve|\s+have)\s+been\s+\w+ing\b.*\b(?:all\s+(?:morning|day|night|afternoon|evening)|for\s+(?:\w+\s+)?(?:minutes|hours)|since\s+(?:this\s+morning|breakfast|lunch))\b",
        r"(?i)^i(?:'ve|\s+have)\s+been\s+(?:\w+ing\s+(?:that|this|it)\b|thinking\b)",
        // Apologies, asides and warnings about the conversation, and leaving it: "I'm so sorry
        // I'll miss it", "You know Dad's going to gloat", "Warning: the dog is barking", "I have
        // to go and be a grown-up".
        r"(?i)^(?:i'?m|i\s+am)\s+(?:so\s+|really\s+|very\s+|terribly\s+)?sorry\b|^you\s+know\b|^(?:warning|fair\s+warning|heads\s+up|spoiler(?:\s+alert)?)\b",
        r"(?i)^i\s+(?:have\s+to|need\s+to|gotta|got\s+to|must)\s+(?:go|run|dash|head\s+off)(?:\s*[,.!;]|\s*$|\s+(?:and|now|soon|be)\b)",
        // The body this moment: "My hands were shaking", "My legs are dead".
        r"(?i)^my\s+(?:hands|arms|forearms|legs|feet|knees|back|shoulders|eyes|head|brain|body|fingers)\s+(?:are|were|is|was|'re|feel|felt)\s+(?:still\s+|totally\s+|so\s+|completely\s+)?(?:shaking|dead|killing\s+me|jelly|numb|spinning|aching|burning|on\s+fire|tingling)\b",
        // A first reaction to someone just met or described: "I love Dennis already", "I like
        // his attitude".
        r"(?i)^i\s+(?:already\s+)?(?:love|like|adore)\s+(?:\p{Lu}\p{L}+\s+already|(?:his|her|their)\s+(?:attitude|energy|style|vibe|spirit|enthusiasm|confidence|humou?r|thinking))\b",
        // Musings ("I don't know if I want to …", "I'm saying …").
        r"(?i)^i\s+don'?t\s+know\s+(?:if|what|whether|how)\b|^i'?m\s+saying\b",
        // A verbless "No more X." of a word or two says what stopped, not what is: the
        // sentence before it does. ("No more meat for me" says whose: it is left to the rules.)
        r"(?i)^no\s+more\s+(?:\p{L}+\s+)?\p{L}+\W*$",
        // Chinese: pauses, hearsay, hypotheticals, vague plans, reactions.
        r"^(?:等一下|等等|稍等|我找一下|我看看|算了|哈哈|好吧|听说|据说|要是|如果我|假如|万一|你说|你的|你真|太厉害|真厉害|恭喜)",
        r"(?:改天|有空再|以后再说|有机会的话|有机会再|再说吧|随便吧|要是.*就好了)",
    ])
});

/// Sentences said to the other speaker, about them or about the conversation: no fact about the
/// speaker, though a summary may need them (a user's "Don't book the hotel until Friday" is what
/// the chat decided).
static TO_THE_LISTENER: LazyLock<RegexSet> = LazyLock::new(|| {
    set(&[
        // An instruction or advice ("Tell her I'll call tonight", "Keep an eye on Mabel", "Put a
        // little aside every week") is about the listener. (A user's instruction to the
        // assistant is a guideline, recognised before this; "Give me a quiet pub over a club any
        // day" is a preference.)
        r"(?i)^(?:tell|keep|put|stop|give\s+(?:her|him|them|it)|send|ask|bring|don'?t|do\s+not|make\s+sure)\b",
        // Promises of the conversation: "I'll ring her tomorrow", "I'll tell you next week".
        r"(?i)^i'?ll\s+(?:ring|call|text|tell|message|email)\s+(?:you|her|him|them)\b",
    ])
});

/// Sentences that may tell something, but not on their own: a fact needs what came before to be
/// read ("It was lovely", "It pays a bit less than the bar"), or is someone else's view of the
/// speaker ("Sione says I've gone soft"; "My doctor says I'm diabetic" is the speaker's own
/// news, and stays). A summary keeps them ("It's Parkinson's."); a fact does not.
static NOT_ON_ITS_OWN: LazyLock<RegexSet> = LazyLock::new(|| {
    set(&[
        r"(?i)^it(?:'s|\s+is|\s+was|\s+pays|\s+costs|\s+looks|\s+feels|\s+sounds|\s+seems)\b",
        r"^\p{Lu}\p{Ll}+\s+(?:says|said|reckons|thinks|claims)\b",
    ])
});

/// How the user wants the assistant to behave; said by the user in a chat only.
static GUIDELINE: LazyLock<RegexSet> = LazyLock::new(|| {
    set(&[
        // "Always/never/don't …" a way of answering (not "don't tell anyone", "don't worry").
        r"(?i)^(?:please\s+)?(?:always|never|don'?t|do\s+not|avoid|stop)\s+(?:ever\s+)?(?:use|using|give|write|call|suggest|recommend|answer|reply|respond|add|include|start|lecture|sugar-?coat|jump|assume|round|translate)\b",
        r"(?i)^(?:please\s+)?call\s+me\b",
        // A format the user reads best: units, currency, spelling, language, tone, length.
        r"(?i)^(?:please\s+)?(?:use|write|keep|give|answer|reply|respond|speak|talk|format|put|show|spell|quote|list)\b.{0,50}\b(?:units|metric|imperial|celsius|fahrenheit|euros?|dollars?|pounds|sterling|rmb|yuan|spelling|british|american|english|chinese|mandarin|spanish|french|german|bullet\s+points|tables?|emojis?|formal|informal|casual|brief|short|concise|plain\s+(?:text|english|language)|24-hour)\b",
        r"(?i)^(?:please\s+)?be\s+(?:blunt|honest|brief|concise|direct|gentle|strict|harsh|straight)\s+(?:with|about)\s+(?:me|my)\b",
        r"(?i)\b(?:in\s+(?:anything|everything|all)\s+(?:you|that\s+you)|every\s+time\s+you|whenever\s+you)\b",
        // A standing condition: "if I ask about money, give me the numbers first".
        r"(?i)^(?:if|when|whenever)\s+i\b.{3,60}?,\s*(?:please\s+)?(?:just\s+)?(?:give|use|answer|reply|tell|show|listen|be|don'?t|do|write|keep|start|put|remind|skip|stick)\b",
        r"(?i)\b(?:from\s+now\s+on|going\s+forward|in\s+(?:all\s+)?future\s+(?:answers|replies))\b",
        r"(?:^(?:请)?(?:以后|之后)?(?:都)?(?:叫我|称呼我)|的时候(?:都|就|请)用|的时候(?:都|就|请)?(?:别|不要|给我|只)|^(?:请)?(?:以后|每次|之后)(?:都)?(?:用|别|不要|给我)|以后(?:请|回答|都))",
    ])
});

/// A one-off request ("use this one instead", "don't mention it") is not a standing rule.
static ONE_OFF: LazyLock<Regex> = LazyLock::new(|| {
    regex(r"(?i)\b(?:this|that|it|these|those|now|today|instead)\b|这个|那个|这次|这篇|现在|先")
});

static DECISION: LazyLock<RegexSet> = LazyLock::new(|| {
    set(&[
        r"(?i)\b(?:i|we)(?:'ve|\s+have)?\s+(?:finally\s+|just\s+|already\s+)?(?:decided|made\s+up\s+(?:my|our)\s+minds?|settled\s+on|opted\s+for|chose|went\s+with)\b",
        r"(?i)\b(?:i|we)\s+(?:finally\s+)?(?:booked|bought|picked|chose|went\s+for|took)\b.{1,60}\binstead\s+of\b",
        r"(?i)\b(?:i'?m|we'?re|i\s+am|we\s+are)\s+(?:going\s+with|switching\s+(?:\w+\s+){0,3}(?:to|from)\b|not\s+having\s+a\b|taking\s+the\s+(?:job|offer|role|position)|going\s+ahead\s+with)",
        r"(?i)\b(?:we|i)\s+(?:agreed|committed)\s+to\b",
        r"(?:决定|定下来|拍板|选定|最后定了|就定了|选了|还是选)",
    ])
});

/// A concrete task the speaker means to do (the `todo` kind), with what or when.
static TASK: LazyLock<RegexSet> = LazyLock::new(|| {
    set(&[
        r"(?i)\b(?:i|we)\s+(?:still\s+|really\s+|definitely\s+)?(?:need|have|must)\s+to\s+(?:book|call|pay|file|send|finish|submit|renew|cancel|buy|pick|get|fix|print|write|email|ring|see|visit|sort|prepare|pack|return|sign|apply|register|collect|clean|move|check|update|order|change|take|bring|make|go|do|start|schedule|reply|meet|contact|deliver|practi[cs]e|study|read)\b",
        r"(?i)\bi'?ve\s+got\s+to\b|\bi\s+gotta\b",
        r"(?i)\bi\s+(?:should|must)\b.{0,60}\b(?:before|by|until|tomorrow|today|tonight|this\s+week|next\s+week|on\s+the\s+\d)",
        r"(?i)\b(?:tomorrow|tonight|first\s+thing|this\s+(?:weekend|week|evening|afternoon)|on\s+(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday))\b.{0,40}\b(?:i'?m|we'?re)\s+\w+ing\b",
        r"(?i)\b(?:i'?m|we'?re)\s+\w+ing\b.{0,60}\b(?:tomorrow|tonight|first\s+thing|monday|tuesday|wednesday|thursday|friday|saturday|sunday|this\s+(?:weekend|week)|next\s+week)\b",
        r"(?:今天|明天|后天|今晚|这周末?|周末|月底前?|下周|下个月|年底前?).{0,12}(?:得|要|需要|必须|记得)(?:把|去|带|交|还|给|买|订|办|约|打|报|续)",
        r"我(?:得|必须)(?:把|去|带|交|还|给|买|订|办|约|打|报|续)",
    ])
});

static GOAL: LazyLock<RegexSet> = LazyLock::new(|| {
    set(&[
        r"(?i)\b(?:the|my|our)\s+(?:goal|aim|target|dream|ambition)\s+(?:is|was)\s+to\b",
        r"(?i)\bi'?m\s+(?:determined\s+to|hoping\s+to|aiming\s+(?:to|for)|working\s+towards?|saving\s+(?:up\s+)?for|training\s+for)\b",
        r"(?i)\bi\s+(?:(?:also|really|still|definitely|finally|now|even)\s+){0,2}(?:want|hope|plan|intend|aim)\s+to\s+(?:learn|get|be|become|run|finish|start|save|lose|build|move|buy|visit|write|climb|pass|improve|speak|play|travel|retire|open|launch|read|cook)\b",
        r"(?i)\b(?:long\s+term|eventually|in\s+the\s+long\s+run|within\s+(?:a|two|three|five)\s+years?)\b.{0,20}\bi'?d\s+(?:like|love)\s+to\b",
        r"(?:目标是|一定要(?:学会|考|做到|拿到|减)|争取|我的梦想|希望(?:能|今年|明年)|打算(?:今年|明年))",
    ])
});

/// A change of state: what is stored is the new state (a fact), not the event.
static STATE_CHANGE: LazyLock<RegexSet> = LazyLock::new(|| {
    set(&[
        r"(?i)\b(?:i|we)\s+(?:just\s+|finally\s+|recently\s+)?(?:got|get)\s+(?:engaged|married|divorced|a\s+(?:dog|cat|puppy|kitten|new\s+job))\b",
        r"(?i)\b(?:i|we)\s+(?:just\s+|finally\s+|recently\s+)?(?:adopted|moved\s+to|moved\s+in\s+with|bought\s+a\s+(?:house|flat|car)|started\s+(?:at|a\s+new\s+job)|joined|quit\s+(?:my|the)|retired)\b",
        r"(?:养了(?:一|两|只)|结婚了|订婚了|离婚了|搬到|搬去了|入职|辞职了|退休了)",
    ])
});

/// Something that happened to the speaker, dated or marked as done once.
static EXPERIENCE_EVENT: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"(?i)\b(?:i|we)\s+(?:finally\s+|once\s+|actually\s+|also\s+)?(?:passed|broke|tried|led|spent|saw|won|came\s+off|finished|had\s+(?:my|our)\b|got\s+(?:stuck|lost|promoted|fired|laid\s+off|bitten|stung)|did\s+(?:a|an|my|our)\b|ran\s+(?:my|a|the|our)\b|built|climbed|visited|went|travell?ed|flew|drove|hiked|cycled|swam|wrote|published|graduated|survived|hurt|met|toured|completed|learned|learnt|crashed|fell|lived|worked|studied|grew\s+up|used\s+to|performed|played|organi[sz]ed|presented|received)\b",
    )
});

/// When the event was: a date, "last …", "… ago", "once", "first", "finally".
static EXPERIENCE_TIME: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"(?i)\b(?:last|ago|yesterday|once|first|finally|back\s+in|when\s+i\s+was|as\s+a\s+(?:kid|child|teenager)|in\s+(?:19|20)\d\d|(?:19|20)\d\d|in\s+(?:january|february|march|april|may|june|july|august|september|october|november|december|spring|summer|autumn|fall|winter)|over\s+the\s+(?:winter|summer|weekend|holidays)|this\s+(?:year|spring|summer)|on\s+(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)|previous|former|at\s+my\s+(?:last|old|previous))\b",
    )
});

static CHINESE_EXPERIENCE: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"(?:去年|前年|上个?月|上周|上次|小时候|以前|那年|第一次|曾经|大学的时候|读书的时候).{0,24}(?:了|过)|我.{0,12}(?:过一次|过两次)",
    )
});

static PREFERENCE: LazyLock<RegexSet> = LazyLock::new(|| {
    set(&[
        r"(?i)\bi\s+(?:(?:just|really|only|also|much|strongly|absolutely|totally|honestly|genuinely|definitely|do|still|always|usually|kind\s+of|kinda)\s+){0,2}(?:like|love|prefer|enjoy|hate|dislike|adore|loathe|detest)\b",
        r"(?i)\bi'?m\s+(?:really\s+|so\s+|totally\s+|a\s+bit\s+|quite\s+)?(?:into|obsessed\s+with|addicted\s+to|hooked\s+on|(?:a\s+)?(?:big\s+|huge\s+)?fan\s+of|not\s+(?:a\s+|much\s+of\s+a\s+)?(?:big\s+)?fan\s+of)\b",
        r"(?i)\bi\s+find\b.{1,40}\b(?:easier|harder|better|worse|nicer|more|less)\b",
        r"(?i)\b(?:over|rather\s+than)\b.{1,40}\bany\s+day\b",
        r"(?i)\b(?:is|are)\s+my\s+(?:thing|jam|go-to|favou?rite|weakness)\b",
        r"(?i)\bi\s+only\s+(?:eat|drink|read|use|wear|buy|watch|listen|fly|shop|cook|drive)\b",
        r"(?i)\bi\s+use\b.{1,40}\beverywhere\b",
        r"(?i)\bi\s+(?:can'?t|cannot)\s+stand\b|\bi'?d\s+rather\b",
        r"(?:只(?:喝|吃|用|看|穿|买|听)|不太能(?:吃|喝)|宁可|宁愿|更喜欢|受不了|最爱)",
    ])
});

/// Who the speaker is and what they have: health, family, home, work, belongings.
static PERSONAL: LazyLock<RegexSet> = LazyLock::new(|| {
    set(&[
        r"(?i)\bi'?m\s+(?:(?:severely\s+|very\s+|mildly\s+)?allergic\s+to|(?:left|right)-handed|colou?r-?blind|diabetic|deaf|dyslexic|autistic|self-employed|freelance|freelancing|vegetarian|vegan|pescatarian|teetotal|an?\s+only\s+child|on\s+\d+\s*mg|on\s+(?:the\s+)?(?:night|day|early|late)\s+(?:rota|shift))\b",
        r"(?i)\bi(?:\s+have|'ve\s+got|\s+have\s+got|\s+got)\s+(?:type\s+\d|asthma|diabetes|coeliac|celiac|adhd|arthritis|epilepsy|migraines|eczema|a\s+(?:mild|bad|chronic|severe)\b|(?:a|one|two|three|four|five|six|\d+)\s+(?:\w+\s+){0,2}(?:kids?|children|sons?|daughters?|brothers?|sisters?|dogs?|cats?|fish|guppies|goldfish|hamsters?|rabbits?|guinea\s+pigs?|budgies?|parrots?|tortoises?|horses?|chickens?|apprentices|grandchildren|employees|flatmates|roommates))",
        // Daily habits: "I drink four coffees a day", "I smoke about ten a day".
        r"(?i)^i\s+(?:\w+\s+)?(?:drink|smoke|eat|vape)\b.{0,40}\b(?:a|per|every)\s+(?:day|week)\b",
        // Where one teaches or volunteers regularly.
        r"(?i)^i\s+(?:teach|volunteer|coach|lecture)\s+(?:\w+\s+){0,2}(?:at|for)\b",
        r"(?i)^(?:my|our)\s+(?:wife|husband|partner|son|daughter|kids|children|mum|mom|dad|mother|father|parents|brother|sister|dog|cat|landlord|flat|house|mortgage|rent|car|laptop|boss|manager|job|office|team|doctor|gp|dentist|physio|physiotherapist|therapist|vet|coach|trainer|tutor|accountant|lawyer)\b(?:'s|\s+\p{Lu}\p{L}+|\s+(?:is|are|was|works|lives|turns|has))",
        r"(?i)\b(?:we|i)\s+(?:rent|own|live|have\s+lived)\b",
        r"(?i)\bi\s+work\s+(?:\w+\s+){0,2}(?:days|nights|shifts|part-time|full-time|remotely|from\s+home|weekends)\b",
        r"(?i)\b(?:we'?re|i'?m)\s+on\s+an?\s+(?:\w+\s+){0,2}(?:tariff|contract|visa|diet|plan|mortgage|lease|rate)\b",
        r"(?i)\bthat'?s\s+my\s+(?:address|number|email|phone|postcode|birthday)\b",
        r"(?i)\bi\s+(?:don'?t|do\s+not|no\s+longer)\s+(?:eat|drink|smoke)\b|\b(?:eat|drink|smoke)\s+(?:meat|alcohol)?\s*any\s*more\b",
        r"(?:我(?:老公|老婆|爸|妈|爸爸|妈妈|儿子|女儿|孩子|男朋友|女朋友|先生|太太|对象)(?:是|在)|我在.{1,20}?(?:公司|医院|学校|银行|工厂|机构|单位|大学)(?:当|做)|我有.{0,6}(?:病|症|过敏|高血压|糖尿病|哮喘)|(?:血压|血脂|血糖).{0,4}(?:高|低)|我.{0,4}(?:手机号|电话|邮箱|地址)是)",
        // Chinese habits and memberships: 一天一包烟, 每天两杯咖啡, 在健身房办了年卡.
        r"(?:一天|每天|一周|每周).{0,6}[\d一二两三四五六七八九十半]+(?:包|杯|瓶|根|支|罐)|办了?(?:的|张)?(?:年卡|月卡|会员卡|会员)",
    ])
});

/// When something is to happen or how often: a day, a date, a time, "next week", "every
/// morning", 明天, 每天; or a firm intent ("I have to", "I'm going to").
static WHEN: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"(?i)\b(?:today|tonight|tomorrow|this\s+(?:morning|afternoon|evening|week|weekend|month|year)|next\s+(?:week|month|year|\w+day)|on\s+(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)|(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)|by\s+the\s+\w+|in\s+(?:january|february|march|april|may|june|july|august|september|october|november|december)|\d{1,2}(?::\d\d)?\s*(?:am|pm)|\d{1,2}(?:st|nd|rd|th)|(?:every|each)\s+\w+|end\s+of\s+\w+|before\s+\w+|i\s+(?:have|need)\s+to|i(?:'m|\s+am)\s+going\s+to)\b|今天|今晚|明天|后天|下周|下个月|周末|月底|年底|每天|每周|每晚|每个月|\d+号|[\d一二三四五六七八九十]+月|之前|我需要|我得",
    )
});

/// Whether a sentence says nothing lasting about its speaker: a reaction or compliment to the
/// other speaker, a vague maybe, a hypothetical, the conversation itself, a passing state or
/// hearsay.
pub fn is_passing(text: &str) -> bool {
    PASSING.is_match(text)
}

/// What kind of lasting statement a sentence makes about its speaker, if any: `None` for what
/// [`is_passing`] leaves out and for a sentence no rule recognises. `to_assistant`: the user
/// said it to the assistant (a chat), so it may be a guideline for the assistant.
pub fn lasting_statement(text: &str, to_assistant: bool) -> Option<Category> {
    if to_assistant && GUIDELINE.is_match(text) && !ONE_OFF.is_match(text) {
        return Some(Category::Guideline);
    }
    // A value of who or where the speaker is (home, work, manager, role, partner, diet, contact
    // details) is lasting even when said as of now ("I'm single at the moment"), and it is what
    // a later statement may supersede.
    // Run only where the answer decides something: most sentences end at a rule above it.
    let states_value = || crate::conflict::subject_value(text).is_some();
    // Something of the speaker's that is over ("I gave up the cello", "我戒烟了"): the old fact
    // naming it is no longer true, and this one says so.
    let ends_something = || !crate::conflict::ended_things(text).is_empty();
    let said_for_others = TO_THE_LISTENER.is_match(text) || NOT_ON_ITS_OWN.is_match(text);
    if (is_passing(text) || said_for_others) && !states_value() {
        return None;
    }
    if DECISION.is_match(text) {
        return Some(Category::Decision);
    }
    if GOAL.is_match(text) {
        return Some(Category::Goal);
    }
    if TASK.is_match(text) {
        return Some(Category::Todo);
    }
    if STATE_CHANGE.is_match(text) {
        return Some(Category::Fact);
    }
    if (EXPERIENCE_EVENT.is_match(text) && EXPERIENCE_TIME.is_match(text))
        || CHINESE_EXPERIENCE.is_match(text)
    {
        return Some(Category::Experience);
    }
    if PREFERENCE.is_match(text) {
        return Some(Category::Preference);
    }
    if PERSONAL.is_match(text) || states_value() || ends_something() {
        return Some(Category::Fact);
    }
    match infer_category(text) {
        // A guideline is the user's to the assistant, not one person's to another.
        Category::Guideline if !to_assistant => None,
        // A "to do" the task rules above did not recognise is a task only when it says when;
        // without, it is mostly a promise made in the conversation ("I'll be unbearable until
        // then", "I'll remind you you said that").
        Category::Todo if !WHEN.is_match(text) => None,
        Category::Fact => None,
        category => Some(category),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reactions_maybes_and_the_conversation_itself_are_not_facts() {
        for text in [
            "I love this quote.",
            "I love the thought Nate.",
            "I love your commitment.",
            "I'll have to check it out sometime.",
            "I'd love to see the aurora one day.",
            "If I had a boat I'd sail to Norway.",
            "Let me paste the stack trace.",
            "I'm so tired today.",
            "Apparently the new phone comes out in May.",
            "算了，改天再说吧。",
        ] {
            assert_eq!(lasting_statement(text, true), None, "{text}");
        }
    }

    #[test]
    fn figures_of_speech_instructions_and_the_day_so_far_are_not_facts() {
        for text in [
            "My lips are sealed, promise.",
            "Dad's going to kill me when he sees the car.",
            "I've made my decision.",
            "I've been pacing the kitchen all afternoon.",
            "I've been putting it off.",
            "I don't know whether to laugh or cry.",
            "No more night shifts!",
            "I'm really sorry I can't make it on Sunday.",
            "You know my brother will never let me forget this.",
            "Fair warning: the baby is awake.",
            "I have to run, the bus is here.",
            "My legs are jelly after that class.",
            "I love Marguerite already.",
            "I like her energy.",
        ] {
            assert!(is_passing(text), "{text}");
        }
        for text in [
            "Tell him I said hi.",
            "Don't let her near the cake.",
            "I'll text you when I land.",
            "Marek says I've gone soft.",
            "It was a bit much, honestly.",
        ] {
            assert_eq!(lasting_statement(text, false), None, "{text}");
            // Not passing: a summary may need what was said to the other.
            assert!(!is_passing(text), "{text}");
        }
        // What lasts stays: a long habit, a preference said as "give me", a task to send.
        for text in [
            "I've been learning Spanish for two years.",
            "Give me a window seat over an aisle any day.",
            "I'll send you the invoice on Monday.",
            "I've been vegetarian since 2019.",
            "No more meat for me.",
            "I have to go to the dentist on Monday.",
            "My back is bad, I've had a slipped disc since 2020.",
        ] {
            assert!(!is_passing(text), "{text}");
        }
    }

    #[test]
    fn each_kind_of_lasting_statement_is_recognised() {
        for (text, category) in [
            (
                "I prefer green tea over coffee, always.",
                Category::Preference,
            ),
            (
                "I love coconut milk, but I also enjoy chocolate.",
                Category::Preference,
            ),
            ("I'm really into climbing these days.", Category::Preference),
            ("We've decided to keep the old car.", Category::Decision),
            ("I need to renew my passport before March.", Category::Todo),
            (
                "I'm determined to run a marathon next year.",
                Category::Goal,
            ),
            ("I broke my ankle skiing last winter.", Category::Experience),
            ("We adopted a rescue greyhound.", Category::Fact),
            ("I'm left-handed.", Category::Fact),
            // An adverb between the speaker and the verb ("also", "still") is the same goal.
            (
                "I also want to run the Lisbon half marathon if the knee holds up.",
                Category::Goal,
            ),
            // Who looks after the speaker, and what their body cannot take, are facts.
            ("My physio is called Marta Lopes.", Category::Fact),
            ("I'm allergic to ibuprofen.", Category::Fact),
            ("我老公是医生。", Category::Fact),
            ("我只喝黑咖啡。", Category::Preference),
        ] {
            assert_eq!(lasting_statement(text, false), Some(category), "{text}");
        }
    }

    #[test]
    fn only_the_user_in_a_chat_gives_the_assistant_guidelines() {
        assert_eq!(
            lasting_statement("Use metric units, please.", true),
            Some(Category::Guideline)
        );
        assert_eq!(lasting_statement("Use metric units, please.", false), None);
        assert_eq!(lasting_statement("Use this one instead.", true), None);
    }
}
