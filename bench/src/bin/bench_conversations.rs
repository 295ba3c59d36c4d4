//! Load generator of `make bench-conversations`: the conversation path of the ingest service
//! (AppendMessages, the segmentation consumer, episodes, consolidation) under a steady stream of
//! turns, with the bus and the local embedder on.
//!
//! `bench-conversations run` goes through these phases, in order:
//! 1. **The target rate** (`--rate` turns/s, open loop): `--clients` clients, each a user with
//!    conversations of its own in several spaces, append one turn at a time at their share of the
//!    rate. A client gives a conversation a few turns, then moves on to another. A conversation is
//!    a series of sessions of 8-20 turns on one topic; the next session starts hours later in the
//!    turns' own times (`at`), a hard gap that closes the previous segment, and some sessions end
//!    with `close_segment` instead (always the last one, after which the conversation is retired
//!    and a new one started). Latency counts from when each turn was due, so an append that waited
//!    for a slow one before it counts the wait.
//! 2. **Drain**: no appends until segmentation has closed every segment the clients closed and
//!    the embeddings are in: how fast segmentation goes with the machine to itself.
//! 3. **A sustainable rate**, only when segmentation needed more than 5 s to catch up after the
//!    target rate: half the rate at which the pipeline got through the target phase's turns (over
//!    the phase and the catch-up), so that the time from a closing turn to its episode is also seen
//!    when segmentation keeps up; drained again afterwards.
//! 4. **Closed loop**: the same clients append back to back for `--closed-seconds`, which gives
//!    the rate at which AppendMessages saturates.
//!
//! Throughout, a sampler reads every second the open backlog (turns of segments the clients
//! closed that segmentation has not closed yet), the segments, episodes and facts written, the
//! outbox and the two queues; a follower times each closing turn until segmentation closed its
//! segment, the episode row is committed (from then on RetrieveMemory's BM25 leg finds it) and
//! its embedding is stored. At the end RetrieveMemory is asked for a sample of episodes, to check
//! that a committed episode is what its BM25 leg finds, and the Markdown report is written.
//!
//! `bench-conversations drop-topology` removes a run's exchanges and queues from the broker.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, TimeDelta, Utc};
use clap::{Parser, Subcommand};
use engram_bench::bench::{HostSpeed, machine_summary};
use engram_proto::v1;
use engram_proto::v1::ingest_service_client::IngestServiceClient;
use engram_proto::v1::retrieval_service_client::RetrievalServiceClient;
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;
use uuid::Uuid;

/// Closing turns followed at once (the others are counted, not timed), so that the follower's
/// queries stay a small load however far segmentation falls behind.
const MAX_FOLLOWED: usize = 512;
/// Closing turns per second the follower times, about (one in every few at higher rates).
const FOLLOWED_PER_SECOND: u32 = 5;
/// A segment closed this long without an episode row of its own wrote none (a near-duplicate
/// episode repeated instead, or a segment of greetings and thanks).
const NO_EPISODE_AFTER: Duration = Duration::from_secs(10);
/// How often the follower asks about closings whose episode is searchable and only its embedding
/// is awaited.
const EMBEDDED_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Episodes RetrieveMemory is asked for at the end.
const BM25_CHECKS: i64 = 20;
/// Longest wait for the embeddings once segmentation caught up after a phase.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);
/// Seconds per row of the backlog table.
const WINDOW_SECS: u64 = 10;

#[derive(Parser)]
#[command(about = "Engram conversations benchmark")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the phases against running services and write the report.
    Run(Box<RunArgs>),
    /// Delete the exchanges and queues of a topology prefix (after the services stopped).
    DropTopology {
        #[arg(long, env = "ENGRAM_AMQP__URL", default_value = LOCAL_AMQP)]
        amqp_url: String,
        #[arg(long, env = "ENGRAM_AMQP__TOPOLOGY_PREFIX")]
        topology_prefix: String,
    },
}

const LOCAL_AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

#[derive(clap::Args)]
struct RunArgs {
    /// The benchmark database (the one the ingest service writes).
    #[arg(long, env = "ENGRAM_DATABASE__URL")]
    database_url: String,
    #[arg(long, default_value = "http://127.0.0.1:50061")]
    endpoint: String,
    #[arg(long, default_value = "http://127.0.0.1:50062")]
    retrieval_endpoint: String,
    #[arg(long, env = "ENGRAM_AMQP__URL", default_value = LOCAL_AMQP)]
    amqp_url: String,
    /// The ingest service's topology prefix (its queues are sampled).
    #[arg(long, env = "ENGRAM_AMQP__TOPOLOGY_PREFIX")]
    topology_prefix: String,
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Offered turns/s of the target phase, from all clients together.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    /// Length of the target phase.
    #[arg(long, default_value_t = 120)]
    seconds: u64,
    /// Longest wait for segmentation to catch up after a phase.
    #[arg(long, default_value_t = 300)]
    drain_seconds: u64,
    /// Length of the phase at a sustainable rate, run when segmentation needed more than 5 s to
    /// catch up after the target rate (0 skips it).
    #[arg(long, default_value_t = 60)]
    sustained_seconds: u64,
    /// Length of the closed loop (0 skips it).
    #[arg(long, default_value_t = 15)]
    closed_seconds: u64,
    /// Conversations each client keeps going at once.
    #[arg(long, default_value_t = 8)]
    conversations_per_client: usize,
    #[arg(long, default_value_t = 8)]
    min_session_turns: u32,
    #[arg(long, default_value_t = 20)]
    max_session_turns: u32,
    /// Share of sessions (other than a conversation's last) ended with `close_segment` rather
    /// than by the hard gap before the next one.
    #[arg(long, default_value_t = 0.25)]
    explicit_close_share: f64,
    #[arg(long)]
    report: PathBuf,
    /// The command line to record in the report.
    #[arg(long, default_value = "make bench-conversations")]
    command_line: String,
    /// The benchmark's ingest service (its CPU is told apart from other processes of that name).
    #[arg(long)]
    ingest_pid: Option<u32>,
    #[arg(long)]
    retrieval_pid: Option<u32>,
    /// The services' settings that differ from their defaults, as the script set them (recorded
    /// in the report).
    #[arg(long, default_value = "")]
    service_settings: String,
}

// ---------------------------------------------------------------------------------------------
// What the users talk about

/// A topic of conversation: the words its turns are made of, so that the turns of one session
/// are about one thing (as the topic rules expect) and sessions differ.
struct Topic {
    space: &'static str,
    things: &'static [&'static str],
    details: &'static [&'static str],
    prefs: &'static [&'static str],
    todos: &'static [&'static str],
}

const SPACES: &[&str] = &["work", "home", "travel", "health"];

const TOPICS: &[Topic] = &[
    Topic {
        space: "work",
        things: &[
            "the Rust rewrite of the billing service",
            "the new parser crate",
            "the async worker pool",
        ],
        details: &[
            "error handling",
            "the database layer",
            "the benchmarks",
            "the CI pipeline",
            "memory usage",
            "the rollout plan",
        ],
        prefs: &[
            "small pull requests",
            "integration tests over mocks",
            "tokio for the runtime",
        ],
        todos: &[
            "write the design doc",
            "review the open pull requests",
            "set up the staging cluster",
        ],
    },
    Topic {
        space: "work",
        things: &[
            "the quarterly report",
            "the revenue forecast",
            "the board slides",
        ],
        details: &[
            "the churn numbers",
            "the marketing spend",
            "the hiring plan",
            "the cash runway",
            "the customer survey",
            "the regional breakdown",
        ],
        prefs: &[
            "charts over tables",
            "a one-page summary",
            "quarterly rather than monthly numbers",
        ],
        todos: &[
            "send the draft to finance",
            "update the forecast spreadsheet",
            "book a review with the CFO",
        ],
    },
    Topic {
        space: "work",
        things: &[
            "the backend engineer opening",
            "the interview loop",
            "the take-home exercise",
        ],
        details: &[
            "the job description",
            "the salary band",
            "the system design round",
            "reference checks",
            "the offer letter",
            "onboarding",
        ],
        prefs: &[
            "pair programming interviews",
            "a short take-home",
            "remote-friendly candidates",
        ],
        todos: &[
            "post the job ad",
            "schedule the panel",
            "write the scorecard",
        ],
    },
    Topic {
        space: "home",
        things: &[
            "the kitchen renovation",
            "the new countertops",
            "the cabinet order",
        ],
        details: &[
            "the plumbing",
            "the electrician's quote",
            "the tile colour",
            "the budget",
            "the permit",
            "the delivery date",
        ],
        prefs: &["oak cabinets", "a matte finish", "induction over gas"],
        todos: &[
            "call the contractor",
            "measure the window wall",
            "order the sink",
        ],
    },
    Topic {
        space: "home",
        things: &[
            "learning Spanish",
            "my Spanish lessons",
            "the conversation class",
        ],
        details: &[
            "irregular verbs",
            "the subjunctive",
            "listening practice",
            "vocabulary flashcards",
            "pronunciation",
            "the B1 exam",
        ],
        prefs: &[
            "short daily sessions",
            "podcasts over textbooks",
            "a tutor on weekends",
        ],
        todos: &[
            "book a tutor",
            "finish the verb drills",
            "register for the exam",
        ],
    },
    Topic {
        space: "home",
        things: &[
            "the birthday party",
            "the surprise dinner",
            "the guest list",
        ],
        details: &[
            "the venue",
            "the cake",
            "the invitations",
            "the music",
            "dietary restrictions",
            "the decorations",
        ],
        prefs: &["a small gathering", "a chocolate cake", "an outdoor venue"],
        todos: &[
            "send the invitations",
            "order the cake",
            "book the restaurant",
        ],
    },
    Topic {
        space: "travel",
        things: &[
            "the Lisbon trip",
            "our week in Portugal",
            "the hotel in Alfama",
        ],
        details: &[
            "the flights",
            "the tram passes",
            "the day trip to Sintra",
            "restaurant bookings",
            "the airport transfer",
            "the travel insurance",
        ],
        prefs: &["a window seat", "small family-run hotels", "walking tours"],
        todos: &[
            "book the flights",
            "reserve the hotel",
            "buy the museum tickets",
        ],
    },
    Topic {
        space: "travel",
        things: &[
            "the Japan trip",
            "two weeks in Kyoto and Tokyo",
            "the rail pass",
        ],
        details: &[
            "the ryokan booking",
            "the cherry blossom dates",
            "the Shinkansen seats",
            "the pocket wifi",
            "the temple visits",
            "the luggage forwarding",
        ],
        prefs: &[
            "quiet neighbourhoods",
            "a green car on the train",
            "one base per city",
        ],
        todos: &[
            "order the rail pass",
            "book the ryokan",
            "exchange some yen",
        ],
    },
    Topic {
        space: "travel",
        things: &[
            "the camping weekend",
            "the hike to the lake",
            "the new tent",
        ],
        details: &[
            "the weather forecast",
            "the campsite permit",
            "water filtering",
            "the sleeping bags",
            "the trail map",
            "the food plan",
        ],
        prefs: &["a lightweight tent", "freeze-dried meals", "an early start"],
        todos: &[
            "reserve the campsite",
            "pack the first aid kit",
            "check the trail conditions",
        ],
    },
    Topic {
        space: "health",
        things: &[
            "the marathon training",
            "my running plan",
            "the half marathon in spring",
        ],
        details: &[
            "the long runs",
            "interval training",
            "my knee pain",
            "the race pace",
            "the tapering week",
            "new running shoes",
        ],
        prefs: &[
            "running in the morning",
            "a heart-rate based plan",
            "trail runs on weekends",
        ],
        todos: &[
            "see the physiotherapist",
            "buy new shoes",
            "register for the race",
        ],
    },
    Topic {
        space: "health",
        things: &[
            "my sleep routine",
            "the evening wind-down",
            "the sleep tracker",
        ],
        details: &[
            "caffeine after lunch",
            "screen time at night",
            "the bedroom temperature",
            "waking up at 3am",
            "weekend lie-ins",
            "the blackout curtains",
        ],
        prefs: &[
            "a fixed wake-up time",
            "reading before bed",
            "a cooler bedroom",
        ],
        todos: &[
            "order blackout curtains",
            "stop coffee after noon",
            "talk to the doctor",
        ],
    },
    Topic {
        space: "health",
        things: &[
            "the meal planning",
            "my lunches for the week",
            "the high-protein diet",
        ],
        details: &[
            "the grocery list",
            "batch cooking",
            "breakfast options",
            "the calorie target",
            "snacks at work",
            "eating out",
        ],
        prefs: &["vegetarian dinners", "cooking on Sundays", "simple recipes"],
        todos: &[
            "write the grocery list",
            "prep the lunches",
            "try the lentil recipe",
        ],
    },
];

