//! Where a conversation's segments end: the rules that turn a stream of turns into episodes.
//!
//! A conversation is segmented from its open tail (the turns after the last closed segment). A
//! boundary falls before a turn when:
//! - **hard gap**: the pause before it is at least `hard_gap` (a new session);
//! - **soft gap**: the pause is at least `soft_gap` and the turn also moves away from the open
//!   segment's topic (cosine to the segment's centroid below `soft_gap_similarity`);
//! - **topic shift**: without a pause, a substantial user turn (at least `topic_min_tokens`) is
//!   far from the segment's topic (cosine below `topic_shift_similarity`), once the segment has
//!   `min_turns` turns;
//! - **size**: the segment holds `max_turns` turns or `max_tokens` tokens (the boundary waits
//!   for the next user turn, so a question keeps its answer, up to twice the limit).
//!
//! Gaps fall before any turn: an assistant answers within seconds, so its turn after a long
//! silence opens a session (a reminder, a check-in, or the other person of a two-person dialog
//! speaking first). Topic shifts fall before user turns only: an assistant's reply belongs with
//! what it answers, however differently it is worded. The open tail itself closes on an explicit request (CloseSegment, or
//! AppendMessages with `close_segment`) or when its last turn arrived `idle_close` ago (arrived:
//! a history appended with its real, old times is not idle at once). Topic rules
//! need turn embeddings; without an embedder they do not apply (gaps, size and explicit closes
//! still do). Everything here is pure: the segmentation consumer reads the turns and writes the
//! episodes.

use chrono::{DateTime, Duration, Utc};

use crate::category::SpeakerRole;

/// The rules' parameters (`segmentation.*` settings).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SegmentationRules {
    pub hard_gap: Duration,
    pub soft_gap: Duration,
    pub soft_gap_similarity: f32,
    pub topic_shift_similarity: f32,
    pub topic_min_tokens: u32,
    pub min_turns: usize,
    pub max_turns: usize,
    pub max_tokens: u32,
    pub idle_close: Duration,
}

impl Default for SegmentationRules {
    fn default() -> Self {
        Self {
            hard_gap: Duration::minutes(60),
            soft_gap: Duration::minutes(10),
            // Calibrated for token vectors on the dialogs (docs/eval/topic.md, make eval-topic).
            soft_gap_similarity: 0.65,
            topic_shift_similarity: 0.38,
            topic_min_tokens: 8,
            min_turns: 4,
            max_turns: 40,
            max_tokens: 4_000,
            idle_close: Duration::minutes(30),
        }
    }
}

/// What the rules see of a turn.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnView {
    pub index: i32,
    pub role: SpeakerRole,
    pub spoken_at: DateTime<Utc>,
    /// When Engram received it (idleness is measured from it).
    pub received_at: DateTime<Utc>,
    pub tokens: u32,
    /// The turn's embedding (unit length), when an embedder is configured.
    pub embedding: Option<Vec<f32>>,
}

/// Why a segment ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundaryReason {
    HardGap,
    SoftGap,
    TopicShift,
    TurnCount,
    TokenSize,
    /// CloseSegment, or AppendMessages with `close_segment`.
    Explicit,
    /// The open segment's last turn arrived `idle_close` ago.
    Idle,
}

impl BoundaryReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HardGap => "hard_gap",
            Self::SoftGap => "soft_gap",
            Self::TopicShift => "topic_shift",
            Self::TurnCount => "turn_count",
            Self::TokenSize => "token_size",
            Self::Explicit => "explicit",
            Self::Idle => "idle",
        }
    }
}

/// A closed segment: turns `first..=last` (turn indexes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClosedSegment {
    pub first: i32,
    pub last: i32,
    pub reason: BoundaryReason,
}

/// The running centroid of a segment's turn embeddings.
#[derive(Debug, Default)]
struct Centroid {
    sum: Vec<f32>,
    count: usize,
}

impl Centroid {
    fn add(&mut self, embedding: &[f32]) {
        if self.sum.is_empty() {
            self.sum = vec![0.0; embedding.len()];
        }
        if self.sum.len() != embedding.len() {
            return;
        }
        for (total, value) in self.sum.iter_mut().zip(embedding) {
            *total += value;
        }
        self.count += 1;
    }

    /// Cosine of `embedding` to the centroid; `None` before any embedding was added.
    fn similarity(&self, embedding: &[f32]) -> Option<f32> {
        if self.count == 0 || self.sum.len() != embedding.len() {
            return None;
        }
        let norm = self.sum.iter().map(|v| v * v).sum::<f32>().sqrt();
        let other = embedding.iter().map(|v| v * v).sum::<f32>().sqrt();
        if norm == 0.0 || other == 0.0 {
            return None;
        }
        let dot: f32 = self.sum.iter().zip(embedding).map(|(a, b)| a * b).sum();
        Some(dot / (norm * other))
    }
}

/// The segment being built while walking the turns.
#[derive(Debug, Default)]
struct Open {
    first: Option<i32>,
    last: i32,
    turns: usize,
    tokens: u32,
    centroid: Centroid,
}

