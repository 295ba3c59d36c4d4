//! The lines of the stored conversations that answer a query (issue 38): each stored turn the
//! search found weighed as a fact is, plus a share of its episode's score; the best chosen with
//! their neighbours (`lines::choose_lines`) and grouped by the episode that holds them; and the
//! episodes' section laid out, the episodes whose lines answer first.

use std::collections::HashMap;

use engram_core::retrieval::ScoreParts;
use engram_core::retrieval::lines;
use engram_core::retrieval::ranking::{LegEvidence, LegScale, is_question, relevance};
use engram_core::speaker::NamedSpeakers;
use engram_store::memories::MemoryRecord;
use engram_store::turn_search::{FoundTurns, StoredTurn, TurnHit};
use uuid::Uuid;

use super::{RankedMemory, RankingContext};

// The defaults of the lines' choice, each chosen on the dialogs by what an assistant reads
// (`make eval-reads`; docs/eval/README.md says how).
/// Lines chosen for what they say, at most, over all episodes (each may bring a neighbour): 40
/// over 30 and 20 (the budget, not this, then decides how many an assistant reads).
const LINES_PER_RETRIEVAL: usize = 40;
/// The share of a line's evidence that is its episode's ranking score (relative to the best
/// episode's): a line of an episode that ranks well on its whole says more. 0.4 over 0.25, 0.3,
/// 0.35, 0.5 and 0.65 once the lines' blocks lost their rank and score (0.5 over 1 before).
const EPISODE_SHARE: f64 = 0.4;
/// BM25's weight against the turn vectors' in a line's relevance (the rest is the cosine's).
/// The static token vectors are coarser than the model's sentence embeddings the facts'
/// `sparse_weight` (0.3) weighs: 0.85 over 0.7, 0.5 and 0.3.
const TURN_SPARSE_WEIGHT: f64 = 0.85;

/// The lines of one episode (or, while its segment is open, of one conversation) that answer
/// the query, in the order they were said.
#[derive(Debug, Clone)]
pub(super) struct LineGroup {
    /// None: the turns are not in an episode yet.
    pub(super) episode: Option<Uuid>,
    lines: Vec<StoredTurn>,
    /// Fewer of its lines, for a budget too small for all of them, the most first: those of its
    /// better half of chosen lines, then its best line, each with the lines shown with them
    /// (only the sets shorter than `lines`).
    shorter: Vec<Vec<StoredTurn>>,
    /// The best score of its lines (`lines::ChosenLine::score`).
    score: f64,
}

/// Chooses the lines that answer the query among the stored turns found (with their
/// neighbours, in conversation order) and groups them by episode, best group first.
pub(super) fn answering_lines(
    query: &str,
    found: &FoundTurns,
    episodes: &HashMap<Uuid, ScoreParts>,
    context: &RankingContext<'_>,
) -> Vec<LineGroup> {
    let turns = &found.stored;
    if turns.is_empty() {
        return Vec::new();
    }
    let offered = weigh_turns(query, &found.hits, &found.nearest, turns, episodes, context);
    let chosen = lines::choose_lines(&offered, LINES_PER_RETRIEVAL);
    group_by_episode(chosen, turns)
}

