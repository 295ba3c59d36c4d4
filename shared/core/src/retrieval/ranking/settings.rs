//! The ranking settings, each declared once: [`RankingParams`], its defaults and
//! [`RANKING_SETTINGS`] come from the one list below. Configuration (`recall.<name>`, the
//! `ENGRAM_RECALL__<NAME>` variables) and requests (`ranking.<name>`) read the numeric settings
//! through the table, so a new setting is a new entry here, a proto field and its line in the
//! retrieval service's request mapping. The profile and the candidates per leg are not numbers
//! on a scale (a name, a count), so they are declared beside the list instead.

use super::RankingProfile;

/// `recall.profile` (chosen with the numeric defaults: see [`RANKING_SETTINGS`]).
pub const DEFAULT_PROFILE: RankingProfile = RankingProfile::Triscore;
/// `recall.candidates_per_leg`; a request may ask for the bounds below.
pub const DEFAULT_CANDIDATES_PER_LEG: u32 = 20;
pub const MIN_CANDIDATES_PER_LEG: u32 = 1;
pub const MAX_CANDIDATES_PER_LEG: u32 = 1_000;

/// One numeric ranking setting: how it is named, its default, the values it may take and the
/// field of [`RankingParams`] that holds it.
#[derive(Debug)]
pub struct RankingSetting {
    /// The field's name: the key under `recall.` and in a request's `ranking`.
    pub name: &'static str,
    /// `recall.<name>`.
    pub config_key: &'static str,
    /// The service's default.
    pub default: f64,
    /// The least value allowed.
    pub min: f64,
    /// The greatest value allowed.
    pub max: f64,
    pub get: fn(&RankingParams) -> f64,
    pub set: fn(&mut RankingParams, f64),
    /// The field's doc comment, its lines joined.
    doc: &'static str,
}

impl RankingSetting {
    /// The setting a configuration key suffix or request field names, if any.
    pub fn named(name: &str) -> Option<&'static Self> {
        RANKING_SETTINGS.iter().find(|setting| setting.name == name)
    }

    /// What the setting does (the doc comment of its field).
    pub fn doc(&self) -> &'static str {
        // Doc comments keep the space after `///`.
        self.doc.trim()
    }
}

