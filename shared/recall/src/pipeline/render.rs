//! The Markdown of a retrieval within its token budget (step 5's end): each fact's line, each
//! episode in its renderings (its whole excerpt, the lines that answer, its summary), fitted by
//! relevance; what the structured results say was shown follows what fit.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use engram_core::retrieval::budget::{self, EpisodePart, FactPart};
use engram_core::retrieval::lines;
use engram_core::retrieval::markdown::{self, Detail, Earlier, EpisodeView, Provenance, Turn};
use engram_store::memories::MemoryRecord;
use engram_store::turn_search::{StoredTurn, TurnKey};

use super::turn_lines::EpisodeEntry;
use super::{RankedMemory, Retrieval, RetrieveRequest, ServedBy};

fn turns_of(record: &MemoryRecord) -> Vec<Turn> {
    record
        .messages
        .as_ref()
        .and_then(|messages| messages.as_array())
        .map(|messages| {
            messages
                .iter()
                .filter_map(|message| {
                    Some(Turn {
                        role: message.get("role")?.as_str()?.to_owned(),
                        content: message.get("content")?.as_str()?.to_owned(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What the fact line may truthfully say of an entry: the conversation it came from, the other
/// references the client gave, whether the user saved or pinned it.
fn provenance(record: &MemoryRecord) -> Provenance {
    Provenance {
        conversations: usize::from(record.conversation_id.is_some()),
        references: record.source_ids.len(),
        saved_by_user: record.manually_saved,
        pinned: record.pinned,
        said_at: Some(record.valid_at.unwrap_or(record.created_at)),
    }
}

/// What a rendering of an episode shows of it.
#[derive(Clone, Copy)]
enum EpisodeShown {
    /// Its whole conversation excerpt (the detail level asked for it).
    Excerpt,
    /// Lines of its conversation that answer the query: which of its [`LinesShown`] (0 all of
    /// them, then fewer: see `lines_to_show`).
    Lines(usize),
    /// Its title and summary alone.
    Summary,
}

/// Lines an entry's rendering shows, and where they sit in its episode's excerpt
/// (`lines_shown`).
#[derive(Clone, Default)]
struct LinesShown {
    lines: Vec<Turn>,
    positions: Vec<usize>,
    /// When the last of the stored lines was said (none for an excerpt's lines).
    said_at: Option<DateTime<Utc>>,
}

impl LinesShown {
    /// Stored turns, placed in the excerpt by `positions` (those of all the entry's lines, so
    /// that a shorter set places a repeated line where the full set does).
    fn of_stored(turns: &[StoredTurn], positions: &HashMap<TurnKey, usize>) -> Self {
        Self {
            lines: turns
                .iter()
                .map(|turn| Turn {
                    role: turn.role.clone(),
                    content: turn.content.clone(),
                })
                .collect(),
            positions: turns
                .iter()
                .filter_map(|turn| positions.get(&turn.key()).copied())
                .collect(),
            said_at: turns.last().map(|turn| turn.spoken_at),
        }
    }
}

/// Lines of an episode's excerpt shown at most when they answer the query, where its turns are
/// not stored (5 over 3 on the dialogs: docs/eval/README.md).
const LINES_PER_EXCERPT: usize = 5;

/// Where each stored turn (in conversation order) sits in the episode's excerpt
/// (`memory.messages`), for `lines_shown`: matched by role and content, in order. A turn the
/// excerpt does not hold (past its size limit, or the neighbour of a line from the next segment)
/// has no place.
fn positions_in_excerpt(turns: &[StoredTurn], excerpt: &[Turn]) -> HashMap<TurnKey, usize> {
    let mut positions = HashMap::with_capacity(turns.len());
    let mut from = 0;
    for turn in turns {
        let found = excerpt[from..]
            .iter()
            .position(|line| line.role == turn.role && line.content == turn.content);
        if let Some(offset) = found {
            positions.insert(turn.key(), from + offset);
            from += offset + 1;
        }
    }
    positions
}

/// The lines each entry may show, the most first: the stored turns that answer (found by the
/// turn search), then fewer (those of its better half of chosen lines, then its best line, each
/// with the lines shown with them) where that is fewer; else, for an
/// episode whose turns are not stored (imported with its excerpt), the excerpt's lines that
/// answer (none at detail NONE).
fn lines_to_show(
    episodic: &[EpisodeEntry],
    excerpts: &[Vec<Turn>],
    request: &RetrieveRequest,
) -> Vec<Vec<LinesShown>> {
    let within_excerpts = if request.detail == Detail::None {
        vec![Vec::new(); episodic.len()]
    } else {
        let texts: Vec<Vec<&str>> = episodic
            .iter()
            .zip(excerpts)
            .map(|(entry, turns)| {
                if entry.lines.is_empty() {
                    turns.iter().map(|turn| turn.content.as_str()).collect()
                } else {
                    Vec::new()
                }
            })
            .collect();
        lines::lines_within_excerpts(&request.query, &texts, LINES_PER_EXCERPT)
    };
    episodic
        .iter()
        .zip(excerpts)
        .zip(within_excerpts)
        .map(|((entry, excerpt), within)| {
            if entry.lines.is_empty() {
                if within.is_empty() {
                    return Vec::new();
                }
                let lines = within.iter().map(|&index| excerpt[index].clone()).collect();
                return vec![LinesShown {
                    lines,
                    positions: within,
                    said_at: None,
                }];
            }
            let positions = positions_in_excerpt(&entry.lines, excerpt);
            let mut shown = vec![LinesShown::of_stored(&entry.lines, &positions)];
            shown.extend(
                entry
                    .shorter
                    .iter()
                    .map(|lines| LinesShown::of_stored(lines, &positions)),
            );
            shown
        })
        .collect()
}

/// Renders both sections, fits them into the budget, and keeps what fit.
pub(super) fn render(
    semantic: Vec<RankedMemory>,
    episodic: Vec<EpisodeEntry>,
    request: &RetrieveRequest,
    served_by: ServedBy,
    now: DateTime<Utc>,
) -> Retrieval {
    let fact_parts: Vec<FactPart> = semantic.iter().map(fact_part).collect();
    let excerpts: Vec<Vec<Turn>> = episodic
        .iter()
        .map(|entry| {
            entry
                .memory
                .as_ref()
                .map(|m| turns_of(&m.record))
                .unwrap_or_default()
        })
        .collect();
    let shown_lines = lines_to_show(&episodic, &excerpts, request);
    let (episode_parts, shown): (Vec<EpisodePart>, Vec<Vec<EpisodeShown>>) = episodic
        .iter()
        .zip(&excerpts)
        .zip(&shown_lines)
        .map(|((entry, excerpt), lines)| episode_part(entry, excerpt, lines, request, now))
        .unzip();
    let fitted = budget::fit(&fact_parts, &episode_parts, request.token_budget);
    let mut semantic: Vec<Option<RankedMemory>> = semantic.into_iter().map(Some).collect();
    let mut episodic: Vec<Option<EpisodeEntry>> = episodic.into_iter().map(Some).collect();
    let semantic = fitted
        .facts
        .iter()
        .filter_map(|&i| semantic[i].take())
        .collect();
    let episodic = fitted
        .episodes
        .iter()
        .filter_map(|&(i, rendering)| {
            let entry = episodic[i].take()?;
            let mut memory = entry.memory?;
            match shown[i][rendering] {
                EpisodeShown::Excerpt => {
                    memory.details_shown = true;
                    memory.lines_shown = (0..excerpts[i].len()).collect();
                }
                EpisodeShown::Lines(which) => {
                    memory.lines_shown = shown_lines[i][which].positions.clone();
                }
                EpisodeShown::Summary => {}
            }
            Some(memory)
        })
        .collect();
    Retrieval {
        markdown: fitted.markdown,
        semantic,
        episodic,
        served_by,
        tokens: fitted.tokens,
        truncated: fitted.truncated,
    }
}

/// A fact's line (with the facts it superseded, when asked) and its relevance.
fn fact_part(m: &RankedMemory) -> FactPart {
    let history: Vec<Earlier> = m
        .history
        .iter()
        .map(|earlier| Earlier {
            text: earlier.text.clone(),
            until: earlier.invalid_at.unwrap_or(earlier.updated_at),
        })
        .collect();
    FactPart {
        line: markdown::fact_line_with_history(
            m.record.category.as_deref().unwrap_or("fact"),
            &m.record.text,
            provenance(&m.record),
            &history,
        ),
        relevance: m.scores.relevance,
    }
}

/// An entry's renderings, the fullest first — its whole excerpt (when the detail level asks for
/// it), its lines that answer (all, then its best), its summary — and what each shows. The lines
/// of a segment still open have no episode: they are shown under the day they were said.
fn episode_part(
    entry: &EpisodeEntry,
    excerpt: &[Turn],
    lines: &[LinesShown],
    request: &RetrieveRequest,
    now: DateTime<Utc>,
) -> (EpisodePart, Vec<EpisodeShown>) {
    let mut renderings = Vec::new();
    let mut shows = Vec::new();
    let Some(m) = &entry.memory else {
        for (which, shown) in lines.iter().enumerate() {
            renderings.push(markdown::open_segment_lines_block(
                shown.said_at.unwrap_or(now),
                &shown.lines,
                now,
            ));
            shows.push(EpisodeShown::Lines(which));
        }
        let part = EpisodePart {
            renderings,
            relevance: entry.relevance,
        };
        return (part, shows);
    };
    let surprise = m.record.surprise.unwrap_or(0.0);
    let view = |turns| EpisodeView {
        title: m.record.title.as_deref().unwrap_or(""),
        rank: m.rank,
        score: entry.score,
        surprise,
        end_at: m.record.end_at.unwrap_or(m.record.created_at),
        summary: &m.record.text,
        turns,
    };
    if !excerpt.is_empty() && request.detail.shows_details(m.rank, surprise) {
        renderings.push(markdown::episode_block(&view(excerpt), true, now));
        shows.push(EpisodeShown::Excerpt);
    }
    for (which, shown) in lines.iter().enumerate() {
        renderings.push(markdown::episode_lines_block(&view(&shown.lines), now));
        shows.push(EpisodeShown::Lines(which));
    }
    renderings.push(markdown::episode_block(&view(excerpt), false, now));
    shows.push(EpisodeShown::Summary);
    let part = EpisodePart {
        renderings,
        relevance: entry.relevance,
    };
    (part, shows)
}

#[cfg(test)]
mod tests {
    use engram_core::Scope;
    use engram_core::retrieval::RankingParams;
    use uuid::Uuid;

    use super::*;

    fn request(token_budget: usize) -> RetrieveRequest {
        RetrieveRequest {
            scope: Scope::parse("scope", "00000000-0000-4000-8000-000000000001", "default")
                .unwrap(),
            conversation: None,
            query: "When does the Lisbon offsite start?".to_owned(),
            episodic_limit: 5,
            semantic_limit: 20,
            detail: Detail::Auto,
            category: None,
            token_budget,
            ranking: RankingParams::default(),
            dense: true,
            side_effects: false,
            include_history: false,
            include_inactive: false,
        }
    }

    fn turn(index: i32, content: &str) -> StoredTurn {
        StoredTurn {
            conversation_id: Uuid::nil(),
            turn_index: index,
            role: "user".to_owned(),
            content: content.to_owned(),
            spoken_at: Utc::now(),
            episode_id: None,
        }
    }

    /// A conversation in progress: six lines on the offsite's agenda, then the one that answers.
    fn offsite_lines() -> EpisodeEntry {
        let best = turn(
            7,
            "Maria: The Lisbon offsite starts on Monday the 14th, flights on Sunday.",
        );
        let mut lines: Vec<StoredTurn> = (0..6)
            .map(|i| {
                turn(
                    i,
                    &format!(
                        "Ana: we went over the offsite agenda, item {i}, at length and in detail"
                    ),
                )
            })
            .collect();
        lines.push(best.clone());
        EpisodeEntry {
            memory: None,
            lines,
            shorter: vec![vec![best]],
            score: 1.0,
            relevance: 1.0,
        }
    }

    #[test]
    fn a_budget_too_small_for_every_line_still_shows_the_best() {
        let now = Utc::now();
        let all = render(
            Vec::new(),
            vec![offsite_lines()],
            &request(2_000),
            ServedBy::default(),
            now,
        );
        assert!(all.markdown.contains("item 5"), "{}", all.markdown);
        assert!(!all.truncated);

        let small = render(
            Vec::new(),
            vec![offsite_lines()],
            &request(80),
            ServedBy::default(),
            now,
        );
        assert!(
            small.markdown.contains("Monday the 14th"),
            "{}",
            small.markdown
        );
        assert!(!small.markdown.contains("item 5"), "{}", small.markdown);
        assert!(small.truncated);
        assert!(small.tokens <= 80, "{}", small.tokens);
    }
}
