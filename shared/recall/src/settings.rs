//! Retrieval's tunables (`recall.*` settings) and the per-request overrides clients may send,
//! validated against bounds that keep a request from asking for something absurd. The numeric
//! ranking settings, with their defaults and bounds, are declared once in engram-core
//! (`RANKING_SETTINGS`); configuration and requests read them from there by name.

use std::collections::BTreeMap;
use std::fmt;

use engram_core::ValidationError;
use engram_core::retrieval::budget::{DEFAULT_TOKEN_BUDGET, MAX_TOKEN_BUDGET, MIN_TOKEN_BUDGET};
use engram_core::retrieval::ranking::{
    DEFAULT_CANDIDATES_PER_LEG, DEFAULT_PROFILE, MAX_CANDIDATES_PER_LEG, MIN_CANDIDATES_PER_LEG,
    RANKING_SETTINGS, RankingSetting,
};
use engram_core::retrieval::{RankingParams, RankingProfile};
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeMap as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Retrievals' traces are written every quarter second by default: a crash loses at most that
/// much of them, and one write serves every retrieval of the interval.
pub(crate) const DEFAULT_TRACE_FLUSH_MS: u32 = 250;

/// Turns the turn legs' word search brings by default, chosen on the dev dialogs by what an
/// assistant reads when it set both legs (docs/eval/README.md, "Turn candidates"): 30 read 82.1 / 85.2 % of the evidence at 1,000 /
/// 2,000 tokens, 60 83.6 / 86.4 %, 75 84.8 / 88.1 %, 90 84.5 / 88.2 %, 120 84.7 / 88.7 %; 75
/// holds nearly all of the gain, and each candidate more is a turn and its neighbours more to
/// load and rank (`make bench-retrieval`).
pub(crate) const DEFAULT_TURN_CANDIDATES: u32 = 75;
/// The most turns a turn leg may bring.
pub(crate) const MAX_TURN_CANDIDATES: u32 = 500;
/// Turns the turn-vector leg brings by default, chosen on the dev dialogs (docs/eval/README.md,
/// "The turn-vector leg on its own"): 30 read 83.1 / 86.0 % of the evidence at 1,000 / 2,000
/// tokens, 50 84.2 / 86.6 %, 75 84.1 / 87.9 %.
pub(crate) const DEFAULT_TURN_VECTOR_CANDIDATES: u32 = 75;

/// The longest flush interval accepted (a minute).
const MAX_TRACE_FLUSH_MS: u64 = 60_000;

#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
pub struct RecallSettings {
    /// `fsrs` or `triscore`.
    #[garde(custom(known_profile))]
    pub profile: String,
    #[garde(range(min = MIN_CANDIDATES_PER_LEG, max = MAX_CANDIDATES_PER_LEG))]
    pub candidates_per_leg: u32,
    /// The numeric ranking settings, `recall.<name>` for each of `RANKING_SETTINGS` (their
    /// ranges are the table's).
    #[serde(flatten)]
    #[garde(dive)]
    pub ranking: RankingValues,
    #[garde(range(min = MIN_TOKEN_BUDGET, max = MAX_TOKEN_BUDGET))]
    pub token_budget: u32,
    /// Least pg_trgm word similarity of a trigram fallback hit.
    #[garde(range(min = 0.0, max = 1.0))]
    pub trigram_threshold: f64,
    /// Spaces up to this many entries get exact nearest neighbours; larger ones use HNSW.
    #[garde(range(min = 0, max = 100_000_000))]
    pub exact_search_max_entries: i64,
    /// HNSW candidates per scan step (pgvector's hnsw.ef_search, which allows 1 to 1,000).
    #[garde(range(min = 1, max = 1_000))]
    pub hnsw_ef_search: u32,
    #[garde(range(min = 0.0, max = 10.0))]
    pub bm25_k1: f64,
    #[garde(range(min = 0.0, max = 1.0))]
    pub bm25_b: f64,
    /// Turns the turn legs' word search brings for the lines (each is loaded with a neighbour
    /// either side).
    #[garde(range(min = 1, max = MAX_TURN_CANDIDATES))]
    pub turn_candidates: u32,
    /// Turns the turn legs' vector search brings beside them (0: none; each is loaded with a
    /// neighbour either side too).
    #[garde(range(min = 0, max = MAX_TURN_CANDIDATES))]
    pub turn_vector_candidates: u32,
    /// How often retrievals' traces (cached scores, notes that entries were returned, metrics
    /// rows) are written, in milliseconds: the most a crash can lose (`read_traces`).
    #[garde(range(min = 1, max = MAX_TRACE_FLUSH_MS))]
    pub trace_flush_ms: u64,
}

fn known_profile(profile: &str, _: &()) -> garde::Result {
    match RankingProfile::parse(profile) {
        Some(_) => Ok(()),
        None => Err(garde::Error::new("not fsrs or triscore")),
    }
}