/// Declares [`RankingParams`], its `Default` and [`RANKING_SETTINGS`] from one list, so that a
/// numeric setting's field, doc, default and bounds cannot drift apart.
macro_rules! ranking_settings {
    (
        $(#[doc = $table_doc:literal])*
        pub static RANKING_SETTINGS;
        $(
            $(#[doc = $doc:literal])+
            $name:ident: default $default:literal, range $min:literal..=$max:literal;
        )+
    ) => {
        /// Everything that shapes ranking, per request (defaults from configuration).
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub struct RankingParams {
            pub profile: RankingProfile,
            /// Candidates taken from each leg before fusion.
            pub candidates_per_leg: u32,
            $($(#[doc = $doc])+ pub $name: f64,)+
        }

        impl Default for RankingParams {
            /// The service's defaults.
            fn default() -> Self {
                Self {
                    profile: DEFAULT_PROFILE,
                    candidates_per_leg: DEFAULT_CANDIDATES_PER_LEG,
                    $($name: $default,)+
                }
            }
        }

        $(#[doc = $table_doc])*
        pub static RANKING_SETTINGS: &[RankingSetting] = &[$(
            RankingSetting {
                name: stringify!($name),
                config_key: concat!("recall.", stringify!($name)),
                default: $default,
                min: $min,
                max: $max,
                get: |params| params.$name,
                set: |params, value| params.$name = value,
                doc: concat!($($doc),+),
            },
        )+];
    };
}

ranking_settings! {
    /// Every numeric ranking setting, in the order they are checked. The defaults were chosen by
    /// `make eval`. On the multi-session dialogs (docs/eval/dialogs.md, "How the ranking defaults
    /// were chosen", which weighs the turns and the conversation's episodes and facts alike):
    /// triscore, its relevance 0.3 × BM25 over the best BM25 + 0.7 × cosine over the best cosine
    /// among the candidates, discounted to 0.6 for a fact that is itself a question and to 0.5 for
    /// a transcript line of a speaker the query does not name when it names one; importance
    /// weighted 1 to relevance's 4; MMR at λ = 1 (order by score: diversity cost recall on the
    /// dialogs, and the write path already merges near-duplicates; requests may still ask for it);
    /// a relevance floor of 0.2 (the cosine an entry no query word matched needs: it lifted the
    /// episodes and facts, which low-cosine facts had crowded; higher floors lose paraphrases that
    /// share no word with the question); and an entry from the days a question names scoring one
    /// and a half times as much (time_match_boost 0.5). RRF k = 1 orders the fsrs profile. Recency
    /// (β = 0.5, τ = 30 days) and the candidates per leg (20) come from the task set
    /// (docs/eval/retrieval.md): the dialogs are months old when asked about, so they cannot
    /// choose them.
    pub static RANKING_SETTINGS;

    /// The reciprocal rank fusion constant k, which orders the fsrs profile.
    rrf_k: default 1.0, range 1.0..=1000.0;
    /// MMR trade-off: 1 ranks by score alone, 0 by diversity alone.
    mmr_lambda: default 1.0, range 0.0..=1.0;
    /// triscore's weight α of relevance.
    alpha: default 4.0, range 0.0..=100.0;
    /// triscore's weight β of freshness.
    beta: default 0.5, range 0.0..=100.0;
    /// triscore's weight γ of importance.
    gamma: default 1.0, range 0.0..=100.0;
    /// Recency time constant τ, in days.
    recency_tau_days: default 30.0, range 0.01..=3650.0;
    /// The relevance floor: a candidate no query word matched is left out when its cosine to the
    /// query is below this (0: none is left out). Word matches always stay.
    min_similarity: default 0.2, range 0.0..=1.0;
    /// When the query names days ("in March", "last week"), a candidate about those days scores
    /// (1 + this) times as much (0: dates in queries change nothing).
    time_match_boost: default 0.5, range 0.0..=10.0;
    /// triscore's relevance: the weight of the sparse leg's score; the cosine has the rest.
    sparse_weight: default 0.3, range 0.0..=1.0;
    /// triscore's relevance of a fact that is a question ("Did you get a dog?") is multiplied by
    /// this (1: questions count like any fact).
    question_weight: default 0.6, range 0.0..=1.0;
    /// triscore's relevance of a transcript line ("Clara: Wow, Jonas!") is multiplied by this when
    /// the query names a speaker and not this line's (1: who said it changes nothing).
    other_speaker_weight: default 0.5, range 0.0..=1.0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_is_found_by_name_and_defaults_within_its_bounds() {
        let defaults = RankingParams::default();
        for setting in RANKING_SETTINGS {
            let named = RankingSetting::named(setting.name);
            assert!(named.is_some_and(|named| std::ptr::eq(named, setting)));
            assert!(setting.min <= setting.default && setting.default <= setting.max);
            assert_eq!((setting.get)(&defaults), setting.default, "{setting:?}");
            assert!(!setting.doc().is_empty() && !setting.doc().starts_with(' '));
        }
        assert!(
            (MIN_CANDIDATES_PER_LEG..=MAX_CANDIDATES_PER_LEG)
                .contains(&defaults.candidates_per_leg)
        );
    }

    #[test]
    fn each_setting_writes_its_own_field() {
        for setting in RANKING_SETTINGS {
            let mut params = RankingParams::default();
            // Within the bounds and unlike any default.
            let value = setting.min + 0.37 * (setting.max - setting.min);
            (setting.set)(&mut params, value);
            assert_eq!((setting.get)(&params), value, "{}", setting.name);
            let others_unchanged = RANKING_SETTINGS
                .iter()
                .filter(|other| other.name != setting.name)
                .all(|other| (other.get)(&params) == other.default);
            assert!(others_unchanged, "{}", setting.name);
        }
    }
}