const NAMES: &[&str] = &[
    "Alice", "Marco", "Priya", "Chen", "Fatima", "Jonas", "Sofia", "Kenji", "Amara", "Lukas",
    "Elena", "Omar",
];

const DAYS: &[&str] = &[
    "Monday",
    "Tuesday",
    "Thursday",
    "Friday",
    "the weekend",
    "next week",
    "the 14th",
    "the end of the month",
    "March 3",
];

/// What users say: questions, plans, preferences, decisions (some of which consolidation keeps
/// as facts). None is a memory command.
const USER_TEMPLATES: &[&str] = &[
    "Can you help me with {thing}?",
    "I'm working on {thing} and I'm stuck on {detail}.",
    "What would you suggest for {detail}, given that {thing} has to be ready by {day}?",
    "I prefer {pref}.",
    "We decided to go with {pref} for {thing}.",
    "I need to {todo} before {day}.",
    "{name} thinks {detail} will take about {num} days. Is that realistic?",
    "Okay, let's keep {detail} simple for now and look at it again after {day}.",
    "How should I handle {detail} if {name} is not around on {day}?",
    "My goal is to finish {thing} by {day}.",
    "Thanks, that helps. What about {detail}?",
    "I tried that yesterday but {detail} still looks wrong, and {name} noticed it too.",
    "Good point. I will {todo} tomorrow.",
    "Can you compare {pref} with the alternatives for {thing}?",
];

const ASSISTANT_TEMPLATES: &[&str] = &[
    "For {thing}, I would start with {detail}, because it usually takes the longest and everything else depends on it.",
    "That sounds reasonable. If {name} can confirm {detail} by {day}, you can {todo} right after that.",
    "A good approach is to list what {thing} needs first, then check {detail} against a budget of about {num} hours.",
    "Yes, {pref} is a common choice for {thing}. The main trade-off is {detail}, so keep an eye on it.",
    "Here is a short plan: first {todo}, then sort out {detail}, and finally go through {thing} with {name} on {day}.",
    "About {num} days is realistic for {detail} if nothing else gets in the way, but leave some slack before {day}.",
    "I would not change {detail} yet. Get {thing} working end to end first, then improve the parts that matter most.",
    "It helps to write down what done means for {thing}, so that {name} and you agree on {detail} before {day}.",
];

/// Most words of an assistant turn.
const MAX_ASSISTANT_WORDS: usize = 60;

fn pick<'a>(items: &[&'a str], rng: &mut StdRng) -> &'a str {
    items.choose(rng).copied().expect("non-empty word list")
}

fn fill(template: &str, topic: &Topic, rng: &mut StdRng) -> String {
    template
        .replace("{thing}", pick(topic.things, rng))
        .replace("{detail}", pick(topic.details, rng))
        .replace("{pref}", pick(topic.prefs, rng))
        .replace("{todo}", pick(topic.todos, rng))
        .replace("{name}", pick(NAMES, rng))
        .replace("{day}", pick(DAYS, rng))
        .replace("{num}", &rng.random_range(2..=40).to_string())
}

