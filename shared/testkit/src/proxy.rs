//! A TCP proxy a test can cut and restore, to play a broker (or any server) going away: cutting
//! drops every proxied connection and refuses new ones; restoring listens again on the same port.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub struct TcpProxy {
    address: SocketAddr,
    upstream: SocketAddr,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl TcpProxy {
    /// Listens on a free local port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let proxy = Self {
            address: listener.local_addr()?,
            upstream,
            tasks: Arc::new(Mutex::new(Vec::new())),
        };
        proxy.serve(listener);
        Ok(proxy)
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    fn serve(&self, listener: TcpListener) {
        let upstream = self.upstream;
        let tasks = self.tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let connection = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                tasks.lock().expect("proxy tasks").push(connection);
            }
        });
        self.tasks.lock().expect("proxy tasks").push(accept);
    }

    /// Drops every connection and stops listening: clients see their connection die, and new
    /// connections are refused.
    pub fn cut(&self) {
        for task in self.tasks.lock().expect("proxy tasks").drain(..) {
            task.abort();
        }
    }

    /// Listens again on the same port.
    pub async fn restore(&self) -> anyhow::Result<()> {
        let listener = TcpListener::bind(self.address).await?;
        self.serve(listener);
        Ok(())
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
    }
}
