//! Bearer-token access control.
//!
//! [`AuthLayer`] is a tower layer in front of every gRPC service. It lets health checks and
//! reflection through, authenticates the `authorization: Bearer <token>` header of everything
//! else, and attaches the token's [`AccessGrant`] to the request. Handlers then check the grant
//! against the user and space the request names (the layer cannot: they live in the protobuf
//! body), answering PermissionDenied outside it. With no tokens configured, every request gets an
//! admin grant: every caller is trusted, which the server logs loudly at start.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

use engram_core::Scope;
use futures::future::{Either, Ready, ready};
use serde::Deserialize;
use tonic::Status;
use tower::{Layer, Service};
use uuid::Uuid;

/// Paths open without a token: Kubernetes probes and `grpcurl list/describe`.
const OPEN_PATH_PREFIXES: [&str; 3] = [
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
];

/// What a request may touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessGrant {
    /// Any user and space, and the admin operations that reach across all of them (re-embedding
    /// every space): a token marked `"admin": true`, or every caller when no tokens are configured.
    Admin,
    /// Any user and space: a token without limits.
    Unrestricted,
    /// Only these users and/or spaces; `None` means any.
    Limited {
        token_name: String,
        users: Option<Vec<Uuid>>,
        spaces: Option<Vec<String>>,
    },
}

impl AccessGrant {
    /// Checks a request's scope against the grant.
    pub fn authorize(&self, scope: &Scope) -> Result<(), Status> {
        match self {
            AccessGrant::Admin | AccessGrant::Unrestricted => Ok(()),
            AccessGrant::Limited {
                token_name,
                users,
                spaces,
            } => {
                if let Some(users) = users
                    && !users.contains(&scope.user_id.as_uuid())
                {
                    return Err(Status::permission_denied(format!(
                        "token {token_name:?} is not granted user {}",
                        scope.user_id
                    )));
                }
                if let Some(spaces) = spaces
                    && !spaces.iter().any(|space| space == scope.space.as_str())
                {
                    return Err(Status::permission_denied(format!(
                        "token {token_name:?} is not granted space {:?}",
                        scope.space.as_str()
                    )));
                }
                Ok(())
            }
        }
    }

    /// Admin operations (reaching every user's data at once) need an admin grant.
    pub fn require_admin(&self, operation: &str) -> Result<(), Status> {
        match self {
            AccessGrant::Admin => Ok(()),
            AccessGrant::Unrestricted | AccessGrant::Limited { .. } => {
                Err(Status::permission_denied(format!(
                    "{operation} needs an admin token (\"admin\": true in the tokens file)"
                )))
            }
        }
    }

    /// The grant a handler finds on its request. A request that did not pass the layer has none,
    /// and is refused: access fails closed.
    pub fn of_request<T>(request: &tonic::Request<T>) -> Result<AccessGrant, Status> {
        request
            .extensions()
            .get::<AccessGrant>()
            .cloned()
            .ok_or_else(|| Status::permission_denied("request carries no access grant"))
    }
}

/// The scope a request names, validated (InvalidArgument naming the field) and checked against
/// the request's grant (PermissionDenied): the first thing every scoped handler does.
pub fn authorized_scope<T>(
    request: &tonic::Request<T>,
    scope: Option<engram_proto::v1::Scope>,
) -> Result<Scope, Status> {
    let grant = AccessGrant::of_request(request)?;
    let scope = crate::convert::scope_from_proto(scope)
        .map_err(|error| Status::invalid_argument(error.to_string()))?;
    grant.authorize(&scope)?;
    Ok(scope)
}

// Unknown keys are refused: a misspelled "users" or "spaces" would otherwise leave that limit out
// and silently grant more than intended.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    tokens: Vec<TokenEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    token: String,
    /// Absent: any user. Present: only these (never empty).
    users: Option<Vec<Uuid>>,
    /// Absent: any space. Present: only these (never empty).
    spaces: Option<Vec<String>>,
    /// May run admin operations across every user (re-embed all spaces); never with limits.
    #[serde(default)]
    admin: bool,
}