/// One or two sentences (5-35 words).
fn user_turn(topic: &Topic, rng: &mut StdRng) -> String {
    let sentences = if rng.random_bool(0.3) { 2 } else { 1 };
    (0..sentences)
        .map(|_| fill(pick(USER_TEMPLATES, rng), topic, rng))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One to three sentences, at most [`MAX_ASSISTANT_WORDS`] words.
fn assistant_turn(topic: &Topic, rng: &mut StdRng) -> String {
    let wanted = rng.random_range(1..=3);
    let mut sentences: Vec<String> = Vec::new();
    let mut words = 0;
    for _ in 0..wanted {
        let sentence = fill(pick(ASSISTANT_TEMPLATES, rng), topic, rng);
        let count = sentence.split_whitespace().count();
        if !sentences.is_empty() && words + count > MAX_ASSISTANT_WORDS {
            break;
        }
        words += count;
        sentences.push(sentence);
    }
    sentences.join(" ")
}

/// Another topic of the same space.
fn next_topic(space: &str, current: &'static Topic, rng: &mut StdRng) -> &'static Topic {
    let candidates: Vec<&'static Topic> = TOPICS
        .iter()
        .filter(|topic| topic.space == space && !std::ptr::eq(*topic, current))
        .collect();
    candidates.choose(rng).copied().unwrap_or(current)
}

// ---------------------------------------------------------------------------------------------
// Clients and their conversations

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClosingKind {
    /// The first turn of the next session, hours later in the turns' times.
    HardGap,
    /// `close_segment` on the session's last turn.
    Explicit,
}

/// How the next session of a conversation starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NextStart {
    /// The current session goes on.
    Continue,
    /// After a pause of hours, which closes the previous segment.
    AfterGapClosing,
    /// After a pause of hours, the previous segment closed already (by `close_segment`).
    AfterGap,
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    min_session_turns: u32,
    max_session_turns: u32,
    explicit_close_share: f64,
}

struct Conversation {
    id: Uuid,
    space: &'static str,
    topic: &'static Topic,
    /// When its last turn was said, in the turns' own times: in the past, so that hours can pass
    /// between sessions while the benchmark runs for minutes.
    clock: DateTime<Utc>,
    session_left: u32,
    /// Sessions still to come after the current one.
    sessions_after: u32,
    user_next: bool,
    next_start: NextStart,
    messages_sent: u32,
}

impl Conversation {
    fn new(shape: Shape, rng: &mut StdRng) -> Self {
        let space = pick(SPACES, rng);
        let topics: Vec<&'static Topic> = TOPICS.iter().filter(|t| t.space == space).collect();
        let started =
            Utc::now() - TimeDelta::days(30) + TimeDelta::seconds(rng.random_range(0..3 * 86_400));
        Self {
            id: Uuid::new_v4(),
            space,
            topic: topics.choose(rng).copied().expect("topics in every space"),
            // Whole microseconds, as Postgres keeps them (the follower matches episodes by time).
            clock: DateTime::from_timestamp_micros(started.timestamp_micros())
                .expect("a representable time"),
            session_left: rng.random_range(shape.min_session_turns..=shape.max_session_turns),
            sessions_after: rng.random_range(1..=3),
            user_next: true,
            next_start: NextStart::Continue,
            messages_sent: 0,
        }
    }
}

/// A turn about to be appended.
struct PlannedTurn {
    slot: usize,
    conversation: Uuid,
    space: &'static str,
    request: v1::AppendMessagesRequest,
    at: DateTime<Utc>,
    /// When the conversation's previous turn was said.
    previous_at: DateTime<Utc>,
    closes: Option<ClosingKind>,
    /// The conversation's last turn: a new conversation takes its place.
    retire: bool,
}

/// A user: its conversations, and which one it is talking in.
struct ClientState {
    user: Uuid,
    conversations: Vec<Conversation>,
    current: usize,
    visit_left: u32,
    shape: Shape,
    rng: StdRng,
    user_turns: u64,
    user_words: u64,
    assistant_turns: u64,
    assistant_words: u64,
    conversations_started: u64,
}

impl ClientState {
    fn new(conversations: usize, shape: Shape) -> Self {
        let mut rng = StdRng::from_os_rng();
        let conversations: Vec<Conversation> = (0..conversations.max(1))
            .map(|_| Conversation::new(shape, &mut rng))
            .collect();
        Self {
            user: Uuid::new_v4(),
            conversations_started: conversations.len() as u64,
            conversations,
            current: 0,
            visit_left: 0,
            shape,
            rng,
            user_turns: 0,
            user_words: 0,
            assistant_turns: 0,
            assistant_words: 0,
        }
    }

    fn next_turn(&mut self) -> PlannedTurn {
        if self.visit_left == 0 {
            // A few turns in one conversation, then another.
            let count = self.conversations.len();
            if count > 1 {
                let mut next = self.rng.random_range(0..count - 1);
                if next >= self.current {
                    next += 1;
                }
                self.current = next;
            }
            self.visit_left = self.rng.random_range(2..=4);
        }
        self.visit_left -= 1;
        let shape = self.shape;
        let rng = &mut self.rng;
        let conversation = &mut self.conversations[self.current];
        let previous_at = conversation.clock;
        let starts = conversation.next_start;
        if starts == NextStart::Continue {
            conversation.clock += TimeDelta::seconds(rng.random_range(5..=60));
        } else {
            conversation.clock += TimeDelta::minutes(rng.random_range(120..=1_200));
            conversation.topic = next_topic(conversation.space, conversation.topic, rng);
            conversation.session_left =
                rng.random_range(shape.min_session_turns..=shape.max_session_turns);
            conversation.sessions_after -= 1;
            conversation.user_next = true;
            conversation.next_start = NextStart::Continue;
        }
        let user = conversation.user_next;
        conversation.user_next = !user;
        let content = if user {
            user_turn(conversation.topic, rng)
        } else {
            assistant_turn(conversation.topic, rng)
        };
        let words = content.split_whitespace().count() as u64;
        conversation.session_left -= 1;
        let mut closes = (starts == NextStart::AfterGapClosing).then_some(ClosingKind::HardGap);
        let mut close_segment = false;
        let mut retire = false;
        if conversation.session_left == 0 {
            if conversation.sessions_after == 0 {
                close_segment = true;
                retire = true;
            } else if rng.random_bool(shape.explicit_close_share) {
                close_segment = true;
                conversation.next_start = NextStart::AfterGap;
            } else {
                conversation.next_start = NextStart::AfterGapClosing;
            }
            if close_segment {
                closes = Some(ClosingKind::Explicit);
            }
        }
        conversation.messages_sent += 1;
        let at = conversation.clock;
        let request = v1::AppendMessagesRequest {
            scope: Some(v1::Scope {
                user_id: self.user.to_string(),
                space: conversation.space.into(),
            }),
            conversation_id: conversation.id.to_string(),
            messages: vec![v1::ConversationMessage {
                role: if user {
                    v1::SpeakerRole::User
                } else {
                    v1::SpeakerRole::Assistant
                }
                .into(),
                content,
                at: Some(prost_types::Timestamp {
                    seconds: at.timestamp(),
                    nanos: at.timestamp_subsec_nanos() as i32,
                }),
                client_message_id: format!("m{}", conversation.messages_sent),
            }],
            close_segment,
        };
        if user {
            self.user_turns += 1;
            self.user_words += words;
        } else {
            self.assistant_turns += 1;
            self.assistant_words += words;
        }
        PlannedTurn {
            slot: self.current,
            conversation: conversation.id,
            space: conversation.space,
            request,
            at,
            previous_at,
            closes,
            retire,
        }
    }

    /// After the append answered: records a closed segment, retires a finished conversation.
    fn answered(
        &mut self,
        turn: PlannedTurn,
        stored_at: Option<i32>,
        returned: Instant,
        shared: &Shared,
        closings: Option<&FollowClosings>,
    ) {
        if let (Some(index), Some(kind)) = (stored_at, turn.closes) {
            let (through, end_at) = match kind {
                ClosingKind::HardGap => (index - 1, turn.previous_at),
                ClosingKind::Explicit => (index, turn.at),
            };
            shared.segment_closed(turn.conversation, self.user, turn.space, through);
            if let Some(follow) = closings
                && shared
                    .closings
                    .fetch_add(1, Ordering::Relaxed)
                    .is_multiple_of(follow.every)
            {
                let _ = follow.sender.send(Closing {
                    phase: follow.phase,
                    kind,
                    user: self.user,
                    space: turn.space,
                    conversation: turn.conversation,
                    through,
                    end_at,
                    returned,
                });
            }
        }
        if turn.retire {
            self.conversations[turn.slot] = Conversation::new(self.shape, &mut self.rng);
            self.conversations_started += 1;
            // The next turn goes to another conversation.
            self.visit_left = 0;
        }
    }
}

/// What the sampler needs to know of every conversation: through which turn the clients closed
/// its segments.
#[derive(Default)]
struct Shared {
    closed_through: Mutex<HashMap<Uuid, (Uuid, &'static str, i32)>>,
    phase: AtomicUsize,
    /// Closing turns so far (every `FollowClosings::every`th is followed).
    closings: AtomicU64,
}

/// Where a phase's closing turns go to be followed.
#[derive(Clone)]
struct FollowClosings {
    phase: usize,
    /// One in this many is followed.
    every: u64,
    sender: mpsc::UnboundedSender<Closing>,
}

impl FollowClosings {
    fn at_rate(phase: usize, rate: u32, sender: &mpsc::UnboundedSender<Closing>) -> Self {
        Self {
            phase,
            every: follow_every(rate),
            sender: sender.clone(),
        }
    }
}

/// One in how many closing turns is followed at `rate` turns/s: about [`FOLLOWED_PER_SECOND`]
/// a second (sessions are about 14 turns).
fn follow_every(rate: u32) -> u64 {
    u64::from((rate / 14 / FOLLOWED_PER_SECOND).max(1))
}

impl Shared {
    fn segment_closed(&self, conversation: Uuid, user: Uuid, space: &'static str, through: i32) {
        self.closed_through
            .lock()
            .expect("not poisoned")
            .insert(conversation, (user, space, through));
    }
}

// ---------------------------------------------------------------------------------------------
// Driving the load

#[derive(Debug, Clone, Copy)]
enum Pace {
    /// Turns/s from all clients together, each client at its share.
    Open(u32),
    /// Each client appends again as soon as it has its answer.
    Closed,
}

struct Client {
    grpc: IngestServiceClient<Channel>,
    state: ClientState,
}

struct LoadResult {
    histogram: Histogram<u64>,
    answered: u64,
    errors: u64,
    elapsed: Duration,
    /// When the appends slower than [`SLOW_APPEND`] were due, from the phase's start, in order.
    slow: Vec<Duration>,
}

/// The target's bound: appends slower than this are counted by when they came.
const SLOW_APPEND: Duration = Duration::from_millis(10);

fn new_histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// Runs the clients at `pace` for `seconds`; returns them (their conversations go on in the next
/// phase) and what they measured.
async fn drive(
    clients: Vec<Client>,
    pace: Pace,
    seconds: u64,
    shared: Arc<Shared>,
    closings: Option<FollowClosings>,
) -> anyhow::Result<(Vec<Client>, LoadResult)> {
    let count = clients.len();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut tasks = Vec::with_capacity(count);
    for (number, mut client) in clients.into_iter().enumerate() {
        let shared = shared.clone();
        let closings = closings.clone();
        tasks.push(tokio::spawn(async move {
            let mut histogram = new_histogram();
            let mut errors = 0_u64;
            let mut slow: Vec<Duration> = Vec::new();
            let interval = match pace {
                Pace::Open(rate) => Some(Duration::from_secs_f64(count as f64 / f64::from(rate))),
                Pace::Closed => None,
            };
            // The clients' turns are spread evenly over one interval.
            let offset = interval.map_or(Duration::ZERO, |interval| {
                interval.mul_f64(number as f64 / count as f64)
            });
            let mut tick = 0_u32;
            loop {
                let due = match interval {
                    Some(interval) => started + offset + interval * tick,
                    None => Instant::now(),
                };
                if due >= deadline {
                    break;
                }
                tick += 1;
                tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
                let turn = client.state.next_turn();
                let response = client.grpc.append_messages(turn.request.clone()).await;
                let returned = Instant::now();
                if returned - due > SLOW_APPEND {
                    slow.push(due - started);
                }
                histogram
                    .record((returned - due).as_micros() as u64)
                    .expect("latency within the histogram's range");
                let stored_at = match response {
                    Ok(response) => response
                        .into_inner()
                        .turns
                        .first()
                        .filter(|t| t.outcome == i32::from(v1::TurnOutcome::Stored))
                        .map(|t| t.turn_index as i32),
                    Err(status) => {
                        errors += 1;
                        if errors <= 3 {
                            eprintln!("append failed: {status}");
                        }
                        None
                    }
                };
                client
                    .state
                    .answered(turn, stored_at, returned, &shared, closings.as_ref());
            }
            (client, histogram, errors, slow)
        }));
    }
    let mut clients = Vec::with_capacity(count);
    let mut histogram = new_histogram();
    let mut errors = 0;
    let mut slow = Vec::new();
    for task in tasks {
        let (client, client_histogram, client_errors, client_slow) = task.await?;
        histogram.add(&client_histogram)?;
        errors += client_errors;
        slow.extend(client_slow);
        clients.push(client);
    }
    slow.sort();
    let elapsed = started.elapsed();
    Ok((
        clients,
        LoadResult {
            answered: histogram.len(),
            histogram,
            errors,
            elapsed,
            slow,
        },
    ))
}

// ---------------------------------------------------------------------------------------------
// Following closed segments to their episodes

/// A turn whose append closed a segment (its own, or the previous session's).
struct Closing {
    phase: usize,
    kind: ClosingKind,
    user: Uuid,
    space: &'static str,
    conversation: Uuid,
    /// The closed segment's last turn.
    through: i32,
    /// When that turn was said: the episode's `end_at`.
    end_at: DateTime<Utc>,
    /// When the closing append returned.
    returned: Instant,
}

/// From a closing append's return to each step, as first seen by the follower.
#[derive(Debug, Clone)]
struct ClosingTimes {
    phase: usize,
    kind: ClosingKind,
    returned: Instant,
    /// Segmentation recorded the segment closed (`segmented_through`).
    closed: Option<Duration>,
    /// The episode row is committed: RetrieveMemory's BM25 leg finds it.
    searchable: Option<Duration>,
    /// Its embedding is stored (the vector leg finds it too).
    embedded: Option<Duration>,
    /// Closed without an episode row of its own (repeated a near-duplicate, or greetings only).
    no_episode: bool,
}

#[derive(Default)]
struct FollowResult {
    times: Vec<ClosingTimes>,
    /// Closing turns not followed (too many followed at once), per phase.
    skipped: HashMap<usize, u64>,
    polls: u64,
    poll_time: Duration,
}

#[derive(sqlx::FromRow)]
struct ClosingState {
    i: i32,
    closed: bool,
    searchable: bool,
    embedded: bool,
}

/// Polls the database for the followed closings until `stop`, at most every 20 ms and never
/// spending more than a fifth of its time querying. A step's time is when the poll that first
/// saw it started (it happened between the previous poll and that one).
async fn follow_closings(
    pool: PgPool,
    mut incoming: mpsc::UnboundedReceiver<Closing>,
    mut stop: watch::Receiver<bool>,
) -> FollowResult {
    let mut result = FollowResult::default();
    let mut pending: Vec<(Closing, ClosingTimes)> = Vec::new();
    let mut last_embedded_poll = Instant::now();
    loop {
        while let Ok(closing) = incoming.try_recv() {
            if pending.len() >= MAX_FOLLOWED {
                *result.skipped.entry(closing.phase).or_default() += 1;
                continue;
            }
            let times = ClosingTimes {
                phase: closing.phase,
                kind: closing.kind,
                returned: closing.returned,
                closed: None,
                searchable: None,
                embedded: None,
                no_episode: false,
            };
            pending.push((closing, times));
        }
        let stopping = *stop.borrow();
        let mut pause = Duration::from_millis(20);
        // Closings whose episode is searchable wait only for its embedding, which the report
        // counts in seconds: they are asked about once a second, so that the probe's own load on
        // Postgres stays small while the embeddings lag.
        let ask_embedded = stopping || last_embedded_poll.elapsed() >= EMBEDDED_POLL_INTERVAL;
        let asked: Vec<usize> = (0..pending.len())
            .filter(|&at| ask_embedded || pending[at].1.searchable.is_none())
            .collect();
        if ask_embedded {
            last_embedded_poll = Instant::now();
        }
        if !asked.is_empty() {
            let asked_closings = || asked.iter().map(|&at| &pending[at].0);
            let polled = Instant::now();
            let rows: Result<Vec<ClosingState>, sqlx::Error> = sqlx::query_as(
                "SELECT d.i, c.segmented_through >= d.through AS closed, m.id IS NOT NULL AS searchable, \
                        e.memory_id IS NOT NULL AS embedded \
                 FROM unnest($1::int4[], $2::uuid[], $3::text[], $4::uuid[], $5::int4[], $6::timestamptz[]) \
                      AS d(i, user_id, space, conversation_id, through, end_at) \
                 JOIN conversations c ON c.user_id = d.user_id AND c.space = d.space \
                      AND c.conversation_id = d.conversation_id \
                 LEFT JOIN LATERAL (SELECT m.id FROM memories m WHERE m.user_id = d.user_id AND m.space = d.space \
                      AND m.conversation_id = d.conversation_id AND m.kind = 'episodic' AND m.end_at = d.end_at \
                      LIMIT 1) m ON true \
                 LEFT JOIN memory_embeddings e ON e.user_id = d.user_id AND e.memory_id = m.id",
            )
            .bind(asked.iter().map(|&at| at as i32).collect::<Vec<i32>>())
            .bind(asked_closings().map(|c| c.user).collect::<Vec<Uuid>>())
            .bind(asked_closings().map(|c| c.space).collect::<Vec<&str>>())
            .bind(asked_closings().map(|c| c.conversation).collect::<Vec<Uuid>>())
            .bind(asked_closings().map(|c| c.through).collect::<Vec<i32>>())
            .bind(asked_closings().map(|c| c.end_at).collect::<Vec<DateTime<Utc>>>())
            .fetch_all(&pool)
            .await;
            let took = polled.elapsed();
            result.polls += 1;
            result.poll_time += took;
            pause = pause.max(took * 4);
            match rows {
                Ok(rows) => {
                    for row in rows {
                        let Some((_, times)) = pending.get_mut(row.i as usize) else {
                            continue;
                        };
                        let since = polled.saturating_duration_since(times.returned);
                        if (row.closed || row.searchable) && times.closed.is_none() {
                            times.closed = Some(since);
                        }
                        if row.searchable && times.searchable.is_none() {
                            times.searchable = Some(since);
                        }
                        if row.embedded && times.embedded.is_none() {
                            times.embedded = Some(since);
                        }
                    }
                }
                Err(error) => eprintln!("follower query failed: {error}"),
            }
        }
        if !pending.is_empty() {
            let now = Instant::now();
            let mut still = Vec::with_capacity(pending.len());
            for (closing, mut times) in pending {
                let without_episode = times.searchable.is_none()
                    && times.closed.is_some_and(|closed| {
                        now.saturating_duration_since(times.returned + closed) > NO_EPISODE_AFTER
                    });
                if times.embedded.is_some() {
                    result.times.push(times);
                } else if without_episode {
                    times.no_episode = true;
                    result.times.push(times);
                } else {
                    still.push((closing, times));
                }
            }
            pending = still;
        }
        if stopping {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
    }
    // Not resolved by the end: counted as not (yet) searchable or embedded.
    result
        .times
        .extend(pending.into_iter().map(|(_, times)| times));
    result
}

// ---------------------------------------------------------------------------------------------
// Sampling the backlog

/// The state of the pipeline at one moment.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    /// Since the first phase started.
    at: Duration,
    phase: usize,
    turns: i64,
    segmented: i64,
    /// Turns of segments the clients closed that segmentation has not closed yet.
    backlog: i64,
    segments: i64,
    episodes: i64,
    facts: i64,
    unembedded: i64,
    outbox: i64,
    segmentation_queue: Option<u32>,
    embedding_queue: Option<u32>,
}

#[derive(sqlx::FromRow)]
struct Counts {
    turns: i64,
    segmented: i64,
    backlog: i64,
    segments: i64,
    episodes: i64,
    facts: i64,
    unembedded: i64,
    outbox: i64,
}

/// Ready messages in the ingest service's two queues, by passive declares.
struct QueueProbe {
    connection: Option<lapin::Connection>,
    channel: Option<lapin::Channel>,
    url: String,
    segmentation: String,
    embedding: String,
}

impl QueueProbe {
    fn new(url: &str, prefix: &str) -> Self {
        let topology = engram_bus::Topology::new(prefix);
        let retry = Duration::from_secs(1);
        Self {
            connection: None,
            channel: None,
            url: url.to_owned(),
            segmentation: topology.queue(engram_bus::queues::segmentation_requested(retry).name),
            embedding: topology.queue(engram_bus::queues::embedding_requested(retry).name),
        }
    }

    async fn channel(&mut self) -> Option<lapin::Channel> {
        if let Some(channel) = &self.channel
            && channel.status().connected()
        {
            return Some(channel.clone());
        }
        if self
            .connection
            .as_ref()
            .is_none_or(|c| !c.status().connected())
        {
            self.connection = lapin::Connection::connect(&self.url, Default::default())
                .await
                .ok();
        }
        let channel = self.connection.as_ref()?.create_channel().await.ok()?;
        self.channel = Some(channel.clone());
        Some(channel)
    }

    /// `None` when the queue cannot be read (not declared yet, broker away).
    async fn ready(&mut self, queue: &str) -> Option<u32> {
        let channel = self.channel().await?;
        let declared = channel
            .queue_declare(
                queue.to_owned().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await;
        match declared {
            Ok(queue) => Some(queue.message_count()),
            Err(_) => {
                // A failed passive declare closes the channel.
                self.channel = None;
                None
            }
        }
    }
}

async fn sample_once(
    pool: &PgPool,
    shared: &Shared,
    probe: &mut QueueProbe,
    started: Instant,
) -> anyhow::Result<Snapshot> {
    let (users, spaces, conversations, through) = {
        let closed = shared.closed_through.lock().expect("not poisoned");
        let mut users = Vec::with_capacity(closed.len());
        let mut spaces = Vec::with_capacity(closed.len());
        let mut conversations = Vec::with_capacity(closed.len());
        let mut through = Vec::with_capacity(closed.len());
        for (conversation, (user, space, last)) in closed.iter() {
            users.push(*user);
            spaces.push(*space);
            conversations.push(*conversation);
            through.push(*last);
        }
        (users, spaces, conversations, through)
    };
    let counts: Counts = sqlx::query_as(
        "SELECT \
           (SELECT coalesce(sum(next_turn_index), 0)::int8 FROM conversations) AS turns, \
           (SELECT coalesce(sum(segmented_through + 1), 0)::int8 FROM conversations) AS segmented, \
           (SELECT coalesce(sum(greatest(d.through - c.segmented_through, 0)), 0)::int8 \
              FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::int4[]) AS d(user_id, space, conversation_id, through) \
              JOIN conversations c ON c.user_id = d.user_id AND c.space = d.space \
                   AND c.conversation_id = d.conversation_id) AS backlog, \
           (SELECT count(*) FROM audit_events WHERE action = 'segment') AS segments, \
           (SELECT count(*) FROM memories WHERE kind = 'episodic') AS episodes, \
           (SELECT count(*) FROM memories WHERE kind = 'semantic') AS facts, \
           (SELECT count(*) FROM memories WHERE needs_embedding) AS unembedded, \
           (SELECT count(*) FROM outbox_events WHERE published_at IS NULL) AS outbox",
    )
    .bind(users)
    .bind(spaces)
    .bind(conversations)
    .bind(through)
    .fetch_one(pool)
    .await?;
    let segmentation_queue = probe.ready(&probe.segmentation.clone()).await;
    let embedding_queue = probe.ready(&probe.embedding.clone()).await;
    Ok(Snapshot {
        at: started.elapsed(),
        phase: shared.phase.load(Ordering::Relaxed),
        turns: counts.turns,
        segmented: counts.segmented,
        backlog: counts.backlog,
        segments: counts.segments,
        episodes: counts.episodes,
        facts: counts.facts,
        unembedded: counts.unembedded,
        outbox: counts.outbox,
        segmentation_queue,
        embedding_queue,
    })
}

/// Samples every second until `stop`; the latest snapshot is also in `latest`.
async fn sample_backlog(
    pool: PgPool,
    shared: Arc<Shared>,
    mut probe: QueueProbe,
    started: Instant,
    latest: Arc<Mutex<Option<Snapshot>>>,
    mut stop: watch::Receiver<bool>,
) -> Vec<Snapshot> {
    let mut snapshots = Vec::new();
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.changed() => break,
        }
        match sample_once(&pool, &shared, &mut probe, started).await {
            Ok(snapshot) => {
                *latest.lock().expect("not poisoned") = Some(snapshot.clone());
                snapshots.push(snapshot);
            }
            Err(error) => eprintln!("backlog sample failed: {error}"),
        }
    }
    snapshots
}

/// Waits until segmentation closed every segment the clients closed and the pipeline is empty
/// (queues, outbox, embeddings), or `limit` (or [`SETTLE_LIMIT`] after segmentation caught up).
/// Returns when the backlog first reached zero and when everything had settled, from the call.
async fn drain(
    latest: &Mutex<Option<Snapshot>>,
    limit: Duration,
) -> (Option<Duration>, Option<Duration>) {
    let started = Instant::now();
    let mut caught_up: Option<Duration> = None;
    while started.elapsed() < limit
        && caught_up.is_none_or(|at| started.elapsed() < at + SETTLE_LIMIT)
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some(snapshot) = latest.lock().expect("not poisoned").clone() else {
            continue;
        };
        if snapshot.backlog == 0 && snapshot.segmentation_queue == Some(0) {
            caught_up.get_or_insert(started.elapsed());
            if snapshot.outbox == 0
                && snapshot.unembedded == 0
                && snapshot.embedding_queue == Some(0)
            {
                return (caught_up, Some(started.elapsed()));
            }
        }
    }
    (caught_up, None)
}