impl RecallSettings {
    /// How often retrievals' traces are written.
    pub fn trace_flush_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.trace_flush_ms)
    }

    /// The configured ranking, checked like a request's (a bad configuration fails at start-up).
    pub fn default_ranking(&self) -> Result<RankingParams, ValidationError> {
        RankingOverrides {
            profile: Some(self.profile.clone()),
            candidates_per_leg: None,
            values: self.ranking.clone(),
        }
        .apply(
            RankingParams {
                candidates_per_leg: self.candidates_per_leg,
                ..RankingParams::default()
            },
            "recall",
        )
    }
}

impl Default for RecallSettings {
    /// The ranking's defaults are `RANKING_SETTINGS`' (how each was chosen is told there); BM25's
    /// are the textbook ones.
    fn default() -> Self {
        Self {
            profile: DEFAULT_PROFILE.as_str().to_owned(),
            candidates_per_leg: DEFAULT_CANDIDATES_PER_LEG,
            ranking: RankingValues(
                RANKING_SETTINGS
                    .iter()
                    .map(|setting| (setting.name, setting.default))
                    .collect(),
            ),
            token_budget: DEFAULT_TOKEN_BUDGET,
            trigram_threshold: 0.3,
            exact_search_max_entries: 20_000,
            hnsw_ef_search: 200,
            bm25_k1: engram_core::retrieval::bm25::K1,
            bm25_b: engram_core::retrieval::bm25::B,
            turn_candidates: DEFAULT_TURN_CANDIDATES,
            turn_vector_candidates: DEFAULT_TURN_VECTOR_CANDIDATES,
            trace_flush_ms: u64::from(DEFAULT_TRACE_FLUSH_MS),
        }
    }
}

/// Values of numeric ranking settings by name (one of `RANKING_SETTINGS`); a setting left out
/// keeps the value it had.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankingValues(BTreeMap<&'static str, f64>);

impl RankingValues {
    /// The values given among optional ones, such as a request's fields.
    pub fn given(values: impl IntoIterator<Item = (&'static str, Option<f64>)>) -> Self {
        Self(
            values
                .into_iter()
                .filter_map(|(name, value)| Some((name, value?)))
                .collect(),
        )
    }

    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.get(name).copied()
    }
}

/// Each value within its setting's range (`RANKING_SETTINGS`), reported under its name.
impl garde::Validate for RankingValues {
    type Context = ();

    fn validate_into(
        &self,
        _: &(),
        parent: &mut dyn FnMut() -> garde::Path,
        report: &mut garde::Report,
    ) {
        for (name, value) in &self.0 {
            let Some(setting) = RankingSetting::named(name) else {
                continue;
            };
            let problem = if *value < setting.min {
                format!("lower than {}", setting.min)
            } else if *value > setting.max {
                format!("greater than {}", setting.max)
            } else {
                continue;
            };
            report.append(parent().join(*name), garde::Error::new(problem));
        }
    }
}

/// Reads `recall.<name>` for each of `RANKING_SETTINGS` and leaves the other keys to
/// `RecallSettings`' own fields.
impl<'de> Deserialize<'de> for RankingValues {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(RankingValuesVisitor)
    }
}

/// Writes each value under its setting's name (flattened into `recall.`, as it is read).
impl Serialize for RankingValues {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

struct RankingValuesVisitor;

impl<'de> Visitor<'de> for RankingValuesVisitor {
    type Value = RankingValues;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("the recall settings")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RankingValues, A::Error> {
        let mut values = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            let Some(setting) = RankingSetting::named(&key) else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            // Parsed as the configuration parses any `f64` field ("0.5" from the environment).
            let value = map
                .next_value::<config::Value>()?
                .into_float()
                .map_err(|error| de::Error::custom(format!("{}: {error}", setting.config_key)))?;
            values.insert(setting.name, value);
        }
        Ok(RankingValues(values))
    }
}

/// Ranking parameters a request may set; `None` (or a value left out) keeps the configured one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankingOverrides {
    pub profile: Option<String>,
    pub candidates_per_leg: Option<u32>,
    pub values: RankingValues,
}

fn bounded(field: String, value: f64, min: f64, max: f64) -> Result<f64, ValidationError> {
    if value.is_finite() && value >= min && value <= max {
        Ok(value)
    } else {
        Err(ValidationError::new(
            field,
            format!("must be between {min} and {max}, got {value}"),
        ))
    }
}

