//! The readable summary of a space (GetSummary): how much Engram holds, what is pinned, the most
//! important facts of each category and the latest episodes. Deterministic, no LLM.

use chrono::{DateTime, Utc};

use super::markdown::relative_time;

/// Longest fact or episode summary shown before it is cut with an ellipsis.
pub const MAX_SHOWN_CHARS: usize = 200;

#[derive(Debug, Clone, PartialEq)]
pub struct SummaryFact {
    pub category: String,
    pub text: String,
    pub pinned: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SummaryEpisode {
    pub title: String,
    pub summary: String,
    pub end_at: DateTime<Utc>,
    /// What the episode left open or settled (from its structured summary).
    pub todos: Vec<String>,
    pub decisions: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SpaceOverview {
    pub space: String,
    pub memory_enabled: bool,
    pub semantic_count: u64,
    pub episodic_count: u64,
    pub pinned_count: u64,
    /// Categories with their fact counts, largest first.
    pub categories: Vec<(String, u64)>,
    /// The facts to show per category (pinned and most important first).
    pub highlights: Vec<SummaryFact>,
    pub recent_episodes: Vec<SummaryEpisode>,
    pub oldest_at: Option<DateTime<Utc>>,
    pub newest_at: Option<DateTime<Utc>>,
}

fn shortened(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= MAX_SHOWN_CHARS {
        flat
    } else {
        let cut: String = flat.chars().take(MAX_SHOWN_CHARS - 1).collect();
        format!("{}…", cut.trim_end())
    }
}

fn plural(count: u64, one: &str, many: &str) -> String {
    if count == 1 {
        format!("1 {one}")
    } else {
        format!("{count} {many}")
    }
}

/// The summary as Markdown.
pub fn render(overview: &SpaceOverview, now: DateTime<Utc>) -> String {
    let mut out = format!("# What Engram remembers in {}\n\n", overview.space);
    if !overview.memory_enabled {
        out.push_str(
            "Memory is turned off for this space: nothing new is stored and nothing is recalled.\n\n",
        );
    }
    if overview.semantic_count == 0 && overview.episodic_count == 0 {
        out.push_str("Nothing is remembered yet.\n");
        return out;
    }
    out.push_str(&format!(
        "{} and {}",
        plural(overview.semantic_count, "fact", "facts"),
        plural(overview.episodic_count, "episode", "episodes"),
    ));
    if overview.pinned_count > 0 {
        out.push_str(&format!(", {} pinned", overview.pinned_count));
    }
    if let (Some(oldest), Some(newest)) = (overview.oldest_at, overview.newest_at) {
        out.push_str(&format!(
            "; the oldest from {}, the newest from {}",
            relative_time(oldest, now),
            relative_time(newest, now)
        ));
    }
    out.push_str(".\n");

    let pinned: Vec<&SummaryFact> = overview.highlights.iter().filter(|f| f.pinned).collect();
    if !pinned.is_empty() {
        out.push_str("\n## Pinned\n");
        for fact in pinned {
            out.push_str(&format!(
                "- [{}] {}\n",
                fact.category,
                shortened(&fact.text)
            ));
        }
    }
    if !overview.categories.is_empty() {
        out.push_str("\n## Facts by category\n");
        for (category, count) in &overview.categories {
            out.push_str(&format!("\n### {category} ({count})\n"));
            for fact in overview
                .highlights
                .iter()
                .filter(|f| &f.category == category && !f.pinned)
            {
                out.push_str(&format!("- {}\n", shortened(&fact.text)));
            }
        }
    }
    if !overview.recent_episodes.is_empty() {
        out.push_str("\n## Recent episodes\n");
        for episode in &overview.recent_episodes {
            out.push_str(&format!(
                "- **{}** ({}): {}\n",
                shortened(&episode.title),
                relative_time(episode.end_at, now),
                shortened(&episode.summary)
            ));
            for decision in &episode.decisions {
                out.push_str(&format!("  - decided: {}\n", shortened(decision)));
            }
            for todo in &episode.todos {
                out.push_str(&format!("  - to do: {}\n", shortened(todo)));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    #[test]
    fn an_empty_space_says_so() {
        let now = Utc::now();
        let overview = SpaceOverview {
            space: "work".into(),
            memory_enabled: false,
            semantic_count: 0,
            episodic_count: 0,
            pinned_count: 0,
            categories: vec![],
            highlights: vec![],
            recent_episodes: vec![],
            oldest_at: None,
            newest_at: None,
        };
        let text = render(&overview, now);
        assert!(text.contains("Memory is turned off"), "{text}");
        assert!(text.ends_with("Nothing is remembered yet.\n"), "{text}");
    }

    #[test]
    fn pinned_facts_categories_and_episodes_are_listed() {
        let now = Utc::now();
        let overview = SpaceOverview {
            space: "work".into(),
            memory_enabled: true,
            semantic_count: 3,
            episodic_count: 1,
            pinned_count: 1,
            categories: vec![("preference".into(), 2), ("fact".into(), 1)],
            highlights: vec![
                SummaryFact {
                    category: "preference".into(),
                    text: "Prefers dark mode".into(),
                    pinned: true,
                },
                SummaryFact {
                    category: "preference".into(),
                    text: "Likes   tea\nover coffee".into(),
                    pinned: false,
                },
                SummaryFact {
                    category: "fact".into(),
                    text: "x".repeat(300),
                    pinned: false,
                },
            ],
            recent_episodes: vec![SummaryEpisode {
                title: "Planning the launch".into(),
                summary: "Agreed on a date".into(),
                end_at: now - Duration::days(2),
                todos: vec!["Book the venue".into()],
                decisions: vec!["Launch on 3 March".into()],
            }],
            oldest_at: Some(now - Duration::days(30)),
            newest_at: Some(now - Duration::hours(1)),
        };
        let text = render(&overview, now);
        assert!(text.contains("3 facts and 1 episode, 1 pinned"), "{text}");
        assert!(
            text.contains("## Pinned\n- [preference] Prefers dark mode\n"),
            "{text}"
        );
        assert!(
            text.contains("### preference (2)\n- Likes tea over coffee\n"),
            "{text}"
        );
        assert!(
            text.contains(&format!("- {}…\n", "x".repeat(199))),
            "{text}"
        );
        assert!(
            text.contains(
                "- **Planning the launch** (2 days ago): Agreed on a date\n  - decided: Launch on 3 March\n  - to do: Book the venue\n"
            ),
            "{text}"
        );
    }
}