// ---------------------------------------------------------------------------------------------
// Where the CPU went

/// CPU time in clock ticks: the machine's, and by process.
struct CpuSample {
    total: u64,
    idle: u64,
    processes: HashMap<u32, (&'static str, u64)>,
}

const CPU_GROUPS: &[&str] = &[
    "ingest",
    "retrieval",
    "Postgres",
    "RabbitMQ",
    "load generator",
];

/// Which processes are the benchmark's: its services by pid (others of the same name, such as a
/// colleague's `make run`, are "other"), and the Postgres backends of its database by their
/// process titles (other databases' backends are "other"; the server's own processes, such as
/// the WAL writer, count as Postgres).
#[derive(Debug, Clone, Default)]
struct Watched {
    ingest: Option<u32>,
    retrieval: Option<u32>,
    database: String,
}

impl Watched {
    fn group(&self, pid: u32, comm: &str) -> Option<&'static str> {
        if pid == std::process::id() {
            return Some("load generator");
        }
        match comm {
            "ingest" => (self.ingest.is_none_or(|p| p == pid)).then_some("ingest"),
            "retrieval" => (self.retrieval.is_none_or(|p| p == pid)).then_some("retrieval"),
            "beam.smp" | "epmd" | "erl_child_setup" | "inet_gethost" => Some("RabbitMQ"),
            comm if comm.starts_with("postgres") => {
                let title = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                    .unwrap_or_default()
                    .replace('\0', " ");
                let ours = title.split_whitespace().any(|word| word == self.database);
                let client = title.contains("127.0.0.1(") || title.contains("[local]");
                (ours || !client).then_some("Postgres")
            }
            _ => None,
        }
    }
}

