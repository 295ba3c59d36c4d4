//! The ranking of a retrieval (step 5 of the crate documentation): each kind's legs fused by RRF,
//! every candidate loaded once and weighed on one scale, scored by the ranking profile and
//! diversified by MMR; the lines of the stored turns that answer are chosen beside, and the
//! episodes' section is laid out.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use engram_core::MemoryKind;
use engram_core::retrieval::mmr::{self, MmrItem};
use engram_core::retrieval::ranking::{
    CandidateFacts, LegEvidence, LegScale, TimeWindow, is_question, relevance, score,
};
use engram_core::retrieval::{Fused, ScoreParts, fuse};
use engram_core::speaker::NamedSpeakers;
use engram_store::memories::MemoryRecord;
use engram_store::retrieval::{self as store, LoadedCandidate};
use engram_store::turn_search::FoundTurns;
use tracing::Instrument as _;
use uuid::Uuid;

use super::search::Found;
use super::turn_lines::{EpisodeEntry, LineGroup, answering_lines, episodes_to_show};
use super::{RankedMemory, RankingContext, Recall, RetrieveRequest, cpu_bound, timed};
use crate::RecallError;

impl Recall {
    /// Ranks what the search found: the facts (with the facts they superseded, when asked) and
    /// the episodes' section (the episodes whose lines answer, then the ranked episodes).
    pub(super) async fn rank(
        &self,
        request: &RetrieveRequest,
        found: Found,
        now: DateTime<Utc>,
        load_time: &mut std::time::Duration,
    ) -> Result<(Vec<RankedMemory>, Vec<EpisodeEntry>), RecallError> {
        let fused: Vec<Vec<Fused>> = found
            .legs
            .iter()
            .map(|l| fuse(&l.sparse, &l.dense, request.ranking.rrf_k))
            .collect();
        let ids: Vec<Uuid> = fused.iter().flatten().map(|f| f.id).collect();
        // What the vector leg did not load with its hits (all of it after an HNSW search, the
        // trigram fallback's hits), candidates and the episodes holding the turns found alike.
        let mut loaded = found.loaded;
        let present: std::collections::HashSet<Uuid> = loaded.iter().map(|c| c.record.id).collect();
        let missing: Vec<Uuid> = ids
            .iter()
            .filter(|id| !present.contains(id))
            .copied()
            .collect();
        let candidates: std::collections::HashSet<Uuid> = ids.iter().copied().collect();
        let headings: Vec<Uuid> = found
            .holding_episodes
            .iter()
            .filter(|id| !candidates.contains(id) && !present.contains(id))
            .copied()
            .collect();
        loaded.extend(
            timed(
                load_time,
                store::load_candidates(&self.reads, &request.scope, &missing, &headings)
                    .instrument(tracing::info_span!("retrieval.load")),
            )
            .await?,
        );
        let ranking = SectionsToRank {
            fused,
            loaded,
            query_embedding: found.query_embedding,
            kinds: found.kinds,
            turns: found.turns,
            request: request.clone(),
            now,
        };
        let Ranked {
            mut sections,
            line_groups,
            mut episode_candidates,
            mut holding_turns,
        } = cpu_bound(move || ranking.rank()).await;
        let ranked_episodes = if sections.len() > 1 {
            sections.pop().unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut semantic = sections.pop().unwrap_or_default();
        if request.include_history {
            self.attach_history(&request.scope, &mut semantic).await?;
        }
        // An episode whose lines answer but that no leg found shows with its heading: loaded
        // with the candidates (or now, should a line's episode not have been among them).
        let mut unloaded: Vec<Uuid> = Vec::new();
        for id in line_groups.iter().filter_map(|group| group.episode) {
            if episode_candidates.contains_key(&id) {
                continue;
            }
            match holding_turns.remove(&id) {
                Some(record) => {
                    episode_candidates.insert(id, (None, record));
                }
                None => unloaded.push(id),
            }
        }
        for candidate in store::load_candidates(&self.reads, &request.scope, &[], &unloaded).await?
        {
            episode_candidates.insert(candidate.record.id, (None, candidate.record));
        }
        let episodic = episodes_to_show(ranked_episodes, line_groups, episode_candidates);
        Ok((semantic, episodic))
    }
}

/// Everything the ranking of a retrieval's sections needs, owned, to run off the runtime.
pub(super) struct SectionsToRank {
    fused: Vec<Vec<Fused>>,
    loaded: Vec<LoadedCandidate>,
    query_embedding: Option<std::sync::Arc<Vec<f32>>>,
    /// The kind of each section, in the order of `fused`.
    kinds: &'static [MemoryKind],
    /// The stored turns the legs found, with their neighbours.
    turns: FoundTurns,
    request: RetrieveRequest,
    now: DateTime<Utc>,
}

/// What the ranking decided.
struct Ranked {
    /// The facts, then the episodes when they were asked for.
    sections: Vec<Vec<RankedMemory>>,
    /// The lines that answer, by episode, best first.
    line_groups: Vec<LineGroup>,
    /// The score and record of each episode candidate that holds a shown line.
    /// (None: not scored, loaded for its lines alone.)
    episode_candidates: HashMap<Uuid, (Option<ScoreParts>, MemoryRecord)>,
    /// The episodes loaded because they hold a turn found, which no leg found.
    holding_turns: HashMap<Uuid, MemoryRecord>,
}

impl SectionsToRank {
    fn rank(self) -> Ranked {
        let Self {
            fused,
            loaded,
            query_embedding,
            kinds,
            turns,
            request,
            now,
        } = self;
        let mut loaded: HashMap<Uuid, LoadedCandidate> =
            loaded.into_iter().map(|c| (c.record.id, c)).collect();
        // The days the query names, if any ("what did I decide in March?").
        let window = engram_core::when::query_window(&request.query, now)
            .map(|(first, last)| TimeWindow::of_days(first, last));
        // Both sections are weighed on one scale, so that a fact and an episode with the same
        // relevance score alike and an answer interleaving them (Markdown, a merged list) puts
        // the better match first whichever section it is in.
        let query_embedding = query_embedding.as_deref().map(Vec::as_slice);
        let evidence: Vec<Vec<Evidenced>> = fused
            .into_iter()
            .map(|fused| weigh_legs(fused, &mut loaded, query_embedding))
            .collect();
        let scale = LegScale::of(evidence.iter().flatten().map(|(_, _, legs)| legs));
        // The speakers the query names, among those whose lines are candidates ("What breed is
        // Jonas's dog?"): the other speakers' lines count less.
        let speakers = NamedSpeakers::in_query(
            &request.query,
            evidence
                .iter()
                .flatten()
                .filter(|(_, candidate, _)| candidate.record.memory_kind() == MemoryKind::Semantic)
                .map(|(_, candidate, _)| candidate.record.text.as_str()),
        );
        let context = RankingContext {
            scale: &scale,
            params: &request.ranking,
            now,
            window: window.as_ref(),
            speakers: &speakers,
            conversation: request.conversation.map(|c| c.as_uuid()),
        };
        let mut sections = Vec::with_capacity(kinds.len());
        let mut line_groups = Vec::new();
        let mut episode_candidates = HashMap::new();
        let found_turns = TurnTexts::of(&turns);
        for (candidates, kind) in evidence.into_iter().zip(kinds) {
            let mut scored = score_section(candidates, &context);
            if *kind == MemoryKind::Semantic {
                // A named speaker's fact that consolidation copied from a turn the turn legs
                // found competes as that line, with its speaker, episode and date: not twice
                // for the same budget. What the user saved or pinned stays, and so does a chat's
                // fact (its validity, superseded or not, is what the line cannot say).
                scored.retain(|(_, _, candidate)| !found_turns.copy_of(&candidate.record));
                sections.push(select(
                    scored,
                    request.semantic_limit,
                    request.ranking.mmr_lambda,
                ));
                continue;
            }
            let episode_scores: HashMap<Uuid, ScoreParts> = scored
                .iter()
                .map(|(_, parts, candidate)| (candidate.record.id, *parts))
                .collect();
            line_groups = answering_lines(&request.query, &turns, &episode_scores, &context);
            // The records of the episodes whose lines are shown, kept before MMR drops the rest.
            let holding_lines: std::collections::HashSet<Uuid> = line_groups
                .iter()
                .filter_map(|group| group.episode)
                .collect();
            episode_candidates = scored
                .iter()
                .filter(|(_, _, candidate)| holding_lines.contains(&candidate.record.id))
                .map(|(_, parts, candidate)| {
                    (
                        candidate.record.id,
                        (Some(*parts), candidate.record.clone()),
                    )
                })
                .collect();
            sections.push(select(
                scored,
                request.episodic_limit,
                request.ranking.mmr_lambda,
            ));
        }
        Ranked {
            sections,
            line_groups,
            episode_candidates,
            // What the legs' candidates did not take.
            holding_turns: loaded
                .into_iter()
                .map(|(id, candidate)| (id, candidate.record))
                .collect(),
        }
    }
}

/// A fused candidate, loaded, with what each leg says of it.
type Evidenced = (Fused, LoadedCandidate, LegEvidence);

/// Loads each fused candidate of one kind and takes both legs' evidence for it: a candidate only
/// the sparse leg found gets its cosine from its stored embedding and `query_embedding`, so that
/// triscore's relevance weighs both legs for every candidate. An id the legs found but that is
/// gone now (forgotten meanwhile) is skipped.
fn weigh_legs(
    fused: Vec<Fused>,
    loaded: &mut HashMap<Uuid, LoadedCandidate>,
    query_embedding: Option<&[f32]>,
) -> Vec<Evidenced> {
    fused
        .into_iter()
        .filter_map(|f| {
            let candidate = loaded.remove(&f.id)?;
            let cosine = f.dense.map(|hit| hit.score).or_else(|| {
                let stored = candidate.embedding.as_ref()?.as_slice();
                let query = query_embedding?;
                (stored.len() == query.len())
                    .then(|| f64::from(engram_embed::cosine(stored, query)))
            });
            let evidence = LegEvidence {
                sparse: f.sparse.map(|hit| hit.score),
                cosine,
            };
            Some((f, candidate, evidence))
        })
        .collect()
}

/// A candidate with its score.
type Scored = (Fused, ScoreParts, LoadedCandidate);

/// Scores the candidates of one kind on the context's scale, best first.
fn score_section(candidates: Vec<Evidenced>, context: &RankingContext<'_>) -> Vec<Scored> {
    let RankingContext {
        scale,
        params,
        now,
        window,
        speakers,
        conversation,
    } = *context;
    let mut scored: Vec<(Fused, ScoreParts, LoadedCandidate)> = candidates
        .into_iter()
        .map(|(f, candidate, evidence)| {
            let record = &candidate.record;
            let fsrs = match (record.stability, record.difficulty, record.last_reviewed_at) {
                (Some(s), Some(d), Some(at)) if record.memory_kind() == MemoryKind::Episodic => {
                    Some((s, d, at))
                }
                _ => None,
            };
            // An episode took place over its turns; a fact when it became valid (consolidated
            // facts carry their episode's time); a turn or memory when it was said.
            let took_place = match (record.start_at, record.end_at) {
                (Some(start), Some(end)) => (start, end),
                _ => {
                    let at = record.valid_at.unwrap_or(record.created_at);
                    (at, at)
                }
            };
            let facts = CandidateFacts {
                created_at: record.created_at,
                took_place,
                importance: record.importance,
                fsrs,
                // An episode's summary may end on a question it quotes; it still stands for the
                // whole segment, answers included.
                is_question: record.memory_kind() == MemoryKind::Semantic
                    && is_question(&record.text),
                // An episode holds every speaker's lines.
                spoken_by_another: record.memory_kind() == MemoryKind::Semantic
                    && speakers.spoken_by_another(&record.text),
                from_request_conversation: conversation.is_some()
                    && record.conversation_id == conversation,
            };
            let relevance = relevance(&evidence, scale, params.sparse_weight);
            let parts = score(f.rrf, relevance, &facts, params, now, window);
            (f, parts, candidate)
        })
        .collect();
    scored.sort_by(|a, b| b.1.total.total_cmp(&a.1.total).then(a.0.id.cmp(&b.0.id)));
    scored
}

/// Lets MMR pick `limit` of the scored candidates (best first), in order.
fn select(mut scored: Vec<Scored>, limit: usize, mmr_lambda: f64) -> Vec<RankedMemory> {
    if limit == 0 {
        return Vec::new();
    }
    // MMR only needs to look a little past the limit: entries far down cannot climb above the
    // diverse picks.
    scored.truncate(limit.saturating_mul(4).max(limit));
    let best_total = scored.first().map(|s| s.1.total).unwrap_or(0.0);
    let items: Vec<MmrItem<'_>> = scored
        .iter()
        .map(|s| MmrItem {
            value: if best_total > 0.0 {
                s.1.total / best_total
            } else {
                0.0
            },
            embedding: s.2.embedding.as_ref().map(|v| v.as_slice()),
            tags: &s.2.record.tags,
        })
        .collect();
    let order = mmr::select(&items, mmr_lambda, limit);
    drop(items);
    let mut slots: Vec<Option<Scored>> = scored.into_iter().map(Some).collect();
    order
        .into_iter()
        .enumerate()
        .filter_map(|(position, index)| {
            let (fused, scores, candidate) = slots[index].take()?;
            Some(RankedMemory {
                record: candidate.record,
                rank: position + 1,
                scores,
                scored: true,
                sparse: fused.sparse,
                dense: fused.dense,
                details_shown: false,
                lines_shown: Vec::new(),
                history: Vec::new(),
            })
        })
        .collect()
}

/// The words of the stored turns the turn legs found, to tell a fact copied from one of them:
/// worked out at the first fact that could be such a copy (most retrievals have none).
struct TurnTexts<'a> {
    turns: &'a FoundTurns,
    words: std::cell::OnceCell<Vec<String>>,
}

impl<'a> TurnTexts<'a> {
    fn of(turns: &'a FoundTurns) -> Self {
        Self {
            turns,
            words: std::cell::OnceCell::new(),
        }
    }

    /// Whether `fact` is a named speaker's fact consolidation copied from one of the turns
    /// word for word (neither saved nor pinned by the user).
    fn copy_of(&self, fact: &MemoryRecord) -> bool {
        if fact.manually_saved || fact.pinned || fact.source_episode_ids.is_empty() {
            return false;
        }
        let Some((_, said)) = engram_core::speaker::split_speaker(&fact.text) else {
            return false;
        };
        let said = words(said);
        !said.is_empty() && {
            let said = format!(" {said} ");
            let turns = self.words.get_or_init(|| {
                self.turns
                    .stored
                    .iter()
                    .map(|turn| format!(" {} ", words(&turn.content)))
                    .collect()
            });
            turns.iter().any(|turn| turn.contains(&said))
        }
    }
}

/// A text's words, lowercased, joined by single spaces (punctuation aside).
fn words(text: &str) -> String {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}