/// The configured tokens. Empty means open access.
#[derive(Debug, Clone, Default)]
pub struct TokenRegistry {
    grants: Arc<HashMap<String, AccessGrant>>,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read tokens file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("tokens file {path} is not valid: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
    #[error("tokens file {path}: {reason}")]
    Invalid { path: String, reason: String },
}

impl TokenRegistry {
    /// Open access: no token required.
    pub fn open() -> Self {
        Self::default()
    }

    pub fn is_open(&self) -> bool {
        self.grants.is_empty()
    }

    /// Reads `{"tokens": [{"name", "token", "users"?, "spaces"?}]}`.
    pub fn from_file(path: &Path) -> Result<Self, TokenFileError> {
        let display = path.display().to_string();
        let raw = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            path: display.clone(),
            source,
        })?;
        let file: TokensFile =
            serde_json::from_str(&raw).map_err(|source| TokenFileError::Parse {
                path: display.clone(),
                source,
            })?;
        let invalid = |reason: String| TokenFileError::Invalid {
            path: display.clone(),
            reason,
        };
        if file.tokens.is_empty() {
            return Err(invalid(
                "lists no tokens; remove the setting for open access".into(),
            ));
        }
        let mut grants = HashMap::new();
        for entry in file.tokens {
            if entry.token.len() < 16 {
                return Err(invalid(format!(
                    "token {:?} is shorter than 16 characters",
                    entry.name
                )));
            }
            // An empty list would read as "no limit" to the registry but as "nothing" to whoever
            // wrote it: refused, so that a limit is either absent or says what it allows.
            for (key, empty) in [
                ("users", entry.users.as_ref().is_some_and(Vec::is_empty)),
                ("spaces", entry.spaces.as_ref().is_some_and(Vec::is_empty)),
            ] {
                if empty {
                    return Err(invalid(format!(
                        "token {:?} has an empty {key} list; list what it may reach, or leave the key out to allow any",
                        entry.name
                    )));
                }
            }
            let unlimited = entry.users.is_none() && entry.spaces.is_none();
            if entry.admin && !unlimited {
                return Err(invalid(format!(
                    "token {:?} is an admin token with users or spaces limits; an admin reaches \
                     every user, so give it no limits or take admin away",
                    entry.name
                )));
            }
            let grant = if entry.admin {
                AccessGrant::Admin
            } else if unlimited {
                AccessGrant::Unrestricted
            } else {
                AccessGrant::Limited {
                    token_name: entry.name.clone(),
                    users: entry.users,
                    spaces: entry.spaces,
                }
            };
            if grants.insert(entry.token, grant).is_some() {
                return Err(invalid(format!(
                    "token of {:?} is listed twice",
                    entry.name
                )));
            }
        }
        Ok(Self {
            grants: Arc::new(grants),
        })
    }

    fn grant_for(&self, authorization: Option<&http::HeaderValue>) -> Result<AccessGrant, Status> {
        if self.is_open() {
            // Without tokens every caller is trusted, admin operations included (the server
            // says so loudly at start).
            return Ok(AccessGrant::Admin);
        }
        let header = authorization
            .ok_or_else(|| Status::unauthenticated("missing authorization: Bearer <token>"))?;
        // The scheme name is case-insensitive (RFC 9110, section 11.1).
        let token = header
            .to_str()
            .ok()
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token)
            .ok_or_else(|| Status::unauthenticated("authorization must be \"Bearer <token>\""))?;
        self.grants
            .get(token.trim())
            .cloned()
            .ok_or_else(|| Status::unauthenticated("unknown bearer token"))
    }
}

/// Tower layer that authenticates requests and attaches their [`AccessGrant`].
#[derive(Debug, Clone)]
pub struct AuthLayer {
    registry: TokenRegistry,
}