fn cpu_sample(watched: &Watched) -> CpuSample {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    let mut processes = HashMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let Some(group) = watched.group(pid, &stat[open + 1..close]) else {
                continue;
            };
            // After the command: state, ppid, ... utime (14th field) and stime (15th).
            let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
            let ticks = rest
                .get(11)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                + rest
                    .get(12)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            processes.insert(pid, (group, ticks));
        }
    }
    CpuSample {
        total,
        idle,
        processes,
    }
}

/// Cores busy by group over one phase: (phase, seconds, [(group, cores)]).
type PhaseCpu = (usize, f64, Vec<(&'static str, f64)>);

/// Cores busy by group between two samples, with "other" and "idle".
fn cpu_between(before: &CpuSample, after: &CpuSample) -> Vec<(&'static str, f64)> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let total = after.total.saturating_sub(before.total).max(1) as f64;
    let mut by_group: HashMap<&'static str, u64> = HashMap::new();
    for (pid, (group, ticks)) in &after.processes {
        let earlier = before.processes.get(pid).map_or(0, |(_, t)| *t);
        *by_group.entry(group).or_default() += ticks.saturating_sub(earlier);
    }
    let idle = after.idle.saturating_sub(before.idle) as f64;
    let known: u64 = by_group.values().sum();
    let busy = total - idle;
    let mut shares: Vec<(&'static str, f64)> = CPU_GROUPS
        .iter()
        .map(|group| {
            (
                *group,
                by_group.get(group).copied().unwrap_or(0) as f64 / total * cores,
            )
        })
        .collect();
    shares.push(("other", ((busy - known as f64).max(0.0)) / total * cores));
    shares.push(("idle", idle / total * cores));
    shares
}

// ---------------------------------------------------------------------------------------------
// The report

/// Milliseconds below 10 s, seconds above.
fn ms(duration: Duration) -> String {
    if duration < Duration::from_secs(10) {
        format!("{:.0} ms", duration.as_secs_f64() * 1000.0)
    } else {
        format!("{:.1} s", duration.as_secs_f64())
    }
}

fn micros(value: u64) -> String {
    format!("{:.2} ms", value as f64 / 1000.0)
}

/// The `q` quantile of durations where `missing` more never arrived (counted as slower than all);
/// `None` when the quantile falls among the missing.
fn quantile(sorted: &[Duration], missing: usize, q: f64) -> Option<Duration> {
    let total = sorted.len() + missing;
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as usize).clamp(1, total) - 1;
    sorted.get(rank).copied()
}

fn quantile_text(sorted: &[Duration], missing: usize, q: f64) -> String {
    match quantile(sorted, missing, q) {
        Some(value) => ms(value),
        None if sorted.len() + missing == 0 => "—".into(),
        None => "not reached".into(),
    }
}

/// Least-squares slope of `values` over time, per second.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mean_t = points.iter().map(|(t, _)| t).sum::<f64>() / n;
    let mean_v = points.iter().map(|(_, v)| v).sum::<f64>() / n;
    let covariance: f64 = points
        .iter()
        .map(|(t, v)| (t - mean_t) * (v - mean_v))
        .sum();
    let variance: f64 = points.iter().map(|(t, _)| (t - mean_t).powi(2)).sum();
    if variance == 0.0 {
        0.0
    } else {
        covariance / variance
    }
}

fn load_row(name: &str, offered: &str, load: &LoadResult) -> String {
    let h = &load.histogram;
    format!(
        "| {name} | {offered} | {answered} | {rate:.1} /s | {p50} | {p95} | {p99} | {max} | {errors} |",
        answered = load.answered,
        rate = load.answered as f64 / load.elapsed.as_secs_f64(),
        p50 = micros(h.value_at_quantile(0.5)),
        p95 = micros(h.value_at_quantile(0.95)),
        p99 = micros(h.value_at_quantile(0.99)),
        max = micros(h.max()),
        errors = load.errors,
    )
}

/// A phase's boundaries in wall-clock time (for the database's timestamps) and run time.
#[derive(Debug, Clone, Copy)]
struct PhaseSpan {
    from_utc: DateTime<Utc>,
    to_utc: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct SegmentRow {
    reason: Option<String>,
    episode: Option<String>,
    segments: i64,
    turns: Option<i64>,
}

/// Segments closed in a span, by reason and by what became of the episode.
async fn segments_by_reason(pool: &PgPool, span: PhaseSpan) -> anyhow::Result<Vec<SegmentRow>> {
    Ok(sqlx::query_as(
        "SELECT detail->>'reason' AS reason, detail->>'episode' AS episode, count(*) AS segments, \
                sum((detail->'segment'->>1)::int - (detail->'segment'->>0)::int + 1)::int8 AS turns \
         FROM audit_events WHERE action = 'segment' AND created_at >= $1 AND created_at < $2 \
         GROUP BY 1, 2 ORDER BY 3 DESC",
    )
    .bind(span.from_utc)
    .bind(span.to_utc)
    .fetch_all(pool)
    .await?)
}

#[derive(sqlx::FromRow)]
struct Written {
    episodes: i64,
    facts: i64,
    consolidated: i64,
}

async fn written_in(pool: &PgPool, span: PhaseSpan) -> anyhow::Result<Written> {
    Ok(sqlx::query_as(
        "SELECT count(*) FILTER (WHERE kind = 'episodic') AS episodes, \
                count(*) FILTER (WHERE kind = 'semantic') AS facts, \
                count(*) FILTER (WHERE kind = 'episodic' AND consolidated_at IS NOT NULL) AS consolidated \
         FROM memories WHERE created_at >= $1 AND created_at < $2",
    )
    .bind(span.from_utc)
    .bind(span.to_utc)
    .fetch_one(pool)
    .await?)
}

/// Asks RetrieveMemory for a sample of episodes by their own title and summary: is a committed
/// episode found by the BM25 leg? Returns (asked, found by BM25, found at all).
async fn check_bm25(pool: &PgPool, endpoint: &str) -> anyhow::Result<(usize, usize, usize)> {
    let episodes: Vec<(Uuid, Uuid, String, String, String)> = sqlx::query_as(
        "SELECT id, user_id, space, coalesce(title, ''), text FROM memories \
         WHERE kind = 'episodic' ORDER BY random() LIMIT $1",
    )
    .bind(BM25_CHECKS)
    .fetch_all(pool)
    .await?;
    let mut retrieval = RetrievalServiceClient::new(
        Channel::from_shared(endpoint.to_owned())?
            .connect()
            .await
            .context("connecting to the retrieval service")?,
    );
    let (mut by_bm25, mut found) = (0, 0);
    for (id, user, space, title, summary) in &episodes {
        let query: String = format!("{title} {summary}").chars().take(2_000).collect();
        let response = retrieval
            .retrieve_memory(v1::RetrieveMemoryRequest {
                scope: Some(v1::Scope {
                    user_id: user.to_string(),
                    space: space.clone(),
                }),
                query,
                episodic_limit: Some(10),
                semantic_limit: Some(0),
                ..Default::default()
            })
            .await?
            .into_inner();
        let hit = response
            .episodic
            .iter()
            .find(|m| m.memory.as_ref().is_some_and(|m| m.id == id.to_string()));
        if let Some(hit) = hit {
            found += 1;
            if hit.score.as_ref().is_some_and(|s| s.sparse_rank > 0) {
                by_bm25 += 1;
            }
        }
    }
    Ok((episodes.len(), by_bm25, found))
}

#[derive(sqlx::FromRow)]
struct PostgresSettings {
    shared_buffers: String,
    huge_pages: String,
    synchronous_commit: String,
    wal_writer_delay: String,
}

struct ClosingSummary {
    followed: usize,
    skipped: u64,
    closed: Vec<Duration>,
    searchable: Vec<Duration>,
    embedded: Vec<Duration>,
    no_episode: usize,
    /// Followed closings that never got as far as a committed episode (excluding `no_episode`).
    not_searchable: usize,
    not_embedded: usize,
    not_closed: usize,
    hard_gap: usize,
    explicit: usize,
}

fn summarize_closings(follow: &FollowResult, phase: usize) -> ClosingSummary {
    let times: Vec<&ClosingTimes> = follow.times.iter().filter(|t| t.phase == phase).collect();
    let mut closed: Vec<Duration> = times.iter().filter_map(|t| t.closed).collect();
    let with_episode: Vec<&&ClosingTimes> = times.iter().filter(|t| !t.no_episode).collect();
    let mut searchable: Vec<Duration> = with_episode.iter().filter_map(|t| t.searchable).collect();
    let mut embedded: Vec<Duration> = with_episode.iter().filter_map(|t| t.embedded).collect();
    closed.sort();
    searchable.sort();
    embedded.sort();
    ClosingSummary {
        followed: times.len(),
        skipped: follow.skipped.get(&phase).copied().unwrap_or(0),
        not_closed: times.len() - closed.len(),
        not_searchable: with_episode.len() - searchable.len(),
        not_embedded: with_episode.len() - embedded.len(),
        no_episode: times.len() - with_episode.len(),
        hard_gap: times
            .iter()
            .filter(|t| t.kind == ClosingKind::HardGap)
            .count(),
        explicit: times
            .iter()
            .filter(|t| t.kind == ClosingKind::Explicit)
            .count(),
        closed,
        searchable,
        embedded,
    }
}

fn closing_rows(summary: &ClosingSummary) -> String {
    let row = |name: &str, sorted: &[Duration], missing: usize| {
        format!(
            "| {name} | {count} | {p50} | {p95} | {max} | {missing} |",
            count = sorted.len(),
            p50 = quantile_text(sorted, missing, 0.5),
            p95 = quantile_text(sorted, missing, 0.95),
            max = sorted.last().map_or("—".into(), |d| ms(*d)),
        )
    };
    [
        row(
            "segment closed (`segmented_through`)",
            &summary.closed,
            summary.not_closed,
        ),
        row(
            "**episode searchable** (row committed: BM25 leg)",
            &summary.searchable,
            summary.not_searchable,
        ),
        row(
            "episode embedded (vector leg)",
            &summary.embedded,
            summary.not_embedded,
        ),
    ]
    .join("\n")
}

/// The per-window table of a phase (and the drain after it).
fn window_rows(
    snapshots: &[Snapshot],
    phases: &[usize],
    follow: &FollowResult,
    run_started: Instant,
) -> String {
    let chosen: Vec<&Snapshot> = snapshots
        .iter()
        .filter(|s| phases.contains(&s.phase))
        .collect();
    let Some(first) = chosen.first() else {
        return String::new();
    };
    let mut rows = Vec::new();
    let mut previous: &Snapshot = first;
    let mut window_start = first.at;
    for (position, snapshot) in chosen.iter().enumerate().skip(1) {
        // A window ends after WINDOW_SECS, at the end of a phase, or at the end.
        let phase_ends = chosen
            .get(position + 1)
            .is_none_or(|next| next.phase != snapshot.phase);
        if snapshot.at - window_start < Duration::from_secs(WINDOW_SECS) && !phase_ends {
            continue;
        }
        let seconds = (snapshot.at - previous.at).as_secs_f64().max(0.001);
        let per_second = |now: i64, before: i64| (now - before) as f64 / seconds;
        // Closing appends that returned in this window: how long until their episode was
        // searchable.
        let mut latencies: Vec<Duration> = follow
            .times
            .iter()
            .filter(|t| {
                let at = t.returned.saturating_duration_since(run_started);
                at >= previous.at && at < snapshot.at && !t.no_episode
            })
            .map(|t| t.searchable.unwrap_or(Duration::MAX))
            .collect();
        latencies.sort();
        let latency = match (latencies.get(latencies.len() / 2), latencies.last()) {
            (Some(median), Some(max)) => {
                let show = |d: &Duration| {
                    if *d == Duration::MAX {
                        "never".to_owned()
                    } else {
                        ms(*d)
                    }
                };
                format!("{} / {}", show(median), show(max))
            }
            _ => "—".into(),
        };
        rows.push(format!(
            "| {from:.0}–{to:.0} s | {phase} | {turns:.0} | {handled} | {segmented:.0} | {segments:.1} | {episodes:.1} | {facts:.1} | {backlog} | {open} | {latency} | {seg_queue} | {outbox} | {emb_queue} | {unembedded} |",
            from = previous.at.as_secs_f64(),
            to = snapshot.at.as_secs_f64(),
            phase = PHASE_NAMES[snapshot.phase],
            turns = per_second(snapshot.turns, previous.turns),
            // One request per appended turn: those that arrived, less the growth of the queue.
            handled = match (snapshot.segmentation_queue, previous.segmentation_queue) {
                (Some(now), Some(before)) => format!(
                    "{:.0}",
                    per_second(snapshot.turns, previous.turns)
                        - per_second(i64::from(now), i64::from(before))
                ),
                _ => "?".into(),
            },
            segmented = per_second(snapshot.segmented, previous.segmented),
            segments = per_second(snapshot.segments, previous.segments),
            episodes = per_second(snapshot.episodes, previous.episodes),
            facts = per_second(snapshot.facts, previous.facts),
            backlog = snapshot.backlog,
            open = snapshot.turns - snapshot.segmented - snapshot.backlog,
            seg_queue = snapshot
                .segmentation_queue
                .map_or("?".into(), |n| n.to_string()),
            outbox = snapshot.outbox,
            emb_queue = snapshot.embedding_queue.map_or("?".into(), |n| n.to_string()),
            unembedded = snapshot.unembedded,
        ));
        previous = snapshot;
        window_start = snapshot.at;
    }
    rows.join("\n")
}

const PHASE_NAMES: &[&str] = &[
    "target rate",
    "drain",
    "sustainable rate",
    "drain",
    "closed loop",
    "after",
];
const TARGET: usize = 0;
const TARGET_DRAIN: usize = 1;
const SUSTAINED: usize = 2;
const SUSTAINED_DRAIN: usize = 3;
const CLOSED: usize = 4;
const AFTER: usize = 5;

/// Segmentation's verdict on one phase: the backlog's slope over the phase's second half (turns/s),
/// and the backlog at its end and at most.
fn backlog_trend(snapshots: &[Snapshot], phase: usize) -> (f64, i64, i64) {
    trend(snapshots, phase, |s| s.backlog)
}

/// The same for the messages ready in the segmentation queue (one per append).
fn queue_trend(snapshots: &[Snapshot], phase: usize) -> (f64, i64, i64) {
    trend(snapshots, phase, |s| {
        s.segmentation_queue.map_or(0, i64::from)
    })
}

fn trend(
    snapshots: &[Snapshot],
    phase: usize,
    value: impl Fn(&Snapshot) -> i64,
) -> (f64, i64, i64) {
    let points: Vec<(f64, f64)> = snapshots
        .iter()
        .filter(|s| s.phase == phase)
        .map(|s| (s.at.as_secs_f64(), value(s) as f64))
        .collect();
    let half = &points[points.len() / 2..];
    let end = points.last().map_or(0, |(_, v)| *v as i64);
    let max = points.iter().map(|(_, v)| *v as i64).max().unwrap_or(0);
    (slope(half), end, max)
}

fn segment_table(rows: &[SegmentRow]) -> String {
    if rows.is_empty() {
        return "| — | — | 0 | — |".into();
    }
    rows.iter()
        .map(|row| {
            format!(
                "| {} | {} | {} | {:.1} |",
                row.reason.as_deref().unwrap_or("?"),
                row.episode.as_deref().unwrap_or("?"),
                row.segments,
                row.turns.unwrap_or(0) as f64 / row.segments.max(1) as f64
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn cpu_row(name: &str, seconds: f64, shares: &[(&'static str, f64)]) -> String {
    let cells: Vec<String> = shares.iter().map(|(_, v)| format!("{v:.2}")).collect();
    format!("| {name} | {seconds:.0} s | {} |", cells.join(" | "))
}

fn yes_no(met: bool) -> &'static str {
    if met { "**met**" } else { "**missed**" }
}

// ---------------------------------------------------------------------------------------------

async fn run(args: RunArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.clients > 0 && args.rate > 0,
        "clients and rate must be positive"
    );
    anyhow::ensure!(
        args.min_session_turns >= 2 && args.max_session_turns >= args.min_session_turns,
        "sessions need at least two turns, and max at least min"
    );
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&args.database_url)
        .await
        .context("connecting to the benchmark database")?;
    let shape = Shape {
        min_session_turns: args.min_session_turns,
        max_session_turns: args.max_session_turns,
        explicit_close_share: args.explicit_close_share,
    };
    let mut clients = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        // A connection per client, as separate assistant processes would have.
        let channel = Channel::from_shared(args.endpoint.clone())?
            .connect()
            .await
            .context("connecting to the ingest service")?;
        clients.push(Client {
            grpc: IngestServiceClient::new(channel),
            state: ClientState::new(args.conversations_per_client, shape),
        });
    }

    let host_before = tokio::task::spawn_blocking(HostSpeed::measure).await?;
    eprintln!("host speed before the load: {}", host_before.describe());

    let shared = Arc::new(Shared::default());
    let run_started = Instant::now();
    let latest = Arc::new(Mutex::new(None));
    let (stop_sampling, sampling_stop) = watch::channel(false);
    let sampler = tokio::spawn(sample_backlog(
        pool.clone(),
        shared.clone(),
        QueueProbe::new(&args.amqp_url, &args.topology_prefix),
        run_started,
        latest.clone(),
        sampling_stop.clone(),
    ));
    let (closings, incoming) = mpsc::unbounded_channel();
    let follower = tokio::spawn(follow_closings(pool.clone(), incoming, sampling_stop));
    let mut spans: HashMap<usize, PhaseSpan> = HashMap::new();
    let mut cpu: Vec<PhaseCpu> = Vec::new();
    let watched = Watched {
        ingest: args.ingest_pid,
        retrieval: args.retrieval_pid,
        database: url::Url::parse(&args.database_url)
            .map(|url| url.path().trim_start_matches('/').to_owned())
            .unwrap_or_default(),
    };
    let mut phase_started = (Utc::now(), Instant::now(), cpu_sample(&watched));
    let mut end_phase =
        |phase: usize, spans: &mut HashMap<usize, PhaseSpan>, cpu: &mut Vec<PhaseCpu>| {
            let now = (Utc::now(), Instant::now(), cpu_sample(&watched));
            spans.insert(
                phase,
                PhaseSpan {
                    from_utc: phase_started.0,
                    to_utc: now.0,
                },
            );
            cpu.push((
                phase,
                (now.1 - phase_started.1).as_secs_f64(),
                cpu_between(&phase_started.2, &now.2),
            ));
            phase_started = now;
        };

    // 1. The target rate.
    eprintln!(
        "target: {} turns/s from {} clients for {} s",
        args.rate, args.clients, args.seconds
    );
    shared.phase.store(TARGET, Ordering::Relaxed);
    let (clients_back, target) = drive(
        clients,
        Pace::Open(args.rate),
        args.seconds,
        shared.clone(),
        Some(FollowClosings::at_rate(TARGET, args.rate, &closings)),
    )
    .await?;
    let clients = clients_back;
    end_phase(TARGET, &mut spans, &mut cpu);
    eprintln!(
        "target: {} appends, p99 {}, {} errors",
        target.answered,
        micros(target.histogram.value_at_quantile(0.99)),
        target.errors
    );

    // 2. Drain.
    shared.phase.store(TARGET_DRAIN, Ordering::Relaxed);
    let drain_limit = Duration::from_secs(args.drain_seconds);
    let (target_caught_up, target_settled) = drain(&latest, drain_limit).await;
    end_phase(TARGET_DRAIN, &mut spans, &mut cpu);
    eprintln!("drain: caught up after {target_caught_up:?}, settled after {target_settled:?}");

    // 3. A sustainable rate, when the target rate left a backlog to drain.
    let mut clients = clients;
    let mut sustained: Option<(u32, LoadResult)> = None;
    let mut sustained_drain: (Option<Duration>, Option<Duration>) = (None, None);
    let drained_for = target_caught_up.unwrap_or(drain_limit);
    if args.sustained_seconds > 0 && drained_for > Duration::from_secs(5) {
        let rate = sustainable_rate(target.answered, target.elapsed, drained_for, args.rate);
        eprintln!(
            "segmentation took a while to catch up; sustainable phase: {rate} turns/s for {} s",
            args.sustained_seconds
        );
        shared.phase.store(SUSTAINED, Ordering::Relaxed);
        let (clients_back, load) = drive(
            clients,
            Pace::Open(rate),
            args.sustained_seconds,
            shared.clone(),
            Some(FollowClosings::at_rate(SUSTAINED, rate, &closings)),
        )
        .await?;
        clients = clients_back;
        end_phase(SUSTAINED, &mut spans, &mut cpu);
        sustained = Some((rate, load));
        shared.phase.store(SUSTAINED_DRAIN, Ordering::Relaxed);
        sustained_drain = drain(&latest, drain_limit).await;
        end_phase(SUSTAINED_DRAIN, &mut spans, &mut cpu);
    }

    // 4. Closed loop.
    let mut closed_loop = None;
    if args.closed_seconds > 0 {
        eprintln!(
            "closed loop: {} clients for {} s",
            args.clients, args.closed_seconds
        );
        shared.phase.store(CLOSED, Ordering::Relaxed);
        let (clients_back, load) = drive(
            clients,
            Pace::Closed,
            args.closed_seconds,
            shared.clone(),
            None,
        )
        .await?;
        clients = clients_back;
        end_phase(CLOSED, &mut spans, &mut cpu);
        closed_loop = Some(load);
    }
    shared.phase.store(AFTER, Ordering::Relaxed);
    // One more sample after the closed loop, for the backlog it left.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    drop(closings);
    let _ = stop_sampling.send(true);
    let snapshots = sampler.await?;
    let follow = follower.await?;
    let host_after = tokio::task::spawn_blocking(HostSpeed::measure).await?;
    eprintln!("host speed after the load: {}", host_after.describe());

    let (bm25_asked, bm25_found, found) = check_bm25(&pool, &args.retrieval_endpoint).await?;
    eprintln!("RetrieveMemory: {bm25_found} of {bm25_asked} episodes found by the BM25 leg");

    write_report(ReportInputs {
        args: &args,
        pool: &pool,
        clients: &clients,
        target,
        target_drain: (target_caught_up, target_settled),
        sustained,
        sustained_drain,
        closed_loop,
        snapshots,
        follow,
        spans,
        cpu,
        run_started,
        host_before,
        host_after,
        bm25: (bm25_asked, bm25_found, found),
    })
    .await
}

/// Half the rate the pipeline got through the target phase's turns: every turn appended at the
/// target rate, over the phase and the time segmentation took to catch up after it, in tens.
fn sustainable_rate(appended: u64, target: Duration, caught_up: Duration, rate: u32) -> u32 {
    let throughput = appended as f64 / (target + caught_up).as_secs_f64().max(0.001);
    (((throughput / 2.0) / 10.0).floor() as u32 * 10).clamp(10, rate)
}

struct ReportInputs<'a> {
    args: &'a RunArgs,
    pool: &'a PgPool,
    clients: &'a [Client],
    target: LoadResult,
    target_drain: (Option<Duration>, Option<Duration>),
    sustained: Option<(u32, LoadResult)>,
    sustained_drain: (Option<Duration>, Option<Duration>),
    closed_loop: Option<LoadResult>,
    snapshots: Vec<Snapshot>,
    follow: FollowResult,
    spans: HashMap<usize, PhaseSpan>,
    cpu: Vec<PhaseCpu>,
    run_started: Instant,
    host_before: HostSpeed,
    host_after: HostSpeed,
    bm25: (usize, usize, usize),
}

fn drained_text(drained: (Option<Duration>, Option<Duration>), limit: u64) -> String {
    match drained {
        (Some(caught_up), Some(settled)) => format!(
            "segmentation caught up {} after the appends stopped, and the whole pipeline \
             (outbox, queues, embeddings) was empty after {}",
            ms(caught_up),
            ms(settled)
        ),
        (Some(caught_up), None) => format!(
            "segmentation caught up {} after the appends stopped; the outbox, the queues and the \
             embeddings were still not all done when the benchmark stopped waiting ({} s later, \
             or {limit} s after the appends)",
            ms(caught_up),
            SETTLE_LIMIT.as_secs()
        ),
        _ => format!("segmentation had **not** caught up {limit} s after the appends stopped"),
    }
}

async fn write_report(inputs: ReportInputs<'_>) -> anyhow::Result<()> {
    let ReportInputs {
        args,
        pool,
        clients,
        target,
        target_drain,
        sustained,
        sustained_drain,
        closed_loop,
        snapshots,
        follow,
        spans,
        cpu,
        run_started,
        host_before,
        host_after,
        bm25,
    } = inputs;

    let postgres: PostgresSettings = sqlx::query_as(
        "SELECT current_setting('shared_buffers') AS shared_buffers, \
                current_setting('huge_pages_status') AS huge_pages, \
                current_setting('synchronous_commit') AS synchronous_commit, \
                current_setting('wal_writer_delay') AS wal_writer_delay",
    )
    .fetch_one(pool)
    .await?;

    // Target 1.
    let p99 = target.histogram.value_at_quantile(0.99);
    let achieved = target.answered as f64 / target.elapsed.as_secs_f64();
    let append_met = p99 <= 10_000 && target.errors == 0;

    // Target 2.
    let (slope_target, backlog_end, backlog_max) = backlog_trend(&snapshots, TARGET);
    let (queue_slope, queue_end, _) = queue_trend(&snapshots, TARGET);
    // Bounded: neither the backlog of closed segments nor the queue of segmentation requests
    // grows by more than 1 % of the offered rate.
    let keeps_up =
        slope_target < f64::from(args.rate) * 0.01 && queue_slope < f64::from(args.rate) * 0.01;
    let target_span = spans[&TARGET];
    let target_segments = segments_by_reason(pool, target_span).await?;
    let target_written = written_in(pool, target_span).await?;
    let target_seconds =
        (target_span.to_utc - target_span.from_utc).num_milliseconds() as f64 / 1000.0;
    let segments_in_target: i64 = target_segments.iter().map(|r| r.segments).sum();
    let turns_in_segments: i64 = target_segments.iter().filter_map(|r| r.turns).sum();
    let last_target = snapshots
        .iter()
        .rfind(|s| s.phase == TARGET)
        .cloned()
        .unwrap_or_default();

    // Target 3.
    let closings = summarize_closings(&follow, TARGET);
    let p95_searchable = quantile(&closings.searchable, closings.not_searchable, 0.95);
    let latency_met = p95_searchable.is_some_and(|p95| p95 <= Duration::from_secs(2));

    let user_turns: u64 = clients.iter().map(|c| c.state.user_turns).sum();
    let user_words: u64 = clients.iter().map(|c| c.state.user_words).sum();
    let assistant_turns: u64 = clients.iter().map(|c| c.state.assistant_turns).sum();
    let assistant_words: u64 = clients.iter().map(|c| c.state.assistant_words).sum();
    let conversations: u64 = clients.iter().map(|c| c.state.conversations_started).sum();

    let mut load_rows = vec![load_row(
        "target rate",
        &format!("{} /s", args.rate),
        &target,
    )];
    if let Some((rate, load)) = &sustained {
        load_rows.push(load_row("sustainable rate", &format!("{rate} /s"), load));
    }
    if let Some(load) = &closed_loop {
        load_rows.push(load_row("closed loop", "as fast as answered", load));
    }

    let mut cpu_rows = Vec::new();
    for (phase, seconds, shares) in &cpu {
        cpu_rows.push(cpu_row(PHASE_NAMES[*phase], *seconds, shares));
    }
    let cpu_header = {
        let mut names: Vec<&str> = CPU_GROUPS.to_vec();
        names.extend(["other", "idle"]);
        format!(
            "| phase | length | {} |\n|---|---|{}",
            names.join(" | "),
            "---|".repeat(names.len())
        )
    };

    let sustained_section = match &sustained {
        Some((rate, load)) => {
            let span = spans[&SUSTAINED];
            let (slope_sustained, end, max) = backlog_trend(&snapshots, SUSTAINED);
            let summary = summarize_closings(&follow, SUSTAINED);
            let segments = segments_by_reason(pool, span).await?;
            let seconds = (span.to_utc - span.from_utc).num_milliseconds() as f64 / 1000.0;
            let closed: i64 = segments.iter().map(|r| r.segments).sum();
            format!(
                "## At a rate segmentation sustains\n\n\
                 After {target_rate} turns/s, segmentation took {caught_up} to catch up, so the same clients then appended at \
                 **{rate} turns/s** for {secs} s: half the rate at which the pipeline got through the target phase's \
                 turns (all of them, over the phase and the catch-up), so \
                 that the time from a closing turn to its episode is also seen when it keeps up. \
                 AppendMessages there: p50 {p50}, p99 {p99}. Segments closed: {closed} ({seg_rate:.1}/s). \
                 Backlog: slope over the second half {slope_sustained:+.2} turns/s, {end} turns at the end \
                 (at most {max}); {drained}.\n\n\
                 | from the closing append to | followed | p50 | p95 | max | never seen |\n|---|---|---|---|---|---|\n{rows}\n\n\
                 Followed: {followed} closing turns, one in {every} ({hard} by a hard gap, {explicit} by `close_segment`); \
                 {no_episode} of their segments closed without an episode row of their own; {skipped} closings \
                 were not followed (more than {MAX_FOLLOWED} at once).\n\n\
                 | reason | episode | segments | turns per segment |\n|---|---|---|---|\n{segment_rows}\n\n",
                target_rate = args.rate,
                caught_up = target_drain
                    .0
                    .map_or(format!("more than {} s", args.drain_seconds), ms),
                secs = args.sustained_seconds,
                p50 = micros(load.histogram.value_at_quantile(0.5)),
                p99 = micros(load.histogram.value_at_quantile(0.99)),
                seg_rate = closed as f64 / seconds.max(0.001),
                drained = drained_text(sustained_drain, args.drain_seconds),
                rows = closing_rows(&summary),
                followed = summary.followed,
                every = follow_every(*rate),
                hard = summary.hard_gap,
                explicit = summary.explicit,
                no_episode = summary.no_episode,
                skipped = summary.skipped,
                segment_rows = segment_table(&segments),
            )
        }
        None => String::new(),
    };

    let after_closed = snapshots
        .iter()
        .rfind(|s| s.phase == AFTER || s.phase == CLOSED);
    // When the target phase's slow appends came: right after the services started, or all along.
    let slow_note = {
        let first_second = target
            .slow
            .iter()
            .filter(|due| **due < Duration::from_secs(1))
            .count();
        let mut by_second: Vec<u64> = target.slow.iter().map(|due| due.as_secs()).collect();
        by_second.dedup();
        format!(
            "At the target rate, {slow} appends took longer than {bound} ms ({share:.2} %): {first_second} \
             of them were due in the phase's first second (the services had just started), the others \
             in {seconds} of its other seconds.",
            slow = target.slow.len(),
            bound = SLOW_APPEND.as_millis(),
            share = 100.0 * target.slow.len() as f64 / target.answered.max(1) as f64,
            seconds = by_second.iter().filter(|second| **second >= 1).count(),
        )
    };
    let closed_note = match (&closed_loop, after_closed) {
        (Some(load), Some(after)) => format!(
            "The closed loop appended {answered} turns in {secs:.0} s ({rate:.0}/s); right after it, \
             {backlog} turns of closed segments were waiting for segmentation ({queue} messages in its queue).",
            answered = load.answered,
            secs = load.elapsed.as_secs_f64(),
            rate = load.answered as f64 / load.elapsed.as_secs_f64(),
            backlog = after.backlog,
            queue = after
                .segmentation_queue
                .map_or("?".into(), |n| n.to_string()),
        ),
        _ => String::new(),
    };

    let window_phases = [TARGET, TARGET_DRAIN];
    let windows = window_rows(&snapshots, &window_phases, &follow, run_started);
    let sustained_windows = if sustained.is_some() {
        format!(
            "\n{}",
            window_rows(
                &snapshots,
                &[SUSTAINED, SUSTAINED_DRAIN],
                &follow,
                run_started
            )
        )
    } else {
        String::new()
    };

    let service_settings = if args.service_settings.is_empty() {
        "none recorded".to_owned()
    } else {
        format!("`{}`", args.service_settings)
    };

    let text = format!(
        "# Conversations benchmark\n\n\
         Produced by `{command_line}` on {date}.\n\n\
         Machine: {machine}. Host speed (`engram_bench::bench::HostSpeed`, independent of Engram) before the \
         load: {host_before}; after it: {host_after}.\n\n\
         Postgres: shared_buffers {shared_buffers}, huge pages {huge_pages}, synchronous_commit {synchronous_commit}, \
         wal_writer_delay {wal_writer_delay}. A fresh database (`engram_bench_conversations`) for each run.\n\n\
         Services: a release ingest service with the bus on (the local RabbitMQ, a topology prefix of its own) and the \
         local embedder (all-MiniLM-L6-v2 on the CPU, as `make run` has it), no LLM, so that titles, summaries, facts \
         and surprise come from the local rules and the topic rules run on token vectors of the turns; a release retrieval \
         service, asked only at the end. Settings that differ from the defaults: {service_settings}. They only \
         place the services (database, ports, bus prefix, model directory) and turn the local embedder on; \
         every `segmentation.*`, `memory.*`, `embed.*` and `amqp.*` setting is at its default (hard gap 1 h, \
         `max_turns` 40, `idle_close_secs` 30 min, prefetch 64). Segments close because of what the clients \
         send, not because of settings: the turns carry their own times (`at`), and the first turn of a session \
         comes hours after the last one of the previous session (a hard gap), or a session's last append has \
         `close_segment: true`.\n\n\
         ## Targets\n\n\
         | target | measured | |\n|---|---|---|\n\
         | AppendMessages p99 ≤ 10 ms at {rate} turns/s offered from {clients} clients | p99 {p99_text} (p50 {p50_text}), {achieved:.1} turns/s achieved, {errors} errors | {append_met} |\n\
         | segmentation keeps up with {rate} turns/s (the open backlog does not grow) | over the run's second half, the backlog grew {slope_target:+.2} turns/s and the segmentation queue {queue_slope:+.2} messages/s; at the end {backlog_end} turns in the backlog (at most {backlog_max}) and {queue_end} messages in the queue; {drain_speed} | {keeps_up} |\n\
         | closing turn → episode searchable, p95 ≤ 2 s | p95 {p95_text}, p50 {p50_searchable} ({followed} segments followed) | {latency_met} |\n\n\
         ## Workload\n\n\
         {clients} clients, each a user with {per_client} conversations going at once in four spaces (`work`, `home`, \
         `travel`, `health`), {conversations} conversations in all by the end. A client appends one turn at a time and \
         gives a conversation 2–4 turns before it moves on to another. A conversation is 2–4 sessions of \
         {min_turns}–{max_turns} turns, user and assistant in turn, on one of three topics of its space (twelve topics \
         in all, so the turns of a session are about one thing); turns are 5–60 words (user turns {user_mean:.1} words \
         on average, assistant turns {assistant_mean:.1}), made of questions, plans, preferences and decisions, \
         so that consolidation finds facts. Between sessions 2–20 hours pass in the turns' times (`at`: the \
         conversations are set a month in the past), so the next session's first user turn closes the previous \
         segment by the hard-gap rule; {explicit_share:.0} % of sessions, and every conversation's last, end \
         with `close_segment: true` instead, after which the conversation is retired and a new one started. Every turn \
         carries a `client_message_id`. Phases: the target rate, open loop, for {seconds} s; no appends until \
         segmentation caught up (at most {drain} s); {sustained_line}a closed loop of {closed_seconds} s.\n\n\
         ## 1. AppendMessages\n\n\
         Open loop: each client sends at its share of the offered rate (one turn every {interval:.0} ms, the clients \
         spread evenly over that interval), one at a time on its own HTTP/2 connection; latency counts from when each \
         turn was due, so an append that waited for the one before it counts the wait. Closed loop: each client sends \
         again as soon as it has its answer (the saturation rate).\n\n\
         | phase | offered | appends | achieved | p50 | p95 | p99 | max | errors |\n|---|---|---|---|---|---|---|---|---|\n\
         {load_rows}\n\n\
         {slow_note}\n\n\
         {closed_note}\n\n\
         ## 2. Segmentation at {rate} turns/s\n\n\
         Every second the benchmark reads the **open backlog**: for each conversation, the turns up to the last segment \
         the client closed (by a hard gap or `close_segment`) that segmentation has not yet put in a closed segment. \
         The turns of the sessions still going on (the open tails) are not in it. \"Open\" counts turns after \
         those: the open tails, less what the topic rules closed early. Latency: from the closing append's return \
         to the episode being searchable, median / max of the closings in the window (\"never\": not by the end of \
         the run). An append asks for segmentation (a `SegmentationRequested` message) unless a request for its \
         conversation is already pending, whose pass reads its turns too; \
         \"requests handled\" is those that arrived less the growth of the queue's ready messages (the consumer also \
         holds up to 64 unacknowledged, its prefetch).\n\n\
         | window | phase | turns appended /s | segmentation requests handled /s | turns segmented /s | segments closed /s | episodes /s | facts /s | backlog (turns) | open (turns) | closing → searchable | segmentation queue | outbox | embedding queue | awaiting embedding |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n{windows}{sustained_windows}\n\n\
         During the {target_secs:.0} s at the target rate: {segments_in_target} segments closed ({segment_rate:.1}/s, \
         {turns_per_segment:.1} turns each on average), {episodes} episodes written ({episode_rate:.1}/s; \
         {consolidated} of them consolidated by the phase's end) and {facts} facts. At the end of the phase: backlog \
         {backlog_end} turns, {seg_queue} messages ready in the segmentation queue, {outbox} events in the outbox, \
         {emb_queue} in the embedding queue, {unembedded} entries awaiting their embedding. After the appends \
         stopped, {drained}.\n\n\
         Segments closed during the target phase, by the rule that closed them and what became of the episode \
         (\"created\"; \"repeated\": a near-duplicate episode was repeated instead; \"none\": greetings and thanks \
         only):\n\n\
         | reason | episode | segments | turns per segment |\n|---|---|---|---|\n{segment_rows}\n\n\
         ## 3. From the closing turn to a searchable episode\n\n\
         For one in {target_every} turns whose append closed a segment (and at most {MAX_FOLLOWED} at once), the \
         benchmark polls \
         the database (every 20 ms, less often when the poll itself gets slow: {polls} polls, {poll_ms:.1} ms each on \
         average; once the episode is searchable, every {embedded_poll_s} s) from the moment the append returned, until segmentation recorded the segment closed, the \
         episode's row was committed — **searchable**: from then on RetrieveMemory's BM25 leg finds it (its \
         `search_document` is a generated column of the row) — and its embedding was stored in \
         `memory_embeddings` (the vector leg finds it too). The episode is matched by conversation and `end_at` \
         (the time of the segment's last turn). A step's time is when the poll that first saw it started.\n\n\
         | from the closing append to | followed | p50 | p95 | max | never seen |\n|---|---|---|---|---|---|\n{closing_rows}\n\n\
         Followed at the target rate: {followed} closing turns ({hard_gap} by a hard gap, {explicit} by \
         `close_segment`); {no_episode} of their segments closed without an episode row of their own; \
         {skipped} closings were not followed (more than {MAX_FOLLOWED} at once). \"Never seen\": not reached by the \
         end of the run; they count as slower than every other in the percentiles.\n\n\
         Check of the definition: RetrieveMemory (the release retrieval service, after the load) was asked for \
         {bm25_asked} random episodes by their own title and summary; its BM25 leg found {bm25_found} of them \
         ({bm25_any} were among the episodes returned).\n\n\
         {sustained_section}\
         ## Where the CPU went\n\n\
         Cores busy by process over each phase (`/proc`): the benchmark's services, Postgres (the \
         benchmark database's backends and the server's own processes such as the WAL writer), RabbitMQ, the \
         load generator; \"other\" is whatever else ran on the machine (a compiler, another database's \
         clients, another service).\n\n\
         {cpu_header}\n{cpu_rows}\n",
        cpu_rows = cpu_rows.join("\n"),
        command_line = args.command_line,
        date = Utc::now().format("%Y-%m-%d %H:%M UTC"),
        machine = machine_summary(
            "Postgres, RabbitMQ, the ingest and retrieval services (release builds) and the load generator"
        ),
        host_before = host_before.describe(),
        host_after = host_after.describe(),
        shared_buffers = postgres.shared_buffers,
        huge_pages = postgres.huge_pages,
        synchronous_commit = postgres.synchronous_commit,
        wal_writer_delay = postgres.wal_writer_delay,
        rate = args.rate,
        clients = args.clients,
        p99_text = micros(p99),
        p50_text = micros(target.histogram.value_at_quantile(0.5)),
        errors = target.errors,
        append_met = yes_no(append_met),
        drain_speed = match target_drain.0 {
            Some(caught_up) => format!(
                "segmentation caught up {} after the appends stopped: it got through the phase's turns at \
                 {:.0} turns/s",
                ms(caught_up),
                target.answered as f64 / (target.elapsed + caught_up).as_secs_f64()
            ),
            None => format!(
                "segmentation had not caught up {} s after the appends stopped",
                args.drain_seconds
            ),
        },
        keeps_up = yes_no(keeps_up),
        p95_text = quantile_text(&closings.searchable, closings.not_searchable, 0.95),
        p50_searchable = quantile_text(&closings.searchable, closings.not_searchable, 0.5),
        followed = closings.followed,
        latency_met = yes_no(latency_met),
        per_client = args.conversations_per_client,
        min_turns = args.min_session_turns,
        max_turns = args.max_session_turns,
        user_mean = user_words as f64 / user_turns.max(1) as f64,
        assistant_mean = assistant_words as f64 / assistant_turns.max(1) as f64,
        explicit_share = args.explicit_close_share * 100.0,
        seconds = args.seconds,
        drain = args.drain_seconds,
        sustained_line = if args.sustained_seconds > 0 {
            format!(
                "when segmentation took more than 5 s to catch up, {} s at half the rate at which it got \
                 through the target phase's turns, and another drain; ",
                args.sustained_seconds
            )
        } else {
            String::new()
        },
        closed_seconds = args.closed_seconds,
        interval = args.clients as f64 / f64::from(args.rate) * 1000.0,
        load_rows = load_rows.join("\n"),
        target_secs = target_seconds,
        segment_rate = segments_in_target as f64 / target_seconds.max(0.001),
        turns_per_segment = turns_in_segments as f64 / segments_in_target.max(1) as f64,
        episodes = target_written.episodes,
        episode_rate = target_written.episodes as f64 / target_seconds.max(0.001),
        consolidated = target_written.consolidated,
        facts = target_written.facts,
        seg_queue = last_target
            .segmentation_queue
            .map_or("?".into(), |n| n.to_string()),
        outbox = last_target.outbox,
        emb_queue = last_target
            .embedding_queue
            .map_or("?".into(), |n| n.to_string()),
        unembedded = last_target.unembedded,
        drained = drained_text(target_drain, args.drain_seconds),
        segment_rows = segment_table(&target_segments),
        polls = follow.polls,
        embedded_poll_s = EMBEDDED_POLL_INTERVAL.as_secs(),
        poll_ms = follow.poll_time.as_secs_f64() * 1000.0 / follow.polls.max(1) as f64,
        closing_rows = closing_rows(&closings),
        hard_gap = closings.hard_gap,
        target_every = follow_every(args.rate),
        explicit = closings.explicit,
        no_episode = closings.no_episode,
        skipped = closings.skipped,
        bm25_asked = bm25.0,
        bm25_found = bm25.1,
        bm25_any = bm25.2,
    );
    engram_bench::eval::write_report(&args.report, &text)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Run(args) => run(*args).await,
        Command::DropTopology {
            amqp_url,
            topology_prefix,
        } => engram_bench::bench::drop_topology(&amqp_url, &topology_prefix).await,
    }
}