impl Open {
    fn start(turn: &TurnView) -> Self {
        let mut open = Open::default();
        open.push(turn);
        open
    }

    fn push(&mut self, turn: &TurnView) {
        self.first.get_or_insert(turn.index);
        self.last = turn.index;
        self.turns += 1;
        self.tokens = self.tokens.saturating_add(turn.tokens);
        if let Some(embedding) = &turn.embedding {
            self.centroid.add(embedding);
        }
    }

    fn close(&self, reason: BoundaryReason) -> Option<ClosedSegment> {
        self.first.map(|first| ClosedSegment {
            first,
            last: self.last,
            reason,
        })
    }
}

/// Why `turn` cannot join the open segment, if it cannot.
fn boundary_before(
    open: &Open,
    previous: &TurnView,
    turn: &TurnView,
    rules: &SegmentationRules,
) -> Option<BoundaryReason> {
    let gap = turn.spoken_at - previous.spoken_at;
    let user = turn.role == SpeakerRole::User;
    // A pause ends a session whoever speaks next: an assistant answers within seconds, so a turn
    // of its after a long silence opens a session (a reminder, a check-in) rather than replying.
    if gap >= rules.hard_gap {
        return Some(BoundaryReason::HardGap);
    }
    let similarity = turn
        .embedding
        .as_deref()
        .and_then(|embedding| open.centroid.similarity(embedding));
    if gap >= rules.soft_gap && similarity.is_some_and(|s| s < rules.soft_gap_similarity) {
        return Some(BoundaryReason::SoftGap);
    }
    if user
        && open.turns >= rules.min_turns
        && turn.tokens >= rules.topic_min_tokens
        && similarity.is_some_and(|s| s < rules.topic_shift_similarity)
    {
        return Some(BoundaryReason::TopicShift);
    }
    // Full: the next user turn starts a new segment; past twice the limit, any turn does.
    let full_turns = open.turns >= rules.max_turns;
    let full_tokens = open.tokens >= rules.max_tokens;
    let overfull =
        open.turns >= rules.max_turns * 2 || open.tokens >= rules.max_tokens.saturating_mul(2);
    if (full_turns || full_tokens) && (user || overfull) {
        return Some(if full_turns {
            BoundaryReason::TurnCount
        } else {
            BoundaryReason::TokenSize
        });
    }
    None
}