impl RankingOverrides {
    /// The defaults with these overrides; every numeric setting, overridden or not, must be within
    /// its bounds. `prefix` names the fields in errors.
    pub fn apply(
        &self,
        defaults: RankingParams,
        prefix: &str,
    ) -> Result<RankingParams, ValidationError> {
        let field = |name: &str| format!("{prefix}.{name}");
        let mut params = defaults;
        if let Some(profile) = &self.profile {
            params.profile = RankingProfile::parse(profile).ok_or_else(|| {
                ValidationError::new(
                    field("profile"),
                    format!("must be fsrs or triscore, got {profile:?}"),
                )
            })?;
        }
        if let Some(candidates) = self.candidates_per_leg {
            params.candidates_per_leg = bounded(
                field("candidates_per_leg"),
                f64::from(candidates),
                f64::from(MIN_CANDIDATES_PER_LEG),
                f64::from(MAX_CANDIDATES_PER_LEG),
            )? as u32;
        }
        // Only a mistake in the code that builds the overrides gives a name outside the table.
        if let Some(unknown) = self
            .values
            .0
            .keys()
            .find(|name| RankingSetting::named(name).is_none())
        {
            return Err(ValidationError::new(
                field(unknown),
                "is not a ranking setting",
            ));
        }
        for setting in RANKING_SETTINGS {
            let value = self
                .values
                .get(setting.name)
                .unwrap_or((setting.get)(&params));
            let value = bounded(field(setting.name), value, setting.min, setting.max)?;
            (setting.set)(&mut params, value);
        }
        Ok(params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_apply_within_bounds_and_name_the_field_otherwise() {
        let defaults = RankingParams::default();
        let params = RankingOverrides {
            profile: Some("fsrs".into()),
            values: RankingValues::given([("alpha", Some(2.0)), ("beta", None)]),
            ..RankingOverrides::default()
        }
        .apply(defaults, "ranking")
        .unwrap();
        assert_eq!(params.profile, RankingProfile::Fsrs);
        assert_eq!(params.alpha, 2.0);
        assert_eq!(params.beta, defaults.beta);

        let error = RankingOverrides {
            values: RankingValues::given([("mmr_lambda", Some(1.5))]),
            ..RankingOverrides::default()
        }
        .apply(defaults, "ranking")
        .unwrap_err();
        assert_eq!(error.field, "ranking.mmr_lambda");
        assert_eq!(error.reason, "must be between 0 and 1, got 1.5");
        let error = RankingOverrides {
            candidates_per_leg: Some(0),
            ..RankingOverrides::default()
        }
        .apply(defaults, "ranking")
        .unwrap_err();
        assert_eq!(error.reason, "must be between 1 and 1000, got 0");
        let error = RankingOverrides {
            values: RankingValues::given([("alpah", Some(2.0))]),
            ..RankingOverrides::default()
        }
        .apply(defaults, "ranking")
        .unwrap_err();
        assert_eq!(error.field, "ranking.alpah");
        let error = RankingOverrides {
            profile: Some("bm25".into()),
            ..RankingOverrides::default()
        }
        .apply(defaults, "ranking")
        .unwrap_err();
        assert!(error.to_string().contains("fsrs or triscore"), "{error}");
        assert!(
            RankingOverrides {
                values: RankingValues::given([("rrf_k", Some(f64::NAN))]),
                ..RankingOverrides::default()
            }
            .apply(defaults, "ranking")
            .is_err()
        );
    }

    /// The settings as the services load them: the defaults, then `overrides` in place of the
    /// environment (as strings, as variables are).
    fn load(overrides: &[(&str, &str)]) -> Result<RecallSettings, config::ConfigError> {
        #[derive(Serialize)]
        struct Service {
            recall: RecallSettings,
        }
        let defaults = config::Config::try_from(&Service {
            recall: RecallSettings::default(),
        })?;
        let builder = config::Config::builder().add_source(defaults);
        overrides
            .iter()
            .try_fold(builder, |builder, (key, value)| {
                builder.set_override(*key, *value)
            })?
            .build()?
            .get("recall")
    }

    #[test]
    fn the_configured_ranking_is_the_tables_defaults_with_what_the_configuration_sets() {
        let settings = load(&[]).unwrap();
        assert_eq!(
            settings.default_ranking().unwrap(),
            RankingParams::default()
        );
        assert_eq!(settings.token_budget, DEFAULT_TOKEN_BUDGET);

        let settings = load(&[
            ("recall.min_similarity", "0.25"),
            ("recall.alpha", "2"),
            ("recall.profile", "fsrs"),
        ])
        .unwrap();
        let ranking = settings.default_ranking().unwrap();
        assert_eq!(ranking.min_similarity, 0.25);
        assert_eq!(ranking.alpha, 2.0);
        assert_eq!(ranking.profile, RankingProfile::Fsrs);
        assert_eq!(ranking.beta, RankingParams::default().beta);
    }

    #[test]
    fn a_bad_configured_ranking_names_its_key() {
        let error = load(&[("recall.alpha", "101")])
            .unwrap()
            .default_ranking()
            .unwrap_err();
        assert_eq!(error.field, "recall.alpha");
        assert_eq!(error.reason, "must be between 0 and 100, got 101");
        let error = load(&[("recall.gamma", "heavy")]).unwrap_err();
        assert!(error.to_string().contains("recall.gamma"), "{error}");
    }
}