impl AuthLayer {
    pub fn new(registry: TokenRegistry) -> Self {
        Self { registry }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            registry: self.registry.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    registry: TokenRegistry,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for AuthService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<Self::Response, Self::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let path = request.uri().path();
        if OPEN_PATH_PREFIXES
            .iter()
            .any(|prefix| path.starts_with(prefix))
        {
            return Either::Right(self.inner.call(request));
        }
        match self
            .registry
            .grant_for(request.headers().get(http::header::AUTHORIZATION))
        {
            Ok(grant) => {
                request.extensions_mut().insert(grant);
                Either::Right(self.inner.call(request))
            }
            Err(status) => Either::Left(ready(Ok(status.into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(user: Uuid, space: &str) -> Scope {
        Scope::parse("scope", &user.to_string(), space).unwrap()
    }

    #[test]
    fn limited_grants_check_users_and_spaces() {
        let alice = Uuid::from_u128(1);
        let grant = AccessGrant::Limited {
            token_name: "crm".into(),
            users: Some(vec![alice]),
            spaces: Some(vec!["work".into()]),
        };
        assert!(grant.authorize(&scope(alice, "work")).is_ok());
        let denied = grant.authorize(&scope(alice, "home")).unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(grant.authorize(&scope(Uuid::from_u128(2), "work")).is_err());
        assert!(
            AccessGrant::Unrestricted
                .authorize(&scope(alice, "home"))
                .is_ok()
        );
    }

    #[test]
    fn tokens_file_is_validated() {
        let dir = std::env::temp_dir().join(format!("engram-auth-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens.json");
        std::fs::write(&path, r#"{"tokens":[{"name":"a","token":"short"}]}"#).unwrap();
        assert!(matches!(
            TokenRegistry::from_file(&path),
            Err(TokenFileError::Invalid { .. })
        ));
        std::fs::write(
            &path,
            r#"{"tokens":[{"name":"admin","token":"0123456789abcdef"},
                          {"name":"crm","token":"fedcba9876543210","spaces":["crm"]}]}"#,
        )
        .unwrap();
        let registry = TokenRegistry::from_file(&path).unwrap();
        let header = http::HeaderValue::from_static("Bearer 0123456789abcdef");
        assert_eq!(
            registry.grant_for(Some(&header)).unwrap(),
            AccessGrant::Unrestricted
        );
        assert!(
            registry
                .grant_for(Some(&header))
                .unwrap()
                .require_admin("x")
                .is_err()
        );
        assert_eq!(
            TokenRegistry::open().grant_for(None).unwrap(),
            AccessGrant::Admin,
            "open access trusts every caller"
        );
        let crm = http::HeaderValue::from_static("Bearer fedcba9876543210");
        assert!(matches!(
            registry.grant_for(Some(&crm)).unwrap(),
            AccessGrant::Limited { .. }
        ));
        let wrong = http::HeaderValue::from_static("Bearer nope");
        assert_eq!(
            registry.grant_for(Some(&wrong)).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            registry.grant_for(None).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        // The scheme is case-insensitive; a token alone, or another scheme, is refused.
        for accepted in ["BEARER 0123456789abcdef", "bearer 0123456789abcdef"] {
            let header = http::HeaderValue::from_static(accepted);
            assert!(registry.grant_for(Some(&header)).is_ok(), "{accepted}");
        }
        for refused in ["0123456789abcdef", "Basic 0123456789abcdef", "Bearer"] {
            let header = http::HeaderValue::from_static(refused);
            assert!(registry.grant_for(Some(&header)).is_err(), "{refused}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_tokens_file_that_would_grant_more_than_it_says_is_refused() {
        let dir = std::env::temp_dir().join(format!("engram-auth-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens.json");
        for (file, says) in [
            // A misspelled limit ("space" for "spaces") would have left the token unrestricted.
            (
                r#"{"tokens":[{"name":"typo","token":"0123456789abcdef","space":["crm"]}]}"#,
                "unknown field `space`",
            ),
            (
                r#"{"tokens":[{"name":"none","token":"0123456789abcdef","users":[]}]}"#,
                "empty users list",
            ),
            (
                r#"{"tokens":[{"name":"none","token":"0123456789abcdef","spaces":[]}]}"#,
                "empty spaces list",
            ),
            (r#"{"tokens":[],"extra":true}"#, "unknown field `extra`"),
            (
                r#"{"tokens":[{"name":"ops","token":"0123456789abcdef","admin":true,"spaces":["crm"]}]}"#,
                "admin token with users or spaces limits",
            ),
        ] {
            std::fs::write(&path, file).unwrap();
            let error = TokenRegistry::from_file(&path).unwrap_err().to_string();
            assert!(error.contains(says), "{file}: {error}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
