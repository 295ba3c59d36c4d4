//! A sandbox for end-to-end tests: each test gets its own Postgres database and all three
//! services started through the same `App::build` path production uses, on free ports, with typed
//! gRPC clients.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use engram_ingest::IngestSettings;
use engram_ingest::metrics::IngestMetrics;
use engram_proto::v1::ingest_service_client::IngestServiceClient;
use engram_proto::v1::retrieval_service_client::RetrievalServiceClient;
use engram_proto::v1::review_service_client::ReviewServiceClient;
use engram_retrieval::RetrievalSettings;
use engram_review::ReviewSettings;
use engram_testkit::TestDatabase;
use secrecy::SecretString;
use sqlx::PgPool;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// A service running in this process until dropped or stopped.
pub struct RunningService {
    pub addr: SocketAddr,
    /// Its Prometheus endpoint (`GET /metrics`).
    pub metrics_addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl RunningService {
    /// Runs a service (`run` is its `run_until`), stopped by [`Self::stop`] or on drop.
    fn spawn<F>(
        (addr, metrics_addr): (SocketAddr, SocketAddr),
        run: impl FnOnce(futures::future::BoxFuture<'static, ()>) -> F,
    ) -> Self
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let (shutdown, signal) = oneshot::channel::<()>();
        let stopped = Box::pin(async move {
            let _ = signal.await;
        });
        let task = tokio::spawn(run(stopped));
        Self {
            addr,
            metrics_addr,
            shutdown: Some(shutdown),
            task: Some(task),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.endpoint())
            .expect("valid endpoint")
            .connect()
            .await
            .expect("service is up")
    }

    /// Sends the shutdown signal and waits for the graceful stop.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningService {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// Options for a sandbox.
#[derive(Debug, Default, Clone)]
pub struct SandboxOptions {
    /// Bearer-token file for all three services; `None` for open access.
    pub tokens_file: Option<PathBuf>,
    /// Global soft cap of the ingest service; `None` keeps the default.
    pub soft_cap: Option<u32>,
    /// Requests one connection may have in flight; `None`: 64.
    pub max_concurrent_requests_per_connection: Option<usize>,
    /// Segmentation settings of the ingest service; `None`: the defaults, with a 100 ms sweep.
    pub segmentation: Option<engram_ingest::config::SegmentationSettings>,
    /// An OpenAI-compatible chat endpoint (a fake server of the test) for the LLM steps; `None`:
    /// the local rules.
    pub llm_base_url: Option<String>,
    /// The review service leaves closed segments in its queue (a test reads them itself).
    pub review_consumer_off: bool,
    /// What the review service does when its LLM fails; `None`: the default (grade locally).
    pub review_on_llm_failure: Option<engram_review::config::LlmFailure>,
    /// The services reach Postgres through a TCP proxy the test can cut (`Sandbox::database_proxy`).
    pub database_proxy: bool,
    /// How long the services wait for a database connection; `None`: 10 s.
    pub database_connect_timeout_secs: Option<u64>,
    /// The services' own request deadline; `None`: 30 s.
    pub request_timeout_secs: Option<u64>,
    /// Group-commit transactions of the ingest service in flight at once; `None` keeps the default.
    pub write_batch_concurrency: Option<usize>,
    /// The embedding backfill of the ingest service (off unless a test needs it).
    pub embedder: TestEmbedder,
    /// The RabbitMQ bus (off unless a test needs it), under a topology prefix of its own.
    pub bus: Option<TestBus>,
    /// How often the retrieval service writes retrievals' traces; `None` keeps the default.
    pub trace_flush_ms: Option<u64>,
}

/// A proxy in front of the test database's server, and the database's URL through it.
async fn proxied_database_url(url: &str) -> (engram_testkit::TcpProxy, String) {
    let parsed = url::Url::parse(url).expect("a database URL");
    let host = parsed.host_str().expect("a database host");
    let port = parsed.port().unwrap_or(5432);
    let upstream = tokio::net::lookup_host((host, port))
        .await
        .expect("the database host resolves")
        .next()
        .expect("an address");
    let proxy = engram_testkit::TcpProxy::start(upstream)
        .await
        .expect("a database proxy");
    let mut through = parsed.clone();
    through
        .set_host(Some(&proxy.address().ip().to_string()))
        .expect("an IP host");
    through
        .set_port(Some(proxy.address().port()))
        .expect("a port");
    (proxy, through.to_string())
}

/// The bus of a sandbox.
#[derive(Debug, Clone)]
pub struct TestBus {
    /// Broker URL (a test may point it at a proxy it can cut).
    pub url: String,
    /// Exchange and queue names start with it; unique per test.
    pub topology_prefix: String,
    /// Only entries at least this old are swept (set it high to prove the consumer did the work).
    pub sweep_min_age_ms: u64,
}

impl TestBus {
    /// The local broker of `make up` (`ENGRAM_AMQP__URL` overrides), a fresh prefix.
    pub fn local() -> Self {
        Self {
            url: amqp_url(),
            topology_prefix: format!("test-{}", uuid::Uuid::new_v4().simple()),
            sweep_min_age_ms: 60_000,
        }
    }
}

pub fn amqp_url() -> String {
    std::env::var("ENGRAM_AMQP__URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Which embedder the sandbox's ingest service runs.
#[derive(Debug, Default, Clone)]
pub enum TestEmbedder {
    #[default]
    Disabled,
    /// The local model, from `ENGRAM_EMBED__MODEL_DIR` or where `make models` installs it.
    Local,
    /// An OpenAI-compatible endpoint (a fake server of the test).
    OpenAi { base_url: String, dimension: usize },
}

/// Where `make models` installs the local embedding model.
pub fn local_model_dir() -> PathBuf {
    engram_embed::installed_model_dir()
}

/// One database and the three services over it.
pub struct Sandbox {
    pub ingest: IngestServiceClient<Channel>,
    pub retrieval: RetrievalServiceClient<Channel>,
    pub review: ReviewServiceClient<Channel>,
    pub ingest_metrics: Arc<IngestMetrics>,
    /// The ingest service's retention job: tests start runs themselves (with the clock they
    /// choose); the periodic runs are off in the sandbox.
    pub retention: engram_ingest::retention::RetentionJob,
    pub review_metrics: Arc<engram_review::metrics::ReviewMetrics>,
    pub pool: PgPool,
    /// The retrieval service's pipeline: [`Sandbox::write_read_traces`] writes what its
    /// retrievals left behind, as its graceful shutdown does.
    pub recall: engram_recall::Recall,
    pub services: Vec<RunningService>,
    pub options: SandboxOptions,
    /// The proxy between the services and Postgres, with `SandboxOptions::database_proxy`.
    pub database_proxy: Option<engram_testkit::TcpProxy>,
    /// The database URL the services use (through the proxy, if there is one).
    services_database_url: String,
    // Last: dropped after the services stopped using it.
    pub database: TestDatabase,
}

/// The sandbox's database settings over a service's own defaults (its `synchronous_commit`).
fn database_settings(
    defaults: engram_server::DatabaseSettings,
    url: &str,
    run_migrations: bool,
    options: &SandboxOptions,
) -> engram_server::DatabaseSettings {
    engram_server::DatabaseSettings {
        url: SecretString::from(url.to_owned()),
        max_connections: 8,
        connect_timeout_secs: options.database_connect_timeout_secs.unwrap_or(10),
        run_migrations,
        schema_wait_secs: 30,
        ..defaults
    }
}

fn grpc_settings(options: &SandboxOptions) -> engram_server::GrpcSettings {
    engram_server::GrpcSettings {
        listen_addr: "127.0.0.1:0".parse().expect("valid address"),
        shutdown_grace_secs: 5,
        max_concurrent_requests_per_connection: options
            .max_concurrent_requests_per_connection
            .unwrap_or(64),
        request_timeout_secs: options.request_timeout_secs.unwrap_or(30),
        readiness_interval_ms: 100,
        metrics_listen_addr: "127.0.0.1:0".parse().expect("valid address"),
        tls: None,
    }
}

/// The segmentation settings a test starts from: the defaults, with a fast sweep.
pub fn segmentation_settings() -> engram_ingest::config::SegmentationSettings {
    let mut settings = engram_server::settings::load_defaults_only::<IngestSettings>()
        .expect("ingest defaults")
        .segmentation;
    settings.sweep_interval_ms = 100;
    settings
}

/// The embedder every service of a sandbox runs with.
fn use_embedder(embed: &mut engram_recall::EmbedConfig, embedder: &TestEmbedder) {
    embed.model_dir = local_model_dir();
    embed.provider = match embedder {
        TestEmbedder::Disabled => engram_embed::EmbedProvider::Disabled,
        TestEmbedder::Local => engram_embed::EmbedProvider::Local,
        TestEmbedder::OpenAi {
            base_url,
            dimension,
        } => {
            embed.openai.base_url = base_url.clone();
            embed.openai.dimension = *dimension;
            embed.openai.max_retries = 1;
            embed.openai.timeout_secs = 5;
            engram_embed::EmbedProvider::Openai
        }
    };
}

/// The ingest settings a sandbox runs with.
fn ingest_settings(database_url: &str, options: &SandboxOptions) -> IngestSettings {
    let mut ingest_settings: IngestSettings =
        engram_server::settings::load_defaults_only::<IngestSettings>().expect("ingest defaults");
    ingest_settings.grpc = grpc_settings(options);
    ingest_settings.database =
        database_settings(ingest_settings.database, database_url, true, options);
    ingest_settings.auth = engram_server::AuthSettings {
        tokens_file: options.tokens_file.clone(),
    };
    if let Some(soft_cap) = options.soft_cap {
        ingest_settings.memory.soft_cap = soft_cap;
    }
    if let Some(concurrency) = options.write_batch_concurrency {
        ingest_settings.memory.write_batch_concurrency = concurrency;
    }
    ingest_settings.embed.poll_interval_ms = 100;
    // Background inference yields the CPU to requests in production (nice 10). Here every
    // process is a test, and four run at once: a nice model would wait on its neighbours.
    ingest_settings.embed.model.inference_nice = 0;
    // Tests that need a retention run start it themselves, at the instant they choose.
    ingest_settings.retention.enabled = false;
    ingest_settings.amqp.bus.enabled = options.bus.is_some();
    if let Some(bus) = &options.bus {
        ingest_settings.amqp.bus.url = SecretString::from(bus.url.clone());
        ingest_settings.amqp.bus.topology_prefix = bus.topology_prefix.clone();
        ingest_settings.embed.sweep_min_age_ms = bus.sweep_min_age_ms;
        ingest_settings.amqp.relay_poll_ms = 100;
        ingest_settings.amqp.bus.retry_delay_ms = 200;
        ingest_settings.amqp.bus.reconnect_max_backoff_ms = 500;
    }
    match &options.segmentation {
        Some(segmentation) => ingest_settings.segmentation = segmentation.clone(),
        None => ingest_settings.segmentation.sweep_interval_ms = 100,
    }
    if let Some(base_url) = &options.llm_base_url {
        ingest_settings.llm.provider = engram_llm::LlmProvider::Openai;
        ingest_settings.llm.base_url = base_url.clone();
        ingest_settings.llm.model = "fake-model".into();
        ingest_settings.llm.timeout_secs = 5;
        ingest_settings.llm.max_retries = 1;
    }
    use_embedder(&mut ingest_settings.embed.model, &options.embedder);
    ingest_settings
}

/// The retrieval settings a sandbox runs with: the same embedder as ingest.
fn retrieval_settings(database_url: &str, options: &SandboxOptions) -> RetrievalSettings {
    let mut settings: RetrievalSettings =
        engram_server::settings::load_defaults_only::<RetrievalSettings>()
            .expect("retrieval defaults");
    settings.grpc = grpc_settings(options);
    settings.database = database_settings(settings.database, database_url, false, options);
    settings.auth = engram_server::AuthSettings {
        tokens_file: options.tokens_file.clone(),
    };
    use_embedder(&mut settings.embed, &options.embedder);
    if let Some(millis) = options.trace_flush_ms {
        settings.recall.trace_flush_ms = millis;
    }
    settings
}

/// The review settings a sandbox runs with: the same embedder and LLM as ingest, the bus when
/// the sandbox has one.
fn review_settings(
    database_url: &str,
    auth: engram_server::AuthSettings,
    options: &SandboxOptions,
) -> ReviewSettings {
    let mut settings: ReviewSettings =
        engram_server::settings::load_defaults_only::<ReviewSettings>().expect("review defaults");
    settings.grpc = grpc_settings(options);
    settings.database = database_settings(settings.database, database_url, false, options);
    settings.auth = auth;
    use_embedder(&mut settings.embed, &options.embedder);
    if let Some(base_url) = &options.llm_base_url {
        settings.llm.provider = engram_llm::LlmProvider::Openai;
        settings.llm.base_url = base_url.clone();
        settings.llm.model = "fake-model".into();
        settings.llm.timeout_secs = 5;
        settings.llm.max_retries = 1;
    }
    if let Some(on_failure) = options.review_on_llm_failure {
        settings.grading.on_llm_failure = on_failure;
    }
    settings.amqp.bus.enabled = options.bus.is_some() && !options.review_consumer_off;
    if let Some(bus) = &options.bus {
        settings.amqp.bus.url = SecretString::from(bus.url.clone());
        settings.amqp.bus.topology_prefix = bus.topology_prefix.clone();
        settings.amqp.bus.retry_delay_ms = 200;
        settings.amqp.bus.reconnect_max_backoff_ms = 500;
    }
    settings
}

impl Sandbox {
    pub async fn start() -> Self {
        Self::start_with(SandboxOptions::default()).await
    }

    pub async fn start_with(options: SandboxOptions) -> Self {
        let database = TestDatabase::create().await.expect("test database");
        let auth = engram_server::AuthSettings {
            tokens_file: options.tokens_file.clone(),
        };
        let (database_proxy, services_database_url) = if options.database_proxy {
            let (proxy, url) = proxied_database_url(database.url()).await;
            (Some(proxy), url)
        } else {
            (None, database.url().to_owned())
        };
        let services_url = services_database_url.as_str();

        let ingest_settings = ingest_settings(services_url, &options);
        let ingest_app = engram_ingest::App::build(ingest_settings)
            .await
            .expect("ingest starts");
        let ingest_metrics = ingest_app.metrics();
        let retention = ingest_app.retention();
        let pool = ingest_app.pool().clone();
        let ingest = RunningService::spawn(
            (ingest_app.local_addr(), ingest_app.metrics_addr()),
            |stopped| ingest_app.run_until(stopped),
        );

        let retrieval_settings = retrieval_settings(services_url, &options);
        let retrieval_app = engram_retrieval::App::build(retrieval_settings)
            .await
            .expect("retrieval starts");
        let recall = retrieval_app.recall().clone();
        let retrieval = RunningService::spawn(
            (retrieval_app.local_addr(), retrieval_app.metrics_addr()),
            |stopped| retrieval_app.run_until(stopped),
        );

        let review_settings = review_settings(services_url, auth, &options);
        let review_app = engram_review::App::build(review_settings)
            .await
            .expect("review starts");
        let review_metrics = review_app.metrics();
        let review = RunningService::spawn(
            (review_app.local_addr(), review_app.metrics_addr()),
            |stopped| review_app.run_until(stopped),
        );

        Self {
            ingest: IngestServiceClient::new(ingest.channel().await),
            retrieval: RetrievalServiceClient::new(retrieval.channel().await),
            review: ReviewServiceClient::new(review.channel().await),
            ingest_metrics,
            retention,
            review_metrics,
            pool,
            recall,
            services: vec![ingest, retrieval, review],
            options,
            database_proxy,
            services_database_url,
            database,
        }
    }

    /// Writes what the retrieval service's retrievals left behind so far (cached scores, notes
    /// that entries were returned, metrics rows), which it otherwise writes within
    /// `recall.trace_flush_ms`: before a test reads them.
    pub async fn write_read_traces(&self) {
        self.recall.flush_traces().await;
    }

    /// Starts one more ingest service over the same database and bus (a second replica, or a
    /// replacement after the first stopped).
    pub async fn start_another_ingest(&self) -> (RunningService, Arc<IngestMetrics>) {
        let app =
            engram_ingest::App::build(ingest_settings(&self.services_database_url, &self.options))
                .await
                .expect("ingest starts");
        let metrics = app.metrics();
        let service = RunningService::spawn((app.local_addr(), app.metrics_addr()), |stopped| {
            app.run_until(stopped)
        });
        (service, metrics)
    }

    /// Starts one more retrieval service over the same database, serving TLS as `tls` says
    /// (its address is the service's; connect with `https://localhost:<port>`).
    pub async fn start_retrieval_with_tls(
        &self,
        tls: engram_server::TlsSettings,
    ) -> anyhow::Result<RunningService> {
        let mut settings = retrieval_settings(&self.services_database_url, &self.options);
        settings.grpc.tls = Some(tls);
        let app = engram_retrieval::App::build(settings).await?;
        Ok(RunningService::spawn(
            (app.local_addr(), app.metrics_addr()),
            |stopped| app.run_until(stopped),
        ))
    }

    pub fn ingest_service(&self) -> &RunningService {
        &self.services[0]
    }

    pub fn retrieval_service(&self) -> &RunningService {
        &self.services[1]
    }
}