/// Each turn's evidence as a line that answers: both turn legs' scores on one scale, as facts'
/// relevance is (BM25 weighing [`TURN_SPARSE_WEIGHT`]), weighed as a fact's is (a question,
/// another speaker's line, the days the query names, the request's conversation), plus
/// [`EPISODE_SHARE`] of its episode's score over the best episode's. A turn no leg found (a
/// neighbour) has none of its own.
fn weigh_turns<'a>(
    query: &str,
    hits: &[TurnHit],
    nearest: &[TurnHit],
    turns: &'a [StoredTurn],
    episodes: &HashMap<Uuid, ScoreParts>,
    context: &RankingContext<'_>,
) -> Vec<lines::OfferedLine<'a>> {
    let sparse: HashMap<_, f64> = hits.iter().map(|hit| (hit.turn, hit.score)).collect();
    let cosine: HashMap<_, f64> = nearest.iter().map(|hit| (hit.turn, hit.score)).collect();
    let legs: Vec<Option<LegEvidence>> = turns
        .iter()
        .map(|turn| {
            let key = turn.key();
            (sparse.contains_key(&key) || cosine.contains_key(&key)).then(|| LegEvidence {
                sparse: sparse.get(&key).copied(),
                cosine: cosine.get(&key).copied(),
            })
        })
        .collect();
    let scale = LegScale::of(legs.iter().flatten());
    let best_episode = episodes
        .values()
        .map(|parts| parts.total)
        .fold(0.0, f64::max);
    let speakers = NamedSpeakers::in_query(query, turns.iter().map(|turn| turn.content.as_str()));
    let params = context.params;
    let factor = |applies: bool, factor: f64| if applies { factor } else { 1.0 };
    // Two turns further apart than this are in different sessions, as segmentation sees them.
    let same_session = engram_core::segmentation::SegmentationRules::default().hard_gap;
    turns
        .iter()
        .zip(&legs)
        .enumerate()
        .map(|(position, (turn, legs))| {
            // The turn said just before, in the same session: a turn of an earlier session is
            // no context for a line (shown beside it, it would read as said the later day,
            // under the later episode's heading).
            let follows_previous = position > 0 && {
                let previous = &turns[position - 1];
                previous.conversation_id == turn.conversation_id
                    && previous.turn_index + 1 == turn.turn_index
                    && (previous.episode_id == turn.episode_id
                        || turn.spoken_at - previous.spoken_at < same_session)
            };
            let evidence = legs.as_ref().map_or(0.0, |legs| {
                let in_window = context
                    .window
                    .is_some_and(|window| window.overlaps(turn.spoken_at, turn.spoken_at));
                let own = relevance(legs, &scale, TURN_SPARSE_WEIGHT)
                    * factor(
                        is_question(&turn.content),
                        params.question_weight.clamp(0.0, 1.0),
                    )
                    * factor(
                        speakers.spoken_by_another(&turn.content),
                        params.other_speaker_weight.clamp(0.0, 1.0),
                    )
                    * factor(in_window, 1.0 + params.time_match_boost)
                    * factor(
                        context.conversation == Some(turn.conversation_id),
                        1.0 + engram_core::retrieval::ranking::REQUEST_CONVERSATION_BOOST,
                    );
                let episode = turn
                    .episode_id
                    .and_then(|id| episodes.get(&id))
                    .filter(|_| best_episode > 0.0)
                    .map_or(0.0, |parts| parts.total / best_episode);
                own + EPISODE_SHARE * episode
            });
            lines::OfferedLine {
                text: &turn.content,
                evidence,
                follows_previous,
            }
        })
        .collect()
}

/// The chosen lines (best first) grouped by the episode that holds each (a conversation's turns
/// not yet in an episode by conversation), best group first; within a group, in the order they
/// were said. A line is shown once, in the group of the first line that shows it (a neighbour
/// shown with a line goes with that line, whatever episode holds it).
fn group_by_episode(chosen: Vec<lines::ChosenLine>, turns: &[StoredTurn]) -> Vec<LineGroup> {
    /// A group being gathered: indexes into `turns`.
    struct Gathering {
        episode: Option<Uuid>,
        conversation: Uuid,
        shown: Vec<usize>,
        /// The lines each chosen line brought with itself, best first.
        by_choice: Vec<Vec<usize>>,
        score: f64,
    }
    let mut groups: Vec<Gathering> = Vec::new();
    let mut shown_already = std::collections::HashSet::new();
    for line in chosen {
        let shown: Vec<usize> = line
            .shown
            .into_iter()
            .filter(|&index| shown_already.insert(index))
            .collect();
        if shown.is_empty() {
            continue;
        }
        let turn = &turns[line.line];
        // A chosen line already shown as another's neighbour brings only its own neighbour: not
        // a set the shorter renderings may stand on.
        let holds_its_line = shown.contains(&line.line);
        let group = groups.iter_mut().find(|group| {
            group.episode == turn.episode_id && group.conversation == turn.conversation_id
        });
        match group {
            Some(group) => {
                group.shown.extend(&shown);
                group.by_choice.extend(holds_its_line.then_some(shown));
            }
            // Lines come best first: a group's first line is its best.
            None => groups.push(Gathering {
                episode: turn.episode_id,
                conversation: turn.conversation_id,
                by_choice: holds_its_line.then(|| shown.clone()).into_iter().collect(),
                shown,
                score: line.score,
            }),
        }
    }
    let of = |mut indexes: Vec<usize>| -> Vec<StoredTurn> {
        indexes.sort_unstable();
        indexes
            .into_iter()
            .map(|index| turns[index].clone())
            .collect()
    };
    groups
        .into_iter()
        .map(|group| {
            let chosen = group.by_choice.len();
            let mut shorter: Vec<Vec<StoredTurn>> = Vec::new();
            for keep in [chosen.div_ceil(2), 1]
                .into_iter()
                .filter(|&keep| keep > 0 && keep <= chosen)
            {
                let lines = of(group.by_choice[..keep].concat());
                let longest = shorter.last().map_or(group.shown.len(), Vec::len);
                if lines.len() < longest {
                    shorter.push(lines);
                }
            }
            LineGroup {
                episode: group.episode,
                score: group.score,
                lines: of(group.shown),
                shorter,
            }
        })
        .collect()
}