/// The segments of an open tail (`turns`, in turn order) that close now. What follows the last
/// one stays open. `close_through`: an explicit close covers every turn up to that index;
/// `now`: an idle tail closes.
pub fn close_segments(
    turns: &[TurnView],
    rules: &SegmentationRules,
    close_through: Option<i32>,
    now: DateTime<Utc>,
) -> Vec<ClosedSegment> {
    let mut closed = Vec::new();
    let Some((first, rest)) = turns.split_first() else {
        return closed;
    };
    let mut open = Open::start(first);
    let mut previous = first;
    for turn in rest {
        // An explicit close ends the segment right after the turn it names.
        if close_through.is_some_and(|through| previous.index <= through && turn.index > through) {
            closed.extend(open.close(BoundaryReason::Explicit));
            open = Open::start(turn);
        } else if let Some(reason) = boundary_before(&open, previous, turn, rules) {
            closed.extend(open.close(reason));
            open = Open::start(turn);
        } else {
            open.push(turn);
        }
        previous = turn;
    }
    if close_through.is_some_and(|through| through >= previous.index) {
        closed.extend(open.close(BoundaryReason::Explicit));
    } else if now - previous.received_at >= rules.idle_close {
        closed.extend(open.close(BoundaryReason::Idle));
    }
    closed
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn at(minutes: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_780_000_000, 0).unwrap() + Duration::minutes(minutes)
    }

    fn turn(index: i32, role: SpeakerRole, minute: i64, topic: Option<usize>) -> TurnView {
        TurnView {
            index,
            role,
            spoken_at: at(minute),
            received_at: at(minute),
            tokens: 12,
            embedding: topic.map(|axis| {
                let mut v = vec![0.0; 4];
                v[axis] = 1.0;
                v
            }),
        }
    }

    /// A user/assistant exchange every minute from `start`, on one topic.
    fn exchange(from: i32, count: i32, start: i64, topic: Option<usize>) -> Vec<TurnView> {
        (0..count)
            .map(|k| {
                let role = if k % 2 == 0 {
                    SpeakerRole::User
                } else {
                    SpeakerRole::Assistant
                };
                turn(from + k, role, start + i64::from(k), topic)
            })
            .collect()
    }

    fn spans(segments: &[ClosedSegment]) -> Vec<(i32, i32, BoundaryReason)> {
        segments
            .iter()
            .map(|s| (s.first, s.last, s.reason))
            .collect()
    }

    #[test]
    fn an_hour_long_pause_starts_a_new_session() {
        let mut turns = exchange(0, 6, 0, None);
        turns.extend(exchange(6, 4, 200, None));
        let segments = close_segments(&turns, &SegmentationRules::default(), None, at(204));
        assert_eq!(spans(&segments), [(0, 5, BoundaryReason::HardGap)]);
    }

    #[test]
    fn a_session_the_assistant_opens_after_a_pause_is_a_new_one() {
        // The user's last turn, a day of silence, then the assistant's reminder and the reply.
        let mut turns = exchange(0, 5, 0, None);
        turns.push(turn(5, SpeakerRole::Assistant, 1_440, None));
        turns.push(turn(6, SpeakerRole::User, 1_441, None));
        let segments = close_segments(&turns, &SegmentationRules::default(), None, at(1_442));
        assert_eq!(spans(&segments), [(0, 4, BoundaryReason::HardGap)]);
    }

    #[test]
    fn a_short_pause_closes_only_when_the_topic_moved_too() {
        let rules = SegmentationRules::default();
        let mut same = exchange(0, 6, 0, Some(0));
        same.extend(exchange(6, 4, 20, Some(0)));
        assert!(close_segments(&same, &rules, None, at(24)).is_empty());
        let mut moved = exchange(0, 6, 0, Some(0));
        moved.extend(exchange(6, 4, 20, Some(1)));
        assert_eq!(
            spans(&close_segments(&moved, &rules, None, at(24))),
            [(0, 5, BoundaryReason::SoftGap)]
        );
    }

    #[test]
    fn a_new_topic_without_a_pause_needs_a_settled_segment_and_a_real_turn() {
        let rules = SegmentationRules::default();
        let mut turns = exchange(0, 6, 0, Some(0));
        turns.extend(exchange(6, 4, 6, Some(2)));
        assert_eq!(
            spans(&close_segments(&turns, &rules, None, at(10))),
            [(0, 5, BoundaryReason::TopicShift)]
        );
        // "ok thanks" on another axis is no new topic.
        let mut short = exchange(0, 6, 0, Some(0));
        let mut thanks = turn(6, SpeakerRole::User, 6, Some(3));
        thanks.tokens = 3;
        short.push(thanks);
        assert!(close_segments(&short, &rules, None, at(7)).is_empty());
        // Two turns are no settled topic yet.
        let mut early = exchange(0, 2, 0, Some(0));
        early.extend(exchange(2, 2, 2, Some(1)));
        assert!(close_segments(&early, &rules, None, at(4)).is_empty());
    }

    #[test]
    fn a_full_segment_closes_before_the_next_user_turn() {
        let rules = SegmentationRules {
            max_turns: 4,
            ..SegmentationRules::default()
        };
        let turns = exchange(0, 10, 0, None);
        assert_eq!(
            spans(&close_segments(&turns, &rules, None, at(10))),
            [
                (0, 3, BoundaryReason::TurnCount),
                (4, 7, BoundaryReason::TurnCount)
            ]
        );
        // A run of assistant turns still ends at twice the limit.
        let monologue: Vec<TurnView> = (0..9)
            .map(|k| turn(k, SpeakerRole::Assistant, i64::from(k), None))
            .collect();
        assert_eq!(
            spans(&close_segments(&monologue, &rules, None, at(9))),
            [(0, 7, BoundaryReason::TurnCount)]
        );
    }

    #[test]
    fn explicit_and_idle_closes_end_the_open_tail() {
        let rules = SegmentationRules::default();
        let turns = exchange(0, 6, 0, None);
        assert!(close_segments(&turns, &rules, None, at(10)).is_empty());
        assert_eq!(
            spans(&close_segments(&turns, &rules, Some(5), at(10))),
            [(0, 5, BoundaryReason::Explicit)]
        );
        assert_eq!(
            spans(&close_segments(&turns, &rules, Some(3), at(10))),
            [(0, 3, BoundaryReason::Explicit)],
            "turns after the close stay open"
        );
        assert_eq!(
            spans(&close_segments(&turns, &rules, None, at(5 + 30))),
            [(0, 5, BoundaryReason::Idle)]
        );
        assert!(close_segments(&[], &rules, Some(3), at(0)).is_empty());
    }

    proptest! {
        #[test]
        fn segments_are_ordered_disjoint_and_within_the_turns(
            gaps in proptest::collection::vec(0i64..120, 1..60),
            roles in proptest::collection::vec(any::<bool>(), 60),
            topics in proptest::collection::vec(proptest::option::of(0usize..4), 60),
            close in proptest::option::of(0i32..70),
            idle in 0i64..200,
        ) {
            let mut minute = 0;
            let turns: Vec<TurnView> = gaps.iter().enumerate().map(|(k, gap)| {
                minute += gap;
                let role = if roles[k] { SpeakerRole::User } else { SpeakerRole::Assistant };
                turn(k as i32, role, minute, topics[k])
            }).collect();
            let segments = close_segments(&turns, &SegmentationRules::default(), close, at(minute + idle));
            let mut next = 0;
            for segment in &segments {
                prop_assert_eq!(segment.first, next, "{:?}", segments);
                prop_assert!(segment.last >= segment.first);
                next = segment.last + 1;
            }
            prop_assert!(next as usize <= turns.len());
            if let Some(through) = close {
                let covered = (through as usize + 1).min(turns.len()) as i32;
                prop_assert!(next >= covered, "an explicit close covers its turns: {:?}", segments);
            }
        }
    }
}