/// An entry of the episodes' section: an episode, with the lines that answer if any, or the
/// lines of a conversation whose segment is still open.
pub(super) struct EpisodeEntry {
    pub(super) memory: Option<RankedMemory>,
    pub(super) lines: Vec<StoredTurn>,
    /// Fewer of its lines, for a small budget (see `LineGroup::shorter`).
    pub(super) shorter: Vec<Vec<StoredTurn>>,
    /// What it was placed by: its best line's score where it has lines, else its episode's
    /// ranking score (the heading shows it).
    pub(super) score: f64,
    /// How well it answers on [0, 1], the scale of a fact's relevance, by which the budget takes
    /// it: its lines' score over the best lines', else its episode's relevance.
    pub(super) relevance: f64,
}

/// The episodes' section: the episodes whose lines answer, best line first, then the ranked
/// episodes without such lines, numbered in that order.
pub(super) fn episodes_to_show(
    ranked: Vec<RankedMemory>,
    line_groups: Vec<LineGroup>,
    mut candidates: HashMap<Uuid, (Option<ScoreParts>, MemoryRecord)>,
) -> Vec<EpisodeEntry> {
    let mut ranked: Vec<Option<RankedMemory>> = ranked.into_iter().map(Some).collect();
    let mut entries: Vec<EpisodeEntry> = Vec::new();
    for group in line_groups {
        let memory = group.episode.and_then(|id| {
            ranked
                .iter_mut()
                .find(|m| m.as_ref().is_some_and(|m| m.record.id == id))
                .and_then(Option::take)
                .or_else(|| {
                    let (scores, record) = candidates.remove(&id)?;
                    Some(RankedMemory {
                        record,
                        rank: 0,
                        scored: scores.is_some(),
                        scores: scores.unwrap_or_default(),
                        sparse: None,
                        dense: None,
                        details_shown: false,
                        lines_shown: Vec::new(),
                        history: Vec::new(),
                    })
                })
        });
        // An episode forgotten meanwhile: its lines are not shown.
        if group.episode.is_some() && memory.is_none() {
            continue;
        }
        entries.push(EpisodeEntry {
            memory,
            lines: group.lines,
            shorter: group.shorter,
            score: group.score,
            // Set below, against the best of the groups shown.
            relevance: 0.0,
        });
    }
    let best_lines = entries.iter().map(|entry| entry.score).fold(0.0, f64::max);
    if best_lines > 0.0 {
        for entry in &mut entries {
            entry.relevance = entry.score / best_lines;
        }
    }
    entries.extend(ranked.into_iter().flatten().map(|memory| EpisodeEntry {
        score: memory.scores.total,
        relevance: memory.scores.relevance,
        memory: Some(memory),
        lines: Vec::new(),
        shorter: Vec::new(),
    }));
    for (position, memory) in entries
        .iter_mut()
        .filter_map(|entry| entry.memory.as_mut())
        .enumerate()
    {
        memory.rank = position + 1;
    }
    entries
}
